"""One writer per identity: a state directory and an app id each have one live process.

Real ``appliance serve`` processes, real TLS, a real Delta table on disk.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from pathlib import Path

import msgpack
from deltalake import DeltaTable

from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.service import ANY_ADMIN_PORT, ApplianceProcess, start_appliance


def send_chunk(app: ApplianceProcess, port: int, chunk: str, events: int = 100) -> object:
    """One PackedForward chunk over TLS; returns the server's answer (the ack)."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    entries = b"".join(
        msgpack.packb([int(time.time()), {"chunk": chunk, "i": i}]) for i in range(events)
    )
    request = msgpack.packb(["one.writer", entries, {"chunk": chunk, "size": events}])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(request)
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = tls.recv(65536)
            if not data:
                return None
            unpacker.feed(data)
            for message in unpacker:
                return message


def test_a_second_serve_on_one_state_directory_exits_naming_the_first(tmp_path: Path) -> None:
    first = start_appliance(tmp_path, {"forward": ""})
    try:
        second_config = tmp_path / "second.toml"
        second_config.write_text(
            f'state_dir = "{first.state_dir}"\nworkers = 1\n{ANY_ADMIN_PORT}[[listeners]]\n'
            'name = "forward"\nbind = "127.0.0.1:0"\n'
        )
        second = run_cli("serve", config=second_config)
        assert second.returncode == 1
        message = (
            f"state directory {first.state_dir} is in use by process {first.process.pid} "
            f"(lock {first.state_dir / 'appliance.lock'}); one appliance per state directory: "
            "stop it, or give this one its own state_dir"
        )
        # The whole stderr: the structured line and the one-line message, no traceback.
        lines = second.stderr.strip().splitlines()
        assert "Traceback" not in second.stderr
        assert lines[-1] == f"appliance: {message}"
        assert lines[-2].endswith(f'event=service.failed reason="{message}"'), lines
        # The first keeps its pid file and every ack it sends is true.
        pid_file = first.state_dir / "appliance.pid"
        assert pid_file.read_text().strip() == str(first.process.pid)
        for i in range(5):
            assert send_chunk(first, first.ports["forward"], f"c{i}") == {"ack": f"c{i}"}
        assert len(first.rows()) == 500
    finally:
        assert first.stop() == 0
    assert not (first.state_dir / "appliance.pid").exists()


def test_two_state_directories_with_one_node_id_on_one_table_refuse_the_second(
    tmp_path: Path,
) -> None:
    """A cloned machine keeps its image's node id: the clone must not start."""
    table = tmp_path / "shared-events"
    extra = 'node_id = "cloned-node"\n'
    lake = f'path = "{table}"\n'
    first = start_appliance(tmp_path, {"forward": ""}, extra=extra, lake=lake)
    try:
        assert send_chunk(first, first.ports["forward"], "before") == {"ack": "before"}
        config = tmp_path / "clone.toml"
        config.write_text(
            f'state_dir = "{tmp_path / "clone-state"}"\nworkers = 1\n'
            f"{extra}{ANY_ADMIN_PORT}[lake]\n{lake}"
            '[[listeners]]\nname = "forward"\nbind = "127.0.0.1:0"\n'
        )
        clone = run_cli("serve", config=config)
        assert clone.returncode == 1
        assert "app id 'cloned-node' is in use" in clone.stderr
        assert "node_id" in clone.stderr
        assert send_chunk(first, first.ports["forward"], "after") == {"ack": "after"}
    finally:
        assert first.stop() == 0
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert sorted({r["batch_id"] for r in rows}) == ["after", "before"]
    assert len(rows) == 200


def test_a_restart_of_the_same_state_directory_reclaims_its_app_id_at_once(
    tmp_path: Path,
) -> None:
    """SIGKILL leaves a fresh lease; the same node takes it back without waiting for it."""
    first = start_appliance(tmp_path, {"forward": ""})
    assert send_chunk(first, first.ports["forward"], "one") == {"ack": "one"}
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait()
    again = start_appliance(tmp_path, {"forward": ""}, index=0)
    try:
        assert send_chunk(again, again.ports["forward"], "two") == {"ack": "two"}
        assert send_chunk(again, again.ports["forward"], "one") == {"ack": "one"}  # a resend
    finally:
        assert again.stop() == 0
    assert sorted(r["batch_id"] for r in again.rows()) == ["one"] * 100 + ["two"] * 100


def _first_message(app: ApplianceProcess, port: int) -> object:
    context = ssl.create_default_context(cafile=str(app.ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(tls.recv(65536))
        return next(unpacker)


def test_sighup_applies_listener_changes_and_names_what_needs_a_restart(tmp_path: Path) -> None:
    from appliance.reload_status import read_status

    app = start_appliance(tmp_path, {"forward": ""})
    try:
        config = tmp_path / "appliance0.toml"
        assert read_status(app.state_dir).generation == 0  # type: ignore[union-attr]
        beats_port = free_port()
        text = config.read_text()
        text = text.replace("commit_max_delay_seconds = 0.1", "commit_max_delay_seconds = 0.2")
        text = text.replace('name = "forward"', 'name = "forward"\nsecurity = "users"')
        text += '[[listeners]]\nname = "beats"\nprotocol = "lumberjack"\n'
        text += f'bind = "127.0.0.1:{beats_port}"\n'
        config.write_text(text)
        app.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        status = read_status(app.state_dir)
        while (status is None or status.generation < 1) and time.monotonic() < deadline:
            time.sleep(0.05)
            status = read_status(app.state_dir)
        assert status is not None
        assert (status.generation, status.ok) == (1, True), status
        assert "listeners" in status.applied
        assert status.restart_required == ["lake.commit_max_delay_seconds"]
        assert "event=config.changed" in app.log()
        assert "lake.commit_max_delay_seconds" in app.log()
        # The forward listener now opens with the handshake: its HELO comes first.
        helo = _first_message(app, app.ports["forward"])
        assert isinstance(helo, list)
        assert helo[0] == "HELO"
        # The new listener accepts TLS connections.
        context = ssl.create_default_context(cafile=str(app.ca_file))
        with (
            socket.create_connection(("127.0.0.1", beats_port), timeout=30) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.version() is not None
        assert "event=listener.started listener=beats" in app.log()
    finally:
        assert app.stop() == 0


def test_a_reload_with_a_broken_config_changes_nothing_and_says_so(tmp_path: Path) -> None:
    from appliance.reload_status import read_status

    app = start_appliance(tmp_path, {"forward": ""})
    try:
        config = tmp_path / "appliance0.toml"
        config.write_text(config.read_text() + '\n[[listeners]]\nbind = "nowhere"\n')
        app.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        status = read_status(app.state_dir)
        while (status is None or status.generation < 1) and time.monotonic() < deadline:
            time.sleep(0.05)
            status = read_status(app.state_dir)
        assert status is not None
        assert not status.ok
        assert "must be host:port" in (status.error or "")
        assert "event=config.reload_failed" in app.log()
        assert send_chunk(app, app.ports["forward"], "still") == {"ack": "still"}
    finally:
        assert app.stop() == 0
