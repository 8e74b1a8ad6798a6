"""Auth databases for the tests: an SQLite file, and a real PostgreSQL server.

The PostgreSQL server comes from ``scripts/postgres-test.sh`` (installed from
Debian's packages when missing, started once per session on a free port,
stopped at the end), or from ``$APPLIANCE_TEST_POSTGRES_URL`` (a user that
may create databases). Each test gets a database of its own. When no server
can be had, the ``postgresql`` parameters are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from auth import schema
from auth.database import open_database
from auth.settings import AuthSettings
from auth.store import SqlCredentialStore

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "postgres-test.sh"
#: An existing server to use instead of starting one.
URL_ENV = "APPLIANCE_TEST_POSTGRES_URL"
#: Seconds the script may take (an apt-get install included).
START_TIMEOUT_SECONDS = 900

BACKENDS = ["sqlite", "postgresql"]


@dataclass
class PostgresServer:
    """The session's PostgreSQL server, or why there is none."""

    url: str | None
    reason: str = ""

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        assert self.url is not None
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, statement: str) -> None:
        assert self.url is not None
        engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(statement))
        finally:
            engine.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """Started at the first PostgreSQL test, stopped at the end of the session."""
    if os.environ.get(URL_ENV):
        yield PostgresServer(os.environ[URL_ENV])
        return
    base = tempfile.mkdtemp(prefix="appliance-pg-")
    try:
        result = subprocess.run(
            ["bash", str(SCRIPT), "start", base],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        result = subprocess.CompletedProcess([], 1, "", str(exc))
    if result.returncode != 0 or not result.stdout.strip():
        reason = f"{SCRIPT.name} failed: {result.stderr.strip()[-500:]}"
        print(f"\nPostgreSQL tests skipped: {reason}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)
        yield PostgresServer(None, reason)
        return
    try:
        yield PostgresServer(result.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", base], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


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
