"""The trio driver every stream protocol shares: reads, deadlines, ordered answers.

A protocol plugs in a :class:`Session`, which turns bytes into
:class:`Submit` (rows to commit, then an ack) and :class:`Reply` (bytes to
send at once) actions; the session holds the sans-IO codec, this module holds
the socket and the clock, and no parsing. Two tasks per connection:

* the reader reads under the idle deadline, hands the bytes to the session,
  submits each block to the writer and queues the answers on a bounded
  per-connection queue. A full writer queue or a full answer queue stops the
  reader: TCP backpressure.
* the answerer is the only task that writes to the stream. It sends answers
  in order; an ack waits for its block's commit, and while it waits it sends
  the session's keepalive every ``keepalive_seconds`` (Lumberjack, Courier).

A protocol error stops the reader and is logged with its reason; the error's
``reply`` is sent after the answers already queued, then the connection
closes. A block the writer refuses (``BlockRefused``: data that cannot be
stored) closes the connection the same way, with no ack for it or for
anything after it. Every send has a deadline, so a peer that never reads
cannot pin a task.

Deadlines on the reader (docs/limits.md): ``idle_timeout_seconds`` between
reads; ``handshake_timeout_seconds`` from the start to the end of the
protocol's handshake; and ``request_timeout_seconds`` from the first byte of
a request to its last, so a peer that trickles a request a byte at a time
(which would restart the idle deadline forever) is closed.

Work on the event loop stays small: a read that completes a large request
(``len(data) + session.buffered_bytes()`` over ``INLINE_DECODE_MAX_BYTES``)
is decoded in a worker thread, so one peer's large or compressed request
cannot stall every other connection's acks. Below that size the work is
bounded: deflate expands at most 1032:1, and every codec caps its objects.
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import trio

from appliance.lake.errors import BlockRefused
from appliance.lake.writer import CommitTicket, LakeWriter
from appliance.logs import StructLogger
from appliance.protocols.errors import RemoteProtocolError
from appliance.rows.block import RowBlock
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo

__all__ = [
    "DECODE_THREADS",
    "INLINE_DECODE_MAX_BYTES",
    "REQUEST_TIMEOUT_SECONDS",
    "SEND_TIMEOUT_SECONDS",
    "Action",
    "Await",
    "DriverSettings",
    "ListenerBounds",
    "Reply",
    "Session",
    "StreamDriver",
    "Submit",
]

#: Seconds one send to the peer may take before the connection is dropped.
SEND_TIMEOUT_SECONDS: Final = 60.0
#: Seconds from the first byte of a request to its last (slow senders).
REQUEST_TIMEOUT_SECONDS: Final = 60.0
#: Bytes of a request (those held plus those just read) up to which it is
#: decoded on the event loop; larger ones go to a worker thread. 512 bytes of
#: deflate inflate to at most about 512 KiB, a few milliseconds of decoding.
INLINE_DECODE_MAX_BYTES: Final = 512
#: Worker threads one listener may decode in at once.
DECODE_THREADS: Final = 4

Bytes = bytes | Callable[[], bytes]


@dataclass(frozen=True, slots=True)
class Submit:
    """Rows to commit, and the answer to send once they are committed.

    ``ack`` (and ``keepalive``) may be callables: they are called when the
    bytes are sent, so a codec can answer with its state at that moment
    (Lumberjack's last acknowledged sequence).
    """

    block: RowBlock
    ack: Bytes | None = None
    #: Names the batch in logs (chunk id, nonce, sequence).
    label: str | None = None
    #: Sent every ``keepalive_seconds`` while the commit is awaited.
    keepalive: Bytes | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """Bytes to send now, in order with the acks queued before them."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Await:
    """Work that must wait (a credential look-up in a worker thread), then more actions.

    The reader awaits it before reading on, so nothing after it is processed
    out of order.
    """

    run: Callable[[], Awaitable[list[Submit | Reply | Await]]]


Action = Submit | Reply | Await


class Session(Protocol):
    """One connection's protocol state, around a sans-IO codec."""

    def receive(self, data: bytes | bytearray, received_at_ns: int) -> list[Action]:
        """The actions the bytes complete.

        Raises:
            RemoteProtocolError: the peer broke the protocol and nothing valid
                came before the violation in ``data``. When something did, the
                actions are returned and :meth:`pending_error` has the error.
        """
        ...

    def pending_error(self) -> RemoteProtocolError | None:
        """The violation that ended the last ``data``, after valid actions."""
        ...

    def greeting(self) -> bytes | None:
        """Bytes to send as soon as the connection is up (e.g. a HELO)."""
        ...

    def handshake_done(self) -> bool:
        """False while the protocol's handshake is unfinished (its deadline applies)."""
        ...

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished request the codec holds (0 between requests).

        While it is above 0, ``request_timeout_seconds`` applies.
        """
        ...


class ListenerBounds(Protocol):
    """The connection bounds every stream listener's config has."""

    @property
    def idle_timeout_seconds(self) -> float: ...

    @property
    def max_pending_acks(self) -> int: ...

    @property
    def read_size_bytes(self) -> int: ...

    @property
    def request_timeout_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """Deadlines and bounds of one listener's connections."""

    idle_timeout_seconds: float
    max_pending_acks: int
    read_size_bytes: int
    keepalive_seconds: float = 5.0
    send_timeout_seconds: float = SEND_TIMEOUT_SECONDS
    #: Seconds from connection to the end of the protocol's handshake.
    handshake_timeout_seconds: float = 10.0
    #: Seconds from the first byte of a request to its last.
    request_timeout_seconds: float = REQUEST_TIMEOUT_SECONDS
    #: Bytes of a request decoded on the event loop; more go to a worker thread.
    inline_decode_max_bytes: int = INLINE_DECODE_MAX_BYTES

    @classmethod
    def from_listener(
        cls,
        listener: ListenerBounds,
        *,
        keepalive_seconds: float | None = None,
        handshake_timeout_seconds: float | None = None,
    ) -> DriverSettings:
        """The bounds of ``listener``'s config; the other settings as given or by default."""
        settings = cls(
            idle_timeout_seconds=listener.idle_timeout_seconds,
            max_pending_acks=listener.max_pending_acks,
            read_size_bytes=listener.read_size_bytes,
            request_timeout_seconds=listener.request_timeout_seconds,
        )
        if keepalive_seconds is not None:
            settings = replace(settings, keepalive_seconds=keepalive_seconds)
        if handshake_timeout_seconds is not None:
            settings = replace(settings, handshake_timeout_seconds=handshake_timeout_seconds)
        return settings


@dataclass(slots=True)
class _Stats:
    batches: int = 0
    events: int = 0
    extra: dict[str, int] = field(default_factory=dict)


#: (ticket, answer, keepalive, label, trio time the request was received: 0 for no ack).
_Queued = tuple[CommitTicket | None, Bytes | None, Bytes | None, str | None, float]


class _PeerGone(Exception):
    """The peer stopped taking bytes; the connection ends."""


def _materialize(value: Bytes) -> bytes:
    return value() if callable(value) else value


class StreamDriver:
    """Runs the connections of one listener (a listener ``Handler``)."""

    def __init__(
        self,
        session_factory: Callable[[ConnectionInfo], Session],
        settings: DriverSettings,
        writer: LakeWriter,
        lifecycle: Lifecycle,
        log: StructLogger,
    ) -> None:
        self._new_session = session_factory
        self._settings = settings
        self._writer = writer
        self._lifecycle = lifecycle
        self._log = log
        self._decode_threads: trio.CapacityLimiter | None = None

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        session = self._new_session(info)
        send, receive = trio.open_memory_channel[_Queued](self._settings.max_pending_acks)
        self._log.info(
            "connection.open", listener=info.listener, peer=info.peer, tls=info.tls,
            source=info.source,
        )  # fmt: skip
        stats = _Stats()
        reason = "closed"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answerer, stream, receive, info, nursery.cancel_scope)
            async with send:
                greeting = session.greeting()
                if greeting is not None:
                    await send.send((None, greeting, None, "greeting", 0.0))
                reason = await self._reader(stream, session, send, info, stats)
        self._log.info(
            "connection.closed", listener=info.listener, peer=info.peer, reason=reason,
            batches=stats.batches, events=stats.events,
        )  # fmt: skip

    async def _reader(
        self,
        stream: trio.abc.Stream,
        session: Session,
        answers: trio.MemorySendChannel[_Queued],
        info: ConnectionInfo,
        stats: _Stats,
    ) -> str:
        idle = self._settings.idle_timeout_seconds
        handshake_deadline = trio.current_time() + self._settings.handshake_timeout_seconds
        request_deadline = math.inf  # set while a request is partly received
        with self._lifecycle.reading():
            while True:
                data: bytes | bytearray | None = None
                deadline = min(trio.current_time() + idle, request_deadline)
                if not session.handshake_done():
                    deadline = min(deadline, handshake_deadline)
                with self._lifecycle.receiving() as receiving, trio.move_on_at(deadline) as waiting:
                    try:
                        data = await stream.receive_some(self._settings.read_size_bytes)
                    except trio.BrokenResourceError as exc:
                        if isinstance(exc.__cause__, ssl.SSLEOFError):
                            return "peer closed without TLS close_notify"
                        return f"broken: {exc.__cause__ or exc}"
                if receiving.cancelled_caught:
                    return "shutdown"
                if waiting.cancelled_caught:
                    if not session.handshake_done():
                        timeout = self._settings.handshake_timeout_seconds
                        self._log.warning("handshake.timeout", peer=info.peer, seconds=timeout)
                        return f"no handshake within {timeout}s"
                    if trio.current_time() >= request_deadline:
                        timeout = self._settings.request_timeout_seconds
                        self._log.warning(
                            "request.timeout", listener=info.listener, peer=info.peer,
                            seconds=timeout, buffered_bytes=session.buffered_bytes(),
                        )  # fmt: skip
                        return f"request not finished within {timeout}s"
                    self._log.info("connection.idle", peer=info.peer, idle_seconds=idle)
                    return f"idle for {idle}s"
                if not data:
                    return "peer closed"
                info.metrics.received_bytes.inc(len(data))
                try:
                    progressed = await self._handle(session, data, answers, info, stats)
                except RemoteProtocolError as exc:
                    self._log.warning(
                        "protocol.error", listener=info.listener, peer=info.peer,
                        reason=exc.reason,
                    )  # fmt: skip
                    info.metrics.protocol_error(exc.reason)
                    if exc.reply:
                        await answers.send((None, exc.reply, None, "error reply", 0.0))
                    return f"protocol error: {exc.reason}"
                except BlockRefused as exc:
                    self._log.warning(
                        "block.refused", listener=info.listener, peer=info.peer,
                        reason=exc.reason,
                    )  # fmt: skip
                    return f"batch cannot be stored: {exc.reason}"
                except trio.ClosedResourceError:
                    return "shutdown"  # the writer takes no more batches
                except trio.BrokenResourceError:
                    return "answers could not be sent"
                # A read that completed a request restarts the clock: a busy
                # client pipelining requests may end every read mid-request.
                if session.buffered_bytes() <= 0:
                    request_deadline = math.inf
                elif progressed or request_deadline == math.inf:
                    request_deadline = trio.current_time() + self._settings.request_timeout_seconds

    async def _handle(
        self,
        session: Session,
        data: bytes | bytearray,
        answers: trio.MemorySendChannel[_Queued],
        info: ConnectionInfo,
        stats: _Stats,
    ) -> bool:
        """Hand ``data`` to the session and queue what it completes; True if it completed any."""
        received_at_ns = time.time_ns()
        received = trio.current_time()
        if len(data) + session.buffered_bytes() <= self._settings.inline_decode_max_bytes:
            actions = session.receive(data, received_at_ns)
        else:
            if self._decode_threads is None:
                self._decode_threads = trio.CapacityLimiter(DECODE_THREADS)
            actions = await trio.to_thread.run_sync(
                session.receive, data, received_at_ns, limiter=self._decode_threads
            )
        progressed = bool(actions)
        while actions:
            action = actions.pop(0)
            if isinstance(action, Await):
                actions[:0] = await action.run()
                continue
            if isinstance(action, Reply):
                await answers.send((None, action.data, None, "reply", 0.0))
                continue
            stats.batches += 1
            stats.events += action.block.rows
            info.metrics.requests.inc()
            info.metrics.events.inc(action.block.rows)
            ticket = await self._writer.submit(action.block)
            await answers.send((ticket, action.ack, action.keepalive, action.label, received))
        error = session.pending_error()
        if error is not None:
            raise error
        return progressed

    async def _send(self, stream: trio.abc.Stream, data: bytes, info: ConnectionInfo) -> None:
        with trio.move_on_after(self._settings.send_timeout_seconds) as scope:
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._log.info("send.failed", peer=info.peer, reason=str(exc) or "closed")
                raise _PeerGone from exc
        if scope.cancelled_caught:
            self._log.warning("send.failed", peer=info.peer, reason="peer does not read")
            raise _PeerGone

    async def _answerer(
        self,
        stream: trio.abc.Stream,
        answers: trio.MemoryReceiveChannel[_Queued],
        info: ConnectionInfo,
        connection: trio.CancelScope,
    ) -> None:
        pending: str | None = None
        async with answers:
            try:
                async for ticket, answer, keepalive, label, received in answers:
                    pending = label
                    if ticket is not None:
                        await self._await_commit(stream, ticket, keepalive, info)
                    if answer is not None:
                        await self._send(stream, _materialize(answer), info)
                        if ticket is not None:
                            info.metrics.acks.inc()
                            info.metrics.ack_latency.observe(trio.current_time() - received)
            except _PeerGone:
                self._log.info("connection.unanswered", peer=info.peer, pending=pending)
                connection.cancel()
            except BlockRefused as exc:
                # Nothing after a refused batch is acked either: acks are in order.
                self._log.warning(
                    "block.refused", listener=info.listener, peer=info.peer, batch=pending,
                    reason=exc.reason,
                )  # fmt: skip
                connection.cancel()

    async def _await_commit(
        self,
        stream: trio.abc.Stream,
        ticket: CommitTicket,
        keepalive: Bytes | None,
        info: ConnectionInfo,
    ) -> None:
        if keepalive is None:
            await ticket.wait()
            return
        while True:
            with trio.move_on_after(self._settings.keepalive_seconds):
                await ticket.wait()
                return
            await self._send(stream, _materialize(keepalive), info)
