"""Reloads never take a listener down: a busy port, a restore, a limit-only change.

In-process service with its admin listener, a real TLS forward client and
the configuration file a reload re-reads. After each step the old listener
still acks, ``/readyz`` answers 200, and what the service reports (its
reload status, the ports it lists) is what is really listening.
"""

from __future__ import annotations

import errno
import json
import socket
from pathlib import Path

import pytest
import trio

from appliance.config import load_config
from appliance.reload_status import read_status
from appliance.service import Running
from tests.appliance.test_metrics import http_get, in_thread
from tests.appliance.test_service import packed, read_ack, tls_client
from tests.support.ports import free_port
from tests.support.service import running


def config_text(tmp_path: Path, bind: str, max_connections: int = 100) -> str:
    return (
        f'state_dir = "{tmp_path / "state"}"\nshutdown_timeout_seconds = 20\n'
        '[lake]\nack = "commit"\ncommit_max_delay_seconds = 0.05\n'
        '[admin]\nbind = "127.0.0.1:0"\n'
        f'[[listeners]]\nname = "forward"\nbind = "{bind}"\nmax_connections = {max_connections}\n'
    )


async def acked(info: Running, chunk: str) -> bool:
    stream = await tls_client(info)
    async with stream:
        await stream.send_all(packed(chunk))
        return await read_ack(stream) == {"ack": chunk}


async def ready(info: Running) -> tuple[int, dict[str, object]]:
    assert info.admin_port is not None
    status, body = await in_thread(http_get, info.admin_port, "/readyz")
    return status, json.loads(body)


@pytest.mark.trio
async def test_a_failed_reload_keeps_the_listener_and_a_later_one_repairs_nothing_lost(
    tmp_path: Path,
) -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    first = port.getsockname()[1]
    port.close()
    file = tmp_path / "appliance.toml"
    file.write_text(config_text(tmp_path, f"127.0.0.1:{first}"))
    busy = socket.socket()  # another process's port
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    try:
        async with running(load_config(file)) as info:
            assert info.reload is not None
            assert await acked(info, "before")

            # 1. Move the listener to a port another process holds.
            file.write_text(config_text(tmp_path, f"127.0.0.1:{taken}"))
            status = await info.reload("SIGHUP")
            assert not status.ok
            assert f"cannot bind 127.0.0.1:{taken}" in (status.error or "")
            assert info.ports["forward"] == first  # still the old port
            assert await acked(info, "after-busy")
            assert (await ready(info))[0] == 200
            written = read_status(tmp_path / "state")
            assert written is not None
            assert not written.ok

            # 2. Restore the file: nothing to change, everything still serves.
            file.write_text(config_text(tmp_path, f"127.0.0.1:{first}"))
            status = await info.reload("SIGHUP")
            assert status.ok, status
            assert info.ports["forward"] == first
            assert await acked(info, "after-restore")
            assert (await ready(info))[0] == 200

            # 3. A change of a limit only: the listener is updated in place.
            file.write_text(config_text(tmp_path, f"127.0.0.1:{first}", max_connections=50))
            status = await info.reload("SIGHUP")
            assert status.ok, status
            assert await acked(info, "after-limit")
            assert (await ready(info))[0] == 200

            # 4. A move to a free port: the new one serves, the old one is gone.
            free = socket.socket()
            free.bind(("127.0.0.1", 0))
            moved = free.getsockname()[1]
            free.close()
            file.write_text(config_text(tmp_path, f"127.0.0.1:{moved}"))
            status = await info.reload("SIGHUP")
            assert status.ok, status
            assert info.ports["forward"] == moved
            assert await acked(info, "after-move")
            assert (await ready(info))[0] == 200
            with pytest.raises(OSError, match="failed"):
                await trio.open_tcp_stream("127.0.0.1", first)
    finally:
        busy.close()


@pytest.mark.trio
async def test_a_listener_that_is_not_open_is_started_by_the_next_reload(tmp_path: Path) -> None:
    file = tmp_path / "appliance.toml"
    file.write_text(config_text(tmp_path, "127.0.0.1:0"))
    async with running(load_config(file)) as info:
        assert info.reload is not None
        # The listener is down (as after a re-open whose fallback failed too).
        info.accepting.pop("forward").cancel()
        info.services.pop("forward")
        info.ports.pop("forward")
        status, body = await ready(info)
        assert status == 503
        assert body["checks"]["listeners"] == {"ok": False, "reason": "not open: forward"}  # type: ignore[index]
        status_after = await info.reload("SIGHUP")  # the file did not change
        assert status_after.ok, status_after
        assert "forward" in info.ports
        assert await acked(info, "repaired")
        assert (await ready(info))[0] == 200


def _tcp_port_whose_udp_port_is_taken() -> tuple[int, socket.socket]:
    """A TCP port that is free while another socket holds the same UDP port."""
    for _ in range(50):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                udp.close()
                continue
        return port, udp
    raise AssertionError("no TCP port free beside a bound UDP port in 50 tries")


@pytest.mark.trio
async def test_a_heartbeat_port_that_is_taken_fails_the_reload_not_the_service(
    tmp_path: Path,
) -> None:
    """The forward listener's UDP heartbeat binds beside its TCP port; when another
    process holds that UDP port, the reload reports it and everything keeps serving."""
    port, udp = _tcp_port_whose_udp_port_is_taken()
    file = tmp_path / "appliance.toml"
    quiet = "udp_heartbeat = false\n"
    try:
        file.write_text(config_text(tmp_path, f"127.0.0.1:{port}") + quiet)
        async with running(load_config(file)) as info:
            assert info.reload is not None
            assert await acked(info, "before")

            # 1. A new listener whose heartbeat cannot bind.
            other, other_udp = _tcp_port_whose_udp_port_is_taken()
            try:
                second = f'[[listeners]]\nname = "second"\nbind = "127.0.0.1:{other}"\n'
                file.write_text(config_text(tmp_path, f"127.0.0.1:{port}") + quiet + second)
                status = await info.reload("SIGHUP")
            finally:
                other_udp.close()
            assert not status.ok
            assert "listener 'second' cannot start beside" in (status.error or ""), status
            assert "second" not in info.ports
            assert await acked(info, "after-new")

            # 2. The same port re-opened with the heartbeat on: the new settings
            # fail, the old ones are opened again.
            file.write_text(config_text(tmp_path, f"127.0.0.1:{port}"))
            status = await info.reload("SIGHUP")
            assert not status.ok
            assert "listener 'forward' cannot start beside" in (status.error or ""), status
            assert info.ports["forward"] == port
            assert await acked(info, "after-reopen")
            assert (await ready(info))[0] == 200
    finally:
        udp.close()


async def acked_plain(info: Running, chunk: str) -> bool:
    stream = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
    async with stream:
        await stream.send_all(packed(chunk))
        return await read_ack(stream) == {"ack": chunk}


@pytest.mark.trio
async def test_a_tls_context_that_cannot_be_built_fails_the_reload_not_the_service(
    tmp_path: Path,
) -> None:
    """Plaintext at start, so no PKI was made; TLS turned on by a reload cannot find its
    files: that listener keeps its old settings and serves, the service stays up."""
    port = free_port()
    file = tmp_path / "appliance.toml"
    tls_on = config_text(tmp_path, f"127.0.0.1:{port}")
    file.write_text(tls_on + "tls = false\n")
    async with running(load_config(file)) as info:
        assert info.reload is not None
        assert await acked_plain(info, "before")
        file.write_text(tls_on)  # the same port: the old closes first, opened again
        status = await info.reload("SIGHUP")
        assert not status.ok
        assert "listener 'forward': cannot build the TLS context" in (status.error or "")
        assert info.ports["forward"] == port
        assert await acked_plain(info, "after")
        assert (await ready(info))[0] == 200


@pytest.mark.trio
async def test_an_auth_database_that_cannot_be_opened_fails_the_reload_not_the_service(
    tmp_path: Path,
) -> None:
    """No listener needed the auth database at start; a reload that turns the forward
    handshake on cannot open it: that listener keeps its settings, the others change."""
    file = tmp_path / "appliance.toml"
    missing = tmp_path / "no" / "such" / "dir" / "auth.db"
    auth = f'[auth]\ndatabase_url = "sqlite:///{missing}"\n'
    text = config_text(tmp_path, "127.0.0.1:0")
    file.write_text(text + auth)
    async with running(load_config(file)) as info:
        assert info.reload is not None
        assert await acked(info, "before")
        port = info.ports["forward"]
        text = text.replace('bind = "127.0.0.1:0"', f'bind = "127.0.0.1:{port}"')
        second = '[[listeners]]\nname = "second"\nbind = "127.0.0.1:0"\n'
        file.write_text(text + 'security = "users"\n' + second + auth)
        status = await info.reload("SIGHUP")
        assert not status.ok
        assert "listener 'forward': the auth database cannot be opened" in (status.error or "")
        assert "second" in info.ports  # the rest of the reload went ahead
        assert await acked(info, "after")  # still without the handshake
        assert (await ready(info))[0] == 200


@pytest.mark.trio
async def test_a_status_that_cannot_be_written_does_not_end_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full state directory at a reload: the reload holds, the service serves on."""
    file = tmp_path / "appliance.toml"
    file.write_text(config_text(tmp_path, "127.0.0.1:0"))
    async with running(load_config(file)) as info:
        assert info.reload is not None

        def full(*_: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("appliance.service.write_status", full)
        status = await info.reload("SIGHUP")
        assert status.ok, status
        assert await acked(info, "after")
