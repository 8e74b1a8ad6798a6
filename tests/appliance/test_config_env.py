"""``${NAME}`` and ``${file:PATH}`` in configuration values: the pure rules, then the service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import make_url

from appliance.config import ConfigError, parse_config, parse_config_sources
from appliance.config_env import MAX_FILE_BYTES, SubstitutionError, expand, read_limited
from tests.postgres import PostgresServer
from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.service import start_appliance


def expanded(value: str, env: dict[str, str] | None = None) -> str:
    return expand(value, env or {}, read_limited)[0]


def test_variables_files_and_the_escape(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    env = {"HOST": "db.example", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert expanded("pg://u@${HOST}/x", env) == "pg://u@db.example/x"
    assert expanded("${file:" + str(secret) + "}") == "s3cret"
    assert expanded("${file:${CREDENTIALS_DIRECTORY}/secret}", env) == "s3cret"
    assert expanded("cost $${HOST} and $5", env) == "cost ${HOST} and $5"


def test_a_substituted_value_is_not_expanded_again() -> None:
    assert expanded("${A}", {"A": "${B}", "B": "no"}) == "${B}"


def test_sources_name_references_never_values(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    value, sources = expand("${USER_}:${file:" + str(secret) + "}", {"USER_": "me"}, read_limited)
    assert value == "me:s3cret"
    assert [(s.kind, s.reference) for s in sources] == [
        ("environment", "${USER_}"),
        ("file", "${file:" + str(secret) + "}"),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("${MISSING}", "environment variable MISSING is not set"),
        ("${not a name}", "is not a variable name"),
        ("${OPEN", "is not closed"),
        ("${file:relative/path}", "needs an absolute path"),
        ("${file:/nonexistent/appliance-secret}", "cannot read /nonexistent/appliance-secret"),
    ],
)
def test_a_bad_reference_names_itself(value: str, message: str) -> None:
    with pytest.raises(SubstitutionError, match=message):
        expanded(value)


def test_a_file_too_large_or_not_text_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(SubstitutionError, match="over"):
        expanded("${file:" + str(big) + "}")
    with pytest.raises(SubstitutionError, match="not UTF-8"):
        expanded("${file:" + str(binary) + "}")


def test_the_config_error_names_the_variable_and_its_line() -> None:
    text = '[lake]\nack = "wal"\n\n[[listeners]]\nname = "forward"\nbind = "${NO_SUCH_BIND}"\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "appliance.toml", environ={})
    assert str(caught.value) == (
        "appliance.toml:6: listeners[0].bind: environment variable NO_SUCH_BIND is not set"
    )


def test_every_string_value_is_expanded_and_its_source_kept() -> None:
    text = (
        '[auth]\ndatabase_url = "postgresql+psycopg://a:${PW}@h/db"\n'
        '[lake]\nack = "${ACK}"\nstorage_options = { AWS_SECRET_ACCESS_KEY = "${S3}" }\n'
        '[[listeners]]\nname = "forward"\nbind = "${BIND}"\n'
    )
    env = {"PW": "pw", "ACK": "commit", "S3": "k", "BIND": "127.0.0.1:7000"}
    config, sources = parse_config_sources(text, "f.toml", environ=env)
    assert config.auth.database_url == "postgresql+psycopg://a:pw@h/db"
    assert config.lake.ack == "commit"
    assert config.lake.storage_options == {"AWS_SECRET_ACCESS_KEY": "k"}
    assert config.listeners[0].bind == "127.0.0.1:7000"
    assert [key for key, _ in sources] == [
        "auth.database_url",
        "lake.ack",
        "lake.storage_options.AWS_SECRET_ACCESS_KEY",
        "listeners[0].bind",
    ]


def test_a_bind_and_the_database_password_from_outside_the_file(
    tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service binds where ${FWD_BIND} says and reaches PostgreSQL with a password
    from a file; the password is in no output: config check, db, the log, status."""
    if postgres_server.url is None:
        pytest.skip(f"PostgreSQL is not available here: {postgres_server.reason}")
    database = make_url(postgres_server.create_database())
    password = database.password
    assert password
    secret = tmp_path / "db-password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    templated = (
        database.set(password="PASSWORD")
        .render_as_string(hide_password=False)
        .replace("PASSWORD", "${file:" + str(secret) + "}")
    )
    port = free_port()
    monkeypatch.setenv("FWD_BIND", f"127.0.0.1:{port}")
    auth = f'[auth]\ndatabase_url = "{templated}"\nsecret_key_file = "{tmp_path / "k"}"\n'
    # `appliance status` finds the admin listener by the config: at a port it names.
    admin = f'[admin]\nbind = "127.0.0.1:{free_port()}"\n'
    app = start_appliance(tmp_path, {"forward": 'bind = "${FWD_BIND}"'}, extra=auth + admin)
    try:
        config = tmp_path / "appliance0.toml"
        assert str(secret) not in password  # the reference is not the secret
        check = run_cli("config", "check", str(config))
        assert check.returncode == 0, check.stderr
        assert f"forward (127.0.0.1:{port})" in check.stdout
        assert "auth.database_url: from file ${file:" + str(secret) + "}" in check.stdout
        assert "listeners[0].bind: from environment ${FWD_BIND}" in check.stdout
        upgraded = run_cli("db", "current", config=config, check=True).stdout
        assert app.ports["forward"] == port
        status = run_cli("status", "--json", config=config, check=True).stdout
        json.loads(status)
        for text in (check.stdout, check.stderr, upgraded, status, app.log()):
            assert password not in text
    finally:
        app.stop()
        postgres_server.drop_database(database.render_as_string(hide_password=False))
