"""The one answering loop: requests read in order, answered in order, each ack only once durable.

Every protocol's connections run here: forward, Lumberjack and Log Courier
over TCP, WebSocket ingest, and each Logjam ZeroMQ socket (one "connection"
whose peers are lanes). A connection is three parts:

* a :class:`Transport` holds the socket: :meth:`~Transport.receive` gives the
  next unit the peer sent (bytes for TCP, a message for WebSocket, a message's
  frames for ZeroMQ) and :meth:`~Transport.send` sends one answer under the
  transport's own send deadline; either raises :class:`PeerGone`.
* a :class:`Session` holds the protocol: it turns each unit into
  :class:`Action` s (its sans-IO codec parses, the rows layer maps) and never
  touches trio, so it may run in a worker thread.
* this module holds the clock and the order. Two sides, in one nursery:

  - the reader takes units under the deadlines, hands each to the session
    (in a worker thread when :meth:`Session.decode_bytes` is over
    ``inline_decode_max_bytes``, so one peer's large or compressed request
    cannot stall the others; with the process's decode budget, whose share
    the session's codec asks before it decodes a request, and which a
    request put off waits for: :mod:`appliance.server.decode_budget`),
    and carries out its actions in order: a
    :class:`Submit` goes to the :class:`BatchSink` and its ack is queued; a
    :class:`Reply` is queued; an :class:`Await` is awaited before anything
    after it; a :class:`Close` queues its reply and ends reading.
  - the answerer sends what is queued, in order within each lane (one lane
    for a TCP or WebSocket connection; one per peer on a ZeroMQ socket, so a
    peer waiting for its commit holds up no other). An ack waits until its
    batch is durable, sending the session's keepalive every
    ``keepalive_seconds`` meanwhile (Lumberjack, Courier).

When a batch is durable is one seam, :class:`BatchSink`: ``submit`` takes a
block and gives a :class:`Durable` whose ``wait()`` returns once the block is
durable and raises :class:`~appliance.blocks.errors.BlockRefused` when it never
will be. The sink is the :class:`~appliance.lake.writer.LakeWriter`: durable
= synced in its write-ahead log (``ack = "wal"``), or in a Delta commit.

Guarantees (tests/appliance/server/test_connection.py):

* Answers leave in the order their requests arrived, within a lane.
* An ack leaves only after its ``wait()`` returned. A block refused at
  ``submit`` or at ``wait`` gets no ack: with a :attr:`Submit.refused`
  answer, that answer goes in the ack's place and the connection goes on
  (WebSocket, Logjam: answers are per message); without one the connection
  closes and nothing after the block is answered (the stream protocols, whose
  acks are ordered or cumulative).
* A cancelled connection sends nothing more: no ack for a batch not known
  durable, and no answer queued after it (each is logged ``reply.withheld``).
* The waiting answers hold at most ``max_pending_bytes`` (their blocks'
  bytes) and number at most ``max_pending_acks``; the next request is not
  taken until it fits (backpressure: TCP's window, ZeroMQ's queue;
  :mod:`appliance.server.pending`). A full sink stops the reader too
  (``submit`` waits).
* Every close has a reason (:class:`Ending`) and a log line.
* No block holding a record over ``RECORD_MAX_BYTES`` of JSON reaches the
  sink: it is refused like a block the sink refuses.

Deadlines on the reader (docs/limits.md): ``idle_timeout_seconds`` between
units; ``handshake_timeout_seconds`` from the start to the end of the
protocol's handshake; ``request_timeout_seconds`` from the first byte of a
request to its last (:meth:`Session.buffered_bytes` above 0), so a peer that
trickles a request a byte at a time (which would restart the idle deadline
forever) is closed. A shutdown (:meth:`Lifecycle.stop_reading`) stops the
reader; what was read is still submitted and answered.
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Generic, Protocol, TypeAlias, TypeVar

import trio

from appliance import defaults
from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.blocks.records import oversized_record
from appliance.logs import StructLogger
from appliance.protocols.errors import Fault
from appliance.server.decode_budget import DecodeBudget, DecodeGrant
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.pending import PendingBudget

__all__ = [
    "DECODE_THREADS",
    "INLINE_DECODE_MAX_BYTES",
    "REQUEST_TIMEOUT_SECONDS",
    "SEND_TIMEOUT_SECONDS",
    "Action",
    "Answer",
    "Arrival",
    "Await",
    "BatchSink",
    "Cause",
    "Close",
    "Connection",
    "DriverSettings",
    "Durable",
    "Ending",
    "ListenerBounds",
    "PeerGone",
    "Reply",
    "Session",
    "SessionDefaults",
    "Submit",
    "Tally",
    "Transport",
]

#: Seconds one send to the peer may take before the connection is dropped (TCP).
SEND_TIMEOUT_SECONDS: Final = 60.0
#: Seconds from the first byte of a request to its last (slow senders).
REQUEST_TIMEOUT_SECONDS: Final = 60.0
#: Bytes of a request (those held plus those just read) up to which it is
#: decoded on the event loop; larger ones go to a worker thread. 512 bytes of
#: deflate inflate to at most about 512 KiB, a few milliseconds of decoding.
INLINE_DECODE_MAX_BYTES: Final = 512
#: Worker threads one stream listener may decode in at once.
DECODE_THREADS: Final = 4

_In = TypeVar("_In")
_Out = TypeVar("_Out")
_In_co = TypeVar("_In_co", covariant=True)
_In_contra = TypeVar("_In_contra", contravariant=True)
_Out_co = TypeVar("_Out_co", covariant=True)
_Out_contra = TypeVar("_Out_contra", contravariant=True)

#: An answer, or a callable that makes it when it is sent (Lumberjack's ack
#: carries the last sequence acknowledged by then).
Answer: TypeAlias = _Out | Callable[[], _Out]


# -- what a session asks for --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a unit arrived, and what decoding it may take of the decode budget."""

    #: Wall-clock epoch nanoseconds: the rows' ``received_at``.
    time_ns: int
    #: trio's clock: rates and the ack latency.
    clock: float
    #: The gate a codec asks before it decodes a request (None: no budget;
    #: appliance/server/decode_budget.py). Valid only during this decode.
    grant: DecodeGrant | None = None


@dataclass(frozen=True, slots=True)
class Submit(Generic[_Out_co]):
    """Rows to make durable, and the answer to send once they are."""

    block: RowBlock
    #: None: nothing is sent (a forward request without a chunk); the block
    #: is still waited for in order when a refusal closes the connection.
    ack: Answer[_Out_co] | None = None
    #: Names the batch in logs (chunk id, nonce, sequence).
    label: str | None = None
    #: Sent every ``keepalive_seconds`` while the block is not yet durable.
    keepalive: Answer[_Out_co] | None = None
    #: The answer in the ack's place when the block is refused (at submit or
    #: once it waited), or None for none; the callable logs the refusal. No
    #: callable: a refusal closes the connection, and nothing after it is
    #: answered.
    refused: Callable[[BlockRefused], _Out_co | None] | None = None
    #: Answers are ordered within a lane (a ZeroMQ peer's routing id).
    lane: Hashable = None


@dataclass(frozen=True, slots=True)
class Reply(Generic[_Out_co]):
    """An answer to send now, in order with the acks queued before it in its lane."""

    data: _Out_co
    lane: Hashable = None


@dataclass(frozen=True, slots=True)
class Await(Generic[_Out_co]):
    """Work that must wait (a credential look-up in a worker thread), then more actions.

    The reader awaits it before it reads on, so nothing after it is processed
    out of order.
    """

    run: Callable[[], Awaitable[Sequence[Action[_Out_co]]]]


@dataclass(frozen=True, slots=True)
class Close(Generic[_Out_co]):
    """The peer broke the protocol: send ``reply`` after what is queued, then close.

    A session's last action; a codec's
    :class:`~appliance.protocols.errors.ProtocolViolation` becomes one.
    """

    reason: str
    reply: _Out_co | None = None
    fault: Fault = "peer"


Action = Submit[_Out] | Reply[_Out] | Await[_Out] | Close[_Out]


class Session(Protocol[_In_contra, _Out_co]):
    """One connection's protocol state, around a sans-IO codec (no trio: it may run in a thread)."""

    def receive(self, unit: _In_contra, arrival: Arrival) -> Sequence[Action[_Out_co]]:
        """The actions ``unit`` completes, in order; a :class:`Close` is the last."""
        ...

    def decode_bytes(self, unit: _In_contra) -> int:
        """Bytes decoding ``unit`` may read and produce (with those held): the thread decision."""
        ...

    def greeting(self) -> _Out_co | None:
        """An answer to send as soon as the connection is up (a HELO), or None."""
        ...

    def handshake_done(self) -> bool:
        """False while the protocol's handshake is unfinished (its deadline applies)."""
        ...

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished request held (0 between requests): the request deadline runs."""
        ...

    def deferred_cost(self) -> int:
        """The decode cost of a request its gate put off (``arrival.grant``), or 0.

        The loop waits for that much of the decode budget, then calls :meth:`resume`.
        """
        ...

    def resume(self, arrival: Arrival) -> Sequence[Action[_Out_co]]:
        """Decode the request that was put off, and what came after it: like :meth:`receive`."""
        ...


class SessionDefaults(Generic[_Out]):
    """What most sessions answer: no greeting, no handshake of their own, nothing held.

    A session overrides what its protocol does differently.
    """

    def greeting(self) -> _Out | None:
        """None: the client speaks first."""
        return None

    def handshake_done(self) -> bool:
        """True: no handshake beyond the transport's (TLS, the HTTP upgrade, ZMTP)."""
        return True

    def buffered_bytes(self) -> int:
        """0: the transport hands over whole requests."""
        return 0

    def deferred_cost(self) -> int:
        """0: the session's codec decodes without asking a gate."""
        return 0

    def resume(self, arrival: Arrival) -> Sequence[Action[_Out]]:
        """Nothing: nothing is ever put off."""
        return []


class PeerGone(Exception):
    """The peer closed, the connection broke, or the peer stopped taking answers."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Transport(Protocol[_In_co, _Out_contra]):
    """One connection's socket, as units in and answers out."""

    async def receive(self) -> _In_co:
        """The next unit the peer sent.

        Raises:
            PeerGone: the peer closed or the connection broke.
        """
        ...

    async def send(self, answer: _Out_contra) -> None:
        """Send one answer within the transport's send deadline.

        Raises:
            PeerGone: the peer is gone or does not read.
        """
        ...


class Durable(Protocol):
    """A submitted block on its way to durable storage (a ``CommitTicket``)."""

    async def wait(self) -> None:
        """Return once the block is durable: then, and only then, acknowledge it.

        Raises:
            BlockRefused: the block cannot be stored; do not acknowledge it.
        """
        ...


class BatchSink(Protocol):
    """Where blocks go to become durable: the one seam for "when may it be acked"."""

    async def submit(self, block: RowBlock) -> Durable:
        """Queue ``block`` (waits while the sink is full: backpressure).

        Raises:
            BlockRefused: the block cannot be stored (checked before it is queued).
            trio.ClosedResourceError: the sink takes no more blocks (shutdown).
        """
        ...


# -- settings and results -----------------------------------------------------------------


class ListenerBounds(Protocol):
    """The connection bounds every listener's config has."""

    @property
    def idle_timeout_seconds(self) -> float: ...

    @property
    def max_pending_acks(self) -> int: ...

    @property
    def max_pending_bytes(self) -> int: ...

    @property
    def read_size_bytes(self) -> int: ...

    @property
    def request_timeout_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """Deadlines and bounds of one listener's connections."""

    idle_timeout_seconds: float
    #: Answers that may wait before the reader stops, whatever their size (a guard).
    max_pending_acks: int
    #: Bytes asked of a TCP stream per read.
    read_size_bytes: int
    #: Bytes the waiting answers' blocks may hold before the reader stops (the bound).
    max_pending_bytes: int = defaults.LISTENER_MAX_PENDING_BYTES
    keepalive_seconds: float = 5.0
    #: Seconds one send may take (TCP; WebSocket and ZeroMQ have their own).
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
            max_pending_bytes=listener.max_pending_bytes,
            request_timeout_seconds=listener.request_timeout_seconds,
        )
        if keepalive_seconds is not None:
            settings = replace(settings, keepalive_seconds=keepalive_seconds)
        if handshake_timeout_seconds is not None:
            settings = replace(settings, handshake_timeout_seconds=handshake_timeout_seconds)
        return settings


class Cause(enum.Enum):
    """Why a connection ended."""

    #: The transport reported the peer gone while reading.
    PEER_CLOSED = "peer closed"
    IDLE = "idle"
    HANDSHAKE_TIMEOUT = "handshake timeout"
    REQUEST_TIMEOUT = "request timeout"
    #: The service stops reading, or the sink takes no more blocks.
    SHUTDOWN = "shutdown"
    #: The session closed it (:class:`Close`).
    VIOLATION = "protocol error"
    #: A block was refused and the session had no answer for it.
    REFUSED = "refused"
    #: An answer could not be sent.
    UNANSWERED = "unanswered"


@dataclass(frozen=True, slots=True)
class Ending:
    """How a connection ended: the cause, and the reason its close line gives."""

    cause: Cause
    reason: str


@dataclass(slots=True)
class Tally:
    """What one connection did, for its close line."""

    #: Blocks the sink took, and their rows.
    batches: int = 0
    events: int = 0
    #: Acks sent.
    acks: int = 0
    #: Blocks refused by ``submit``, and once waited for.
    refused: int = 0
    refused_at_commit: int = 0
    #: Answers never sent because the connection was cancelled first.
    withheld: int = 0


@dataclass(slots=True)
class _Queued(Generic[_Out]):
    """An answer waiting in its lane."""

    answer: Answer[_Out] | None
    durable: Durable | None = None
    keepalive: Answer[_Out] | None = None
    label: str | None = None
    refused: Callable[[BlockRefused], _Out | None] | None = None
    #: trio time the request arrived (the ack latency's start).
    received: float = 0.0
    #: Bytes of the block it waits for, as charged to the pending budget.
    nbytes: int = 0


class _Ended(Exception):
    """The answerer ended the connection; this lane stops."""


def _check_records(block: RowBlock) -> None:
    """Refuse a block holding a record over ``RECORD_MAX_BYTES`` of JSON: it is never stored.

    Every protocol's rows pass here before the sink; the forward codec
    already refuses such a record while it decodes a large stream.

    Raises:
        BlockRefused: naming the record's size and the limit.
    """
    over = oversized_record(block.records, defaults.RECORD_MAX_BYTES)
    if over is not None:
        raise BlockRefused(
            f"a record of {over} bytes of JSON is over the limit of "
            f"{defaults.RECORD_MAX_BYTES} (RECORD_MAX_BYTES)"
        )


def _materialize(value: Answer[_Out]) -> _Out:
    # An Answer is either the value or a zero-argument callable that makes it.
    return value() if callable(value) else value


# -- the loop -------------------------------------------------------------------------------


class Connection(Generic[_In, _Out]):
    """One connection in the answering loop (module docstring); :meth:`run` serves it.

    Args:
        transport: the socket, as units and answers.
        session: the protocol.
        sink: where blocks become durable.
        settings: deadlines and bounds.
        lifecycle: the service's shutdown state.
        log: the listener's logger.
        info: who is on the other end (a ZeroMQ socket: its own address), and the metrics.
        decode_threads: the listener's limit on worker threads that decode.
        decode_budget: the process's decode budget (appliance/server/decode_budget.py),
            or None: the session's gates let everything through.
    """

    def __init__(
        self,
        transport: Transport[_In, _Out],
        session: Session[_In, _Out],
        sink: BatchSink,
        settings: DriverSettings,
        *,
        lifecycle: Lifecycle,
        log: StructLogger,
        info: ConnectionInfo,
        decode_threads: trio.CapacityLimiter,
        decode_budget: DecodeBudget | None = None,
    ) -> None:
        self._transport = transport
        self._session = session
        self._sink = sink
        self._settings = settings
        self._lifecycle = lifecycle
        self._log = log
        self._info = info
        self._decode_threads = decode_threads
        self._decode_budget = decode_budget
        self._pending = PendingBudget(settings.max_pending_bytes, settings.max_pending_acks)
        self._lanes: dict[Hashable, deque[_Queued[_Out]]] = {}
        self._ending: Ending | None = None
        self._nursery: trio.Nursery | None = None
        self.tally = Tally()

    async def run(self) -> Ending:
        """Serve until the connection ends; what was queued before the end is still answered."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            greeting = self._session.greeting()
            if greeting is not None:
                await self._pending.acquire(0)
                self._put(None, _Queued(greeting, label="greeting"))
            ending = await self._read()
            self._ending = self._ending or ending
        assert self._ending is not None
        return self._ending

    def _end(self, ending: Ending) -> None:
        """End the connection now: the reader and every lane stop, nothing more is sent."""
        self._ending = self._ending or ending
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- the reader ---------------------------------------------------------------------

    async def _read(self) -> Ending:
        settings, session = self._settings, self._session
        idle = settings.idle_timeout_seconds
        handshake_deadline = trio.current_time() + settings.handshake_timeout_seconds
        request_deadline = math.inf  # set while a request is partly received
        with self._lifecycle.reading():
            while True:
                if self._lifecycle.stopping:
                    return Ending(Cause.SHUTDOWN, "shutdown")
                deadline = min(trio.current_time() + idle, request_deadline)
                if not session.handshake_done():
                    deadline = min(deadline, handshake_deadline)
                unit = await self._receive(deadline, request_deadline)
                if isinstance(unit, Ending):
                    return unit
                arrival = Arrival(time.time_ns(), trio.current_time())
                actions = await self._decode(unit, arrival)
                ending = await self._carry_out(actions, arrival)
                if ending is None and self._decode_budget is not None:
                    ending = await self._decode_deferred(arrival)
                if ending is not None:
                    return ending
                # A unit that completed a request restarts the clock: a busy
                # client pipelining requests may end every read mid-request.
                if session.buffered_bytes() <= 0:
                    request_deadline = math.inf
                elif actions or request_deadline == math.inf:
                    request_deadline = trio.current_time() + settings.request_timeout_seconds

    async def _receive(self, deadline: float, request_deadline: float) -> _In | Ending:
        """The next unit, or how the connection ends while waiting for it."""
        with (
            self._lifecycle.receiving() as receiving,
            trio.move_on_at(deadline) as waiting,
        ):
            try:
                return await self._transport.receive()
            except PeerGone as exc:
                return Ending(Cause.PEER_CLOSED, exc.reason)
        if receiving.cancelled_caught:
            return Ending(Cause.SHUTDOWN, "shutdown")
        assert waiting.cancelled_caught
        return self._deadline_passed(request_deadline)

    def _deadline_passed(self, request_deadline: float) -> Ending:
        settings, info = self._settings, self._info
        if not self._session.handshake_done():
            timeout = settings.handshake_timeout_seconds
            self._log.warning("handshake.timeout", peer=info.peer, seconds=timeout)
            return Ending(Cause.HANDSHAKE_TIMEOUT, f"no handshake within {timeout}s")
        if trio.current_time() >= request_deadline:
            timeout = settings.request_timeout_seconds
            self._log.warning(
                "request.timeout", listener=info.listener, peer=info.peer, seconds=timeout,
                buffered_bytes=self._session.buffered_bytes(),
            )  # fmt: skip
            return Ending(Cause.REQUEST_TIMEOUT, f"request not finished within {timeout}s")
        idle = settings.idle_timeout_seconds
        self._log.info("connection.idle", peer=info.peer, idle_seconds=idle)
        return Ending(Cause.IDLE, f"idle for {idle}s")

    async def _decode(self, unit: _In, arrival: Arrival) -> Sequence[Action[_Out]]:
        session, budget = self._session, self._decode_budget
        if session.decode_bytes(unit) <= self._settings.inline_decode_max_bytes:
            # On the event loop: small costs only, outside the budget; a
            # larger one is put off and decoded below, in a worker thread.
            grant = None if budget is None else DecodeGrant(budget, on_loop=True)
            return session.receive(unit, replace(arrival, grant=grant))
        grant = None if budget is None else DecodeGrant(budget)
        try:
            return await trio.to_thread.run_sync(
                session.receive, unit, replace(arrival, grant=grant), limiter=self._decode_threads
            )
        finally:
            if grant is not None:
                grant.release()  # the decoded objects are rows now, or garbage

    async def _decode_deferred(self, arrival: Arrival) -> Ending | None:
        """Decode what the session's gate put off, once the budget has room for it.

        The wait is the budget's (first come first served, at most
        ``DECODE_BUDGET_WAIT_SECONDS``) and holds nothing: what this
        connection decoded before was released. A stop cancels it.
        """
        session, budget = self._session, self._decode_budget
        assert budget is not None  # without one, every gate lets everything through
        while (cost := session.deferred_cost()) > 0:
            with self._lifecycle.receiving() as waiting:
                refusal = await budget.acquire(cost)
            if waiting.cancelled_caught:
                return Ending(Cause.SHUTDOWN, "shutdown")
            if refusal is not None:
                return await self._close(Close(refusal, fault="appliance"))
            grant = DecodeGrant(budget, prepaid=cost)
            try:
                actions = await trio.to_thread.run_sync(
                    session.resume, replace(arrival, grant=grant), limiter=self._decode_threads
                )
            finally:
                grant.release()
            ending = await self._carry_out(actions, arrival)
            if ending is not None:
                return ending
        return None

    async def _carry_out(self, actions: Sequence[Action[_Out]], arrival: Arrival) -> Ending | None:
        """Submit and queue what ``actions`` ask for, in order; the ending, if they end it."""
        pending: deque[Action[_Out]] = deque(actions)
        while pending:
            action = pending.popleft()
            if isinstance(action, Await):
                pending.extendleft(reversed(await action.run()))
            elif isinstance(action, Reply):
                await self._pending.acquire(0)
                self._put(action.lane, _Queued(action.data, label="reply"))
            elif isinstance(action, Close):
                return await self._close(action)
            else:
                ending = await self._submit(action, arrival)
                if ending is not None:
                    return ending
        return None

    async def _close(self, close: Close[_Out]) -> Ending:
        info = self._info
        self._log.warning(
            "protocol.error", listener=info.listener, peer=info.peer, reason=close.reason,
            fault=close.fault,
        )  # fmt: skip
        info.metrics.protocol_error(close.reason)
        if close.reply is not None:
            await self._pending.acquire(0)
            self._put(None, _Queued(close.reply, label="error reply"))
        return Ending(Cause.VIOLATION, f"protocol error: {close.reason}")

    async def _submit(self, submit: Submit[_Out], arrival: Arrival) -> Ending | None:
        # Nothing waits for a block with no ack whose refusal is answered (an
        # async Logjam message): it takes no slot.
        waits = submit.ack is not None or submit.refused is None
        nbytes = submit.block.nbytes
        if waits:
            await self._pending.acquire(nbytes)  # backpressure before the block is taken
        try:
            _check_records(submit.block)
            durable = await self._sink.submit(submit.block)
        except BlockRefused as exc:
            self.tally.refused += 1
            self._info.metrics.batch_refused(exc.reason)  # status: listener errors
            if submit.refused is None:
                self._pending.release(nbytes)
                info = self._info
                self._log.warning("block.refused", listener=info.listener, peer=info.peer,
                                  reason=exc.reason)  # fmt: skip
                return Ending(Cause.REFUSED, f"batch cannot be stored: {exc.reason}")
            answer = submit.refused(exc)
            if answer is None:
                if waits:
                    self._pending.release(nbytes)
                return None
            if waits:
                self._pending.release(nbytes)  # the refusal holds no block
            await self._pending.acquire(0)
            self._put(submit.lane, _Queued(answer, label=submit.label))
            return None
        except trio.ClosedResourceError:
            if waits:
                self._pending.release(nbytes)
            return Ending(Cause.SHUTDOWN, "shutdown")  # the sink takes no more blocks
        rows = submit.block.rows
        self.tally.batches += 1
        self.tally.events += rows
        self._info.metrics.requests.inc()
        self._info.metrics.events.inc(rows)
        if waits:
            self._put(
                submit.lane,
                _Queued(submit.ack, durable, submit.keepalive, submit.label, submit.refused,
                        arrival.clock, nbytes),
            )  # fmt: skip
        return None

    # -- the answerer -------------------------------------------------------------------

    def _put(self, lane: Hashable, queued: _Queued[_Out]) -> None:
        """Queue an answer (its share of the pending budget is taken) at the end of its lane."""
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()
            assert self._nursery is not None
            self._nursery.start_soon(self._answer_lane, lane, queue)
        queue.append(queued)

    async def _answer_lane(self, lane: Hashable, queue: deque[_Queued[_Out]]) -> None:
        """Send one lane's answers in order; the task ends when the lane is empty."""
        try:
            while queue:
                await self._answer(queue[0])
                self._pending.release(queue.popleft().nbytes)
        except _Ended:
            queue.popleft()  # its refusal or failed send is logged already
        finally:
            if self._lanes.get(lane) is queue:
                del self._lanes[lane]
            for left in queue:
                # Cancelled (the service stops) or ended before these went:
                # no answer at all, above all no ack for a batch that may
                # not be durable. The peer resends.
                self.tally.withheld += 1
                self._log.info(
                    "reply.withheld", listener=self._info.listener, peer=self._info.peer,
                    batch=left.label, reason="not sent before the connection ended",
                )  # fmt: skip

    async def _answer(self, queued: _Queued[_Out]) -> None:
        answer, acked = queued.answer, False
        if queued.durable is not None:
            try:
                await self._durable(queued.durable, queued.keepalive, queued.label)
                acked = answer is not None
            except BlockRefused as exc:
                self.tally.refused_at_commit += 1
                self._info.metrics.batch_refused(exc.reason)  # status: listener errors
                if queued.refused is None:
                    # Nothing after a refused batch is acked either: acks are in order.
                    info = self._info
                    self._log.warning(
                        "block.refused", listener=info.listener, peer=info.peer,
                        batch=queued.label, reason=exc.reason,
                    )  # fmt: skip
                    self._end(Ending(Cause.REFUSED, f"batch cannot be stored: {exc.reason}"))
                    raise _Ended from None
                answer = queued.refused(exc)
        if answer is None:
            return
        # A wait that returned does not deliver a cancel already pending, and
        # a transport's send need not checkpoint (ZeroMQ's does not).
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._send(answer, queued.label)
        if acked:
            self.tally.acks += 1
            self._info.metrics.acks.inc()
            self._info.metrics.ack_latency.observe(trio.current_time() - queued.received)

    async def _durable(
        self, durable: Durable, keepalive: Answer[_Out] | None, label: str | None
    ) -> None:
        """Wait until ``durable`` resolves, sending ``keepalive`` every ``keepalive_seconds``."""
        if keepalive is None:
            await durable.wait()
            return
        while True:
            with trio.move_on_after(self._settings.keepalive_seconds):
                await durable.wait()
                return
            await self._send(keepalive, label)

    async def _send(self, answer: Answer[_Out], label: str | None) -> None:
        try:
            await self._transport.send(_materialize(answer))
        except PeerGone as exc:
            self._log.info("connection.unanswered", peer=self._info.peer, pending=label)
            self._end(Ending(Cause.UNANSWERED, exc.reason))
            raise _Ended from None
