"""The auth database's schema: Alembic run from code, no ``alembic.ini`` on disk.

At start, :func:`prepare` (run by :func:`auth.database.open_database` on
the process's engine): the embedded default (SQLite under the state
directory) is upgraded in place (:func:`upgrade`); a configured database is
only checked (:func:`check_schema`), because an operator upgrades a shared
database on purpose, once, with ``appliance db upgrade``. Every function
takes the database as a URL (a short-lived engine of its own, for the ``db``
commands and tests) or as an open engine.
"""

from __future__ import annotations

import fcntl
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

import migrations
from auth.engine import IMMEDIATE, database_error, display_url, make_engine, normalize_url
from auth.errors import SchemaError

__all__ = [
    "UPGRADE_ADVICE",
    "Database",
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

#: The database a function works on: its URL, or the process's open engine.
Database = str | Engine
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


def _url(database: Database) -> URL:
    return database.url if isinstance(database, Engine) else normalize_url(database)


@contextmanager
def _engine(database: Database) -> Iterator[Engine]:
    """``database``'s engine; a URL gets one of its own, disposed after the block.

    Every SQLAlchemy error in the block leaves as a :class:`DatabaseError`
    that names the database without its password.
    """
    if isinstance(database, Engine):
        engine, owned = database, False
    else:
        engine, owned = make_engine(database, pool_size=1), True
    try:
        with _database_errors(engine):
            yield engine
    finally:
        if owned:
            engine.dispose()


@contextmanager
def _database_errors(engine: Engine) -> Iterator[None]:
    try:
        yield
    except SQLAlchemyError as exc:
        raise database_error(engine.url, exc) from None


def status(database: Database) -> SchemaStatus:
    """The database's current revisions and the head revision."""
    with _engine(database) as engine, engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_heads()
    return SchemaStatus(current=tuple(current), head=head_revision())


def check_schema(database: Database) -> None:
    """Raise :class:`SchemaError` unless ``database`` is at the head revision."""
    found = status(database)
    if found.up_to_date:
        return
    where = display_url(_url(database))
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
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes.

    SQLite answers "database is locked" at once, whatever the busy timeout,
    when two connections that both read try to write: processes starting
    together would race. An advisory lock beside the file orders them, as
    pg_advisory_xact_lock does for PostgreSQL.
    """
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
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


def _migrate(database: Database, revision: str, *, up: bool) -> SchemaStatus:
    with (
        _ALEMBIC_LOCK,
        _engine(database) as engine,
        _sqlite_file_lock(engine),
        engine.connect() as connection,
    ):
        connection = connection.execution_options(**{IMMEDIATE: True})
        with connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
            config = alembic_config(connection=connection)
            try:
                if up:
                    command.upgrade(config, revision)
                else:
                    command.downgrade(config, revision)
            except CommandError as exc:
                raise SchemaError(f"cannot migrate to {revision!r}: {exc}") from None
    return status(database)


def upgrade(database: Database, revision: str = "head") -> SchemaStatus:
    """Upgrade ``database`` to ``revision`` in one transaction."""
    return _migrate(database, revision, up=True)


def downgrade(database: Database, revision: str) -> SchemaStatus:
    """Downgrade ``database`` to ``revision`` (``base``: drop everything)."""
    return _migrate(database, revision, up=False)


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


def prepare(database: Database, *, upgrade_in_place: bool | None = None) -> None:
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
        upgrade_in_place = _url(database).get_backend_name() == "sqlite"
    if upgrade_in_place:
        upgrade(database)
    check_schema(database)
