"""``appliance tail`` without a WebSocket listener: the admin listener's ``/tail``.

The services run as ``appliance serve`` subprocesses with one forward
listener; events go in with a TLS forward client and must come out of
``appliance tail`` (a subprocess too, its config the service's). The token
rules are ``appliance status``'s: the configured ``token_file`` or
``$APPLIANCE_ADMIN_TOKEN``, never in clear off loopback, never along a
redirect.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from appliance.cli import main
from appliance.commands.tail import stream_admin_tail, tail_url
from appliance.config import AdminConfig, Config, ForwardListenerConfig, WebSocketListenerConfig
from tests.appliance.commands.support import redirecting_server
from tests.support.cli import run_cli, start_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

TOKEN = "0123456789abcdef0123456789abcdef"
#: Seconds the test keeps sending events for the tail to print (it subscribes
#: at some moment in between; events committed before are not its).
SEND_FOR_SECONDS = 60.0


def forward(app: ApplianceProcess, tag: str, chunk: str, events: int) -> object:
    """One PackedForward chunk of ``tag`` over TLS; the server's ack."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    entries = b"".join(
        msgpack.packb([int(time.time()), {"chunk": chunk, "i": i}]) for i in range(events)
    )
    request = msgpack.packb([tag, entries, {"chunk": chunk, "size": events}])
    with (
        socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(request)
        unpacker = msgpack.Unpacker(raw=False)
        while data := tls.recv(65536):
            unpacker.feed(data)
            for message in unpacker:
                return message
    return None


def start(tmp_path: Path, admin: str = "") -> ApplianceProcess:
    bind = f'bind = "127.0.0.1:{free_port()}"'
    return start_appliance(tmp_path, {"forward": ""}, extra=f"[admin]\n{bind}\n{admin}\n")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ApplianceProcess]:
    app = start(tmp_path)
    yield app
    assert app.stop() == 0


def tail_while_sending(
    app: ApplianceProcess, config: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``appliance tail ARGS`` while chunks of ``tail.test`` (and ``other``) go in; and how many."""
    tail = start_cli("tail", *args, config=config, env=env)
    sent = 0
    deadline = time.monotonic() + SEND_FOR_SECONDS
    while tail.process.poll() is None and time.monotonic() < deadline:
        assert forward(app, "other", f"o{sent}", 1) == {"ack": f"o{sent}"}
        assert forward(app, "tail.test", f"c{sent}", 2) == {"ack": f"c{sent}"}
        sent += 1
        time.sleep(0.1)
    return tail.finish(timeout=30), sent


def test_tail_reads_the_admin_listener_of_a_service_without_websocket(
    service: ApplianceProcess, tmp_path: Path
) -> None:
    config = tmp_path / "appliance0.toml"
    done, sent = tail_while_sending(service, config, "--tag", "tail.", "--json", "--count", "6")
    assert done.returncode == 0, done.stderr
    documents = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(documents) == 6
    assert {d["tag"] for d in documents} == {"tail.test"}
    assert {d["protocol"] for d in documents} == {"forward"}
    assert {d["record"]["chunk"] for d in documents} <= {f"c{i}" for i in range(sent)}
    # Whole chunks, in commit order: the two events of a chunk come together.
    assert [d["record"]["i"] for d in documents] == [0, 1] * 3


def test_tail_takes_the_admin_token_as_status_does(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    app = start(tmp_path, f'token_file = "{token_file}"')
    try:
        config = tmp_path / "appliance0.toml"
        wrong = {"APPLIANCE_ADMIN_TOKEN": "X" * 32}
        refused = run_cli("tail", "--count", "1", config=config, env=wrong)
        assert refused.returncode == 1
        assert "refused (401)" in refused.stderr
        # The configured token_file, which this user may read; the terminal's lines.
        done, _ = tail_while_sending(app, config, "--tag", "tail.", "--count", "2")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 2
        assert all(" forward tail.test " in line for line in lines), lines
        assert TOKEN not in done.stdout + done.stderr
    finally:
        assert app.stop() == 0
    assert TOKEN not in app.log()


# -- which tail, and where the token may go ----------------------------------------------------


def test_the_tail_is_the_websocket_listener_s_else_the_admin_listener_s(tmp_path: Path) -> None:
    plain = Config(
        state_dir=tmp_path,
        listeners=[ForwardListenerConfig(bind="127.0.0.1:24224")],
        admin=AdminConfig(bind="127.0.0.1:9881"),
    )
    assert tail_url(None, plain, admin=False) == "http://127.0.0.1:9881/tail"
    websocket = Config(
        state_dir=tmp_path,
        listeners=[WebSocketListenerConfig(bind="127.0.0.1:8443")],
        admin=AdminConfig(bind="127.0.0.1:9881", tls=True),
    )
    assert tail_url(None, websocket, admin=False) == "wss://127.0.0.1:8443/tail"
    assert tail_url(None, websocket, admin=True) == "https://127.0.0.1:9881/tail"
    assert tail_url("http://h:1/tail", websocket, admin=True) == "http://h:1/tail"
    with pytest.raises(ValueError, match="its --url is http"):
        tail_url("wss://h:1/tail", websocket, admin=True)
    with pytest.raises(ValueError, match="must be http"):
        tail_url("ftp://h:1/tail", websocket, admin=False)
    off = Config(state_dir=tmp_path, admin=AdminConfig(enabled=False))
    with pytest.raises(ValueError, match="admin listener is off"):
        tail_url(None, off, admin=False)


def test_the_admin_token_is_not_sent_in_clear_off_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n')
    monkeypatch.setenv("APPLIANCE_ADMIN_TOKEN", TOKEN)
    code = main(["tail", "--config", str(config), "--url", "http://192.0.2.1:9880/tail"])
    assert code == 2
    assert "not sending the admin token in clear" in capsys.readouterr().err


def test_a_redirect_is_not_followed_with_the_token() -> None:
    """The tail URL answers 302 to another server: that server never sees the token."""
    errors: list[str] = []
    with redirecting_server("/tail") as (url, seen):
        code = stream_admin_tail(f"{url}/tail", TOKEN, None, out=lambda _: None, err=errors.append)
    assert code == 1
    assert seen == []
    assert "redirect (302), which is not followed" in errors[0]
