"""A listener behind a load balancer: trusted proxies, the PROXY header, the client's address.

Real loopback sockets, plaintext (the header comes before TLS, which HAProxy
passes through; tests/interop/test_haproxy_appliances.py runs the real thing).
The listener's peer here is 127.0.0.1; the headers name documentation
addresses (RFC 5737) as the clients.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from appliance.config import ForwardListenerConfig
from appliance.protocols.proxy import Endpoint, encode_v1, encode_v2
from appliance.server.listener import ConnectionInfo, TcpService
from appliance.server.proxied import ProxySettings

pytestmark = pytest.mark.trio

LOOPBACK = ProxySettings((ipaddress.ip_network("127.0.0.0/8"),), header_timeout_seconds=0.5)
ELSEWHERE = ProxySettings((ipaddress.ip_network("10.0.0.0/8"),), header_timeout_seconds=0.5)
BALANCER = Endpoint(ipaddress.ip_address("127.0.0.1"), 443)


def client(address: str, port: int = 40000) -> Endpoint:
    return Endpoint(ipaddress.ip_address(address), port)


@dataclass
class Served:
    port: int
    service: TcpService
    seen: list[ConnectionInfo] = field(default_factory=list)
    first_bytes: list[bytes] = field(default_factory=list)

    async def connect(self, header: bytes, then: bytes = b"") -> trio.SocketStream:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        await stream.send_all(header + then)
        return stream


@asynccontextmanager
async def listening(proxy: ProxySettings, **settings: int) -> AsyncIterator[Served]:
    """A plaintext TcpService with ``proxy``; its handler records who it served and echoes."""
    served: Served

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        served.seen.append(info)
        data = await stream.receive_some(100)
        served.first_bytes.append(data)
        await stream.send_all(b"served " + info.peer.encode())
        with trio.move_on_after(10):
            await stream.receive_some(1)  # held until the client closes

    service = TcpService("t", handler, ssl_context=None, tls_handshake_timeout=2,
                         max_connections=10, proxy=proxy, **settings)  # fmt: skip
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
            served = Served(sockets[0].socket.getsockname()[1], service)
            nursery.start_soon(service.serve, sockets, nursery)
            yield served
            nursery.cancel_scope.cancel()


async def answer(stream: trio.SocketStream) -> bytes:
    """What the service sends before it closes (or within 5 s)."""
    received = b""
    with trio.move_on_after(5):
        try:
            while chunk := await stream.receive_some(1000):
                received += chunk
                if received.startswith(b"served "):
                    break
        except trio.BrokenResourceError:
            pass  # closed with our bytes unread: a reset
    return received


@pytest.fixture(autouse=True)
def _info_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, str]]:
    return [r.fields for r in caplog.records if r.getMessage() == name]  # type: ignore[attr-defined]


@pytest.mark.parametrize("encode", [encode_v1, encode_v2], ids=["v1", "v2"])
async def test_the_connection_is_the_client_named_in_the_header(
    encode, caplog: pytest.LogCaptureFixture
) -> None:
    async with listening(LOOPBACK) as served:
        stream = await served.connect(encode(client("203.0.113.7"), BALANCER), b"hello")
        assert await answer(stream) == b"served 203.0.113.7:40000"
        await stream.aclose()
    (info,) = served.seen
    assert (info.address, info.port) == ("203.0.113.7", 40000)
    assert served.first_bytes == [b"hello"]  # not a byte of the header, not one lost
    (proxied,) = events(caplog, "connection.proxied")
    assert proxied["peer"] == "203.0.113.7:40000"
    assert proxied["via"].startswith("127.0.0.1:")


async def test_an_ipv6_client_keeps_its_address(caplog: pytest.LogCaptureFixture) -> None:
    async with listening(LOOPBACK) as served:
        header = encode_v2(client("2001:db8::5", 7), Endpoint(ipaddress.ip_address("::1"), 1))
        stream = await served.connect(header, b"x")
        assert await answer(stream) == b"served [2001:db8::5]:7"
        await stream.aclose()


async def test_a_connection_from_outside_the_trusted_proxies_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with listening(ELSEWHERE) as served:
        stream = await served.connect(encode_v2(client("203.0.113.7"), BALANCER), b"x")
        assert await answer(stream) == b""
    assert served.seen == []
    (refused,) = events(caplog, "connection.refused")
    assert "not a trusted proxy" in refused["reason"]
    assert served.service.active == 0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "not a PROXY"),
        (b"\x16\x03\x01\x02\x00", "TLS"),  # a client that bypassed the balancer
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "LF"),
    ],
    ids=["http", "tls", "bare-lf"],
)
async def test_a_connection_without_a_valid_header_is_refused(
    data: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with listening(LOOPBACK) as served:
        stream = await served.connect(data)
        assert await answer(stream) == b""
    assert served.seen == []
    (refused,) = events(caplog, "proxy.refused")
    assert reason.lower() in refused["reason"].lower(), refused
    assert served.service.active == 0


async def test_a_header_that_does_not_finish_in_time_is_cut_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with listening(LOOPBACK) as served:
        stream = await served.connect(encode_v2(client("203.0.113.7"), BALANCER)[:20])
        assert await answer(stream) == b""
    assert served.seen == []
    (incomplete,) = events(caplog, "proxy.incomplete")
    assert "within 0.5s" in incomplete["reason"]


async def test_the_per_address_limit_counts_clients_not_the_balancer() -> None:
    async with listening(LOOPBACK, max_connections_per_address=1) as served:
        first = await served.connect(encode_v2(client("203.0.113.7"), BALANCER), b"a")
        assert await answer(first) == b"served 203.0.113.7:40000"
        other = await served.connect(encode_v2(client("198.51.100.2"), BALANCER), b"b")
        assert await answer(other) == b"served 198.51.100.2:40000"  # same balancer, new client
        again = await served.connect(encode_v2(client("203.0.113.7", 40001), BALANCER), b"c")
        assert await answer(again) == b""  # that client holds its one connection
        await first.aclose()
        await other.aclose()
    assert [i.address for i in served.seen] == ["203.0.113.7", "198.51.100.2"]


async def test_a_health_check_is_no_connection(caplog: pytest.LogCaptureFixture) -> None:
    """HAProxy's check with send-proxy-v2: a LOCAL header, then the balancer closes."""
    async with listening(LOOPBACK) as served:
        stream = await served.connect(encode_v2(None, None))
        await stream.aclose()
        relayed = await served.connect(encode_v2(None, None), b"direct")
        assert (await answer(relayed)).startswith(b"served 127.0.0.1:")  # its own address
        await relayed.aclose()
        with trio.fail_after(5):
            while served.service.active:
                await trio.sleep(0.05)
    assert len(served.seen) == 1
    assert events(caplog, "connection.failed") == []


async def test_config_keys_give_the_settings() -> None:
    listener = ForwardListenerConfig(
        proxy_protocol=True, trusted_proxies=["10.0.0.0/8", "fd00::/8"],
        proxy_header_timeout_seconds=3.0,
    )  # fmt: skip
    settings = ProxySettings.of(listener)
    assert settings is not None
    assert settings.trusts("10.1.2.3")
    assert settings.trusts("::ffff:10.1.2.3")  # a dual-stack socket's IPv4 peer
    assert settings.trusts("fd00::1")
    assert not settings.trusts("11.0.0.1")
    assert not settings.trusts("unknown")
    assert settings.header_timeout_seconds == 3.0
    assert ProxySettings.of(ForwardListenerConfig()) is None
