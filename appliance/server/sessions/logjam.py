"""The Logjam session: each ZeroMQ message decoded, mapped to its row, and answered per peer.

One session serves one socket (ROUTER or PULL) of a listener in the answering
loop (:mod:`appliance.server.connection`): every peer of the socket is a lane
of its own, keyed by the routing id, so replies keep each peer's order and a
peer waiting for its commit holds up no other.

A message is decoded on the event loop only when the codec's bound on the
bytes its decoding reads and produces (the body as *decompressed*, see
:meth:`LogjamReceiver.decode_size_bound`) is at most ``INLINE_DECODE_BYTES``;
anything larger, which for deflate is any body over about 63 bytes, is
decoded in a worker thread, one at a time per listener.

A message whose ``User-Id`` (the CURVE key's name) was revoked while its
connection stayed open is dropped before it is decoded, with no reply
(docs/logjam.md, "CURVE"): the first of each key is logged
(``message.revoked``), the others counted (``revoked`` in ``listener.closed``).

Faults are per message: a malformed message gets its 400 (or nothing on an
async socket), a block the writer refuses (``BlockRefused``) gets a 400 and
a ``message.refused`` line, and any other exception while one message is
decoded and mapped is logged as ``message.failed`` with its type, counted,
and the socket goes on with the next message: no reply is sent for that
message (the client resends after its timeout).

What each message becomes (one row per data message) is
:mod:`appliance.rows.logjam`'s; a string host that cannot be stored becomes
null there and is counted here in ``hosts_dropped`` and logged
(``message.host_dropped``).

Replies are the spec's frames after the routing id, with no empty frame:
``[app-env]["202 Accepted"]``, ``[app-env]["400 Bad Request"]``,
``["ping"]["200 OK"][fqdn]`` (the codec's ``accepted_frames``,
``bad_request_frames``, ``pong_frames``; docs/logjam.md, "Replies"). A
request's ``202 Accepted`` is its ack: it goes out once its row is committed,
and never otherwise (a refused block gets ``400 Bad Request``; a listener
cancelled before the commit sends nothing for it). A ``400`` or a ping's
``200 OK`` goes out as soon as the peer's earlier replies have.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

from appliance.blocks.errors import BlockRefused
from appliance.logs import get_logger
from appliance.metrics import ListenerMetrics
from appliance.protocols.logjam import (
    DataMessage,
    FrameData,
    LogjamReceiver,
    MalformedMessage,
    Ping,
    Route,
    accepted_frames,
    bad_request_frames,
    pong_frames,
)
from appliance.rows.logjam import message_block
from appliance.server.connection import Action, Arrival, Reply, SessionDefaults, Submit
from appliance.server.listener import ANONYMOUS, describe_failure
from appliance.server.transports.zeromq import ZmqMessage

__all__ = ["INLINE_DECODE_BYTES", "LogjamSession", "MessageStats", "SocketKind"]

log = get_logger("logjam")

#: Messages whose decoding may read and produce more than this many bytes (all
#: frames plus the body as decompressed: ``LogjamReceiver.decode_size_bound``)
#: are decoded in a worker thread, so no body stalls the event loop.
INLINE_DECODE_BYTES: Final = 64 * 1024

SocketKind = Literal["router", "pull"]
#: A reply's frames.
Frames = list[bytes]


@dataclass(slots=True)
class MessageStats:
    """What one socket's messages were, for the listener's close line."""

    messages: int = 0
    malformed: int = 0
    pings: int = 0
    hosts_dropped: int = 0
    failed: int = 0
    #: Messages dropped because their CURVE key was revoked.
    revoked: int = 0


class LogjamSession(SessionDefaults[list[bytes]]):
    """One Logjam socket's messages: decoded, mapped to rows, answered in each peer's lane.

    Args:
        kind: which socket (a PULL socket's messages get no reply).
        receiver: the listener's decoder.
        listener: the listener's name, for logs.
        curve: whether the socket is CURVE (the ZAP user id is the source).
        fqdn: the name a ping's reply carries.
        metrics: the listener's metrics.
        revoked: the user ids (CURVE key names) whose messages are dropped;
            the listener adds to it while the session runs.
    """

    def __init__(
        self,
        kind: SocketKind,
        receiver: LogjamReceiver,
        *,
        listener: str,
        curve: bool,
        fqdn: str,
        metrics: ListenerMetrics,
        revoked: Set[str] = frozenset(),
    ) -> None:
        self.kind: SocketKind = kind
        self._receiver = receiver
        self._listener = listener
        self._curve = curve
        self._fqdn = fqdn
        self._metrics = metrics
        self._revoked = revoked
        #: The revoked user ids whose first dropped message was logged.
        self._revoked_logged: set[str] = set()
        self.stats = MessageStats()

    def decode_bytes(self, message: ZmqMessage) -> int:
        """The codec's bound on what decoding ``message`` reads and produces."""
        return self._receiver.decode_size_bound(message.frames, router=self.kind == "router")

    def decode(self, frames: list[FrameData]) -> DataMessage | Ping:
        """The codec's event of one message (raises ``MalformedMessage``)."""
        if self.kind == "router":
            return self._receiver.receive_router(frames)
        return self._receiver.receive_pull(frames)

    def receive(self, message: ZmqMessage, arrival: Arrival) -> list[Action[Frames]]:
        """The reply or the row of one message (nothing for a message that failed)."""
        self.stats.messages += 1
        try:
            return self._receive(message, arrival)
        except Exception as exc:  # noqa: BLE001 - the per-message boundary (module docstring)
            # Whatever one message raises ends that message only; the socket
            # serves every other peer. trio.Cancelled is not an Exception.
            self.stats.failed += 1
            error, reason = describe_failure(exc)
            log.error("message.failed", listener=self._listener, socket=self.kind,
                      error=error, reason=reason)  # fmt: skip
            return []

    def _receive(self, message: ZmqMessage, arrival: Arrival) -> list[Action[Frames]]:
        peer = message.peer
        source = (message.user_id or ANONYMOUS) if self._curve else ANONYMOUS
        if self._curve and message.user_id and message.user_id in self._revoked:
            self._drop_revoked(message.user_id, peer)
            return []
        try:
            event = self.decode(message.frames)
        except MalformedMessage as exc:
            self.stats.malformed += 1
            self._metrics.protocol_error(exc.reason)
            log.warning("message.malformed", listener=self._listener, socket=self.kind,
                        peer=peer, source=source, reason=exc.reason,
                        frames=len(message.frames) + message.dropped,
                        reply="400" if exc.reply_frames else "none")  # fmt: skip
            if exc.reply_frames and exc.route is not None:
                return [Reply(exc.reply_frames, lane=exc.route.identity)]
            return []
        if isinstance(event, Ping):
            self.stats.pings += 1
            return [Reply(pong_frames(event.route, self._fqdn), lane=event.route.identity)]
        if event.host_dropped is not None:
            self.stats.hosts_dropped += 1
            log.warning("message.host_dropped", listener=self._listener, socket=self.kind,
                        peer=peer, source=source, reason=event.host_dropped)  # fmt: skip
        block = message_block(event, source=source, peer=peer, received_at_ns=arrival.time_ns)
        # The route of a request (it wants a reply), None for async data.
        route = event.route if event.route is not None and event.route.reply else None
        refused = partial(self._refused, route, peer, source)
        if route is None:
            return [Submit(block, refused=refused)]
        return [
            Submit(block, ack=accepted_frames(route), label=block.batch_id, refused=refused,
                   lane=route.identity)
        ]  # fmt: skip

    def _drop_revoked(self, user_id: str, peer: str) -> None:
        """Count a message of a revoked key; log the first of each key."""
        self.stats.revoked += 1
        if user_id in self._revoked_logged:
            return
        self._revoked_logged.add(user_id)
        log.warning("message.revoked", listener=self._listener, socket=self.kind, peer=peer,
                    credential=f"curve:{user_id}", reason="CURVE key revoked", reply="none",
                    more="counted as revoked in listener.closed")  # fmt: skip

    def _refused(
        self, route: Route | None, peer: str, source: str, exc: BlockRefused
    ) -> Frames | None:
        log.warning("message.refused", listener=self._listener, socket=self.kind, peer=peer,
                    source=source, reason=exc.reason,
                    reply="400" if route is not None else "none")  # fmt: skip
        return bad_request_frames(route) if route is not None else None
