"""UDP heartbeat responder on the forward port (spec "Heartbeat Message").

Clients may send a datagram to the TCP port's number to check that the
server is there; the server answers each with one byte ``0x00``, as
in_forward does. The answer is never larger than the question, so the
responder cannot amplify a spoofed flood.
"""

from __future__ import annotations

import socket
from typing import Final

import trio

from appliance.logs import get_logger

__all__ = ["MAX_HEARTBEAT_DATAGRAM_BYTES", "serve_udp_heartbeat"]

log = get_logger("heartbeat")

#: Bytes read per datagram; anything longer is truncated (heartbeats are 1 byte).
MAX_HEARTBEAT_DATAGRAM_BYTES: Final = 64


async def serve_udp_heartbeat(
    host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Answer heartbeats on ``host:port`` until cancelled; reports the bound port."""
    info = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, _, _, _, address = info[0]
    with trio.socket.socket(family, socket.SOCK_DGRAM) as sock:
        await sock.bind(address)
        task_status.started(sock.getsockname()[1])
        while True:
            try:
                data, peer = await sock.recvfrom(MAX_HEARTBEAT_DATAGRAM_BYTES)
            except OSError as exc:  # e.g. ICMP port unreachable from an earlier reply
                log.debug("heartbeat.receive_failed", reason=str(exc))
                continue
            if len(data) != 1:
                continue  # not a heartbeat (spec: a byte of 0x00)
            try:
                await sock.sendto(b"\x00", peer)
            except OSError as exc:
                log.debug("heartbeat.reply_failed", peer=str(peer[0]), reason=str(exc))
