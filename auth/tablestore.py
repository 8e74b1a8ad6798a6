"""The plumbing every auth-database store shares: engine, sessions, errors, audit.

:class:`TableStore` owns a small connection pool; ``_read`` and ``_write``
open a transaction (writes with SQLite's BEGIN IMMEDIATE, so concurrent
writers queue instead of failing), and every SQLAlchemy error leaves as an
:class:`~auth.errors.AuthError` that names the database without its password.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Self

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from auth.db import DEFAULT_POOL_SIZE, IMMEDIATE, display_url, make_engine
from auth.errors import ConflictError, DatabaseError
from auth.models import NAME_LENGTH, AuditEntry, utc_now

__all__ = ["TableStore", "first_line"]


def first_line(exc: SQLAlchemyError) -> str:
    """The first line of a database error, for messages (never a URL with a password)."""
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


class TableStore:
    """A store over some tables of the auth database.

    Args:
        url: SQLAlchemy URL of the auth database (schema at head: see
            :func:`auth.schema.prepare`).
        pool_size: connections kept open.
    """

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        self.url = url
        self._engine: Engine = make_engine(url, pool_size=pool_size)

    def close(self) -> None:
        """Close the pooled connections."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise ConflictError(
                f"the change conflicts with the database's contents: {first_line(exc)}"
            ) from None
        except SQLAlchemyError as exc:
            where = display_url(self.url)
            raise DatabaseError(f"auth database {where}: {first_line(exc)}") from None

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._errors(), Session(self._engine) as session, session.begin():
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._errors(), self._engine.connect() as connection:
            connection = connection.execution_options(**{IMMEDIATE: True})
            with Session(bind=connection) as session, session.begin():
                yield session

    @staticmethod
    def _audit(session: Session, action: str, target: str, actor: str, detail: str = "") -> None:
        session.add(
            AuditEntry(
                at=utc_now(), actor=actor[:NAME_LENGTH], action=action, target=target,
                detail=detail,
            )
        )  # fmt: skip
