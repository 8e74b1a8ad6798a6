"""A listener behind a load balancer: who may relay, and the PROXY header read before anything else.

With ``proxy_protocol = true`` a TCP listener accepts connections only from
its ``trusted_proxies`` networks, and each must start with a PROXY protocol
header (v1 or v2, HAProxy's ``doc/proxy-protocol.txt``; the codec is
:mod:`appliance.protocols.proxy`) that names the real client. The header
is read with sized reads (:meth:`ProxyHeaderReader.safe_read_size`), so the
socket is left at the first byte after it: TLS, passed through by the
balancer, starts there as on a direct connection. The whole header must
arrive within ``proxy_header_timeout_seconds``.

The spec (§5) forbids guessing: on such a listener a connection without a
header is refused, and a listener without ``proxy_protocol`` never reads one.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import trio

from appliance import defaults
from appliance.config import ListenerConfig
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.proxy import ProxyHeader, ProxyHeaderReader

__all__ = ["ProxyFailure", "ProxySettings", "is_health_check", "read_proxy_header"]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(address: str) -> IpAddress | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return ip


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """A listener's PROXY protocol settings: the balancers it trusts, and the header deadline."""

    trusted: tuple[IpNetwork, ...]
    header_timeout_seconds: float = defaults.PROXY_HEADER_TIMEOUT_SECONDS

    @classmethod
    def of(cls, listener: ListenerConfig) -> ProxySettings | None:
        """A listener's settings (CIDRs checked by the config), or None without proxy_protocol."""
        if not listener.proxy_protocol:
            return None
        trusted = tuple(ipaddress.ip_network(c) for c in listener.trusted_proxies)
        return cls(trusted, listener.proxy_header_timeout_seconds)

    def trusts(self, address: str) -> bool:
        """Whether a connection from ``address`` may relay clients (IPv4-mapped normalised)."""
        ip = _ip(address)
        return ip is not None and any(ip.version == n.version and ip in n for n in self.trusted)


@dataclass(frozen=True, slots=True)
class ProxyFailure:
    """Why a connection's header was not read: the log event and its reason."""

    #: ``proxy.refused`` (not a header) or ``proxy.incomplete`` (EOF, deadline).
    event: str
    reason: str


async def read_proxy_header(
    sock: trio.SocketStream, settings: ProxySettings
) -> ProxyHeader | ProxyFailure:
    """The connection's PROXY header, read exactly (nothing after it), or why there is none."""
    reader = ProxyHeaderReader()
    with trio.move_on_after(settings.header_timeout_seconds):
        while True:
            try:
                data = await sock.receive_some(reader.safe_read_size())
            except trio.BrokenResourceError as exc:
                return ProxyFailure("proxy.incomplete", f"connection broken: {exc.__cause__}")
            if not data:
                return ProxyFailure(
                    "proxy.incomplete",
                    f"closed after {reader.buffered_bytes} bytes of a PROXY header",
                )
            try:
                header = reader.receive(data)
            except RemoteProtocolError as exc:
                return ProxyFailure("proxy.refused", exc.reason)
            if header is not None:
                return header
    return ProxyFailure(
        "proxy.incomplete",
        f"no complete PROXY header within {settings.header_timeout_seconds}s "
        f"({reader.buffered_bytes} bytes)",
    )


async def is_health_check(sock: trio.SocketStream, header: ProxyHeader, seconds: float) -> bool:
    """Whether a ``LOCAL`` connection is a balancer's health check: it closes before a byte.

    HAProxy's ``check`` with ``send-proxy-v2`` sends a v2 ``LOCAL`` header and
    closes. Peeks, so a real connection's first byte is still there.
    """
    if not header.uses_connection_address:
        return False
    with trio.move_on_after(seconds):
        try:
            first = await sock.socket.recv(1, socket.MSG_PEEK)
        except OSError:
            return True  # reset right after the header: nothing to serve either
        return first == b""
    return False
