"""Opening the auth database: the one entry point of every caller, one engine per process.

The service's handshakes, the Logjam and WebSocket listeners, the TLS audit
and every CLI command open the database with :func:`open_database` and the
same :class:`~auth.settings.AuthSettings`. The first call in a process makes
the engine (its connection pool); later calls with the same URL share it,
and the last :meth:`AuthDatabase.close` disposes of it. Every open checks
the schema (:func:`auth.schema.prepare`): the embedded default is brought to
head, a configured database must already be there.
"""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Final, Self

from sqlalchemy import Engine

from auth import schema
from auth.audit import AuditLog
from auth.engine import make_engine, normalize_url
from auth.settings import AuthSettings
from auth.store import SqlCredentialStore

if TYPE_CHECKING:
    # pyzmq loads only for the processes that check CURVE keys.
    from auth.curve import CurveKeyStore
    from auth.tokens import TokenStore

__all__ = ["AuthDatabase", "open_database"]


@dataclass(slots=True)
class _Shared:
    """The process's engine on one database, and how many opens hold it."""

    engine: Engine
    holders: int = 0


#: Engines by URL (password included: two users are two pools); guarded by _LOCK.
_ENGINES: Final[dict[str, _Shared]] = {}
_LOCK: Final = threading.Lock()


def _forget_engines_in_child() -> None:
    # A forked child must not use its parent's pooled connections (the
    # sockets are shared): drop them without closing, as SQLAlchemy advises.
    for shared in _ENGINES.values():
        shared.engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_engines_in_child)


class AuthDatabase:
    """One caller's hold on the auth database: the process's engine and the stores over it.

    The stores are made on first use and share the engine; :meth:`close`
    (or the end of a ``with`` block) gives the hold back.
    """

    def __init__(self, settings: AuthSettings, engine: Engine, key: str) -> None:
        self.settings = settings
        self.engine = engine
        self._key = key
        self._closed = False

    @cached_property
    def credentials(self) -> SqlCredentialStore:
        """Users, shared keys and client networks: the forward handshake and its admin."""
        return SqlCredentialStore(self.engine, self.settings.secret_key_file)

    @cached_property
    def audit(self) -> AuditLog:
        """The audit log, for changes made outside the stores (certificates, erasures, ...)."""
        return AuditLog(self.engine)

    @cached_property
    def curve_keys(self) -> CurveKeyStore:
        """The CURVE keys of Logjam producers."""
        from auth.curve import CurveKeyStore

        return CurveKeyStore(self.engine)

    @cached_property
    def tokens(self) -> TokenStore:
        """The API tokens of the WebSocket listener."""
        from auth.tokens import TokenStore

        return TokenStore(self.engine)

    def close(self) -> None:
        """Give this hold back; the engine is disposed when no hold is left (idempotent)."""
        if self._closed:
            return
        self._closed = True
        _release(self._key)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(key: str) -> None:
    with _LOCK:
        shared = _ENGINES[key]
        shared.holders -= 1
        if shared.holders > 0:
            return
        del _ENGINES[key]
    shared.engine.dispose()


def open_database(settings: AuthSettings) -> AuthDatabase:
    """A hold on the auth database of ``settings``, its schema checked (blocking).

    The engine is the process's one engine on that URL, made by the first
    open (with ``settings.pool_size``) and shared by every later one.

    Raises:
        auth.errors.InvalidValueError: not a SQLite or PostgreSQL URL.
        auth.errors.SchemaError: the schema is not at the head revision (and
            ``settings.upgrade_in_place`` is false).
        auth.errors.DatabaseError: the database cannot be reached.
    """
    key = normalize_url(settings.url).render_as_string(hide_password=False)
    with _LOCK:
        shared = _ENGINES.get(key)
        if shared is None:
            engine = make_engine(settings.url, pool_size=settings.pool_size)
            shared = _ENGINES[key] = _Shared(engine)
        shared.holders += 1
    database = AuthDatabase(settings, shared.engine, key)
    with ExitStack() as unless_prepared:
        unless_prepared.callback(database.close)
        schema.prepare(shared.engine, upgrade_in_place=settings.upgrade_in_place)
        unless_prepared.pop_all()
    return database
