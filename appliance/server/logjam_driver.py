"""The Logjam listener: ZeroMQ ROUTER and PULL sockets driven from trio, CURVE via ZAP.

How the sockets meet trio (docs/logjam.md, "Sockets and trio"): every socket
is used only from the trio thread. A reader task waits on the socket's file
descriptor with :func:`trio.lowlevel.wait_readable` and then drains while
``ZMQ_EVENTS`` reports ``POLLIN``. ZeroMQ's descriptor is edge-triggered and
any send or ``EVENTS`` query may consume the edge, so a reply sent by another
task wakes the reader (:meth:`_Pump.poke`) to look again, and the wait
re-checks ``EVENTS`` every ``FD_RECHECK_SECONDS`` as a second guard. No
message crosses a thread, a slow writer stops the reader (libzmq then queues
up to ``rcvhwm`` messages per peer and TCP pushes back), and shutdown is a
trio cancel.

What each message becomes (one row per data message, :func:`message_block`):

* ``tag``: the topic; ``host``: the body's ``host`` when it is a string;
* ``source``: the CURVE key's name (the ZAP user id), ``anonymous`` without CURVE;
* ``peer``: ZeroMQ's ``Peer-Address`` of the message;
* event time: the body's ``started_ms`` (a Logjam request's start, in ms)
  when it is an integer, else the meta frame's ``created_ms``; 0 or an
  out-of-range value means the receive time;
* ``record``: the JSON body, plus ``"_logjam": {"app_env", "device",
  "sequence", "created_ms"}`` so the app-env survives into the table;
* ``batch_id``: app-env, device, sequence, created_ms and a digest of topic
  and body: the writer acknowledges a resent message again without a second row.

Replies (ack after commit): a request's ``202 Accepted`` goes out once its row
is committed, a ``400 Bad Request`` or a ping's ``200 OK`` at once, but always
in the order the peer sent its messages. At most ``max_pending_replies``
requests wait for their commit; past that the listener stops reading.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import trio
import zmq
import zmq.auth
from zmq.utils import z85

from appliance.config import LogjamListenerConfig
from appliance.lake.rows import RowBlock
from appliance.lake.writer import CommitTicket, LakeWriter
from appliance.logs import get_logger
from appliance.protocols.logjam import (
    DataMessage,
    LogjamReceiver,
    MalformedMessage,
    Ping,
    Route,
    accepted_frames,
    pong_frames,
)
from appliance.records import record_json
from appliance.server.context import ServiceContext
from auth.errors import AuthError
from auth.ratelimit import FailureLimiter

if TYPE_CHECKING:
    from auth.curve import ServerKeypair

__all__ = [
    "FD_RECHECK_SECONDS",
    "INLINE_DECODE_BYTES",
    "REPLY_LINGER_SECONDS",
    "LogjamPorts",
    "message_block",
    "serve_logjam",
]

log = get_logger("logjam")

#: Longest wait on a socket's descriptor before ``ZMQ_EVENTS`` is asked again.
FD_RECHECK_SECONDS: Final = 1.0
#: Messages larger than this (all frames) are decoded in a worker thread, so a
#: big body never stalls the event loop.
INLINE_DECODE_BYTES: Final = 64 * 1024
#: Seconds the last replies may take to leave when the listener closes.
REPLY_LINGER_SECONDS: Final = 2.0
#: A ZAP handler bound here answers every CURVE handshake of the context.
_ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
#: Largest event time in ms whose nanoseconds fit the table's int64.
_MAX_EVENT_MS: Final = (2**63 - 1) // 1_000_000
_ANONYMOUS: Final = "anonymous"

SocketKind = Literal["router", "pull"]


@dataclass(frozen=True, slots=True)
class LogjamPorts:
    """What a started listener reports."""

    router: int
    #: None when ``pull_bind`` is off.
    pull: int | None
    #: The server's CURVE public key (Z85), None without CURVE.
    server_public_key: str | None


# -- rows ----------------------------------------------------------------------------


def _event_ms(message: DataMessage) -> int | None:
    started = message.record.get("started_ms")
    if type(started) is int and 0 < started <= _MAX_EVENT_MS:
        return started
    created = message.meta.created_ms
    return created if 0 < created <= _MAX_EVENT_MS else None


def message_block(message: DataMessage, *, source: str, peer: str, received_at_ns: int) -> RowBlock:
    """The one row of a data message."""
    record = dict(message.record)
    record["_logjam"] = {
        "app_env": message.app_env,
        "device": message.meta.device,
        "sequence": message.meta.sequence,
        "created_ms": message.meta.created_ms,
    }
    text = record_json(record)
    host = record.get("host")
    event_ms = _event_ms(message)
    return RowBlock(
        protocol="logjam",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=message.batch_id,
        tag=message.topic,
        host=host if isinstance(host, str) and host else None,
        times_ns=[event_ms * 1_000_000 if event_ms is not None else None],
        records=[text],
        nbytes=len(text) + 96,
    )


# -- sockets in trio -----------------------------------------------------------------


class _Pump:
    """One ZeroMQ socket driven from trio: edge-triggered FD, drained by ``EVENTS``."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self._fd = sock.FD
        self._waiting: trio.CancelScope | None = None

    def try_receive(self) -> list[zmq.Frame] | None:
        """The next message's frames if one is queued (not copied: their metadata is read)."""
        if int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                return self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
        return None

    async def receive(self) -> list[zmq.Frame]:
        """The next message's frames, waiting for one."""
        while True:
            frames = self.try_receive()
            if frames is not None:
                return frames
            with trio.move_on_after(FD_RECHECK_SECONDS) as self._waiting:
                await trio.lowlevel.wait_readable(self._fd)
            self._waiting = None

    def poke(self) -> None:
        """Make a waiting :meth:`receive` look at ``EVENTS`` again (after a send)."""
        if self._waiting is not None:
            self._waiting.cancel()

    def send(self, frames: Sequence[bytes]) -> str | None:
        """Send without blocking; the reason it could not be sent, or None."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return "the peer's reply queue is full (sndhwm)"
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return "the peer is gone"
            raise
        finally:
            self.poke()
        return None

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        self.sock.close(linger=int(REPLY_LINGER_SECONDS * 1000))


def _property(frame: zmq.Frame, name: str) -> str:
    try:
        value = frame.get(name)
    except zmq.ZMQError:
        return ""
    return value if isinstance(value, str) else ""


# -- CURVE authentication --------------------------------------------------------------


class _Zap(zmq.auth.Authenticator):
    """The context's ZAP handler: CURVE keys checked in the auth database at every handshake.

    zmq.auth's :class:`~zmq.auth.Authenticator` speaks ZAP; this subclass is
    driven by a trio task (:meth:`run`), looks the key up in a worker thread,
    and names the peer by its key's name (the ZAP user id, which becomes the
    message's ``User-Id`` property and so the row's ``source``).
    """

    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        lookup: Callable[[str], str | None],
        *,
        listener: str,
        auth_threads: trio.CapacityLimiter,
        failures: FailureLimiter,
    ) -> None:
        super().__init__(context=zctx, log=logging.getLogger("appliance.logjam.zap"))
        self._lookup = lookup
        self._listener = listener
        self._auth_threads = auth_threads
        self._failures = failures
        self._address = ""
        self._names: dict[bytes, str] = {}
        self.configure_curve_callback(domain=listener, credentials_provider=self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    async def callback(self, domain: str, key: bytes) -> bool:
        """Whether the Z85 public ``key`` belongs to an active CURVE key."""
        address = self._address
        public_key = key.decode("ascii")
        now = trio.current_time()
        wait = self._failures.retry_after(address, now)
        if wait > 0:
            log.warning("curve.refused", listener=self._listener, peer=address,
                        reason=f"failure backoff, {wait:.1f}s left")  # fmt: skip
            return False
        try:
            name = await trio.to_thread.run_sync(
                self._lookup, public_key, limiter=self._auth_threads
            )
        except AuthError as exc:
            log.error("curve.lookup_failed", listener=self._listener, peer=address, reason=str(exc))
            return False
        if name is None:
            backoff = self._failures.failure(address, trio.current_time())
            log.warning("curve.refused", listener=self._listener, peer=address,
                        public_key=public_key, reason="unknown or revoked key",
                        backoff_seconds=round(backoff, 3))  # fmt: skip
            return False
        self._failures.success(address)
        self._names[z85.decode(key)] = name
        log.info("curve.accepted", listener=self._listener, peer=address, source=name)
        return True

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._names.pop(client_public_key, _ANONYMOUS)

    def start(self) -> None:
        """Bind the handler (inproc), so every CURVE handshake of the context reaches it."""
        super().start()
        assert self.zap_socket is not None
        self.zap_socket.set(zmq.LINGER, 0)

    async def serve(self) -> None:
        """Answer ZAP requests until cancelled (:meth:`start` has bound the handler)."""
        assert self.zap_socket is not None
        pump = _Pump(self.zap_socket)
        try:
            while True:
                frames = await pump.receive()
                await self.handle_zap_message([f.bytes for f in frames])
        finally:
            trio.lowlevel.notify_closing(self.zap_socket.FD)


# -- replies ---------------------------------------------------------------------------


class _Replies:
    """Replies in each peer's order; a 202 waits for its commit, at most ``limit`` waiting."""

    def __init__(self, pump: _Pump, nursery: trio.Nursery, limit: int, listener: str) -> None:
        self._pump = pump
        self._nursery = nursery
        self._permits = trio.Semaphore(limit)
        self._listener = listener
        #: Per routing id: set once the last reply queued for it has gone.
        self._tails: dict[bytes, trio.Event] = {}
        self.sent = 0
        self.unsent = 0

    async def reserve(self) -> None:
        """Take a reply slot; waits (and so stops the reader) while all are taken."""
        await self._permits.acquire()

    def release(self) -> None:
        """Give back a slot that will not be used."""
        self._permits.release()

    def queue(self, route: Route, frames: list[bytes], ticket: CommitTicket | None) -> None:
        """Send ``frames`` after the peer's earlier replies (and after ``ticket`` commits)."""
        previous = self._tails.get(route.identity)
        done = trio.Event()
        self._tails[route.identity] = done
        if previous is None and ticket is None:
            self._finish(route, frames, done)
            return
        self._nursery.start_soon(self._later, route, frames, ticket, previous, done)

    async def _later(
        self,
        route: Route,
        frames: list[bytes],
        ticket: CommitTicket | None,
        previous: trio.Event | None,
        done: trio.Event,
    ) -> None:
        try:
            if previous is not None:
                await previous.wait()
            if ticket is not None and not await ticket.wait():
                # Shut down before the commit: no 202 for what is not in the table.
                self.unsent += 1
                log.info("reply.withheld", listener=self._listener, reason="not committed")
                frames = []
        finally:
            self._finish(route, frames, done)

    def _finish(self, route: Route, frames: list[bytes], done: trio.Event) -> None:
        try:
            if frames:
                problem = self._pump.send(frames)
                if problem is None:
                    self.sent += 1
                else:
                    self.unsent += 1
                    log.warning("reply.undeliverable", listener=self._listener, reason=problem)
        finally:
            done.set()
            if self._tails.get(route.identity) is done:
                del self._tails[route.identity]
            self._permits.release()


# -- the listener ------------------------------------------------------------------------


def _endpoint(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port if port else '*'}"


def _bound_port(sock: zmq.Socket[bytes]) -> int:
    endpoint = sock.get_string(zmq.LAST_ENDPOINT)
    return int(endpoint.rsplit(":", 1)[1])


class _Listener:
    """The sockets, ZAP handler and tasks of one Logjam listener."""

    def __init__(
        self,
        settings: LogjamListenerConfig,
        context: ServiceContext,
        zctx: zmq.Context[zmq.Socket[bytes]],
        keypair: ServerKeypair | None,
        fqdn: str,
    ) -> None:
        self.settings = settings
        self.context = context
        self.writer: LakeWriter = context.writer
        self.zctx = zctx
        self.keypair = keypair
        self.fqdn = fqdn
        self.receiver = LogjamReceiver(settings.limits())
        self.decode_threads = trio.CapacityLimiter(1)
        self.stats = {"messages": 0, "rows": 0, "malformed": 0, "pings": 0}

    def socket(self, kind: int, host: str, port: int) -> zmq.Socket[bytes]:
        """A configured socket, bound; OSError when the address cannot be bound."""
        s = self.settings
        sock: zmq.Socket[bytes] = self.zctx.socket(kind)
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
        if self.keypair is not None:
            sock.set(zmq.ZAP_DOMAIN, s.name.encode("utf-8"))
            # No ZAP handler must mean no connection, never an unchecked one.
            sock.set(zmq.ZAP_ENFORCE_DOMAIN, 1)
            sock.set(zmq.CURVE_SERVER, 1)
            sock.set(zmq.CURVE_SECRETKEY, self.keypair.secret)
        endpoint = _endpoint(host, port)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise OSError(
                exc.errno, f"logjam listener {s.name}: cannot bind {endpoint}: {exc.strerror}"
            ) from None
        return sock

    def decode(self, kind: SocketKind, frames: list[bytes]) -> DataMessage | Ping:
        if kind == "router":
            return self.receiver.receive_router(frames)
        return self.receiver.receive_pull(frames)

    async def read(self, kind: SocketKind, pump: _Pump, replies: _Replies | None) -> None:
        """Read, decode and submit until shutdown stops reading or the writer closes."""
        lifecycle = self.context.lifecycle
        with lifecycle.reading():
            while True:
                # Queued messages are taken without a wait (and its cancel scopes).
                frames = pump.try_receive() if not lifecycle.stopping else None
                if frames is not None:
                    await trio.lowlevel.checkpoint()  # a flood must not starve the other tasks
                else:
                    with lifecycle.receiving() as receiving:
                        frames = await pump.receive()
                    if receiving.cancelled_caught:
                        return
                try:
                    await self.handle(kind, frames, replies)
                except trio.ClosedResourceError:
                    return  # the writer takes no more rows

    async def handle(
        self, kind: SocketKind, zframes: list[zmq.Frame], replies: _Replies | None
    ) -> None:
        received_at_ns = time.time_ns()
        self.stats["messages"] += 1
        last = zframes[-1]
        peer = _property(last, "Peer-Address")
        source = (_property(last, "User-Id") or _ANONYMOUS) if self.keypair else _ANONYMOUS
        frames = [f.bytes for f in zframes]
        reserved = False
        if replies is not None and len(frames) >= 2 and not frames[1]:
            await replies.reserve()
            reserved = True
        try:
            try:
                event = await self._decode(kind, frames)
            except MalformedMessage as exc:
                self.stats["malformed"] += 1
                log.warning("message.malformed", listener=self.settings.name, socket=kind,
                            peer=peer, source=source, reason=exc.reason,
                            reply="400" if exc.reply_frames else "none")  # fmt: skip
                if replies is not None and exc.reply_frames and exc.route is not None:
                    reserved = False
                    replies.queue(exc.route, exc.reply_frames, None)
                return
            if isinstance(event, Ping):
                self.stats["pings"] += 1
                assert replies is not None
                reserved = False
                replies.queue(event.route, pong_frames(event.route, self.fqdn), None)
                return
            block = message_block(event, source=source, peer=peer, received_at_ns=received_at_ns)
            ticket = await self.writer.submit(block)
            self.stats["rows"] += 1
            if event.route is not None and event.route.reply:
                assert replies is not None
                reserved = False
                replies.queue(event.route, accepted_frames(event.route), ticket)
        finally:
            if reserved and replies is not None:
                replies.release()

    async def _decode(self, kind: SocketKind, frames: list[bytes]) -> DataMessage | Ping:
        if sum(map(len, frames)) <= INLINE_DECODE_BYTES:
            return self.decode(kind, frames)
        return await trio.to_thread.run_sync(self.decode, kind, frames, limiter=self.decode_threads)


def _curve_lookup(
    state_dir: Path, auth_database_url: str | None
) -> tuple[Callable[[str], str | None], Callable[[], None]]:
    """The key look-up of the ZAP handler and its closer; prepares the schema (blocking)."""
    from auth import schema
    from auth.curve import CurveKeyStore

    # The same rule as the service: only the embedded default upgrades itself.
    url = auth_database_url or f"sqlite:///{state_dir / 'auth' / 'auth.db'}"
    schema.prepare(url, upgrade_in_place=auth_database_url is None)
    store = CurveKeyStore(url)
    return store.active_name, store.close


async def serve_logjam(
    listener: LogjamListenerConfig,
    context: ServiceContext,
    state_dir: Path,
    *,
    auth_database_url: str | None = None,
    task_status: trio.TaskStatus[LogjamPorts] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one Logjam listener until shutdown stops reading and its replies are sent.

    With ``listener.curve`` the server keypair is created under
    ``<state_dir>/curve`` on first start and client keys are checked in the
    auth database: ``auth_database_url``, or the embedded SQLite database under
    ``state_dir`` (upgraded in place) when None. Reports the bound ports.

    Raises:
        OSError: an address cannot be bound.
        auth.errors.AuthError: the auth database is unreachable or behind.
    """
    from auth.curve import ensure_server_keypair

    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pumps: list[_Pump] = []
    closers: list[Callable[[], None]] = []
    try:
        keypair: ServerKeypair | None = None
        if listener.curve:
            keypair = await trio.to_thread.run_sync(ensure_server_keypair, state_dir)
        fqdn: str = listener.self_hostname or ""
        if not fqdn:
            fqdn = await trio.to_thread.run_sync(socket.getfqdn)
        runner = _Listener(listener, context, zctx, keypair, fqdn)
        zap: _Zap | None = None
        if keypair is not None:
            lookup, close_store = await trio.to_thread.run_sync(
                _curve_lookup, state_dir, auth_database_url
            )
            closers.append(close_store)
            zap = _Zap(zctx, lookup, listener=listener.name, auth_threads=context.auth_threads,
                       failures=context.failure_limiter)  # fmt: skip
            # Bound before the listening sockets: no handshake can happen without it.
            zap.start()
            closers.append(zap.stop)
        router = _Pump(runner.socket(zmq.ROUTER, listener.host, listener.port))
        pumps.append(router)
        pull: _Pump | None = None
        if listener.pull_host is not None and listener.pull_port is not None:
            pull = _Pump(runner.socket(zmq.PULL, listener.pull_host, listener.pull_port))
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
            async with trio.open_nursery() as reply_tasks:
                replies = _Replies(router, reply_tasks, listener.max_pending_replies, listener.name)
                async with trio.open_nursery() as readers:
                    readers.start_soon(runner.read, "router", router, replies)
                    if pull is not None:
                        readers.start_soon(runner.read, "pull", pull, None)
                # Reading has stopped: the replies wait for their commits, then go.
            outer.cancel_scope.cancel()  # the ZAP handler
        log.info("listener.closed", listener=listener.name, replies=replies.sent,
                 unsent=replies.unsent, **runner.stats)  # fmt: skip
    finally:
        for pump in pumps:
            pump.close()
        for close in closers:
            close()
        with trio.CancelScope(shield=True):
            # Bounded by the sockets' linger: the last replies leave, then libzmq stops.
            await trio.to_thread.run_sync(zctx.term)
