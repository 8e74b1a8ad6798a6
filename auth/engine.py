"""Engines for the auth database: SQLite (embedded default) or PostgreSQL (psycopg 3).

This is the only place that configures connections to the auth database;
:func:`auth.database.open_database` holds the one engine a process uses.
Both backends behave the same to the callers: real transactions (SQLite's
driver is told to stay out of the way so ``BEGIN`` is ours), foreign keys
enforced, a small connection pool shared by the service's worker threads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final

from sqlalchemy import URL, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from auth.errors import DatabaseError, InvalidValueError
from auth.settings import DEFAULT_POOL_SIZE

__all__ = [
    "IMMEDIATE",
    "SUPPORTED_BACKENDS",
    "database_error",
    "display_url",
    "first_line",
    "make_engine",
    "normalize_url",
    "ping",
]

SUPPORTED_BACKENDS: Final = ("sqlite", "postgresql")
#: Execution option: begin the transaction with SQLite's ``BEGIN IMMEDIATE``
#: (take the write lock at once; read-then-write transactions then never
#: fail half-way on a lock upgrade). No effect on PostgreSQL.
IMMEDIATE: Final = "appliance_sqlite_immediate"
#: Seconds SQLite waits for another writer's lock before it gives up.
SQLITE_BUSY_TIMEOUT_SECONDS: Final = 30
#: Seconds to establish a PostgreSQL connection.
POSTGRES_CONNECT_TIMEOUT_SECONDS: Final = 10
#: Seconds after which a pooled PostgreSQL connection is replaced.
POSTGRES_POOL_RECYCLE_SECONDS: Final = 1800


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; ``postgresql://`` means psycopg 3.

    Raises:
        InvalidValueError: not a SQLite or PostgreSQL URL (the message never
            repeats the URL, which may carry a password).
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidValueError("the auth database URL cannot be parsed") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise InvalidValueError(
            f"unsupported auth database {parsed.get_backend_name()!r} "
            "(use sqlite:///PATH or postgresql+psycopg://...)"
        )
    return parsed


#: Query parameters of a database URL that may carry a secret: libpq and
#: psycopg take ``password`` and ``sslpassword`` there as well as in the
#: URL's authority; anything naming a password, secret or token is masked.
_SECRET_QUERY: Final = re.compile(r"pass|secret|token", re.IGNORECASE)


def display_url(url: str | URL) -> str:
    """The URL with its password masked, wherever it is given, for messages."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "<unparsable URL>"
    masked = {
        name: ("***" if _SECRET_QUERY.search(name) else value)
        for name, value in parsed.query.items()
    }
    rendered = parsed.set(query=masked).render_as_string(hide_password=True)
    return rendered.replace("=%2A%2A%2A", "=***")


def first_line(exc: SQLAlchemyError) -> str:
    """The driver's message, first line only: no SQL parameters (sealed secrets), no URL."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def database_error(url: str | URL, exc: SQLAlchemyError) -> DatabaseError:
    """The :class:`DatabaseError` for ``exc``: the database named without its password."""
    return DatabaseError(f"auth database {display_url(url)}: {first_line(exc)}")


def _sqlite_path(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _prepare_sqlite_file(path: Path) -> None:
    """Create the database file 0600 in a 0700 directory before SQLite does (0644)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def _on_sqlite_connect(dbapi_connection: Any, record: Any) -> None:
    # Autocommit in the driver: SQLAlchemy's "begin" hook below emits BEGIN,
    # so a transaction covers its SELECTs too (pysqlite defers it otherwise).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_SECONDS * 1000}")
        # Readers (the service's handshakes) never wait for the CLI's writes.
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _on_sqlite_begin(connection: Any) -> None:
    immediate = connection.get_execution_options().get(IMMEDIATE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str | URL, *, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    """An engine for the auth database at ``url`` with a small pool."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_path(parsed)
        if path is None:
            engine = create_engine(parsed, connect_args={"check_same_thread": False})
        else:
            _prepare_sqlite_file(path)
            engine = create_engine(
                parsed,
                connect_args={
                    "check_same_thread": False,
                    "timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
                },
                pool_size=pool_size,
                max_overflow=pool_size,
            )
        event.listen(engine, "connect", _on_sqlite_connect)
        event.listen(engine, "begin", _on_sqlite_begin)
        return engine
    return create_engine(
        parsed,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=POSTGRES_POOL_RECYCLE_SECONDS,
        connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_SECONDS},
    )


def ping(url: str | URL) -> None:
    """``SELECT 1`` on a fresh connection, no pool (blocking): is the database reachable?

    Raises:
        InvalidValueError: not a SQLite or PostgreSQL URL.
        sqlalchemy.exc.SQLAlchemyError: the database did not answer.
    """
    parsed = normalize_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_SECONDS
    engine = create_engine(parsed, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()
