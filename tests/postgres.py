"""The session's PostgreSQL server for the tests that need a real one (auth, fleet).

``scripts/postgres-test.sh`` installs Debian's PostgreSQL when missing and
starts a throw-away cluster; ``APPLIANCE_TEST_POSTGRES_URL`` names an
existing server instead. Registered once, in the root conftest, so one
session starts one server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "postgres-test.sh"
#: An existing server to use instead of starting one.
URL_ENV = "APPLIANCE_TEST_POSTGRES_URL"
#: Seconds the script may take (an apt-get install included).
START_TIMEOUT_SECONDS = 900


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
