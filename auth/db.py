"""Engines for the auth database: SQLite (embedded default) or PostgreSQL (psycopg 3).

Both behave the same to the callers: real transactions (SQLite's driver is
told to stay out of the way so ``BEGIN`` is ours), foreign keys enforced, a
small connection pool shared by the service's worker threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError

from auth.errors import InvalidValueError

__all__ = [
    "IMMEDIATE",
    "SUPPORTED_BACKENDS",
    "display_url",
    "make_engine",
    "normalize_url",
]

SUPPORTED_BACKENDS: Final = ("sqlite", "postgresql")
#: Execution option: begin the transaction with SQLite's ``BEGIN IMMEDIATE``
#: (take the write lock at once; read-then-write transactions then never
#: fail half-way on a lock upgrade). No effect on PostgreSQL.
IMMEDIATE: Final = "appliance_sqlite_immediate"
#: Connections kept open per engine: the handshakes are short look-ups.
DEFAULT_POOL_SIZE: Final = 2
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


def display_url(url: str | URL) -> str:
    """The URL with its password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"


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
