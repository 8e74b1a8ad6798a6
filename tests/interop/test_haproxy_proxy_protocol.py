"""A real HAProxy in TCP mode sends the PROXY protocol; our reader names the real client.

No appliance here: each test runs a tiny trio TCP server of its own behind
HAProxy (tests/interop/haproxy.py, Debian's package). The server reads the
header with :class:`appliance.protocols.proxy.ProxyHeaderReader`, then
answers the client with the source, destination and version it parsed; the
client checks they are its own address and source port (127.0.0.1 and the
port its socket was given) and HAProxy's frontend. This proves the codec
against HAProxy's ``send-proxy`` (v1), ``send-proxy-v2`` and
``proxy-v2-options crc32c`` (the checksum verified), with health checks
(v2 ``LOCAL``), with reads sized by ``safe_read_size`` (nothing read past the
header) and greedy reads (the header's ``trailing`` bytes carried on), and
with TLS passed through: the header arrives before the ClientHello, and the
client's TLS session ends at the backend, whose certificate it verified.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trustme

from appliance.protocols.proxy import Command, ProxyHeader, ProxyHeaderReader
from tests.interop.haproxy import Balancer, SendProxy, ensure_haproxy, start_haproxy

pytestmark = pytest.mark.interop

#: Seconds one test may take, HAProxy's start included.
TEST_TIMEOUT_SECONDS = 60
#: A greedy server's read size: more than any header, so the client's bytes may come along.
GREEDY_READ_BYTES = 65536
SERVER_NAME = "backend.test"


@pytest.fixture(scope="module", autouse=True)
def haproxy_installed() -> str:
    return ensure_haproxy()


class Replay(trio.abc.Stream):
    """``inner``, with ``first`` handed out before anything read from it."""

    def __init__(self, inner: trio.abc.Stream, first: bytes) -> None:
        self._inner = inner
        self._first = first

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._first:
            n = len(self._first) if max_bytes is None else max_bytes
            out, self._first = self._first[:n], self._first[n:]
            return out
        return await self._inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Backend:
    """What one toy backend saw."""

    greedy: bool = False
    tls: ssl.SSLContext | None = None
    headers: list[ProxyHeader] = field(default_factory=list)
    #: The first byte on the socket after the header (TLS: must be a handshake record).
    after_header: list[bytes] = field(default_factory=list)

    async def handle(self, stream: trio.SocketStream) -> None:
        reader = ProxyHeaderReader()
        header = None
        while header is None:
            size = GREEDY_READ_BYTES if self.greedy else reader.safe_read_size()
            data = await stream.receive_some(size)
            if not data:
                return
            header = reader.receive(data)
        self.headers.append(header)
        if header.command is Command.LOCAL:
            await stream.aclose()  # a health check: nothing follows
            return
        if not self.greedy:
            assert header.trailing == b""
        io: trio.abc.Stream = stream
        pending = header.trailing
        if self.tls is not None:
            first = pending[:1] or await stream.socket.recv(1, socket.MSG_PEEK)
            self.after_header.append(first)
            # What a greedy read took past the header is the start of TLS: replay it.
            transport: trio.abc.Stream = Replay(stream, pending) if pending else stream
            io = trio.SSLStream(transport, self.tls, server_side=True)
            pending = b""
        line = pending
        while not line.endswith(b"\n"):
            chunk = await io.receive_some(1024)
            if not chunk:
                return
            line += chunk
        answer = f"{header.source} {header.destination} v{header.version} {line.decode().strip()}\n"
        await io.send_all(answer.encode())
        await io.aclose()


Client = Callable[[int, list[Backend]], Awaitable[None]]


def run_behind_haproxy(
    tmp_path: Path,
    backends: list[Backend],
    send_proxy: SendProxy,
    client: Client,
    *,
    check: bool = False,
) -> None:
    """Start ``backends`` on loopback and HAProxy before them; run ``client(port, backends)``."""

    async def main() -> None:
        with trio.fail_after(TEST_TIMEOUT_SECONDS):
            listeners = [await trio.open_tcp_listeners(0, host="127.0.0.1") for _ in backends]
            ports = [ls[0].socket.getsockname()[1] for ls in listeners]
            async with trio.open_nursery() as nursery:
                for backend, ls in zip(backends, listeners, strict=True):
                    nursery.start_soon(trio.serve_listeners, backend.handle, ls)
                balancer = Balancer(ports, send_proxy=send_proxy, check=check)
                proxy = await trio.to_thread.run_sync(start_haproxy, tmp_path, balancer)
                try:
                    await client(proxy.port, backends)
                finally:
                    await trio.to_thread.run_sync(proxy.stop)
                nursery.cancel_scope.cancel()

    trio.run(main)


async def talk(
    port: int, message: str, tls: ssl.SSLContext | None = None, local_address: str | None = None
) -> tuple[int, str]:
    """Connect through HAProxy, send a line, return our source port and the answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local_address)
    own_port = stream.socket.getsockname()[1]
    io: trio.abc.Stream = stream
    if tls is not None:
        io = trio.SSLStream(stream, tls, server_hostname=SERVER_NAME)
    await io.send_all(message.encode() + b"\n")
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = await io.receive_some(1024)
        assert chunk, f"the backend closed without answering (so far {answer!r})"
        answer += chunk
    await io.aclose()
    return own_port, answer.decode().strip()


#: Bytes of HAProxy's v2 header over IPv4: 16 fixed, 12 of addresses (and a
#: 7-byte CRC32c TLV with ``proxy-v2-options crc32c``).
V2_TCP4_BYTES = {"v2": 28, "v2-crc32c": 35}


@pytest.mark.parametrize(
    ("send_proxy", "version", "greedy"),
    [("v2", 2, False), ("v2", 2, True), ("v2-crc32c", 2, False), ("v1", 1, False), ("v1", 1, True)],
)
def test_the_backend_sees_the_real_client(
    tmp_path: Path, send_proxy: SendProxy, version: int, greedy: bool
) -> None:
    async def client(port: int, backends: list[Backend]) -> None:
        for n in range(3):
            own_port, answer = await talk(port, f"hello {n}")
            assert answer == f"127.0.0.1:{own_port} 127.0.0.1:{port} v{version} hello {n}"
        headers = backends[0].headers
        assert len(headers) == 3
        if send_proxy in V2_TCP4_BYTES:
            # With crc32c the checksum TLV was there, and the reader verified it.
            assert {h.header_bytes for h in headers} == {V2_TCP4_BYTES[send_proxy]}

    run_behind_haproxy(tmp_path, [Backend(greedy=greedy)], send_proxy, client)


def test_the_header_names_the_client_not_the_socket_peer(tmp_path: Path) -> None:
    """A client bound to 127.0.0.2: the header says so, while the backend's socket peer
    is HAProxy's 127.0.0.1 (how an appliance test tells the two apart on loopback)."""
    peers: list[str] = []

    class Peered(Backend):
        async def handle(self, stream: trio.SocketStream) -> None:
            peers.append(stream.socket.getpeername()[0])
            await super().handle(stream)

    async def client(port: int, backends: list[Backend]) -> None:
        own_port, answer = await talk(port, "from two", local_address="127.0.0.2")
        assert answer == f"127.0.0.2:{own_port} 127.0.0.1:{port} v2 from two"
        assert peers == ["127.0.0.1"]

    run_behind_haproxy(tmp_path, [Peered()], "v2", client)


def test_round_robin_over_two_backends(tmp_path: Path) -> None:
    async def client(port: int, backends: list[Backend]) -> None:
        for n in range(4):
            own_port, answer = await talk(port, f"hello {n}")
            assert answer == f"127.0.0.1:{own_port} 127.0.0.1:{port} v2 hello {n}"
        assert [len(b.headers) for b in backends] == [2, 2]

    run_behind_haproxy(tmp_path, [Backend(), Backend()], "v2", client)


def test_health_checks_send_local(tmp_path: Path) -> None:
    """With ``check``, HAProxy probes with a v2 LOCAL header: use the connection's address."""

    async def client(port: int, backends: list[Backend]) -> None:
        while not backends[0].headers:
            await trio.sleep(0.05)
        probe = backends[0].headers[0]
        assert probe.command is Command.LOCAL
        assert probe.uses_connection_address
        own_port, answer = await talk(port, "after a check")
        assert answer == f"127.0.0.1:{own_port} 127.0.0.1:{port} v2 after a check"

    run_behind_haproxy(tmp_path, [Backend()], "v2", client, check=True)


@pytest.mark.parametrize("greedy", [False, True])
def test_tls_passes_through_after_the_header(tmp_path: Path, greedy: bool) -> None:
    """HAProxy relays TLS untouched: the header, then the ClientHello; TLS ends at the backend."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(SERVER_NAME).configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    backend = Backend(greedy=greedy, tls=server_context)

    async def client(port: int, backends: list[Backend]) -> None:
        own_port, answer = await talk(port, "over tls", tls=client_context)
        assert answer == f"127.0.0.1:{own_port} 127.0.0.1:{port} v2 over tls"
        # The first byte after the header (read along with it, or peeked) starts a
        # TLS handshake record: the ClientHello, relayed untouched.
        assert backends[0].after_header == [b"\x16"]

    run_behind_haproxy(tmp_path, [backend], "v2", client)
