"""Auth databases for the tests: an SQLite file, and a real PostgreSQL server.

The PostgreSQL server comes from ``scripts/postgres-test.sh`` (installed from
Debian's packages when missing, started once per session on a free port,
stopped at the end), or from ``$APPLIANCE_TEST_POSTGRES_URL`` (a user that
may create databases). Each test gets a database of its own. When no server
can be had, the ``postgresql`` parameters are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from auth import schema
from auth.database import open_database
from auth.settings import AuthSettings
from auth.store import SqlCredentialStore
from tests.postgres import PostgresServer

BACKENDS = ["sqlite", "postgresql"]


def _database(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'auth.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    if server.url is None:
        pytest.skip(f"PostgreSQL unavailable: {server.reason}")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema): SQLite, then PostgreSQL."""
    yield from _database(request, tmp_path, request.param)


@pytest.fixture
def migrated_url(db_url: str) -> str:
    """A database at the head revision."""
    schema.upgrade(db_url)
    return db_url


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return tmp_path / "keys" / "secret.key"


@contextmanager
def credentials(url: str, key_file: Path) -> Iterator[SqlCredentialStore]:
    """The credential store of the database at ``url`` (at head), opened as a caller does."""
    with open_database(AuthSettings(url, key_file, upgrade_in_place=False)) as database:
        yield database.credentials


@pytest.fixture
def store(migrated_url: str, key_file: Path) -> Iterator[SqlCredentialStore]:
    with credentials(migrated_url, key_file) as opened:
        yield opened
