"""The Alembic revisions on SQLite and PostgreSQL: empty to head, down to base and back."""

from __future__ import annotations

import importlib
import multiprocessing
import pkgutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

import auth
from auth import schema
from auth.errors import DatabaseError, SchemaError
from auth.models import Base
from tests.auth.conftest import credentials

TABLES = {"users", "shared_keys", "client_networks", "client_network_users", "audit_log"}


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_empty_to_head_down_to_base_and_up_again(db_url: str, tmp_path: Path) -> None:
    head = schema.head_revision()
    assert schema.status(db_url).current == ()
    with pytest.raises(SchemaError, match="appliance db upgrade"):
        schema.check_schema(db_url)

    upgraded = schema.upgrade(db_url)
    assert upgraded.current == (head,)
    assert upgraded.up_to_date
    assert tables(db_url) >= TABLES
    schema.check_schema(db_url)
    with credentials(db_url, tmp_path / "secret.key") as store:
        store.add_user("alice", b"pw", actor="test")

    # Upgrading again is a no-op.
    assert schema.upgrade(db_url).current == (head,)

    down = schema.downgrade(db_url, "base")
    assert down.current == ()
    assert not (TABLES & tables(db_url))
    with pytest.raises(SchemaError, match="appliance db upgrade"):
        schema.check_schema(db_url)

    assert schema.upgrade(db_url).up_to_date
    with credentials(db_url, tmp_path / "secret.key") as store:
        assert store.list_users() == []
        store.add_user("alice", b"pw", actor="test")
        assert store.password_of("alice") == b"pw"


def test_head_matches_the_models(migrated_url: str) -> None:
    for module in pkgutil.iter_modules(auth.__path__):  # tables declared beside auth.models
        importlib.import_module(f"auth.{module.name}")
    engine = create_engine(migrated_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_check_schema_when_behind_and_when_unknown(migrated_url: str) -> None:
    engine = create_engine(migrated_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '0000'"))
        with pytest.raises(SchemaError, match="does not know") as raised:
            schema.check_schema(migrated_url)
        assert "0000" in str(raised.value)
        assert not schema.status(migrated_url).known
    finally:
        engine.dispose()


def test_prepare_upgrades_only_in_place(db_url: str) -> None:
    with pytest.raises(SchemaError, match="run 'appliance db upgrade'"):
        schema.prepare(db_url, upgrade_in_place=False)
    assert schema.status(db_url).current == ()
    schema.prepare(db_url, upgrade_in_place=True)
    assert schema.status(db_url).up_to_date
    schema.prepare(db_url, upgrade_in_place=False)


def test_prepare_decides_by_backend_by_default(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        schema.prepare(db_url)
        assert schema.status(db_url).up_to_date
    else:
        with pytest.raises(SchemaError, match="appliance db upgrade"):
            schema.prepare(db_url)


def _upgrade_in_child(url: str) -> tuple[str, ...]:
    return schema.upgrade(url).current


def test_concurrent_upgrades_do_not_collide(db_url: str) -> None:
    """Processes (or nodes) starting at once: one migrates, the others wait and find head."""
    # Forked processes: each has its own Alembic state, none pays the imports again.
    with multiprocessing.get_context("fork").Pool(3) as pool:
        results = pool.map(_upgrade_in_child, [db_url] * 3, chunksize=1)
    assert results == [(schema.head_revision(),)] * 3
    assert schema.status(db_url).up_to_date


def test_upgrade_sql_renders_without_a_database() -> None:
    postgres = schema.upgrade_sql("postgresql+psycopg://u:secret@nowhere.invalid/db")
    assert "CREATE TABLE users" in postgres
    assert "BYTEA" in postgres
    assert "secret" not in postgres.replace("secret_sealed", "")
    sqlite = schema.upgrade_sql("sqlite:////nonexistent/dir/auth.db")
    assert "CREATE TABLE shared_keys" in sqlite
    assert not Path("/nonexistent/dir/auth.db").exists()


def test_unreachable_database_is_a_clear_error(tmp_path: Path) -> None:
    url = "postgresql+psycopg://appliance:hunter2@127.0.0.1:1/none"
    with pytest.raises(DatabaseError) as raised:
        schema.check_schema(url)
    assert "hunter2" not in str(raised.value)
    assert "127.0.0.1" in str(raised.value)


def test_migrations_need_no_ini_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no alembic.ini here, nor in the package
    location = schema.migrations_dir()
    assert (location / "env.py").is_file()
    assert (location / "versions" / "0001_initial.py").is_file()
    assert not (location / "alembic.ini").exists()
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    assert schema.upgrade(url).up_to_date
