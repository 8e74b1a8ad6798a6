"""ByteStream over TLS: a read takes every whole record already buffered, within ``read_size``."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance.logs import get_logger
from appliance.server.connection import PeerGone
from appliance.server.listener import ConnectionInfo
from appliance.server.transports.stream import ByteStream
from pki.authority import CertificateAuthority, PkiPaths
from pki.tls import server_context

#: Bytes of one TLS record's plaintext at most (RFC 8446, section 5.1).
RECORD_BYTES = 16384


@pytest.fixture
def contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.ensure(["localhost"])
    paths = ca.paths
    client = ssl.create_default_context(cafile=str(paths.ca_cert))
    return server_context(paths.server_cert, paths.server_key), client


async def _pair(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], read_size: int
) -> tuple[ByteStream, trio.SSLStream[trio.abc.Stream]]:
    server_context_, client_context = contexts
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_context_, server_side=True)
    client = trio.SSLStream(right, client_context, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    info = ConnectionInfo("forward", "127.0.0.1", 5000, True)
    transport = ByteStream(server, info, get_logger("test"), read_size=read_size, send_timeout=5)
    return transport, client


@pytest.mark.trio
async def test_buffered_records_come_in_one_read_and_in_order(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    transport, client = await _pair(contexts, read_size=256 * 1024)
    payload = bytes(range(256)) * 400  # 102,400 bytes: seven records
    await client.send_all(payload)
    received = bytearray()
    reads = 0
    with trio.fail_after(10):
        while len(received) < len(payload):
            received += await transport.receive()
            reads += 1
    assert bytes(received) == payload
    # One record per read would take seven; the memory stream hands over
    # what was sent at once, so the buffered records come together.
    assert reads < len(payload) // RECORD_BYTES


@pytest.mark.trio
async def test_a_read_never_exceeds_read_size(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    read_size = RECORD_BYTES + 100
    transport, client = await _pair(contexts, read_size=read_size)
    payload = b"x" * (5 * RECORD_BYTES)
    await client.send_all(payload)
    received = bytearray()
    with trio.fail_after(10):
        while len(received) < len(payload):
            data = await transport.receive()
            assert len(data) <= read_size
            received += data
    assert bytes(received) == payload


@pytest.mark.trio
async def test_close_notify_after_buffered_records_is_still_seen(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    transport, client = await _pair(contexts, read_size=256 * 1024)
    payload = b"y" * (3 * RECORD_BYTES)
    await client.send_all(payload)
    await client.aclose()
    received = bytearray()
    with trio.fail_after(10):
        while len(received) < len(payload):
            received += await transport.receive()
        with pytest.raises(PeerGone):
            await transport.receive()
    assert bytes(received) == payload
