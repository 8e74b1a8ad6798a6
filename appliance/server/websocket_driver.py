"""The WebSocket listener: WSS ingest (``/ingest``) and the live tail (``/tail``).

Transport: the shared :class:`~appliance.server.listener.TcpService` accepts
and does TLS (so mutual TLS, the certificate subject as ``source``, CRLs and
certificate reload work as for every listener); this handler then runs
trio-websocket's server side over the TLS stream
(:func:`trio_websocket.wrap_server_stream`), checks the request and accepts
or rejects it. Parsing and the answers' JSON are the sans-IO
:mod:`appliance.protocols.websocket_messages`.

The HTTP upgrade, under ``tls_handshake_timeout_seconds``, is refused with:

* 404 for a path other than ``/ingest`` and ``/tail``;
* 403 for an Origin header outside ``allowed_origins`` (checked first);
* 429 while the peer's address is throttled after failed authentications;
* 401 without a bearer token (``Authorization: Bearer ...``, or the
  subprotocol ``bearer.<token>`` beside ``appliance.v1`` for browsers) or a
  verified client certificate, and for a token that is unknown or revoked;
* 403 for ``/tail`` without an ``admin`` token.

The body of a refusal is ``{"error": reason}``. Tokens are checked in the auth
database (:class:`auth.tokens.TokenStore`) in a worker thread under the
service's ``auth_threads`` limiter, afresh at every handshake, so a revoked
token is refused from its next connection on.

Ingest: messages are parsed as they arrive, their rows submitted to the
writer, and answered strictly in order: ``{"ack": id}`` once the commit that
holds them succeeded (:meth:`CommitTicket.wait` returned), ``{"error": reason,
"id": id}`` when the message was refused and nothing of it written (invalid
JSON, a bad field, too many events, a tag outside the token's prefixes, over
``max_messages_per_second``, or a block the writer refused with
:class:`~appliance.lake.errors.BlockRefused`, from ``submit`` or from
``wait``). A refused message does not end the connection: answers are per
message, and the next message is independent of it. A message larger than
``max_message_bytes`` closes the connection with 1009. At most
``max_pending_acks`` answers wait; then the driver stops reading. An answer
the client does not read within ``idle_timeout_seconds`` closes the
connection (1008), so a client that never reads cannot hold its slot.

Shutdown: the reader stops at the lifecycle's signal, the answers of what was
read are sent as their tickets resolve (the writer commits everything
queued), then the connection closes with 1001. When the connection task is
cancelled, a ticket that has not resolved gets no answer at all: neither an
ack (nothing says it is stored) nor an error (it may still be); the client
resends what was not acked and the dedupe window recognises what was stored.

Dedupe scope: a message's batch id is its ``id``, deduplicated per
``source``: the principal ``token:<name>`` or the certificate subject, not
the connection, so a resend on a new connection is recognised. Clients that
share a token must use ids unique across all of them (UUIDs); see
:mod:`appliance.protocols.websocket_messages`.

Failures: a peer that goes away during the handshake, or while trio-websocket
answers its protocol error, is logged (``websocket.handshake_failed``,
``websocket.aborted``) and is not an error of the appliance. Any other
exception is a bug: the WebSocket is closed with 1011 ("internal error", so
the client is not told it was a normal close) and the exception propagates
to the listener's connection boundary (``TcpService``), which logs
``connection.failed`` with its type and closes this connection only. This
driver has no catch-all of its own, so no bug is hidden here.

Tail: the writer calls :meth:`TailHub.publish` with the blocks of each commit;
every tail connection has a queue of at most ``tail_queue_events`` events.
A full queue drops the new events and counts them, so a slow tail client
never slows a commit; once the client has caught up it gets ``{"dropped": n}``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import orjson
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from appliance.config import WebSocketListenerConfig
from appliance.lake.errors import BlockRefused
from appliance.lake.rows import RowBlock
from appliance.lake.writer import CommitTicket
from appliance.logs import get_logger
from appliance.protocols.websocket_messages import (
    INGEST_PATH,
    TAIL_PATH,
    MessageError,
    MessageId,
    MessageRate,
    TailFilter,
    ack_json,
    bearer_token,
    dropped_json,
    error_json,
    header,
    origin_allowed,
    parse_ingest,
    parse_target,
    tail_events_json,
)
from appliance.server.context import ServiceContext
from appliance.server.listener import ANONYMOUS, ConnectionInfo
from auth.errors import AuthError

if TYPE_CHECKING:
    from auth.records import TokenGrant
    from auth.settings import AuthSettings

__all__ = [
    "SUBPROTOCOL",
    "TailHub",
    "TailSubscription",
    "TokenVerifier",
    "WebSocketHandler",
    "open_token_verifier",
    "websocket_driver",
]

log = get_logger("websocket")

#: The subprotocol a browser offers beside ``bearer.<token>`` (browsers cannot set headers).
SUBPROTOCOL: Final = "appliance.v1"
_BEARER_SUBPROTOCOL: Final = "bearer."
#: Messages trio-websocket buffers between its reader task and this driver.
MESSAGE_QUEUE_MESSAGES: Final = 4
#: Bytes asked of the TLS stream per read by trio-websocket's reader task.
RECEIVE_BUFFER_BYTES: Final = 64 * 1024
#: Seconds a polite close (close frame and its answer) may take.
CLOSE_TIMEOUT_SECONDS: Final = 2.0
#: WebSocket close codes (RFC 6455 §7.4.1).
CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_ABNORMAL: Final = 1006  # never sent: what a peer that vanished is recorded as
CLOSE_POLICY: Final = 1008
CLOSE_INTERNAL_ERROR: Final = 1011
_SHUTTING_DOWN: Final = "the appliance is shutting down"

#: The token check: token text -> what it allows, or None (blocking; runs in a thread).
TokenVerifier = Callable[[str], "TokenGrant | None"]


def open_token_verifier(auth: AuthSettings) -> tuple[TokenVerifier, Callable[[], None]]:
    """The token look-up of the auth database and its closer; checks the schema (blocking).

    Raises:
        auth.errors.AuthError: the database is unreachable or behind.
    """
    from auth.database import open_database

    database = open_database(auth)
    return database.tokens.verify, database.close


def _address(peer: str) -> str:
    """The IP address of a ``host:port`` or ``[v6]:port`` peer name."""
    return peer.rsplit(":", 1)[0].strip("[]")


# -- the live tail --------------------------------------------------------------------


class TailSubscription:
    """One tail connection's bounded queue of committed rows.

    Args:
        tail_filter: which rows it wants.
        max_events: rows that may wait; further ones are dropped and counted.
    """

    def __init__(self, tail_filter: TailFilter, max_events: int) -> None:
        self.filter = tail_filter
        self.max_events = max_events
        self._queue: deque[tuple[RowBlock, list[int]]] = deque()
        self._queued = 0
        #: Rows dropped since the client was last told.
        self.dropped = 0
        #: Rows dropped over the connection's life.
        self.dropped_total = 0
        self._wake = trio.Event()

    def offer(self, blocks: Sequence[RowBlock]) -> None:
        """Queue the wanted rows of ``blocks``, dropping what does not fit (never waits)."""
        added = False
        for block in blocks:
            rows = self.filter.rows(block)
            if not rows:
                continue
            if self._queued + len(rows) > self.max_events:
                self.dropped += len(rows)
                self.dropped_total += len(rows)
                added = True
                continue
            self._queue.append((block, rows))
            self._queued += len(rows)
            added = True
        if added:
            self._wake.set()

    async def next(self) -> tuple[list[tuple[RowBlock, list[int]]], int]:
        """Wait for rows or drops; returns the queued rows and the drops since last time."""
        while not self._queue and not self.dropped:
            self._wake = trio.Event()
            await self._wake.wait()
        items = list(self._queue)
        self._queue.clear()
        self._queued = 0
        dropped, self.dropped = self.dropped, 0
        return items, dropped


class TailHub:
    """Fans each commit's blocks out to the tail connections; a writer commit listener."""

    def __init__(self) -> None:
        self._subscriptions: set[TailSubscription] = set()

    def publish(self, blocks: Sequence[RowBlock]) -> None:
        """The writer's :data:`~appliance.lake.writer.CommitListener`: never waits."""
        for subscription in self._subscriptions:
            subscription.offer(blocks)

    @contextmanager
    def subscribe(self, tail_filter: TailFilter, max_events: int) -> Iterator[TailSubscription]:
        """A subscription for the duration of the ``with`` block."""
        subscription = TailSubscription(tail_filter, max_events)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        """Tail connections open now."""
        return len(self._subscriptions)

    @property
    def dropped_events(self) -> int:
        """Events dropped so far by the tail connections open now."""
        return sum(s.dropped_total for s in self._subscriptions)


# -- the handshake ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Refusal:
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class _Admission:
    path: str
    source: str
    grant: TokenGrant | None
    tail_filter: TailFilter
    subprotocol: str | None


@dataclass(frozen=True, slots=True)
class _Answer:
    message_id: MessageId | None
    ticket: CommitTicket | None = None
    error: str | None = None
    #: trio time the message was received (the ack latency's start).
    received: float = 0.0


@dataclass(slots=True)
class _Outcome:
    """How an ingest connection ends, when its answering task decides it."""

    code: int = CLOSE_NORMAL
    reason: str = ""


def _subprotocol_token(offered: Sequence[str]) -> tuple[str | None, str | None]:
    """The token of a ``bearer.<token>`` subprotocol, and the subprotocol to select."""
    token = next(
        (p[len(_BEARER_SUBPROTOCOL) :] for p in offered if p.startswith(_BEARER_SUBPROTOCOL)),
        None,
    )
    return token or None, SUBPROTOCOL if SUBPROTOCOL in offered else None


class WebSocketHandler:
    """The connection handler of one WebSocket listener.

    Args:
        settings: the listener's configuration.
        context: the service's writer, lifecycle and auth limits.
        tokens: the token check; None means no bearer token is accepted
            (only client certificates authenticate). :attr:`tokens` may be set
            later, before connections arrive.
    """

    def __init__(
        self,
        settings: WebSocketListenerConfig,
        context: ServiceContext,
        tokens: TokenVerifier | None = None,
    ) -> None:
        self.settings = settings
        self.context = context
        self.tokens = tokens
        self.hub = TailHub()
        context.writer.commit_listeners.append(self.hub.publish)
        self._limits = settings.limits()

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await self._connection(nursery, stream, info)
                finally:
                    # trio-websocket's reader task runs in this nursery.
                    nursery.cancel_scope.cancel()
        except* ConnectionClosed:
            # trio-websocket's reader task raises it when it answers a bad
            # request or frame (its 400, its 1002/1007 close) on a socket the
            # peer has already closed: "garbage\r\n\r\n" and a close did it
            # before the handshake. The peer's doing, not a bug; any other
            # exception in the group propagates (module docstring, Failures).
            log.warning(
                "websocket.aborted",
                listener=info.listener,
                peer=info.peer,
                code=CLOSE_ABNORMAL,
                reason="the peer closed the connection abruptly",
            )

    async def _connection(
        self, nursery: trio.Nursery, stream: trio.abc.Stream, info: ConnectionInfo
    ) -> None:
        settings = self.settings
        ws: WebSocketConnection | None = None
        decision: _Refusal | _Admission | None = None
        try:
            with trio.move_on_after(settings.tls_handshake_timeout_seconds) as deadline:
                request = await wrap_server_stream(
                    nursery,
                    stream,
                    message_queue_size=MESSAGE_QUEUE_MESSAGES,
                    max_message_size=settings.max_message_bytes,
                    receive_buffer_size=RECEIVE_BUFFER_BYTES,
                )
                decision = await self._decide(request, info)
                if isinstance(decision, _Refusal):
                    log.warning(
                        "websocket.refused",
                        listener=info.listener,
                        peer=info.peer,
                        status=decision.status,
                        reason=decision.reason,
                    )
                    body = orjson.dumps({"error": decision.reason})
                    headers = [(b"content-type", b"application/json")]
                    await request.reject(decision.status, extra_headers=headers, body=body)
                    return
                ws = await request.accept(subprotocol=decision.subprotocol)
        except ConnectionClosed:
            # The peer left before the answer to its upgrade could be sent.
            log.warning("websocket.handshake_failed", listener=info.listener, peer=info.peer,
                        reason="the peer closed the connection during the handshake")  # fmt: skip
            return
        if deadline.cancelled_caught or ws is None or not isinstance(decision, _Admission):
            log.warning(
                "websocket.handshake_failed",
                listener=info.listener,
                peer=info.peer,
                reason=f"no WebSocket handshake within {settings.tls_handshake_timeout_seconds}s",
            )
            return
        log.info(
            "websocket.open",
            listener=info.listener,
            peer=info.peer,
            path=decision.path,
            source=decision.source,
        )
        # What the client is told when neither path returns: a bug (1011, and
        # the exception goes on to the listener's boundary), or cancellation.
        code, reason = CLOSE_INTERNAL_ERROR, "internal error"
        try:
            if decision.path == TAIL_PATH:
                code, reason = await self._tail(ws, info, decision)
            else:
                code, reason = await self._ingest(ws, info, decision)
        finally:
            if code == CLOSE_INTERNAL_ERROR and trio.current_effective_deadline() == -math.inf:
                # -inf: this task is being cancelled (the service stops), not failing.
                code, reason = CLOSE_GOING_AWAY, _SHUTTING_DOWN
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_SECONDS):
                await ws.aclose(code, reason or None)
        log.info("websocket.closed", listener=info.listener, peer=info.peer, code=code,
                 reason=reason or None)  # fmt: skip

    async def _decide(
        self, request: WebSocketRequest, info: ConnectionInfo
    ) -> _Refusal | _Admission:
        headers = request.headers
        try:
            path, tail_filter = parse_target(request.path)
        except MessageError as exc:
            return _Refusal(400, exc.reason)
        if path not in (INGEST_PATH, TAIL_PATH):
            return _Refusal(404, f"no endpoint {path!r}: use {INGEST_PATH} or {TAIL_PATH}")
        if not origin_allowed(header(headers, b"origin"), self.settings.allowed_origins):
            return _Refusal(403, "origin not allowed")
        token = bearer_token(headers)
        sub_token, subprotocol = _subprotocol_token(request.proposed_subprotocols)
        token = token or sub_token
        grant: TokenGrant | None = None
        if token is not None:
            refusal_or_grant = await self._verify(token, info)
            if isinstance(refusal_or_grant, _Refusal):
                return refusal_or_grant
            grant = refusal_or_grant
            source = f"token:{grant.name}"
        elif info.source != ANONYMOUS:
            source = info.source  # the verified client certificate's subject
        else:
            return _Refusal(401, "authentication required: a bearer token or a client certificate")
        if path == TAIL_PATH and (grant is None or grant.scope != "admin"):
            return _Refusal(403, "the live tail needs an admin token")
        return _Admission(path, source, grant, tail_filter, subprotocol)

    async def _verify(self, token: str, info: ConnectionInfo) -> _Refusal | TokenGrant:
        verifier = self.tokens
        if verifier is None:
            return _Refusal(401, "bearer tokens are not enabled on this listener")
        limiter = self.context.failure_limiter
        address = _address(info.peer)
        wait = limiter.begin(address)  # counted before the look-up (auth/ratelimit.py)
        if wait > 0:
            info.metrics.auth("token", "throttled")
            return _Refusal(429, f"too many failed authentications; retry in {wait:.0f}s")
        try:
            grant = await trio.to_thread.run_sync(
                verifier, token, limiter=self.context.auth_threads
            )
        except AuthError as exc:
            limiter.release(address)
            log.error("websocket.auth_unavailable", peer=info.peer, reason=str(exc))
            info.metrics.auth("token", "unavailable")
            return _Refusal(503, "the auth database is unavailable; try again later")
        if grant is None:
            info.metrics.auth("token", "failure")
            return _Refusal(401, "invalid or revoked token")
        limiter.success(address)
        info.metrics.auth("token", "success")
        return grant

    # -- ingest ---------------------------------------------------------------------

    async def _ingest(
        self, ws: WebSocketConnection, info: ConnectionInfo, admission: _Admission
    ) -> tuple[int, str]:
        send, receive = trio.open_memory_channel[_Answer](self.settings.max_pending_acks)
        outcome = (CLOSE_NORMAL, "")
        ended = _Outcome()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer, ws, info, receive, nursery.cancel_scope, ended)
            async with send:
                outcome = await self._read(ws, info, admission, send)
        if nursery.cancel_scope.cancelled_caught:
            # The answering task ended the connection (client gone or not reading).
            return ended.code, ended.reason
        return outcome

    async def _read(
        self,
        ws: WebSocketConnection,
        info: ConnectionInfo,
        admission: _Admission,
        answers: trio.MemorySendChannel[_Answer],
    ) -> tuple[int, str]:
        settings = self.settings
        lifecycle = self.context.lifecycle
        rate = MessageRate(settings.max_messages_per_second, trio.current_time())
        with lifecycle.reading():
            while True:
                data: str | bytes | None = None
                with lifecycle.receiving() as stopping:
                    with trio.move_on_after(settings.idle_timeout_seconds) as idle:
                        try:
                            data = await ws.get_message()
                        except ConnectionClosed as exc:
                            closed = exc.reason
                            return (closed.code if closed else CLOSE_NORMAL), ""
                if stopping.cancelled_caught:
                    return CLOSE_GOING_AWAY, _SHUTTING_DOWN
                if idle.cancelled_caught or data is None:
                    return CLOSE_NORMAL, f"idle for {settings.idle_timeout_seconds}s"
                received_at_ns = time.time_ns()
                info.metrics.received_bytes.inc(len(data))
                answer = await self._message(data, info, admission, rate, received_at_ns)
                await answers.send(answer)

    async def _message(
        self,
        data: str | bytes,
        info: ConnectionInfo,
        admission: _Admission,
        rate: MessageRate,
        received_at_ns: int,
    ) -> _Answer:
        if not rate.allow(trio.current_time()):
            reason = f"more than {self.settings.max_messages_per_second} messages per second"
            info.metrics.protocol_error(reason)
            return self._refused(MessageError(reason), info)
        try:
            message = parse_ingest(data, self._limits)
        except MessageError as exc:
            info.metrics.protocol_error(exc.reason)
            return self._refused(exc, info)
        grant = admission.grant
        if grant is not None and not grant.allows_tag(message.tag):
            reason = f"tag {message.tag!r} is outside the token's tag prefixes"
            info.metrics.protocol_error("tag outside the token's prefixes")
            return self._refused(MessageError(reason, message.id), info)
        block = message.block(
            source=admission.source, peer=info.peer, received_at_ns=received_at_ns
        )
        try:
            ticket = await self.context.writer.submit(block)
        except BlockRefused as exc:
            # Checked before it joined a commit group: no other batch is affected.
            return self._refused(MessageError(f"not stored: {exc.reason}", message.id), info)
        info.metrics.requests.inc()
        info.metrics.events.inc(block.rows)
        return _Answer(message.id, ticket=ticket, received=trio.current_time())

    @staticmethod
    def _refused(error: MessageError, info: ConnectionInfo) -> _Answer:
        log.warning("websocket.message_refused", peer=info.peer, id=error.message_id,
                    reason=error.reason)  # fmt: skip
        return _Answer(error.message_id, error=error.reason)

    async def _answer(
        self,
        ws: WebSocketConnection,
        info: ConnectionInfo,
        answers: trio.MemoryReceiveChannel[_Answer],
        connection: trio.CancelScope,
        ended: _Outcome,
    ) -> None:
        send_timeout = self.settings.idle_timeout_seconds
        async with answers:
            async for answer in answers:
                acked = False
                if answer.ticket is not None:
                    assert answer.message_id is not None
                    try:
                        # Returns only once the rows are committed. Cancelled
                        # here (the service stops): no answer at all for it.
                        await answer.ticket.wait()
                    except BlockRefused as exc:
                        error = MessageError(f"not stored: {exc.reason}", answer.message_id)
                        self._refused(error, info)  # logs it
                        text = error_json(error.reason, answer.message_id)
                    else:
                        text = ack_json(answer.message_id)
                        acked = True
                else:
                    text = error_json(answer.error or "refused", answer.message_id)
                with trio.move_on_after(send_timeout) as stalled:
                    try:
                        await ws.send_message(text)
                    except ConnectionClosed:
                        # The client is gone: stop reading too. Submitted rows
                        # still commit; a client that resends them is deduplicated.
                        connection.cancel()
                        return
                if stalled.cancelled_caught:
                    ended.code, ended.reason = CLOSE_POLICY, f"read nothing for {send_timeout}s"
                    connection.cancel()
                    return
                if acked:
                    info.metrics.acks.inc()
                    info.metrics.ack_latency.observe(trio.current_time() - answer.received)

    # -- tail -----------------------------------------------------------------------

    async def _tail(
        self, ws: WebSocketConnection, info: ConnectionInfo, admission: _Admission
    ) -> tuple[int, str]:
        settings = self.settings
        outcome = (CLOSE_NORMAL, "")
        with self.hub.subscribe(admission.tail_filter, settings.tail_queue_events) as sub:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain, ws, nursery.cancel_scope)
                outcome = await self._push(ws, sub)
                nursery.cancel_scope.cancel()
        if sub.dropped_total:
            log.info("websocket.tail_dropped", peer=info.peer, events=sub.dropped_total)
        return outcome

    async def _push(self, ws: WebSocketConnection, sub: TailSubscription) -> tuple[int, str]:
        lifecycle = self.context.lifecycle
        send_timeout = self.settings.idle_timeout_seconds
        while True:
            items: list[tuple[RowBlock, list[int]]] = []
            dropped = 0
            with lifecycle.receiving() as stopping:
                items, dropped = await sub.next()
            if stopping.cancelled_caught:
                return CLOSE_GOING_AWAY, _SHUTTING_DOWN
            texts = [text for block, rows in items for text in tail_events_json(block, rows)]
            if dropped:
                texts.append(dropped_json(dropped))
            with trio.move_on_after(send_timeout) as stalled:
                try:
                    for text in texts:
                        await ws.send_message(text)
                except ConnectionClosed:
                    return CLOSE_NORMAL, ""
            if stalled.cancelled_caught:
                return CLOSE_POLICY, f"read nothing for {send_timeout}s"

    @staticmethod
    async def _drain(ws: WebSocketConnection, tail: trio.CancelScope) -> None:
        """Read (and ignore) what a tail client sends, so its close frame is seen."""
        try:
            while True:
                await ws.get_message()
        except ConnectionClosed:
            tail.cancel()


def websocket_driver(
    settings: WebSocketListenerConfig, context: ServiceContext
) -> WebSocketHandler:
    """The connection handler of one WebSocket listener (tokens from the service context)."""
    return WebSocketHandler(settings, context, tokens=context.tokens)
