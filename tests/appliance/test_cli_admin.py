"""Admin commands that tell the truth about their state, and ``config check``
(docs/decisions.md, 16-21).

Each runs the real ``appliance`` command as a subprocess and checks what it
prints and its exit code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli


def files_under(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*"))


# -- no state, no new state ---------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["user", "list"],
        ["user", "add", "alice", "--password-stdin"],
        ["key", "list"],
        ["key", "generate", "k"],
        ["client", "list"],
        ["audit", "list"],
        ["db", "current"],
        ["token", "list"],
        ["token", "add", "t"],
        ["curve", "list"],
        ["curve", "server-key"],
        ["cert", "list"],
        ["cert", "revoke", "web-01"],
    ],
)
def test_an_empty_directory_gets_no_state(command: list[str], tmp_path: Path) -> None:
    result = run_cli(*command, cwd=tmp_path, stdin="pw-pw-pw-pw\n")
    assert result.returncode == 1, result
    state = tmp_path / "var"
    lines = result.stderr.splitlines()
    assert lines[0].startswith(
        f"appliance: state {state} (no config file: the embedded default)"
    ), lines
    assert f"no state in {state}: the directory does not exist" in result.stderr
    assert "run 'appliance serve' once" in result.stderr
    assert "Traceback" not in result.stderr
    assert files_under(tmp_path) == []


def test_reading_commands_do_not_create_the_auth_database(tmp_path: Path) -> None:
    (tmp_path / "var").mkdir()  # a state directory, without an auth database yet
    listed = run_cli("user", "list", cwd=tmp_path)
    assert listed.returncode == 1
    database = tmp_path / "var" / "auth" / "auth.db"
    assert f"no auth database at {database}" in listed.stderr
    assert "'appliance db upgrade' creates it now" in listed.stderr
    current = run_cli("db", "current", cwd=tmp_path)
    assert current.returncode == 0, current.stderr
    assert "no database file yet" in current.stdout
    assert files_under(tmp_path) == [tmp_path / "var"]
    # Adding is what creates it, inside the existing state directory.
    added = run_cli("user", "add", "alice", "--password-stdin", cwd=tmp_path, stdin="pw-1234\n")
    assert added.returncode == 0, added.stderr
    assert database.exists()
    assert run_cli("user", "list", cwd=tmp_path).returncode == 0


def test_every_admin_command_names_its_state_and_masks_passwords(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[auth]\n'
        'database_url = "postgresql+psycopg://ingest:hunter2@db.example:5432/auth"\n'
    )
    result = run_cli("db", "upgrade", "--sql", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"appliance: state {tmp_path / 'state'} (config {config}), "
        "auth database postgresql+psycopg://ingest:***@db.example:5432/auth"
    )
    assert "hunter2" not in result.stdout + result.stderr


def test_config_before_the_subcommand_and_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    (tmp_path / "state").mkdir()
    before = run_cli("--config", str(config), "user", "add", "bob", "--password-stdin",
                       cwd=tmp_path, stdin="pw-1234\n")  # fmt: skip
    assert before.returncode == 0, before.stderr
    assert f"state {tmp_path / 'state'} (config {config})" in before.stderr
    listed = run_cli("--config", str(config), "user", "list", cwd=tmp_path)
    assert "bob" in listed.stdout
    from_env = run_cli("user", "list", cwd=tmp_path, env={"APPLIANCE_CONFIG": str(config)})
    assert "bob" in from_env.stdout
    assert f"(config {config} ($APPLIANCE_CONFIG))" in from_env.stderr
    assert not (tmp_path / "var").exists()


def test_config_check_takes_the_file_from_config_or_the_environment(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[listeners]]\nbind = "127.0.0.1:24224"\n')
    for args, env in [
        (["config", "check", str(good)], None),
        (["--config", str(good), "config", "check"], None),
        (["config", "check", "--config", str(good)], None),
        (["config", "check"], {"APPLIANCE_CONFIG": str(good)}),
    ]:
        result = run_cli(*args, cwd=tmp_path, env=env)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.startswith(f"{good}: ok; listeners: forward (127.0.0.1:24224)")
    missing = run_cli("config", "check", cwd=tmp_path)
    assert missing.returncode == 2
    assert "which file? give FILE, --config FILE or $APPLIANCE_CONFIG" in missing.stderr


# -- config check: files and binds --------------------------------------------------------


def test_config_check_names_each_missing_file(tmp_path: Path) -> None:
    present = tmp_path / "server.pem"
    present.write_text("x")
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'[tls]\ncert_file = "{present}"\nkey_file = "{tmp_path / "server.key"}"\n'
        f'client_ca_file = "{tmp_path / "clients-ca.pem"}"\ncrl_file = "{tmp_path}"\n'
        f'[auth]\nsecret_key_file = "{tmp_path / "secret.key"}"\n'
    )
    result = run_cli("config", "check", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert f"appliance: {config}: tls.key_file: no such file: {tmp_path / 'server.key'}" in (
        result.stderr
    )
    assert f"tls.client_ca_file: no such file: {tmp_path / 'clients-ca.pem'}" in result.stderr
    assert f"tls.crl_file: not a file: {tmp_path}" in result.stderr
    assert "tls.cert_file" not in result.stderr
    # The key file is made by the first stored secret: a warning, named all the same.
    assert (
        f"warning: auth.secret_key_file: no such file: {tmp_path / 'secret.key'}" in result.stderr
    )
    assert "ok" not in result.stdout


def test_config_check_relative_paths_and_half_a_pair(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text('[tls]\ncert_file = "certs/server.pem"\n')
    result = run_cli("config", "check", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert "tls.cert_file and tls.key_file go together" in result.stderr
    assert (
        "tls.cert_file: no such file: certs/server.pem (relative to the current directory: "
        f"{tmp_path / 'certs' / 'server.pem'})"
    ) in result.stderr


def test_config_check_warns_about_a_missing_sqlite_database(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'[auth]\ndatabase_url = "sqlite:///{tmp_path / "auth.db"}"\n')
    result = run_cli("config", "check", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"no SQLite database at {tmp_path / 'auth.db'}" in result.stderr
    assert not (tmp_path / "auth.db").exists()


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        (
            '[[listeners]]\nname = "a"\nbind = "127.0.0.1:24224"\n\n'
            '[[listeners]]\nname = "b"\nbind = "127.0.0.1:24224"\n',
            7,
            "listeners[1].bind: two listeners bind the same address: "
            "listener 'b' (bind 127.0.0.1:24224) and listener 'a' (bind 127.0.0.1:24224)",
        ),
        (  # both on the default bind: the second [[listeners]] header is the line
            '[[listeners]]\nname = "a"\n\n[[listeners]]\nname = "b"\ntls = false\n',
            4,
            "listeners[1].bind: two listeners bind the same address: "
            "listener 'b' (bind 127.0.0.1:24224) and listener 'a' (bind 127.0.0.1:24224)",
        ),
        (  # a wildcard takes the port on every address
            '[[listeners]]\nname = "all"\nbind = "0.0.0.0:5044"\n'
            '[[listeners]]\nname = "beats"\nprotocol = "lumberjack"\nbind = "127.0.0.1:5044"\n',
            7,
            "listener 'beats' (bind 127.0.0.1:5044) and listener 'all' (bind 0.0.0.0:5044)",
        ),
        (  # logjam's PULL socket collides with another listener
            '[[listeners]]\nname = "fw"\nbind = "127.0.0.1:9605"\n\n'
            '[[listeners]]\nname = "lj"\nprotocol = "logjam"\n',
            5,
            "listeners[1].pull_bind: two listeners bind the same address: "
            "listener 'lj' (pull_bind 127.0.0.1:9605) and listener 'fw' (bind 127.0.0.1:9605)",
        ),
        (  # two logjam listeners: the second's bind is the first's pull_bind
            '[[listeners]]\nname = "one"\nprotocol = "logjam"\npull_bind = "127.0.0.1:7001"\n'
            '[[listeners]]\nname = "two"\nprotocol = "logjam"\nbind = "127.0.0.1:7001"\n'
            'pull_bind = ""\n',
            8,
            "listener 'two' (bind 127.0.0.1:7001) and listener 'one' (pull_bind 127.0.0.1:7001)",
        ),
    ],
)
def test_duplicate_binds_name_both_listeners_at_the_second_line(
    body: str, line: int, message: str, tmp_path: Path
) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(body)
    result = run_cli("config", "check", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert f"appliance: config error: {config}:{line}: " in result.stderr
    assert message in result.stderr


def test_different_addresses_on_one_port_are_fine(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(
        '[[listeners]]\nname = "a"\nbind = "127.0.0.1:24224"\n'
        '[[listeners]]\nname = "b"\nbind = "127.0.0.2:24224"\n'
        '[[listeners]]\nname = "c"\nbind = "[::1]:24224"\n'
    )
    result = run_cli("config", "check", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
