"""The plumbing every auth-database store shares: transactions, errors, names and the audit path.

:class:`TableStore` works on the process's engine (:mod:`auth.database`);
``_read`` and ``_write`` open a transaction (writes with SQLite's BEGIN
IMMEDIATE, so concurrent writers queue instead of failing), and every
SQLAlchemy error leaves as an :class:`~auth.errors.AuthError` that names the
database without its password. ``_audit`` is the one way an audit entry is
written: every text it stores is sanitised (control characters escaped,
cut to the column's size).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Protocol, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import InstrumentedAttribute, Session

from auth.engine import IMMEDIATE, database_error, first_line
from auth.errors import ConflictError, InvalidValueError, NotFoundError
from auth.models import ADDRESS_LENGTH, NAME_LENGTH, AuditEntry, utc_now

__all__ = ["MAX_DETAIL_CHARS", "TableStore", "check_name", "clean"]

#: Longest audit detail kept, in characters (a failure reason comes from the wire).
MAX_DETAIL_CHARS: Final = 1000


def check_name(what: str, name: str) -> str:
    """``name`` as given, if it is a valid name of a ``what`` (user, shared key, token, ...).

    Raises:
        InvalidValueError: empty, too long, or holding spaces or control characters.
    """
    if not name or len(name) > NAME_LENGTH:
        raise InvalidValueError(f"a {what} name needs 1 to {NAME_LENGTH} characters")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidValueError(f"a {what} name cannot hold spaces or control characters")
    return name


def clean(text: str, limit: int) -> str:
    """Printable text for the audit log: control characters escaped, length capped."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)[:limit]


class _Revocable(Protocol):
    """A row that can be revoked (a CURVE key, an API token)."""

    revoked_at: dt.datetime | None


_Row = TypeVar("_Row", bound=_Revocable)

_Info = TypeVar("_Info")


class TableStore:
    """A store over some tables of the auth database.

    Args:
        engine: the process's engine on the auth database (schema at head:
            :func:`auth.database.open_database` checks it).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise ConflictError(
                f"the change conflicts with the database's contents: {first_line(exc)}"
            ) from None
        except SQLAlchemyError as exc:
            raise database_error(self._engine.url, exc) from None

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._errors(), Session(self._engine) as session, session.begin():
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._errors(), self._write_session() as session:
            yield session

    @contextmanager
    def _write_session(self) -> Iterator[Session]:
        with self._engine.connect() as connection:
            connection = connection.execution_options(**{IMMEDIATE: True})
            with Session(bind=connection) as session, session.begin():
                yield session

    @staticmethod
    def _audit(
        session: Session,
        action: str,
        target: str,
        *,
        actor: str | None,
        detail: str = "",
        source_address: str | None = None,
    ) -> None:
        """Add one audit entry to ``session``'s transaction (``detail`` must hold no secret)."""
        session.add(
            AuditEntry(
                at=utc_now(),
                actor=clean(actor, NAME_LENGTH) if actor is not None else None,
                source_address=(
                    clean(source_address, ADDRESS_LENGTH) if source_address is not None else None
                ),
                action=action,
                target=clean(target, NAME_LENGTH),
                detail=clean(detail, MAX_DETAIL_CHARS),
            )
        )

    def _revoke(
        self,
        session: Session,
        row: _Row | None,
        *,
        what: str,
        name: str,
        action: str,
        actor: str,
    ) -> _Row:
        """Revoke ``row`` (the ``what`` named ``name``; None: there is none), audited as ``action``.

        Raises:
            NotFoundError: no such row.
            ConflictError: it is revoked already.
        """
        if row is None:
            raise NotFoundError(f"no {what} named {name!r}")
        if row.revoked_at is not None:
            raise ConflictError(f"{what} {name!r} is revoked already")
        row.revoked_at = utc_now()
        self._audit(session, action, name, actor=actor)
        session.flush()
        return row

    def _all_by_name(
        self, model: type[_Row], name: InstrumentedAttribute[str], info: Callable[[_Row], _Info]
    ) -> list[_Info]:
        """``info`` of every row of ``model``, active and revoked, by its ``name`` column."""
        with self._read() as session:
            return [info(row) for row in session.scalars(select(model).order_by(name))]

    def _revoke_named(
        self,
        model: type[_Row],
        column: InstrumentedAttribute[str],
        name: str,
        info: Callable[[_Row], _Info],
        *,
        what: str,
        action: str,
        actor: str,
    ) -> _Info:
        """Revoke the ``model`` row whose ``column`` is ``name`` (audited as ``action``); its info.

        Raises:
            NotFoundError: no such row.
            ConflictError: it is revoked already.
        """
        with self._write() as session:
            row = session.scalar(select(model).where(column == name))
            revoked = self._revoke(session, row, what=what, name=name, action=action, actor=actor)
            return info(revoked)
