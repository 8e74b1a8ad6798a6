"""The Fluentd forward session: handshake, codec events to rows, acks and logs.

Transport, deadlines and ordered acks are the answering loop's
(:mod:`appliance.server.connection`, :mod:`appliance.server.transports.stream`);
parsing and digests are the codec's (:mod:`appliance.protocols.forward`,
:mod:`appliance.protocols.forward.handshake`); the rows are
:mod:`appliance.rows.forward`'s. This module ties them together
and, with ``security`` on, asks the credential store (in a worker
thread, at every PING, so CLI changes apply to the next connection) and the
failure limiter.

Once the handshake succeeded, the connection's user (or, without one, the
shared key its PING matched) is registered as its credential
(:mod:`appliance.server.revocation`): the same look-ups and the same PING
check are made again every ``RECHECK_INTERVAL_SECONDS`` and on a reload, and
a user disabled, deleted, denied the network or given a new password, or a
shared key deleted, closes the connection (``connection.revoked``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from functools import partial

import trio

from appliance.config import ForwardListenerConfig, settings_from
from appliance.logs import get_logger
from appliance.protocols.decode_gate import Admission, DecodeGate, always
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.forward import (
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    PingReceived,
)
from appliance.protocols.forward.handshake import (
    AUTH_SALT_BYTES,
    NONCE_BYTES,
    REASON_SHARED_KEY,
    Helo,
    Verdict,
    anonymous_denied_reason,
)
from appliance.rows.forward import forward_block
from appliance.server.connection import Action, Arrival, Await, DriverSettings, Reply, Submit
from appliance.server.context import ServiceContext
from appliance.server.decode_budget import DecodeBudget, DecodeGrant
from appliance.server.listener import ANONYMOUS, ConnectionInfo
from appliance.server.revocation import Credential, Revoked
from appliance.server.transports.stream import ByteStreamSession, StreamHandler, close_for
from auth.errors import AuthError
from auth.policy import CredentialStore, SourcePolicy
from auth.ratelimit import GuessLimiter, GuessRules, LimiterSettings

__all__ = ["ForwardSession", "forward_handler"]

log = get_logger("forward")

#: Why a user's connection is closed, by the detail of the PING check that now fails.
_USER_REVOKED: dict[str, str] = {
    "unknown or disabled user": "user disabled or deleted",
    "password mismatch": "password changed",
    "user not allowed from this client network": "user no longer allowed from this client network",
}


def _key_name(policy: SourcePolicy, key: bytes | None) -> str:
    """The name of the shared key a PING matched (its scope when the store names none)."""
    if key is not None and key in policy.shared_keys:
        index = policy.shared_keys.index(key)
        if index < len(policy.shared_key_names):
            return policy.shared_key_names[index]
    return policy.network or "global"


@dataclass(frozen=True, slots=True)
class _Security:
    store: CredentialStore
    limiter: GuessLimiter
    users_required: bool
    allow_anonymous_source: bool
    server_hostname: str
    thread_limiter: trio.CapacityLimiter


class ForwardSession(ByteStreamSession):
    """One forward connection: the codec, its handshake, and what its events become.

    With a decode budget, the codec asks, before each request, the grant the
    loop handed over with the unit (``Arrival.grant``); between units (the
    handshake's verdict drains what came after the PING) a grant of the
    event loop's own small allowance.
    """

    def __init__(
        self,
        settings: ForwardListenerConfig,
        info: ConnectionInfo,
        security: _Security | None,
        decode_budget: DecodeBudget | None = None,
    ) -> None:
        self._info = info
        self._security = security
        self._budget = decode_budget
        #: The gate the codec asks now (set for each decode).
        self._gate: DecodeGate = self._loop_gate()
        helo = None
        if security is not None:
            auth_salt = os.urandom(AUTH_SALT_BYTES) if security.users_required else b""
            helo = Helo(os.urandom(NONCE_BYTES), auth_salt, keepalive=True)
        self._codec = ForwardServerConnection(
            settings_from(settings, ForwardLimits), allow_json=True, helo=helo, gate=self._admit
        )
        self._host: str | None = None
        #: The shared key the PING matched, named (set by a successful check).
        self._key_name = ""

    def _loop_gate(self) -> DecodeGate:
        return always if self._budget is None else DecodeGrant(self._budget, on_loop=True)

    def _admit(self, cost: int) -> Admission:
        return self._gate(cost)

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
        self._gate = arrival.grant or always
        try:
            return self._actions(self._codec.receive_data(data), arrival.time_ns)
        finally:
            self._gate = self._loop_gate()

    def deferred_cost(self) -> int:
        """The cost of the request the decode budget put off (0: none)."""
        return self._codec.deferred_cost

    def resume(self, arrival: Arrival) -> list[Action[bytes]]:
        """The actions of the request put off and of those after it, now that it may be decoded."""
        self._gate = arrival.grant or always
        try:
            return self._actions(self._codec.resume(), arrival.time_ns)
        finally:
            self._gate = self._loop_gate()

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
        # Counted per address, per (address, username) and per username; only
        # a username the listener checks names a count (auth/ratelimit.py).
        counted_user = ping.username if security.users_required else ""
        # The attempt is counted before the look-up: parallel PINGs cannot
        # pass the limit while their look-ups run.
        # The counts may live in a file shared by the workers (flock, pread):
        # never on the event loop.
        wait = await trio.to_thread.run_sync(
            security.limiter.begin, address, counted_user, limiter=security.thread_limiter
        )
        if wait > 0:
            log.warning(
                "handshake.throttled", peer=self._info.peer, username=counted_user or None,
                retry_after_seconds=round(wait),
            )  # fmt: skip
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
            await trio.to_thread.run_sync(
                security.limiter.release, address, counted_user, limiter=security.thread_limiter
            )
            log.error("handshake.unavailable", peer=self._info.peer, reason=str(exc))
            self._info.metrics.auth(mechanism, "unavailable")
            refusal = self._codec.refuse("authentication unavailable; retry later", "appliance")
            return [close_for(refusal)]
        self._info.metrics.auth(mechanism, "success" if verdict.ok else "failure")
        if not verdict.ok:
            backoff = await trio.to_thread.run_sync(
                security.limiter.failure, address, counted_user, limiter=security.thread_limiter
            )
            log.warning(
                "handshake.failed", peer=self._info.peer, client_hostname=ping.client_hostname,
                username=ping.username or None, reason=verdict.reason, backoff_seconds=backoff,
            )  # fmt: skip
        else:
            # Clears this (address, username) pair only: a login does not wipe
            # the failures of guesses at other users' passwords.
            await trio.to_thread.run_sync(
                security.limiter.success, address, counted_user, limiter=security.thread_limiter
            )
            self._host = ping.client_hostname or None
            if verdict.username:
                # The authenticated user is the principal of this connection's events.
                self._info = replace(self._info, source=verdict.username)
            self._watch(ping.username, verdict)
            log.info(
                "handshake.ok", peer=self._info.peer, client_hostname=ping.client_hostname,
                username=verdict.username, source=self._info.source,
            )  # fmt: skip
        self._gate = self._loop_gate()  # on the event loop: small costs only, others put off
        pong, events = self._codec.finish_handshake(verdict, security.server_hostname)
        return [Reply(pong), *self._actions(events, received_at_ns)]

    def _check(self, username: str, address: str) -> tuple[SourcePolicy, Verdict]:
        """The PING checked against the database as it is now (blocking: a worker thread)."""
        security = self._security
        assert security is not None
        policy = security.store.resolve_source(address)
        if policy.network is None and not security.allow_anonymous_source:
            return policy, Verdict(False, anonymous_denied_reason(address))
        password = None
        # The user is looked up only once the PING proved the shared key:
        # without the key, whether a username exists takes no time to tell
        # (and the store spends as long on a missing user as on one).
        if (
            security.users_required
            and username
            and self._codec.check_ping(
                shared_keys=policy.shared_keys, users_required=False, password=None
            ).ok
        ):
            password = security.store.password_of(username)
        verdict = self._codec.check_ping(
            shared_keys=policy.shared_keys,
            users_required=security.users_required,
            password=password,
            allowed_users=policy.allowed_users,
            allow_anonymous=policy.allow_anonymous,
        )
        return policy, verdict

    def _verdict(self, username: str, address: str) -> Verdict:
        """The blocking part of the handshake: database look-ups and audit (worker thread)."""
        security = self._security
        assert security is not None
        policy, verdict = self._check(username, address)
        if verdict.ok:
            self._key_name = _key_name(policy, verdict.shared_key)
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

    def _watch(self, username: str, verdict: Verdict) -> None:
        """Register what the handshake authenticated: checked again while the connection lasts."""
        guard = self._info.guard
        if guard is None:
            return
        key = f"key:{self._key_name}"
        ident = f"user:{verdict.username}" if verdict.username else key
        address = self._info.address

        def recheck() -> Revoked | None:
            _, now = self._check(username, address)
            if now.ok:
                return None
            if now.reason == REASON_SHARED_KEY:
                return Revoked(key, "shared key deleted or changed")
            if now.detail and username:
                return Revoked(f"user:{username}", _USER_REVOKED.get(now.detail, now.detail))
            if now.detail:
                return Revoked(key, "clients without a user no longer allowed from this network")
            return Revoked(ident, "source address no longer in an allowed client network")

        # Checked per connection: the PING's digests are this connection's own.
        guard.add(Credential(ident, ("forward", id(self)), recheck))


def forward_handler(settings: ForwardListenerConfig, context: ServiceContext) -> StreamHandler:
    """The connection handler of one forward listener."""
    security: _Security | None = None
    if settings.security != "off":
        if context.credentials is None:
            raise ValueError(f"listener {settings.name}: security needs the auth database")
        security = _Security(
            store=context.credentials,
            # The listener's own rules over the counts that every listener and,
            # in a service, every worker of the node share (context.guess_counts).
            limiter=GuessLimiter(
                GuessRules.of(
                    LimiterSettings(
                        free_failures=settings.free_failed_handshakes,
                        base_backoff_seconds=settings.failed_handshake_backoff_seconds,
                        max_backoff_seconds=settings.failed_handshake_max_backoff_seconds,
                    )
                ),
                context.guess_counts,
            ),
            users_required=settings.security == "users",
            allow_anonymous_source=settings.allow_anonymous_source,
            server_hostname=settings.self_hostname or socket.getfqdn(),
            thread_limiter=context.auth_threads,
        )
    budget = context.decode_budget
    return StreamHandler(
        lambda info: ForwardSession(settings, info, security, budget),
        DriverSettings.from_listener(
            settings, handshake_timeout_seconds=settings.handshake_timeout_seconds
        ),
        context.writer,
        context.lifecycle,
        log,
        decode_budget=budget,
    )
