"""UDP heartbeat responder on the forward port (spec "Heartbeat Message").

Clients may send a datagram to the TCP port's number to check that the
server is there; the server answers each with one byte ``0x00``. Like
Fluentd's in_forward, it answers **any** datagram, whatever its length or
content (fluent/fluentd at ff8682d, lib/fluent/plugin/in_forward.rb:192:
the UDP server block writes ``HEARTBEAT_UDP_PAYLOAD`` for every ``data``,
reading at most 128 bytes). The answer is one byte, no larger than the
smallest question (an empty datagram still carries 28 bytes of IP and UDP
headers), so the responder cannot amplify a spoofed flood.
"""

from __future__ import annotations

from typing import Final

import trio

from appliance.logs import get_logger
from appliance.server.binding import bind_udp

__all__ = ["MAX_HEARTBEAT_DATAGRAM_BYTES", "serve_udp_heartbeat"]

log = get_logger("heartbeat")

#: Bytes read per datagram; anything longer is truncated (in_forward reads 128).
MAX_HEARTBEAT_DATAGRAM_BYTES: Final = 128


async def serve_udp_heartbeat(
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer heartbeats on ``host:port`` until cancelled; reports the bound port.

    ``reuse_port``: share the port with other processes (its TCP listener's ``reuse_port``).
    """
    with await bind_udp(host, port, reuse_port=reuse_port) as sock:
        task_status.started(sock.getsockname()[1])
        while True:
            try:
                _data, peer = await sock.recvfrom(MAX_HEARTBEAT_DATAGRAM_BYTES)
            except OSError as exc:  # e.g. ICMP port unreachable from an earlier reply
                log.debug("heartbeat.receive_failed", reason=str(exc))
                continue
            try:
                await sock.sendto(b"\x00", peer)
            except OSError as exc:
                log.debug("heartbeat.reply_failed", peer=str(peer[0]), reason=str(exc))
