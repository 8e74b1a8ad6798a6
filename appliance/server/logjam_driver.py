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

Bounded work per message (issue 13): the pump reads at most
``MAX_MESSAGE_FRAMES + 1`` frames of a message as views (no copy) and drops
the rest unread in batches of ``DISCARD_BATCH_FRAMES`` with a checkpoint
between batches, so a message of a million empty frames costs neither a
million copies nor a stalled event loop, and is refused (400 for a request).
A message is decoded on the event loop only when the codec's bound on the
bytes its decoding reads and produces (the body as *decompressed*, see
:meth:`LogjamReceiver.decode_size_bound`) is at most ``INLINE_DECODE_BYTES``;
anything larger, which for deflate is any body over about 63 bytes, is
decoded in a worker thread, one at a time per listener. (libzmq itself
holds a message's frames until its last one arrives; ``max_message_bytes``
bounds each frame, not their number, and no ZeroMQ option bounds that.)

Faults are per message: a malformed message gets its 400 (or nothing on an
async socket), a block the writer refuses (``BlockRefused``) gets a 400
and a ``message.refused`` line, and any other exception while one message
is handled is logged as ``message.failed`` with its type, counted, and the
reader goes on with the next message: no reply is sent for that message
(the client resends after its timeout).

What each message becomes (one row per data message, :func:`message_block`):

* ``tag``: the topic; ``host``: the body's ``host`` when it is a non-empty
  string that is valid UTF-8 of at most ``MAX_HOST_BYTES``; a string host
  that is not is stored as null (the record keeps it), counted in
  ``hosts_dropped`` and logged (``message.host_dropped``);
* ``source``: the CURVE key's name (the ZAP user id), ``anonymous`` without CURVE;
* ``peer``: ZeroMQ's ``Peer-Address`` of the message;
* event time: the body's ``started_ms`` (a Logjam request's start, in ms)
  when it is an integer, else the meta frame's ``created_ms``; 0 or an
  out-of-range value means the receive time;
* ``record``: the JSON body, plus ``"_logjam": {"app_env", "device",
  "sequence", "created_ms"}`` so the app-env survives into the table;
* ``batch_id``: app-env, device, sequence, created_ms and a digest of topic
  and body: the writer acknowledges a resent message again without a second row.

Replies are the spec's frames after the routing id, with no empty frame:
``[app-env]["202 Accepted"]``, ``[app-env]["400 Bad Request"]``,
``["ping"]["200 OK"][fqdn]`` (the codec's ``accepted_frames``,
``bad_request_frames``, ``pong_frames``; docs/logjam.md, "Replies").

Replies (ack after commit): a request's ``202 Accepted`` goes out once its
ticket's ``wait()`` has returned, that is once its row is committed, and
never otherwise: a refused block gets ``400 Bad Request``, and a listener
cancelled before the commit sends nothing for it. A ``400`` or a ping's
``200 OK`` goes out at once, but every reply keeps the order in which the
peer sent its messages. At most ``max_pending_replies`` requests wait for
their commit; past that the listener stops reading.
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
from appliance.lake.errors import BlockRefused
from appliance.lake.rows import RowBlock
from appliance.lake.writer import CommitTicket, LakeWriter
from appliance.logs import get_logger
from appliance.metrics import NULL_LISTENER, ListenerMetrics
from appliance.protocols.logjam import (
    MAX_MESSAGE_FRAMES,
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
from appliance.records import record_json
from appliance.server.context import ServiceContext
from appliance.server.listener import describe_failure
from appliance.timefmt import ns_in_range
from auth.errors import AuthError
from auth.ratelimit import FailureLimiter
from auth.settings import AuthSettings

if TYPE_CHECKING:
    from auth.curve import ServerKeypair

__all__ = [
    "DISCARD_BATCH_FRAMES",
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
#: Messages whose decoding may read and produce more than this many bytes (all
#: frames plus the body as decompressed: ``LogjamReceiver.decode_size_bound``)
#: are decoded in a worker thread, so no body stalls the event loop.
INLINE_DECODE_BYTES: Final = 64 * 1024
#: Frames past ``MAX_MESSAGE_FRAMES`` are dropped unread this many at a time,
#: with a trio checkpoint between batches (a count).
DISCARD_BATCH_FRAMES: Final = 1024
#: Most frames of a ZAP request read (a count): libzmq sends 7 for CURVE.
_ZAP_MAX_FRAMES: Final = 16
#: Seconds the last replies may take to leave when the listener closes.
REPLY_LINGER_SECONDS: Final = 2.0
#: A ZAP handler bound here answers every CURVE handshake of the context.
_ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
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


def _ms_to_ns(ms: object) -> int | None:
    """Epoch ms as ns when positive and within the table's int64 ns, else None."""
    if type(ms) is not int or ms <= 0:
        return None
    ns = ms * 1_000_000
    return ns if ns_in_range(ns) else None


def _event_ns(message: DataMessage) -> int | None:
    started = _ms_to_ns(message.record.get("started_ms"))
    return started if started is not None else _ms_to_ns(message.meta.created_ms)


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
    return RowBlock(
        protocol="logjam",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=message.batch_id,
        tag=message.topic,
        host=message.host,
        times_ns=[_event_ns(message)],
        records=[text],
        nbytes=len(text) + 96,
    )


# -- sockets in trio -----------------------------------------------------------------


class _Pump:
    """One ZeroMQ socket driven from trio: edge-triggered FD, drained by ``EVENTS``.

    A message is read frame by frame, at most ``max_frames + 1`` of them: a
    message with more sets :attr:`truncated`, and its other frames stay
    unread until :meth:`discard_rest` drops them.
    """

    def __init__(self, sock: zmq.Socket[bytes], max_frames: int = MAX_MESSAGE_FRAMES) -> None:
        self.sock = sock
        self._fd = sock.FD
        self._waiting: trio.CancelScope | None = None
        self._max_frames = max_frames
        #: The last message received has frames past ``max_frames + 1`` still unread.
        self.truncated = False

    def try_receive(self) -> list[zmq.Frame] | None:
        """The next message's first frames if one is queued (not copied: their metadata is read).

        libzmq delivers a message whole, so once its first frame is here every
        other one is too and the non-blocking reads of the rest cannot fail.
        """
        assert not self.truncated, "discard_rest() first"
        if not int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN:
            return None
        try:
            frames = [self.sock.recv(zmq.NOBLOCK, copy=False)]
        except zmq.Again:
            return None
        while frames[-1].more and len(frames) <= self._max_frames:
            frames.append(self.sock.recv(zmq.NOBLOCK, copy=False))
        self.truncated = frames[-1].more
        return frames

    async def discard_rest(self) -> int:
        """Drop the unread frames of a truncated message; returns how many there were.

        Linear in the frames, with a checkpoint every ``DISCARD_BATCH_FRAMES``
        so a message of millions of frames does not stall the other tasks.
        """
        dropped = 0
        while self.truncated:
            for _ in range(DISCARD_BATCH_FRAMES):
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
                dropped += 1
                if not frame.more:
                    self.truncated = False
                    break
            await trio.lowlevel.checkpoint()
        return dropped

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
            # Any other failure loses this one reply, never the listener.
            return f"send failed: {exc.strerror}"
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
        metrics: ListenerMetrics = NULL_LISTENER,
    ) -> None:
        super().__init__(context=zctx, log=logging.getLogger("appliance.logjam.zap"))
        self._lookup = lookup
        self._listener = listener
        self._auth_threads = auth_threads
        self._failures = failures
        self._metrics = metrics
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
        wait = self._failures.begin(address)  # counted before the look-up
        if wait > 0:
            log.warning("curve.refused", listener=self._listener, peer=address,
                        reason=f"failure backoff, {wait:.1f}s left")  # fmt: skip
            self._metrics.auth("curve", "throttled")
            return False
        try:
            name = await trio.to_thread.run_sync(
                self._lookup, public_key, limiter=self._auth_threads
            )
        except AuthError as exc:
            self._failures.release(address)
            log.error("curve.lookup_failed", listener=self._listener, peer=address, reason=str(exc))
            self._metrics.auth("curve", "unavailable")
            return False
        if name is None:
            backoff = self._failures.failure(address)
            log.warning("curve.refused", listener=self._listener, peer=address,
                        public_key=public_key, reason="unknown or revoked key",
                        backoff_seconds=round(backoff, 3))  # fmt: skip
            self._metrics.auth("curve", "failure")
            return False
        self._failures.success(address)
        self._metrics.auth("curve", "success")
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
        pump = _Pump(self.zap_socket, max_frames=_ZAP_MAX_FRAMES)
        try:
            while True:
                frames = await pump.receive()
                if pump.truncated:  # libzmq's own requests never are
                    await pump.discard_rest()
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
        #: Requests answered 400 because the writer refused their block.
        self.refused = 0

    async def reserve(self) -> None:
        """Take a reply slot; waits (and so stops the reader) while all are taken."""
        await self._permits.acquire()

    def release(self) -> None:
        """Give back a slot that will not be used."""
        self._permits.release()

    def queue(self, route: Route, frames: list[bytes], ticket: CommitTicket | None) -> None:
        """Send ``frames`` after the peer's earlier replies (and after ``ticket`` commits).

        With a ticket, ``frames`` (the 202) go only once ``ticket.wait()`` has
        returned; a refused ticket sends a 400 instead, and a cancelled wait
        sends nothing.
        """
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
        ready = False
        try:
            if previous is not None:
                await previous.wait()
            if ticket is not None:
                try:
                    await ticket.wait()  # returns only once the row is committed
                except BlockRefused as exc:
                    self.refused += 1
                    log.warning("message.refused", listener=self._listener, reason=exc.reason,
                                reply="400")  # fmt: skip
                    frames = bad_request_frames(route)
            # An earlier reply withheld at a stop wakes this one: a wait that
            # returned does not deliver a cancel that is already pending.
            await trio.lowlevel.checkpoint_if_cancelled()
            ready = True
        finally:
            if not ready:
                # Cancelled (the listener is stopping) before the commit or before
                # this peer's earlier reply: no reply at all, above all no 202
                # for a row that may not be in the table. The peer resends.
                self.unsent += 1
                log.info("reply.withheld", listener=self._listener, reason="not committed")
            # The slot and the peer's order are released either way.
            self._finish(route, frames if ready else [], done)

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
        self.metrics = context.metrics.listener(settings.name, "logjam")
        self.stats = {"messages": 0, "rows": 0, "malformed": 0, "pings": 0, "refused": 0,
                      "hosts_dropped": 0, "failed": 0}  # fmt: skip

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

    def decode(self, kind: SocketKind, frames: Sequence[FrameData]) -> DataMessage | Ping:
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
                # Frames past MAX_MESSAGE_FRAMES were never copied; drop them unread.
                dropped = await pump.discard_rest() if pump.truncated else 0
                try:
                    await self.handle(kind, frames, replies, dropped=dropped)
                except trio.ClosedResourceError:
                    return  # the writer takes no more rows
                except Exception as exc:  # noqa: BLE001 - the per-message boundary (module docstring)
                    # The one catch-all of the listener: whatever one message raises
                    # ends that message only. trio.Cancelled is a BaseException, not
                    # an Exception, so a shutdown still passes through.
                    self.stats["failed"] += 1
                    error, reason = describe_failure(exc)
                    log.error("message.failed", listener=self.settings.name, socket=kind,
                              error=error, reason=reason)  # fmt: skip

    async def handle(
        self,
        kind: SocketKind,
        zframes: list[zmq.Frame],
        replies: _Replies | None,
        *,
        dropped: int = 0,
    ) -> None:
        """Decode, submit and queue the reply of one message (``dropped``: frames not read)."""
        received_at_ns = time.time_ns()
        self.stats["messages"] += 1
        last = zframes[-1]
        peer = _property(last, "Peer-Address")
        source = (_property(last, "User-Id") or _ANONYMOUS) if self.keypair else _ANONYMOUS
        # Views of libzmq's buffers: the codec copies a frame once its size is checked.
        frames: list[FrameData] = [f.buffer for f in zframes]
        self.metrics.received_bytes.inc(sum(map(len, frames)))
        reserved = False
        if replies is not None and len(frames) >= 2 and len(frames[1]) == 0:
            await replies.reserve()
            reserved = True
        try:
            # Taking a reply slot never raises Cancelled (trio shields it): a
            # message read as the listener stops must not be answered either.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                event = await self._decode(kind, frames)
            except MalformedMessage as exc:
                self.stats["malformed"] += 1
                self.metrics.protocol_error(exc.reason)
                log.warning("message.malformed", listener=self.settings.name, socket=kind,
                            peer=peer, source=source, reason=exc.reason,
                            frames=len(frames) + dropped,
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
            if event.host_dropped is not None:
                self.stats["hosts_dropped"] += 1
                log.warning("message.host_dropped", listener=self.settings.name, socket=kind,
                            peer=peer, source=source, reason=event.host_dropped)  # fmt: skip
            block = message_block(event, source=source, peer=peer, received_at_ns=received_at_ns)
            # The route of a request (it wants a reply), None for async data.
            route = event.route if event.route is not None and event.route.reply else None
            try:
                ticket = await self.writer.submit(block)
            except BlockRefused as exc:
                self.stats["refused"] += 1
                log.warning("message.refused", listener=self.settings.name, socket=kind,
                            peer=peer, source=source, reason=exc.reason,
                            reply="400" if route is not None else "none")  # fmt: skip
                if route is not None and replies is not None:
                    reserved = False
                    replies.queue(route, bad_request_frames(route), None)
                return
            self.stats["rows"] += 1
            self.metrics.requests.inc()
            self.metrics.events.inc()
            if route is not None:
                assert replies is not None
                reserved = False
                replies.queue(route, accepted_frames(route), ticket)
        finally:
            if reserved and replies is not None:
                replies.release()

    async def _decode(self, kind: SocketKind, frames: list[FrameData]) -> DataMessage | Ping:
        # The bound counts the body as decompressed: 33 KB of deflate may become
        # 32 MiB, which must not be inflated and parsed on the event loop.
        if self.receiver.decode_size_bound(frames, router=kind == "router") <= INLINE_DECODE_BYTES:
            return self.decode(kind, frames)
        return await trio.to_thread.run_sync(self.decode, kind, frames, limiter=self.decode_threads)


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
                _curve_lookup, auth or AuthSettings.under(state_dir)
            )
            closers.append(close_store)
            zap = _Zap(zctx, lookup, listener=listener.name, auth_threads=context.auth_threads,
                       failures=context.failure_limiter, metrics=runner.metrics)  # fmt: skip
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
                 unsent=replies.unsent, refused_at_commit=replies.refused,
                 **runner.stats)  # fmt: skip
    finally:
        for pump in pumps:
            pump.close()
        for close in closers:
            close()
        with trio.CancelScope(shield=True):
            # Bounded by the sockets' linger: the last replies leave, then libzmq stops.
            await trio.to_thread.run_sync(zctx.term)
