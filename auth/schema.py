"""The auth database's schema: Alembic run from code, no ``alembic.ini`` on disk.

At start, :func:`prepare`: the embedded default (SQLite under the state
directory) is upgraded in place (:func:`upgrade`); a configured database is
only checked (:func:`check_schema`), because an operator upgrades a shared
database on purpose, once, with ``appliance db upgrade``.
"""

from __future__ import annotations

import fcntl
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

import migrations
from auth.db import IMMEDIATE, display_url, make_engine, normalize_url
from auth.errors import DatabaseError, SchemaError

__all__ = [
    "UPGRADE_ADVICE",
    "SchemaStatus",
    "alembic_config",
    "check_schema",
    "downgrade",
    "head_revision",
    "migrations_dir",
    "prepare",
    "status",
    "upgrade",
    "upgrade_sql",
]

#: What every "behind" message tells the operator to run.
UPGRADE_ADVICE: Final = "run 'appliance db upgrade'"
#: PostgreSQL advisory lock held by a migration, so two nodes never migrate at once.
_MIGRATION_LOCK_KEY: Final = 0x617574685F6462  # "auth_db"
#: Alembic keeps the running migration in module globals (``alembic.context``):
#: one migration at a time per process.
_ALEMBIC_LOCK: Final = threading.Lock()


def migrations_dir() -> Path:
    """The installed ``migrations`` package directory (Alembic's script location)."""
    # __path__, not __file__: it also works when the package is a namespace
    # package (an editable install made before migrations/__init__.py existed).
    return Path(next(iter(migrations.__path__))).resolve()


def alembic_config(url: str | None = None, connection: Connection | None = None) -> AlembicConfig:
    """An Alembic configuration built in code for ``url`` or an open ``connection``."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    # Kept out of the ini options: configparser would interpolate '%' in passwords.
    if url is not None:
        config.attributes["url"] = url
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this appliance ships."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database stands against the revisions this appliance ships."""

    #: The database's revisions (empty: no schema at all).
    current: tuple[str, ...]
    head: str

    @property
    def up_to_date(self) -> bool:
        """The database is at the head revision."""
        return self.current == (self.head,)

    @property
    def known(self) -> bool:
        """Every current revision is one this appliance knows."""
        script = ScriptDirectory.from_config(alembic_config())
        try:
            return all(script.get_revision(rev) is not None for rev in self.current)
        except CommandError:
            return False


@contextmanager
def _database_errors(url: str) -> Iterator[None]:
    try:
        yield
    except SQLAlchemyError as exc:
        raise DatabaseError(_describe(url, exc)) from None


def _describe(url: str, exc: SQLAlchemyError) -> str:
    # The driver's own message, first line: no SQL parameters, no URL password.
    cause = getattr(exc, "orig", None) or exc
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return f"auth database {display_url(url)}: {first}"


def status(url: str) -> SchemaStatus:
    """The database's current revisions and the head revision."""
    engine = make_engine(url, pool_size=1)
    try:
        with _database_errors(url), engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_heads()
    finally:
        engine.dispose()
    return SchemaStatus(current=tuple(current), head=head_revision())


def check_schema(url: str) -> None:
    """Raise :class:`SchemaError` unless the database at ``url`` is at the head revision."""
    found = status(url)
    if found.up_to_date:
        return
    where = display_url(url)
    if not found.current:
        raise SchemaError(
            f"the auth database {where} has no schema (this appliance needs revision "
            f"{found.head}): {UPGRADE_ADVICE}"
        )
    revisions = ", ".join(found.current)
    if not found.known:
        raise SchemaError(
            f"the auth database {where} is at revision {revisions}, which this appliance "
            f"does not know (written by a newer version?); it needs {found.head}"
        )
    raise SchemaError(
        f"the auth database {where} is at revision {revisions}, behind {found.head}: "
        f"{UPGRADE_ADVICE}"
    )


@contextmanager
def _sqlite_file_lock(url: str) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes.

    SQLite answers "database is locked" at once, whatever the busy timeout,
    when two connections that both read try to write: processes starting
    together would race. An advisory lock beside the file orders them, as
    pg_advisory_xact_lock does for PostgreSQL.
    """
    database = normalize_url(url).database
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _migrate(url: str, revision: str, *, up: bool) -> SchemaStatus:
    engine = make_engine(url, pool_size=1)
    is_sqlite = normalize_url(url).get_backend_name() == "sqlite"
    try:
        with (
            _ALEMBIC_LOCK,
            _sqlite_file_lock(url) if is_sqlite else nullcontext(),
            _database_errors(url),
            engine.connect() as connection,
        ):
            connection = connection.execution_options(**{IMMEDIATE: True})
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                    )
                config = alembic_config(url, connection)
                try:
                    if up:
                        command.upgrade(config, revision)
                    else:
                        command.downgrade(config, revision)
                except CommandError as exc:
                    raise SchemaError(f"cannot migrate to {revision!r}: {exc}") from None
    finally:
        engine.dispose()
    return status(url)


def upgrade(url: str, revision: str = "head") -> SchemaStatus:
    """Upgrade the database at ``url`` to ``revision`` in one transaction."""
    return _migrate(url, revision, up=True)


def downgrade(url: str, revision: str) -> SchemaStatus:
    """Downgrade the database at ``url`` to ``revision`` (``base``: drop everything)."""
    return _migrate(url, revision, up=False)


def upgrade_sql(url: str, revision: str = "head", start: str | None = None) -> str:
    """The SQL an upgrade from ``start`` (default: empty) would run, for review by a DBA."""
    normalize_url(url)
    buffer = io.StringIO()
    config = alembic_config(url)
    config.output_buffer = buffer
    target = f"{start}:{revision}" if start else revision
    try:
        with _ALEMBIC_LOCK:
            command.upgrade(config, target, sql=True)
    except CommandError as exc:
        raise SchemaError(f"cannot render the SQL to {revision!r}: {exc}") from None
    return buffer.getvalue()


def prepare(url: str, *, upgrade_in_place: bool | None = None) -> None:
    """At start (service or CLI): upgrade the embedded database in place, check any other.

    Args:
        upgrade_in_place: true for the embedded default (no ``[auth]
            database_url`` configured): it is brought to head by itself. A
            configured database is only checked, because an operator upgrades
            a shared database on purpose, once, with ``appliance db upgrade``.

    Raises:
        SchemaError: the database is not at the head revision.
        DatabaseError: the database cannot be reached.
    """
    if upgrade_in_place is None:
        upgrade_in_place = normalize_url(url).get_backend_name() == "sqlite"
    if upgrade_in_place:
        upgrade(url)
    check_schema(url)
