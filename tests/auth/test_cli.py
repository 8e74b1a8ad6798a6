"""``appliance user|key|client|db|audit`` run as the real command, on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from appliance.cli import main
from appliance.config import ConfigError, parse_config
from tests.auth.conftest import credentials
from tests.support.cli import run_cli

PASSWORD_1 = "correct horse battery"
PASSWORD_2 = "new horse staple"
PASSWORD_BOB = "bob-secret-pw"
NET_KEY = "net shared key 123"


class Cli:
    """The command against one config file; keeps every output and argv.

    ``cli(...)`` runs the real command as a subprocess; ``cli.here(...)``
    runs the same ``main()`` in this process (no interpreter start-up: the
    many smaller checks use it to keep the suite fast).
    """

    def __init__(self, config: Path, cwd: Path) -> None:
        self.config = config
        self.cwd = cwd
        self.outputs: list[str] = []
        self.argvs: list[list[str]] = []
        self.in_process = False

    def __call__(
        self, *args: str, stdin: str | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [*args, "--config", str(self.config)]
        self.argvs.append(argv)
        if self.in_process:
            out, err = io.StringIO(), io.StringIO()
            with (
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
                mock.patch.object(sys, "stdin", io.StringIO(stdin or "")),
            ):
                code = main(argv)
            result = subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
        else:
            result = run_cli(*args, config=self.config, stdin=stdin, cwd=self.cwd)
        self.outputs.append(result.stdout + result.stderr)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    @property
    def here(self) -> Cli:
        """The same commands, run in this process."""
        twin = Cli(self.config, self.cwd)
        twin.outputs, twin.argvs, twin.in_process = self.outputs, self.argvs, True
        return twin

    def json(self, *args: str, stdin: str | None = None) -> Any:
        return json.loads(self(*args, "--json", stdin=stdin).stdout)

    def fails(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin, ok=False)
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
        return result.stderr


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n\n[auth]\ndatabase_url = "{db_url}"\n',
        encoding="utf-8",
    )
    return Cli(config, tmp_path)


def test_admin_commands_end_to_end(cli: Cli, db_url: str, tmp_path: Path) -> None:
    """The main paths as subprocesses (``cli``); the many smaller checks in-process (``here``)."""
    here = cli.here
    # A configured database is upgraded on purpose (only the embedded default by itself).
    assert "run 'appliance db upgrade'" in cli.fails("user", "list")
    status = here.json("db", "current")
    assert (status["current"], status["up_to_date"]) == ([], False)
    if db_url.startswith("postgresql"):
        assert "***" in status["url"]  # the password is masked
    assert here("db", "current", "--check", ok=False).returncode == 1
    assert "upgraded from (empty) to" in cli("db", "upgrade").stdout
    assert here("user", "list").stdout.strip() == "(none)"

    # Users.
    added = cli("user", "add", "alice", "--password-stdin", stdin=PASSWORD_1 + "\n")
    assert added.stdout == "added user alice\n"
    assert "already exists" in cli.fails("user", "add", "alice", "--password-stdin", stdin="x\n")
    bob = here.json("user", "add", "bob", "--disabled", "--password-stdin", stdin=PASSWORD_BOB)
    assert (bob["name"], bob["enabled"]) == ("bob", False)
    here("user", "disable", "alice")
    assert here.json("user", "show", "alice")["enabled"] is False
    here("user", "enable", "alice")
    here("user", "passwd", "alice", "--password-stdin", stdin=PASSWORD_2 + "\n")
    users = here.json("user", "list")
    assert [(u["name"], u["enabled"]) for u in users] == [("alice", True), ("bob", False)]
    assert "no user named 'nobody'" in here.fails("user", "show", "nobody")
    assert "alice" in here("user", "show", "alice").stdout

    # Client networks and keys.
    assert "no client network 10.0.0.0/8" in here.fails(
        "key", "add", "k-net", "--network", "10.0.0.0/8", "--secret-stdin", stdin=NET_KEY
    )
    network = here.json("client", "add", "10.0.0.0/8", "--user", "alice", "--allow-anonymous")
    assert (network["users"], network["allow_anonymous"]) == (["alice"], True)
    assert "host bits set" in here.fails("client", "add", "10.0.0.1/8")
    here("key", "add", "k-net", "--network", "10.0.0.0/8", "--secret-stdin", stdin=NET_KEY)
    generated = cli.json("key", "generate", "k-gen")
    assert generated["scope"] == "global"
    assert len(generated["secret"]) >= 40
    shown_once = here("key", "add", "k-glob", "--generate").stdout
    glob_secret = shown_once.split("shared_key): ")[1].strip()
    keys = here.json("key", "list")
    assert [(k["name"], k["scope"]) for k in keys] == [
        ("k-gen", "global"),
        ("k-glob", "global"),
        ("k-net", "10.0.0.0/8"),
    ]
    assert all("secret" not in k for k in keys)
    assert here.json("key", "show", "k-net")["network"] == "10.0.0.0/8"
    table = here("client", "list").stdout
    assert table.splitlines()[0].split() == ["network", "keys", "users", "anonymous", "created"]
    assert "k-net" in table
    assert here.json("client", "show", "10.0.0.0/8")["keys"] == ["k-net"]
    here("user", "allow", "bob", "10.0.0.0/8")
    assert here.json("user", "deny", "alice", "10.0.0.0/8")["users"] == ["bob"]

    rotated = cli.json("key", "rotate-master")
    assert (rotated["resealed"], rotated["resumed"]) == (5, False)
    key_file = tmp_path / "state" / "auth" / "secret.key"
    assert key_file.stat().st_mode & 0o777 == 0o600

    # What the service sees now, without a restart.
    with credentials(db_url, key_file) as store:
        assert store.password_of("alice") == PASSWORD_2.encode()
        assert store.password_of("bob") is None  # disabled
        policy = store.resolve_source("10.20.30.40")
        assert policy.shared_keys == (NET_KEY.encode(),)
        assert policy.allowed_users == frozenset({"bob"})
        assert policy.allow_anonymous
        anonymous = store.resolve_source("192.0.2.1")
        assert set(anonymous.shared_keys) == {generated["secret"].encode(), glob_secret.encode()}

    assert "has shared keys k-net" in here.fails("client", "delete", "10.0.0.0/8")
    here("client", "delete", "10.0.0.0/8", "--with-keys")
    here("user", "delete", "bob")
    audit = cli.json("audit", "list")
    actions = [entry["action"] for entry in reversed(audit)]
    assert actions[:3] == ["user.add", "user.add", "user.disable"]
    assert actions[-3:] == ["key.rotate-master", "client.delete", "user.delete"]
    assert {entry["actor"] for entry in audit} == {audit[0]["actor"]}
    assert audit[0]["actor"].startswith("cli:")

    # The schema commands.
    assert here.json("db", "current")["up_to_date"] is True
    assert "--yes" in here.fails("db", "downgrade", "base")
    assert "downgraded from" in here("db", "downgrade", "base", "--yes").stdout
    assert here("db", "current", "--check", ok=False).returncode == 1
    here("db", "upgrade")
    assert "up to date" in here("db", "current").stdout

    # Secrets: never in argv, never in any output but the generated keys' one showing.
    everything = "\n".join(cli.outputs)
    argv = " ".join(" ".join(a) for a in cli.argvs)
    for secret in [PASSWORD_1, PASSWORD_2, PASSWORD_BOB, NET_KEY]:
        assert secret not in everything
        assert secret not in argv
    assert everything.count(generated["secret"]) == 1
    assert everything.count(glob_secret) == 1


def test_secrets_cannot_be_given_in_argv(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n', encoding="utf-8")
    cli = Cli(config, tmp_path)
    for args in (
        ["user", "add", "alice", "--password", "pw"],
        ["user", "passwd", "alice", "--password=pw"],
        ["key", "add", "k", "--secret", "pw"],
    ):
        result = cli(*args, ok=False)
        assert result.returncode == 2
        assert "unrecognized arguments" in result.stderr
    # No state directory yet: an admin command creates none.
    refused = cli("key", "add", "k", "--secret-stdin", stdin="shared\n", ok=False)
    assert refused.returncode == 1
    assert f"no state in {tmp_path / 'state'}" in refused.stderr
    assert not (tmp_path / "state").exists()
    # The embedded default: SQLite and the key file under the state directory.
    (tmp_path / "state").mkdir()
    cli("key", "add", "k", "--secret-stdin", stdin="shared\n")
    assert (tmp_path / "state" / "auth" / "auth.db").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "state" / "auth" / "secret.key").stat().st_mode & 0o777 == 0o600


def test_prompted_passwords_are_asked_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n', encoding="utf-8")
    answers = iter(["typed-pw", "typed-pw", "typed-pw", "typo-pw"])
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr(getpass, "getpass", fake_getpass)
    (tmp_path / "state").mkdir()
    assert main(["user", "add", "carol", "--config", str(config)]) == 0
    assert prompts == ["password for carol: ", "again: "]
    assert main(["user", "passwd", "carol", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    assert "differ" in captured.err
    assert "typed-pw" not in captured.out + captured.err
    key_file = tmp_path / "state" / "auth" / "secret.key"
    with credentials(f"sqlite:///{tmp_path / 'state' / 'auth' / 'auth.db'}", key_file) as s:
        assert s.password_of("carol") == b"typed-pw"


def test_auth_section_of_the_config() -> None:
    config = parse_config(
        'state_dir = "/srv/a"\n[auth]\ndatabase_url = "postgresql+psycopg://u:p@db/auth"\n'
        'secret_key_file = "/etc/appliance/secret.key"\n'
    )
    assert config.auth_database_url == "postgresql+psycopg://u:p@db/auth"
    assert config.auth_secret_key_file == Path("/etc/appliance/secret.key")
    default = parse_config('state_dir = "/srv/a"\n')
    assert default.auth_database_url == "sqlite:////srv/a/auth/auth.db"
    assert default.auth_secret_key_file == Path("/srv/a/auth/secret.key")
    with pytest.raises(ConfigError, match=r"f\.toml:3: auth\.database_url: must be") as raised:
        parse_config('\n[auth]\ndatabase_url = "mysql://u:hunter2@db/x"\n', "f.toml")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config("[auth]\nurl = 'x'\n")
