"""The whole service in-process: real TLS, real sockets on loopback, a real Delta table."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
import trio
from deltalake import DeltaTable

from appliance.config import Config, ForwardListenerConfig
from appliance.service import Running, serve
from tests.faults import read_only_dir
from tests.support.service import FAST_LAKE, running, service_config, table_rows


def make_config(tmp_path: Path, **listener: object) -> Config:
    return service_config(tmp_path, ForwardListenerConfig, **listener)


async def tls_client(info: Running, name: str = "forward") -> trio.SSLStream[trio.SocketStream]:
    assert info.ca_file is not None
    context = ssl.create_default_context(cafile=str(info.ca_file))
    sock = await trio.open_tcp_stream("127.0.0.1", info.ports[name])
    stream = trio.SSLStream(sock, context, server_hostname="localhost")
    await stream.do_handshake()
    return stream


def packed(chunk: str, n: int = 3, tag: str = "svc.test") -> bytes:
    now = int(time.time())
    entries = b"".join(
        msgpack.packb([msgpack.ExtType(0, now.to_bytes(4, "big") + i.to_bytes(4, "big")), {"i": i}])
        for i in range(n)
    )
    return msgpack.packb([tag, entries, {"chunk": chunk, "size": n}])


async def read_ack(stream: trio.abc.ReceiveStream, seconds: float = 30) -> object | None:
    unpacker = msgpack.Unpacker()
    with trio.move_on_after(seconds):
        while True:
            try:
                data = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                return None
            if not data:
                return None
            unpacker.feed(data)
            for obj in unpacker:
                return obj
    return None


async def keep_sending(stream: trio.abc.SendStream) -> None:
    for _ in range(50):
        await stream.send_all(b"\x90" * 1024)
        await trio.sleep(0.05)


async def refused(info: Running) -> bool:
    """True when a new connection is closed without serving a request."""
    try:
        extra = await tls_client(info)
        await extra.send_all(packed("extra"))
    except (trio.BrokenResourceError, ssl.SSLError, OSError):
        return True
    return await read_ack(extra, seconds=5) is None


@pytest.mark.trio
async def test_tls_request_is_committed_then_acked(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        stream = await tls_client(info)
        await stream.send_all(packed("chunk-1"))
        assert await read_ack(stream) == {"ack": "chunk-1"}
        # The ack came after the commit: the rows are already readable.
        rows = table_rows(config)
        assert len(rows) == 3
        assert {r["batch_id"] for r in rows} == {"chunk-1"}
        assert {r["protocol"] for r in rows} == {"forward"}
        await stream.aclose()


@pytest.mark.trio
async def test_first_start_creates_ca_and_keys_with_private_modes(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        assert info.ca_file is not None
        assert info.ca_file.exists()
    pki = config.pki_dir
    assert (pki / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (pki / "server.key").stat().st_mode & 0o777 == 0o600
    assert config.state_dir.stat().st_mode & 0o777 == 0o750


@pytest.mark.trio
async def test_unwritable_table_means_no_ack_and_resend_commits_once(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        warm = await tls_client(info)
        await warm.send_all(packed("warm-up"))
        assert await read_ack(warm) == {"ack": "warm-up"}
        log_dir = Path(config.table_uri) / "_delta_log"
        with read_only_dir(log_dir) as fault:
            fault.break_()
            first = await tls_client(info)
            await first.send_all(packed("chunk-during-fault"))
            assert await read_ack(first, seconds=2) is None, "acked while the table was read-only"
            # The client gives up on this connection and resends on a new one,
            # as out_forward does after its ack timeout.
            await first.aclose()
            fault.heal()
        second = await tls_client(info)
        await second.send_all(packed("chunk-during-fault"))
        assert await read_ack(second) == {"ack": "chunk-during-fault"}
        await second.aclose()
        await warm.aclose()
    batches = [r["batch_id"] for r in table_rows(config)]
    assert batches.count("chunk-during-fault") == 3


@pytest.mark.trio
async def test_graceful_stop_commits_and_acks_in_flight(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config = replace(config, lake=replace(FAST_LAKE, commit_max_delay_seconds=2.0))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(
            lambda task_status: serve(config, stop=stop, task_status=task_status)
        )
        stream = await tls_client(info)
        await stream.send_all(packed("at-shutdown"))
        await trio.sleep(0.3)  # read by the server, waiting in an open commit group
        stop.set()
        assert await read_ack(stream) == {"ack": "at-shutdown"}
    assert len(table_rows(config)) == 3


@pytest.mark.trio
async def test_bad_input_closes_only_that_connection(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        good = await tls_client(info)
        bad = await tls_client(info)
        await bad.send_all(b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        assert await read_ack(bad, seconds=10) is None
        with pytest.raises(trio.BrokenResourceError):
            await keep_sending(bad)
        await good.send_all(packed("still-fine"))
        assert await read_ack(good) == {"ack": "still-fine"}
        await good.aclose()


@pytest.mark.trio
async def test_tls_handshake_has_a_deadline(tmp_path: Path) -> None:
    config = make_config(tmp_path, tls_handshake_timeout_seconds=0.5)
    async with running(config) as info:
        sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
        with trio.fail_after(10):
            # Say nothing: the server gives up on the handshake and closes.
            assert await sock.receive_some(100) == b""


@pytest.mark.trio
async def test_plaintext_client_on_tls_listener_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plaintext client is recognised from its first bytes, and the log says the fix."""
    config = make_config(tmp_path)
    async with running(config) as info:
        sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
        await sock.send_all(packed("plain"))
        with trio.fail_after(10):
            data = await sock.receive_some(100)
            while data:
                data = await sock.receive_some(100)
    assert DeltaTable(config.table_uri).to_pyarrow_table().num_rows == 0
    (plaintext,) = [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "tls.plaintext_client"
    ]
    assert "plaintext Fluentd forward client" in plaintext["reason"]
    assert "enable TLS in the client" in plaintext["reason"]


@pytest.mark.trio
async def test_connection_limit_closes_extra_connections(tmp_path: Path) -> None:
    config = make_config(tmp_path, max_connections=1)
    async with running(config) as info:
        first = await tls_client(info)
        assert await refused(info)
        await first.send_all(packed("first"))
        assert await read_ack(first) == {"ack": "first"}
        assert info.services["forward"].refused == 1
        await first.aclose()


@pytest.mark.trio
@pytest.mark.parametrize("question", [b"\x00", b"", b"ping", b"x" * 500])
async def test_udp_heartbeat_answers_any_datagram(tmp_path: Path, question: bytes) -> None:
    """Fluentd's in_forward answers every datagram with one 0x00 byte (heartbeat.py)."""
    config = make_config(tmp_path)
    async with running(config) as info:
        udp = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with udp:
            await udp.sendto(question, ("127.0.0.1", info.ports["forward"]))
            with trio.fail_after(5):
                data, _ = await udp.recvfrom(16)
        assert data == b"\x00"


@pytest.mark.trio
async def test_plaintext_listener_only_when_configured(tmp_path: Path) -> None:
    config = make_config(tmp_path, tls=False)
    async with running(config) as info:
        sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
        await sock.send_all(packed("plain-ok"))
        assert await read_ack(sock) == {"ack": "plain-ok"}
        await sock.aclose()


@pytest.mark.trio
async def test_several_listeners_start_and_stop_together(tmp_path: Path) -> None:
    config = replace(
        make_config(tmp_path),
        listeners=[
            ForwardListenerConfig(name="tls", bind="127.0.0.1:0"),
            ForwardListenerConfig(name="plain", bind="127.0.0.1:0", tls=False),
        ],
    )
    async with running(config) as info:
        assert set(info.ports) == {"tls", "plain"}
        stream = await tls_client(info, "tls")
        await stream.send_all(packed("over-tls"))
        assert await read_ack(stream) == {"ack": "over-tls"}
        plain = await trio.open_tcp_stream("127.0.0.1", info.ports["plain"])
        await plain.send_all(packed("over-plain"))
        assert await read_ack(plain) == {"ack": "over-plain"}
        await stream.aclose()
        await plain.aclose()
