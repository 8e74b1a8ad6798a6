"""WholeRecords: trio-websocket's reads of a TLS stream take every whole record already buffered."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance.server.transports.websocket import WholeRecords
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
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> tuple[trio.abc.Stream, trio.SSLStream[trio.abc.Stream]]:
    server_context_, client_context = contexts
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_context_, server_side=True)
    client = trio.SSLStream(right, client_context, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    wrapped = WholeRecords.wrap(server)
    assert isinstance(wrapped, WholeRecords)
    return wrapped, client


async def _read(stream: trio.abc.Stream, size: int, max_bytes: int) -> tuple[bytes, int]:
    received = bytearray()
    reads = 0
    with trio.fail_after(10):
        while len(received) < size:
            data = await stream.receive_some(max_bytes)
            assert 0 < len(data) <= max_bytes
            received += data
            reads += 1
    return bytes(received), reads


@pytest.mark.trio
async def test_buffered_records_come_in_one_read_in_order_within_max_bytes(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    stream, client = await _pair(contexts)
    payload = bytes(range(256)) * 400  # 102,400 bytes: seven records
    await client.send_all(payload)
    received, reads = await _read(stream, len(payload), 256 * 1024)
    assert received == payload
    # One record per read would take seven; the memory stream hands over
    # what was sent at once, so the buffered records come together.
    assert reads < len(payload) // RECORD_BYTES
    await client.send_all(payload)
    received, reads = await _read(stream, len(payload), RECORD_BYTES + 100)
    assert received == payload


@pytest.mark.trio
async def test_answers_go_out_and_close_notify_is_still_seen(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    stream, client = await _pair(contexts)
    await stream.send_all(b"answer")
    with trio.fail_after(10):
        assert await client.receive_some(100) == b"answer"
    payload = b"y" * (3 * RECORD_BYTES)
    await client.send_all(payload)
    await client.aclose()
    received, _ = await _read(stream, len(payload), 256 * 1024)
    assert received == payload
    with trio.fail_after(10):
        assert await stream.receive_some(256 * 1024) == b""
    await stream.aclose()


def test_a_stream_without_tls_is_not_wrapped() -> None:
    plain, _ = trio.testing.memory_stream_pair()
    assert WholeRecords.wrap(plain) is plain
