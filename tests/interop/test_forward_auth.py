"""The forward handshake end to end: the real service, the real CLI, real clients.

Credentials are managed with the ``appliance user|key|client`` commands
against the service's own (SQLite) auth database while it runs. npm
``@fluent-org/logger`` and ``fluent-logger`` log in with shared key, username
and password over TLS; refusals are checked with a small client written from
the spec that reads the PONG reason, and with the npm clients' exit codes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import msgpack
import pytest

from tests.support.cli import run_cli
from tests.support.service import ApplianceProcess

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).parent / "node"
SHARED_KEY = "s3cret-shared-key"


def cli(config: Path, *args: str, stdin: str | None = None) -> str:
    return run_cli(*args, config=config, stdin=stdin, check=True).stdout


LISTENER = 'security = "users"\nself_hostname = "appliance.test"\n'


@pytest.fixture
def secured(
    appliance, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[ApplianceProcess, Path]:
    # Tests that count on many refusals lift the brute-force throttle.
    extra = getattr(request, "param", "")
    app = appliance({"forward": LISTENER + extra})
    config = tmp_path / "appliance0.toml"
    cli(config, "key", "add", "fleet", "--secret-stdin", stdin=SHARED_KEY + "\n")
    cli(config, "user", "add", "alice", "--password-stdin", stdin="alice-password\n")
    return app, config


def sha512_hex(*parts: bytes) -> str:
    digest = hashlib.sha512()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def handshake(
    app: ApplianceProcess,
    *,
    key: str = SHARED_KEY,
    user: str = "alice",
    password: str = "alice-password",
    key_digest: str | None = None,
    password_digest: str | None = None,
) -> list[object]:
    """Log in as the spec says; returns the PONG (then sends one event if accepted)."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    raw = socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=30)
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        unpacker = msgpack.Unpacker(raw=False)

        def read() -> object:
            while True:
                for message in unpacker:
                    return message
                data = tls.recv(65536)
                if not data:
                    return None
                unpacker.feed(data)

        helo = read()
        assert isinstance(helo, list)
        assert helo[0] == "HELO"
        nonce, auth = helo[1]["nonce"], helo[1]["auth"]
        assert isinstance(nonce, bytes)
        assert len(nonce) == 16
        assert isinstance(auth, bytes)
        assert len(auth) in (0, 16)  # empty when the listener checks no users
        salt = os.urandom(16).hex().encode()
        if key_digest is None:
            key_digest = sha512_hex(salt, b"py-client", nonce, key.encode())
        if password_digest is None:
            password_digest = sha512_hex(auth, user.encode(), password.encode())
        tls.sendall(msgpack.packb(["PING", "py-client", salt, key_digest, user, password_digest]))
        pong = read()
        assert isinstance(pong, list)
        if pong[1] is True:
            assert pong[4] == sha512_hex(salt, b"appliance.test", nonce, key.encode())
            entries = msgpack.packb([1700000000, {"via": "py-client"}])
            tls.sendall(msgpack.packb(["auth.test", entries, {"chunk": "py-chunk"}]))
            assert read() == {"ack": "py-chunk"}
        return pong


def node_send(
    app: ApplianceProcess, client: str, password: str, tag: str
) -> subprocess.CompletedProcess[str]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the npm interop clients cannot run")
    return subprocess.run(
        ["node", str(NODE_DIR / "send.mjs"), "--client", client, "--mode", "packed",
         "--host", "127.0.0.1", "--port", str(app.ports["forward"]), "--ca", str(app.ca_file),
         "--tag", tag, "--count", "12", "--batch", "4", "--shared-key", SHARED_KEY,
         "--username", "alice", "--password", password, "--client-hostname", f"{client}.test",
         "--timeout-ms", "30000"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


@pytest.mark.parametrize("client", ["fluent-org", "fluent-logger"])
def test_npm_clients_log_in_and_deliver(secured, client: str) -> None:
    app, _ = secured
    result = node_send(app, client, "alice-password", f"auth.{client}")
    assert result.returncode == 0, result.stderr
    rows = [r for r in app.rows() if r["tag"] == f"auth.{client}"]
    assert sorted(json.loads(r["record"])["seq"] for r in rows) == list(range(12))
    assert {r["source"] for r in rows} == {"alice"}
    assert {r["host"] for r in rows} == {f"{client}.test"}


@pytest.mark.parametrize("client", ["fluent-org", "fluent-logger"])
def test_npm_clients_with_a_wrong_password_are_refused(secured, client: str) -> None:
    app, _ = secured
    result = node_send(app, client, "not-her-password", f"auth.bad.{client}")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert not [r for r in app.rows() if r["tag"] == f"auth.bad.{client}"]
    assert "username/password mismatch" in app.log()


@pytest.mark.parametrize("secured", ["free_failed_handshakes = 100"], indirect=True)
def test_refusals_carry_the_reason_and_write_nothing(secured) -> None:
    app, config = secured
    cli(config, "user", "add", "bob", "--password-stdin", stdin="bob-password\n")
    cli(config, "user", "disable", "bob")
    cases = {
        "wrong password": dict(password="nope"),
        "unknown user": dict(user="mallory", password="x"),
        "disabled user": dict(user="bob", password="bob-password"),
    }
    for name, kwargs in cases.items():
        assert handshake(app, **kwargs) == ["PONG", False, "username/password mismatch", "", ""], (
            name
        )
    assert handshake(app, key="wrong-key") == ["PONG", False, "shared_key mismatch", "", ""]
    assert handshake(app, key_digest="")[2] == "shared_key mismatch"
    assert handshake(app, key_digest="ab" * 10)[2] == "shared_key mismatch"
    assert handshake(app, password_digest="")[2] == "username/password mismatch"
    assert handshake(app, password_digest="cd" * 10)[2] == "username/password mismatch"
    assert app.rows() == []  # the table exists from start-up; nothing was committed


def test_user_added_while_running_logs_in(secured) -> None:
    app, config = secured
    assert handshake(app, user="carol", password="carol-password")[1] is False
    cli(config, "user", "add", "carol", "--password-stdin", stdin="carol-password\n")
    assert handshake(app, user="carol", password="carol-password")[1] is True
    rows = app.rows()
    assert [r["source"] for r in rows] == ["carol"]
    assert [r["host"] for r in rows] == ["py-client"]


def test_source_outside_the_client_networks_is_denied(appliance, tmp_path: Path) -> None:
    app = appliance(
        {"forward": 'security = "shared_key"\nallow_anonymous_source = false\n'
                    'self_hostname = "appliance.test"'}
    )  # fmt: skip
    config = tmp_path / "appliance0.toml"
    cli(config, "key", "add", "fleet", "--secret-stdin", stdin=SHARED_KEY + "\n")
    cli(config, "client", "add", "10.0.0.0/8")
    assert handshake(app) == ["PONG", False, "anonymous source host '127.0.0.1' denied", "", ""]
    cli(config, "client", "add", "127.0.0.0/8", "--key", "fleet")
    assert handshake(app)[1] is True


def test_repeated_failures_are_throttled(secured) -> None:
    app, _ = secured
    reasons = [handshake(app, password="guess")[2] for _ in range(5)]
    assert reasons[:3] == ["username/password mismatch"] * 3
    assert reasons[-1].startswith("too many failed handshakes")
    assert "event=handshake.throttled" in app.log()
