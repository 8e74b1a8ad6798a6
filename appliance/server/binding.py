"""Binding listening sockets, with ``SO_REUSEPORT`` when several processes share a port.

Processes started by hand on one machine (``reuse_port = true``) each bind
the same address with ``SO_REUSEPORT``; the kernel then spreads new
connections (and heartbeat datagrams) over them by a hash of the client's
address and port. The workers of one supervisor share one socket per TCP
port instead (appliance/server/spread.py), which the supervisor binds here
with ``SO_REUSEPORT`` too; each still binds the forward UDP heartbeat with
it. Without it, this is :func:`trio.open_tcp_listeners` (``SO_REUSEADDR``,
``IPV6_V6ONLY``).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Final

import trio

__all__ = ["LISTEN_BACKLOG", "bind_tcp", "bind_udp", "open_tcp_listeners"]

#: Connections the kernel queues before accept, per socket (trio's default is the
#: system's somaxconn, capped at 0xffff; this is what it asks for).
LISTEN_BACKLOG: Final = 0xFFFF


async def open_tcp_listeners(
    port: int, host: str, *, reuse_port: bool = False
) -> list[trio.SocketListener]:
    """Listening sockets for every address ``host`` resolves to, as trio's own.

    Args:
        reuse_port: set ``SO_REUSEPORT`` (Linux): other processes that set it
            too may bind the same address, and share its connections.

    Raises:
        OSError: an address cannot be bound (in use by a process without
            ``SO_REUSEPORT``, or not available).
    """
    if not reuse_port:
        return await trio.open_tcp_listeners(port, host=host)
    sockets = await bind_tcp(port, host)
    with contextlib.ExitStack() as opened:  # on any failure, close them all
        for sock in sockets:
            opened.enter_context(sock)
        for sock in sockets:
            sock.listen(LISTEN_BACKLOG)
        opened.pop_all()  # all listening: the listeners own them now
    return [trio.SocketListener(sock) for sock in sockets]


async def bind_tcp(port: int, host: str) -> list[trio.socket.SocketType]:
    """TCP sockets bound with ``SO_REUSEPORT`` to every address ``host`` resolves to, not listening.

    The supervisor of ``workers`` binds them and each worker listens
    (appliance/server/spread.py): the port takes connections once the first
    worker serves it, not while they all start.

    Raises:
        OSError: an address cannot be bound.
    """
    addresses = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[trio.socket.SocketType] = []
    with contextlib.ExitStack() as opened:  # on any failure, close what was opened
        for family, kind, proto, _, address in addresses:
            sock = opened.enter_context(trio.socket.socket(family, kind, proto))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            await sock.bind(address)
            sockets.append(sock)
        opened.pop_all()  # all bound: the caller owns them now
    return sockets


async def bind_udp(host: str, port: int, *, reuse_port: bool = False) -> trio.socket.SocketType:
    """A UDP socket bound to ``host:port`` (the first address it resolves to).

    Raises:
        OSError: the address cannot be bound.
    """
    addresses = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, _, _, _, address = addresses[0]
    with contextlib.ExitStack() as opened:  # closed unless bound
        sock = opened.enter_context(trio.socket.socket(family, socket.SOCK_DGRAM))
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        await sock.bind(address)
        opened.pop_all()
    return sock
