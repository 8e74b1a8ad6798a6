"""The Fluentd forward session: handshake, codec events to rows, acks and logs.

Transport, deadlines and ordered acks are the answering loop's
(:mod:`appliance.server.connection`, :mod:`appliance.server.transports.stream`);
parsing and digests are the codec's (:mod:`appliance.protocols.forward`,
:mod:`appliance.protocols.forward_handshake`); the rows are
:mod:`appliance.rows.forward`'s. This module ties them together
and, with ``security`` on, asks the credential store (in a worker
thread, at every PING, so CLI changes apply to the next connection) and the
failure limiter.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from functools import partial

import trio

from appliance.config import ForwardListenerConfig, settings_from
from appliance.logs import get_logger
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.forward import (
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    PingReceived,
)
from appliance.protocols.forward_handshake import (
    AUTH_SALT_BYTES,
    NONCE_BYTES,
    Helo,
    Verdict,
    anonymous_denied_reason,
)
from appliance.rows.forward import forward_block
from appliance.server.connection import Action, Arrival, Await, DriverSettings, Reply, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ANONYMOUS, ConnectionInfo
from appliance.server.transports.stream import ByteStreamSession, StreamHandler, close_for
from auth.errors import AuthError
from auth.policy import CredentialStore
from auth.ratelimit import FailureLimiter, LimiterSettings

__all__ = ["ForwardSession", "forward_handler"]

log = get_logger("forward")


@dataclass(frozen=True, slots=True)
class _Security:
    store: CredentialStore
    limiter: FailureLimiter
    users_required: bool
    allow_anonymous_source: bool
    server_hostname: str
    thread_limiter: trio.CapacityLimiter


class ForwardSession(ByteStreamSession):
    """One forward connection: the codec, its handshake, and what its events become."""

    def __init__(
        self, settings: ForwardListenerConfig, info: ConnectionInfo, security: _Security | None
    ) -> None:
        self._info = info
        self._security = security
        helo = None
        if security is not None:
            auth_salt = os.urandom(AUTH_SALT_BYTES) if security.users_required else b""
            helo = Helo(os.urandom(NONCE_BYTES), auth_salt, keepalive=True)
        self._codec = ForwardServerConnection(
            settings_from(settings, ForwardLimits), allow_json=True, helo=helo
        )
        self._host: str | None = None

    def greeting(self) -> bytes | None:
        return self._codec.helo_bytes() if self._security is not None else None

    def handshake_done(self) -> bool:
        return self._codec.state not in (ForwardState.AWAITING_PING, ForwardState.AUTHENTICATING)

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished request the codec holds (also those held while
        the PING is checked); 0 between requests."""
        return self._codec.buffered_bytes

    def completes_nothing(self, data: bytes | bytearray) -> bool:
        """What the codec's PackedForward header says: ``data`` leaves the request short."""
        return self._codec.completes_nothing(data)

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        """The actions of the requests ``data`` completes (a violation's Close last)."""
        # No trio here: the loop may run this in a worker thread (one at a time).
        return self._actions(self._codec.receive_data(data), arrival.time_ns)

    def _actions(self, events: list[ForwardEvent], received_at_ns: int) -> list[Action[bytes]]:
        actions: list[Action[bytes]] = []
        for event in events:
            if isinstance(event, ProtocolViolation):
                actions.append(close_for(event))
                continue  # the codec's last event
            if isinstance(event, PingReceived):
                actions.append(Await(partial(self._authenticate, event, received_at_ns)))
                continue
            if not isinstance(event, EventsReceived):
                continue  # heartbeat
            chunk = event.chunk.text() if event.chunk is not None else None
            if event.dropped:
                log.warning(
                    "events.dropped",
                    peer=self._info.peer,
                    tag=event.tag,
                    chunk=chunk,
                    dropped=sum(event.dropped.values()),
                    reasons=event.dropped,
                )
                for reason, count in event.dropped.items():
                    self._info.metrics.events_dropped(reason, count)
            ack = self._codec.ack_bytes(event.chunk, json_form=event.json) if event.chunk else None
            block = forward_block(
                event,
                source=self._info.source,
                peer=self._info.peer,
                received_at_ns=received_at_ns,
                host=self._host,
            )
            actions.append(Submit(block, ack, chunk))
        return actions

    async def _authenticate(self, event: PingReceived, received_at_ns: int) -> list[Action[bytes]]:
        security = self._security
        assert security is not None
        if self._codec.state is not ForwardState.AUTHENTICATING:
            # A guard: the codec drops a PING whose read also broke a rule.
            return []
        ping = event.ping
        address = self._info.address
        mechanism = "users" if security.users_required else "shared_key"
        # The attempt is counted before the look-up: parallel PINGs cannot
        # pass the limit while their look-ups run (auth/ratelimit.py).
        wait = security.limiter.begin(address)
        if wait > 0:
            log.warning(
                "handshake.throttled", peer=self._info.peer, retry_after_seconds=round(wait)
            )
            self._info.metrics.auth(mechanism, "throttled")
            return [
                close_for(
                    self._codec.refuse(f"too many failed handshakes; retry in {int(wait) + 1}s")
                )
            ]
        try:
            verdict = await trio.to_thread.run_sync(
                self._verdict, ping.username, address, limiter=security.thread_limiter
            )
        except AuthError as exc:
            # The credential database is down or a secret cannot be opened:
            # fail closed for this client, keep serving the others.
            security.limiter.release(address)
            log.error("handshake.unavailable", peer=self._info.peer, reason=str(exc))
            self._info.metrics.auth(mechanism, "unavailable")
            refusal = self._codec.refuse("authentication unavailable; retry later", "appliance")
            return [close_for(refusal)]
        self._info.metrics.auth(mechanism, "success" if verdict.ok else "failure")
        if not verdict.ok:
            backoff = security.limiter.failure(address)
            log.warning(
                "handshake.failed", peer=self._info.peer, client_hostname=ping.client_hostname,
                username=ping.username or None, reason=verdict.reason, backoff_seconds=backoff,
            )  # fmt: skip
        else:
            security.limiter.success(address)
            self._host = ping.client_hostname or None
            if verdict.username:
                # The authenticated user is the principal of this connection's events.
                self._info = replace(self._info, source=verdict.username)
            log.info(
                "handshake.ok", peer=self._info.peer, client_hostname=ping.client_hostname,
                username=verdict.username, source=self._info.source,
            )  # fmt: skip
        pong, events = self._codec.finish_handshake(verdict, security.server_hostname)
        return [Reply(pong), *self._actions(events, received_at_ns)]

    def _verdict(self, username: str, address: str) -> Verdict:
        """The blocking part of the handshake: database look-ups and audit (worker thread)."""
        security = self._security
        assert security is not None
        policy = security.store.resolve_source(address)
        if policy.network is None and not security.allow_anonymous_source:
            verdict = Verdict(False, anonymous_denied_reason(address))
        else:
            password = None
            if security.users_required and username:
                password = security.store.password_of(username)
            verdict = self._codec.check_ping(
                shared_keys=policy.shared_keys,
                users_required=security.users_required,
                password=password,
                allowed_users=policy.allowed_users,
                allow_anonymous=policy.allow_anonymous,
            )
        if verdict.ok:
            security.store.note_login(verdict.username, address)
            certificate = self._info.source
            if verdict.username and certificate != ANONYMOUS:
                # Both identities are kept: the user becomes the rows' source
                # (docs/auth.md, "Which identity wins"); the certificate is here.
                security.store.record_audit(
                    "auth.login", verdict.username, actor=verdict.username,
                    detail=f"certificate={certificate}", source_address=address,
                )  # fmt: skip
        else:
            reason = verdict.reason
            if verdict.detail:
                # The client got in_forward's generic reason; the audit log says which rule.
                network = policy.network or "no client network"
                reason = f"{verdict.reason}: {verdict.detail} ({network})"
            security.store.note_failure(address, username or None, reason)
        return verdict


def forward_handler(settings: ForwardListenerConfig, context: ServiceContext) -> StreamHandler:
    """The connection handler of one forward listener."""
    security: _Security | None = None
    if settings.security != "off":
        if context.credentials is None:
            raise ValueError(f"listener {settings.name}: security needs the auth database")
        security = _Security(
            store=context.credentials,
            limiter=FailureLimiter(
                LimiterSettings(
                    free_failures=settings.free_failed_handshakes,
                    base_backoff_seconds=settings.failed_handshake_backoff_seconds,
                    max_backoff_seconds=settings.failed_handshake_max_backoff_seconds,
                )
            ),
            users_required=settings.security == "users",
            allow_anonymous_source=settings.allow_anonymous_source,
            server_hostname=settings.self_hostname or socket.getfqdn(),
            thread_limiter=context.auth_threads,
        )
    return StreamHandler(
        lambda info: ForwardSession(settings, info, security),
        DriverSettings.from_listener(
            settings, handshake_timeout_seconds=settings.handshake_timeout_seconds
        ),
        context.writer,
        context.lifecycle,
        log,
    )
