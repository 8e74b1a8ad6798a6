"""The WebSocket listener: WSS ingest (``/ingest``) and the live tail (``/tail``).

Transport: the shared :class:`~appliance.server.listener.TcpService` accepts
and does TLS (so mutual TLS, the certificate subject as ``source``, CRLs and
certificate reload work as for every listener); this handler then runs
trio-websocket's server side over the TLS stream
(:func:`trio_websocket.wrap_server_stream`), checks the request and accepts
or rejects it. Parsing and the answers' JSON are the sans-IO
:mod:`appliance.protocols.websocket_messages`; the rows of a message and the
tail's messages are :mod:`appliance.rows.websocket`'s.

The HTTP upgrade, under ``tls_handshake_timeout_seconds``, is refused with:

* 404 for a path other than ``/ingest`` and ``/tail``;
* 403 for an Origin header outside ``allowed_origins``, or for more than
  one Origin header (checked first);
* 429 while the peer's address is throttled after failed authentications;
* 401 without a bearer token (``Authorization: Bearer ...``, or the
  subprotocol ``bearer.<token>`` beside ``appliance.v1`` for browsers) or a
  verified client certificate, and for a token that is unknown or revoked;
* 403 for ``/tail`` without an ``admin`` token.

The body of a refusal is ``{"error": reason}``. Tokens are checked in the auth
database (:class:`auth.tokens.TokenStore`) in a worker thread under the
service's ``auth_threads`` limiter, afresh at every handshake, so a revoked
token is refused from its next connection on. The token of an open
connection is checked again with the same look-up (every
``RECHECK_INTERVAL_SECONDS`` and on a reload: :mod:`appliance.server.revocation`);
once revoked, the connection (ingest or tail) is closed with 1008 and the
reason, ``token revoked``. A client certificate's revocation closes it the
same way (the listener checks it).

Ingest: each message is one unit of the answering loop
(:mod:`appliance.server.connection`) through the ingest session
(:mod:`appliance.server.sessions.websocket`, which says how it is answered),
over :class:`~appliance.server.transports.websocket.WebSocketMessages`. A
message larger than ``max_message_bytes`` closes the connection with 1009
(trio-websocket). At most ``max_pending_acks`` answers wait; then the loop
stops reading. An answer the client does not read within
``idle_timeout_seconds`` closes the connection (1008), so a client that never
reads cannot hold its slot; so does a connection idle that long (1000).

Shutdown: the reader stops at the lifecycle's signal, the answers of what was
read are sent as their tickets resolve (the writer commits everything
queued), then the connection closes with 1001. When the connection task is
cancelled, a ticket that has not resolved gets no answer at all: neither an
ack (nothing says it is stored) nor an error (it may still be); the client
resends what was not acked and the dedupe window recognises what was stored.
Clients that share a token must use message ids unique across all of them
(UUIDs); see :mod:`appliance.protocols.websocket_messages`.

Failures: a peer that goes away during the handshake, or while trio-websocket
answers its protocol error, is logged (``websocket.handshake_failed``,
``websocket.aborted``) and is not an error of the appliance. Any other
exception is a bug: the WebSocket is closed with 1011 ("internal error", so
the client is not told it was a normal close) and the exception propagates
to the listener's connection boundary (``TcpService``), which logs
``connection.failed`` with its type and closes this connection only. This
handler has no catch-all of its own, so no bug is hidden here.

Tail: :mod:`appliance.server.tail` (an ``admin`` token's ``/tail`` connection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
from appliance.logs import get_logger
from appliance.protocols.websocket_messages import (
    INGEST_PATH,
    TAIL_PATH,
    MessageError,
    TailFilter,
    bearer_token,
    header,
    origin_allowed,
    parse_target,
)
from appliance.server.connection import Cause, Connection, DriverSettings
from appliance.server.context import ServiceContext
from appliance.server.listener import ANONYMOUS, ConnectionInfo
from appliance.server.revocation import Credential, Revoked
from appliance.server.sessions.websocket import IngestSession
from appliance.server.tail import TailHub, serve_tail
from appliance.server.transports.websocket import (
    CLOSE_ABNORMAL,
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    SHUTTING_DOWN,
    WebSocketMessages,
)
from auth.errors import AuthError

if TYPE_CHECKING:
    from auth.records import TokenGrant
    from auth.settings import AuthSettings

__all__ = [
    "SUBPROTOCOL",
    "TokenVerifier",
    "WebSocketHandler",
    "open_token_verifier",
    "token_credential",
    "websocket_handler",
]

log = get_logger("websocket")

#: The subprotocol a browser offers beside ``bearer.<token>`` (browsers cannot set headers).
SUBPROTOCOL: Final = "appliance.v1"
_BEARER_SUBPROTOCOL: Final = "bearer."
#: Messages trio-websocket buffers between its reader task and the answering loop.
MESSAGE_QUEUE_MESSAGES: Final = 4
#: Bytes asked of the TLS stream per read by trio-websocket's reader task.
RECEIVE_BUFFER_BYTES: Final = 64 * 1024
#: Seconds a polite close (close frame and its answer) may take.
CLOSE_TIMEOUT_SECONDS: Final = 2.0
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


def token_credential(verifier: TokenVerifier, token: str, name: str) -> Credential:
    """The credential of a connection that ``token`` (named ``name``) authenticated.

    Checked again with the handshake's own look-up; the token stays in the
    check's closure, in memory only (the id is ``token:<name>``).
    """
    ident = f"token:{name}"

    def recheck() -> Revoked | None:
        grant = verifier(token)
        return None if grant is not None and grant.name == name else Revoked(ident, "token revoked")

    return Credential(ident, ("token", name), recheck)


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
    #: The bearer token that ``grant`` came from, checked again while the connection is open.
    token: str | None = field(default=None, repr=False)


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
        # Messages are decoded inline: max_message_bytes bounds each one.
        loop_settings = DriverSettings.from_listener(settings)
        self._loop_settings = replace(
            loop_settings, inline_decode_max_bytes=settings.max_message_bytes
        )
        self._decode_threads = trio.CapacityLimiter(1)  # unused while decoding stays inline

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
        guard = info.guard
        if guard is not None and decision.grant is not None and decision.token is not None:
            assert self.tokens is not None  # it verified the grant
            guard.add(token_credential(self.tokens, decision.token, decision.grant.name))
        # What the client is told when neither path returns: a bug (1011, and
        # the exception goes on to the listener's boundary), or cancellation.
        code, reason = CLOSE_INTERNAL_ERROR, "internal error"
        try:
            if decision.path == TAIL_PATH:
                code, reason = await self._tail(ws, info, decision)
            else:
                code, reason = await self._ingest(ws, info, decision)
        finally:
            if guard is not None and guard.revoked is not None:
                # Cancelled because its token or certificate was revoked.
                code, reason = CLOSE_POLICY, guard.revoked.reason
            elif code == CLOSE_INTERNAL_ERROR and trio.current_effective_deadline() == -math.inf:
                # -inf: this task is being cancelled (the service stops), not failing.
                code, reason = CLOSE_GOING_AWAY, SHUTTING_DOWN
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
        if sum(1 for name, _ in headers if name.lower() == b"origin") > 1:
            # Which one a browser meant cannot be told: judging the first would
            # let a second, disallowed one through to whatever reads the last.
            return _Refusal(403, "more than one Origin header")
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
        return _Admission(path, source, grant, tail_filter, subprotocol,
                          token if grant is not None else None)  # fmt: skip

    async def _verify(self, token: str, info: ConnectionInfo) -> _Refusal | TokenGrant:
        verifier = self.tokens
        if verifier is None:
            return _Refusal(401, "bearer tokens are not enabled on this listener")
        limiter = self.context.failure_limiter
        address = info.address
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
        settings = self.settings
        transport = WebSocketMessages(ws, info, send_timeout=settings.idle_timeout_seconds)
        session = IngestSession(settings, info, source=admission.source, grant=admission.grant,
                                now=trio.current_time())  # fmt: skip
        connection = Connection(
            transport, session, self.context.writer, self._loop_settings,
            lifecycle=self.context.lifecycle, log=log, info=info,
            decode_threads=self._decode_threads,
        )  # fmt: skip
        ending = await connection.run()
        if transport.send_failure is not None:
            # An answer could not be sent: the client is gone, or reads nothing.
            return transport.send_failure
        if ending.cause is Cause.SHUTDOWN:
            return CLOSE_GOING_AWAY, SHUTTING_DOWN
        if ending.cause is Cause.PEER_CLOSED:
            return transport.peer_close_code or CLOSE_NORMAL, ""
        return CLOSE_NORMAL, ending.reason

    # -- tail -----------------------------------------------------------------------

    async def _tail(
        self, ws: WebSocketConnection, info: ConnectionInfo, admission: _Admission
    ) -> tuple[int, str]:
        settings = self.settings
        with self.hub.subscribe(admission.tail_filter, settings.tail_queue_events) as sub:
            outcome = await serve_tail(
                ws, sub, self.context.lifecycle, settings.idle_timeout_seconds
            )
        if sub.dropped_total:
            log.info("websocket.tail_dropped", peer=info.peer, events=sub.dropped_total)
        return outcome


def websocket_handler(
    settings: WebSocketListenerConfig, context: ServiceContext
) -> WebSocketHandler:
    """The connection handler of one WebSocket listener (tokens from the service context)."""
    return WebSocketHandler(settings, context, tokens=context.tokens)
