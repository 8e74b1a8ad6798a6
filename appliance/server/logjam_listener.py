"""The Logjam listener: a ROUTER and an optional PULL socket in the answering loop, CURVE via ZAP.

Each socket is one connection of the answering loop
(:mod:`appliance.server.connection`): its messages come through
:class:`~appliance.server.transports.zeromq.ZeroMQFrames` and the
:class:`~appliance.server.sessions.logjam.LogjamSession` (which says what a
message becomes and how it is answered); each peer of the ROUTER socket is a
lane of its own. At most ``max_pending_replies`` replies of all peers wait;
past that the listener stops reading (libzmq queues up to ``rcvhwm``
messages per peer and TCP pushes back). ZeroMQ has no idle or request
deadlines of the loop's: ``handshake_timeout_seconds`` and the heartbeat
settings are libzmq's own, per connection.

With ``curve`` the server's keypair is created under ``<state_dir>/curve`` on
first start and each client's key is checked in the auth database by the
context's ZAP handler (:mod:`appliance.server.zap`), bound before the
listening sockets so no handshake can happen without it. Without it the
sockets speak plain ZMTP, and the listener says so in its log. A key
revoked while its peers stay connected is found by the service's checks of
open connections (:mod:`appliance.server.revocation`, through the ZAP
handler), and both sockets' sessions drop its messages from then on.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio
import zmq

from appliance.config import LogjamListenerConfig, settings_from
from appliance.logs import get_logger
from appliance.metrics import ListenerMetrics
from appliance.protocols.logjam import LogjamLimits, LogjamReceiver
from appliance.server.connection import Connection, DriverSettings
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.logjam import INLINE_DECODE_BYTES, LogjamSession, SocketKind
from appliance.server.transports.zeromq import REPLY_LINGER_SECONDS, Pump, ZeroMQFrames, ZmqMessage
from appliance.server.zap import ZapHandler
from auth.settings import AuthSettings

if TYPE_CHECKING:
    from auth.curve import ServerKeypair

__all__ = ["LogjamPorts", "serve_logjam"]

log = get_logger("logjam")


@dataclass(frozen=True, slots=True)
class LogjamPorts:
    """What a started listener reports."""

    router: int
    #: None when ``pull_bind`` is off.
    pull: int | None
    #: The server's CURVE public key (Z85), None without CURVE.
    server_public_key: str | None


def _endpoint(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port if port else '*'}"


def _bound_port(sock: zmq.Socket[bytes]) -> int:
    endpoint = sock.get_string(zmq.LAST_ENDPOINT)
    return int(endpoint.rsplit(":", 1)[1])


def _socket(
    zctx: zmq.Context[zmq.Socket[bytes]],
    s: LogjamListenerConfig,
    keypair: ServerKeypair | None,
    kind: int,
    host: str,
    port: int,
) -> zmq.Socket[bytes]:
    """A configured socket, bound; OSError when the address cannot be bound."""
    sock: zmq.Socket[bytes] = zctx.socket(kind)
    sock.set(zmq.RCVHWM, s.rcvhwm)
    sock.set(zmq.SNDHWM, s.sndhwm)
    sock.set(zmq.MAXMSGSIZE, s.max_message_bytes)
    sock.set(zmq.HANDSHAKE_IVL, int(s.handshake_timeout_seconds * 1000))
    sock.set(zmq.HEARTBEAT_IVL, int(s.heartbeat_interval_seconds * 1000))
    sock.set(zmq.HEARTBEAT_TIMEOUT, int(s.heartbeat_timeout_seconds * 1000))
    sock.set(zmq.LINGER, int(REPLY_LINGER_SECONDS * 1000))
    if ":" in host:
        sock.set(zmq.IPV6, 1)
    if kind == zmq.ROUTER:
        sock.set(zmq.ROUTER_MANDATORY, 1)
    if keypair is not None:
        sock.set(zmq.ZAP_DOMAIN, s.name.encode("utf-8"))
        # No ZAP handler must mean no connection, never an unchecked one.
        sock.set(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.set(zmq.CURVE_SERVER, 1)
        sock.set(zmq.CURVE_SECRETKEY, keypair.secret)
    endpoint = _endpoint(host, port)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise OSError(
            exc.errno, f"logjam listener {s.name}: cannot bind {endpoint}: {exc.strerror}"
        ) from None
    return sock


@dataclass(slots=True)
class _Socket:
    """One socket of the listener in the loop, and what its close line reports."""

    transport: ZeroMQFrames
    session: LogjamSession
    connection: Connection[ZmqMessage, list[bytes]]


class _SocketFactory:
    """Builds each socket's transport, session and loop; the decoder and its thread are shared."""

    def __init__(
        self,
        settings: LogjamListenerConfig,
        context: ServiceContext,
        metrics: ListenerMetrics,
        curve: bool,
        fqdn: str,
        revoked: set[str],
    ) -> None:
        self._settings = settings
        self._context = context
        self._metrics = metrics
        self._curve = curve
        self._fqdn = fqdn
        self._revoked = revoked
        self._receiver = LogjamReceiver(settings_from(settings, LogjamLimits))
        #: One message decodes in a worker thread at a time per listener.
        self._decode_threads = trio.CapacityLimiter(1)
        self._loop = DriverSettings(
            idle_timeout_seconds=math.inf,  # libzmq's heartbeats watch the peers
            max_pending_acks=settings.max_pending_replies,
            read_size_bytes=settings.read_size_bytes,
            inline_decode_max_bytes=INLINE_DECODE_BYTES,
        )

    def __call__(self, kind: SocketKind, pump: Pump) -> _Socket:
        name = self._settings.name
        transport = ZeroMQFrames(pump, listener=name, log=log, metrics=self._metrics)
        session = LogjamSession(kind, self._receiver, listener=name, curve=self._curve,
                                fqdn=self._fqdn, metrics=self._metrics,
                                revoked=self._revoked)  # fmt: skip
        # A socket's peers are many: its logs name the socket.
        info = ConnectionInfo(name, kind, None, tls=False, metrics=self._metrics)
        connection: Connection[ZmqMessage, list[bytes]] = Connection(
            transport, session, self._context.writer, self._loop,
            lifecycle=self._context.lifecycle, log=log, info=info,
            decode_threads=self._decode_threads,
        )  # fmt: skip
        return _Socket(transport, session, connection)


async def _serve_sockets(sockets: list[_Socket]) -> None:
    """Run each socket's loop until reading stops and its replies have gone."""
    async with trio.open_nursery() as nursery:
        for item in sockets:
            nursery.start_soon(item.connection.run)


def _closed_line(listener: str, sockets: list[_Socket]) -> dict[str, object]:
    tallies = [item.connection.tally for item in sockets]
    stats = [item.session.stats for item in sockets]
    return {
        "listener": listener,
        "replies": sum(item.transport.sent for item in sockets),
        "unsent": sum(item.transport.unsent for item in sockets) + sum(t.withheld for t in tallies),
        "refused_at_commit": sum(t.refused_at_commit for t in tallies),
        "messages": sum(s.messages for s in stats),
        "rows": sum(t.batches for t in tallies),
        "malformed": sum(s.malformed for s in stats),
        "pings": sum(s.pings for s in stats),
        "refused": sum(t.refused for t in tallies),
        "hosts_dropped": sum(s.hosts_dropped for s in stats),
        "failed": sum(s.failed for s in stats),
        "revoked": sum(s.revoked for s in stats),
    }


def _curve_lookup(
    auth: AuthSettings,
) -> tuple[Callable[[str], str | None], Callable[[], None]]:
    """The key look-up of the ZAP handler and its closer; checks the schema (blocking)."""
    from auth.database import open_database

    database = open_database(auth)
    return database.curve_keys.active_name, database.close


async def serve_logjam(
    listener: LogjamListenerConfig,
    context: ServiceContext,
    state_dir: Path,
    *,
    auth: AuthSettings | None = None,
    task_status: trio.TaskStatus[LogjamPorts] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one Logjam listener until shutdown stops reading and its replies are sent.

    With ``listener.curve`` the server keypair is created under
    ``<state_dir>/curve`` on first start and client keys are checked in the
    auth database of ``auth``, or (None) the embedded SQLite database under
    ``state_dir``, upgraded in place. Reports the bound ports.

    Raises:
        OSError: an address cannot be bound.
        auth.errors.AuthError: the auth database is unreachable or behind.
    """
    from auth.curve import ensure_server_keypair

    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pumps: list[Pump] = []
    closers: list[Callable[[], None]] = []
    try:
        keypair: ServerKeypair | None = None
        if listener.curve:
            keypair = await trio.to_thread.run_sync(ensure_server_keypair, state_dir)
        fqdn: str = listener.self_hostname or ""
        if not fqdn:
            fqdn = await trio.to_thread.run_sync(socket.getfqdn)
        metrics = context.metrics.listener(listener.name, "logjam")
        zap: ZapHandler | None = None
        # CURVE user ids revoked while connected: their messages are dropped.
        revoked: set[str] = set()
        if keypair is not None:
            lookup, close_store = await trio.to_thread.run_sync(
                _curve_lookup, auth or AuthSettings.under(state_dir)
            )
            closers.append(close_store)
            zap = ZapHandler(zctx, lookup, listener=listener.name,
                             auth_threads=context.auth_threads,
                             failures=context.failure_limiter, metrics=metrics,
                             connections=context.connections, revoked=revoked)  # fmt: skip
            # Bound before the listening sockets: no handshake can happen without it.
            zap.start()
            closers.append(zap.stop)
        router = Pump(_socket(zctx, listener, keypair, zmq.ROUTER, listener.host, listener.port))
        pumps.append(router)
        pull: Pump | None = None
        if listener.pull_host is not None and listener.pull_port is not None:
            pull = Pump(
                _socket(zctx, listener, keypair, zmq.PULL, listener.pull_host, listener.pull_port)
            )
            pumps.append(pull)
        async with trio.open_nursery() as outer:
            if zap is not None:
                outer.start_soon(zap.serve)
            ports = LogjamPorts(
                router=_bound_port(router.sock),
                pull=_bound_port(pull.sock) if pull is not None else None,
                server_public_key=keypair.public.decode("ascii") if keypair else None,
            )
            if keypair is None:
                log.warning("listener.plaintext", listener=listener.name, bind=listener.bind,
                            reason="curve = false: plain ZMTP, no encryption")  # fmt: skip
            log.info("listener.ready", listener=listener.name, protocol="logjam",
                     router=ports.router, pull=ports.pull, curve=keypair is not None)  # fmt: skip
            task_status.started(ports)
            new = _SocketFactory(listener, context, metrics, keypair is not None, fqdn, revoked)
            sockets = [new("router", router)]
            if pull is not None:
                sockets.append(new("pull", pull))
            # Until reading stops; then the replies wait for their commits, and go.
            await _serve_sockets(sockets)
            outer.cancel_scope.cancel()  # the ZAP handler
        log.info("listener.closed", **_closed_line(listener.name, sockets))
    finally:
        for pump in pumps:
            pump.close()
        for close in closers:
            close()
        with trio.CancelScope(shield=True):
            # Bounded by the sockets' linger: the last replies leave, then libzmq stops.
            await trio.to_thread.run_sync(zctx.term)
