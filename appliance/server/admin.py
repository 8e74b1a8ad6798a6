"""The admin HTTP listener (``[admin]``): ``/metrics``, ``/livez``, ``/readyz`` and ``/tail``.

A small HTTP/1.1 server: h11 parses and frames (sans-IO), this module holds
the socket and the clock. Transport is the listeners' own
:class:`~appliance.server.listener.TcpService`: the TLS handshake under a
deadline, the plaintext-client check and the connection boundary that logs
and closes a connection that fails. Docs: docs/observability.md.

Endpoints (``GET`` or ``HEAD``; anything else is 405, an unknown path 404):

* ``/metrics``: the service's registry in the Prometheus text format (or
  OpenMetrics when the ``Accept`` header asks for it);
* ``/livez``: 200 whenever the event loop answers (a wedged loop answers nothing);
* ``/readyz``: 200, or 503, each with a JSON body naming every check: the
  configured listeners are open, the service is not stopping, the table
  takes commits (open: at start ``opening: <reason>`` until it is; its
  directory and ``_delta_log`` writable for a local table, no commit
  failing, the disk guard not refusing), with ``[lake] ack
  = "wal"`` the write-ahead log takes appends (the last group did not fail,
  and no append waits for room under its cap), and the auth database answers
  ``SELECT 1`` when a listener uses it; and which appliance answers
  (``instance``: node id, state directory, pid, version, worker);
* ``/tail?tag=PREFIX&protocol=P``: the committed events as they are
  committed, one JSON document a line (``application/x-ndjson``, chunked),
  the same documents as the WebSocket ``/tail``
  (:mod:`appliance.server.tail`'s hub, bounded per subscriber: a client that
  falls behind gets ``{"dropped": n}`` for what was left out), and an empty
  line after :data:`TAIL_HEARTBEAT_SECONDS` without one.

With a ``token_file`` every request needs ``Authorization: Bearer <token>``
(compared in constant time), else 401 and the connection is closed. Off
the loopback interface the config insists on TLS and a token
(:class:`~appliance.config.AdminConfig`).

Admission (:mod:`appliance.server.admin_slots`): a connection waits for its
first byte without a slot, a request head that has begun holds one of
:data:`~appliance.server.admin_slots.READING_SLOTS` (a quarter of them per
address), a head that arrives whole in one read takes none, and ``/livez``
is answered without one; the waiting room and the reading slots make room
for a newcomer by closing the longest-held place. So ``/livez`` is answered
while others hold every slot.

Bounds: a new connection's first byte within :data:`FIRST_BYTE_TIMEOUT_SECONDS`
(the TLS handshake then within :data:`TLS_HANDSHAKE_TIMEOUT_SECONDS`), a
head within :data:`HEAD_TIMEOUT_SECONDS` of its first byte, a kept-alive
connection's next request within :data:`KEEPALIVE_IDLE_SECONDS`; every send
within :data:`SEND_TIMEOUT_SECONDS`; a request head is at most
:data:`MAX_REQUEST_HEAD_BYTES`, counting every byte read while it is
incomplete (431), a request body is refused (413), and a connection serves
at most :data:`MAX_REQUESTS_PER_CONNECTION` requests. At most
:data:`MAX_OPEN_CONNECTIONS` sockets are open at once, a backstop the stages
above stay under.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import ssl
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import h11
import orjson
import trio

from appliance.blocks.block import RowBlock
from appliance.config import DEFAULT_ADMIN_BIND, DEFAULT_TAIL_QUEUE_EVENTS, AdminConfig, Config
from appliance.lake.diskguard import local_path
from appliance.lake.writer import LakeWriter
from appliance.logs import get_logger
from appliance.metrics import Instance, Metrics
from appliance.protocols.websocket_messages import (
    MessageError,
    TailFilter,
    dropped_json,
    parse_target,
)
from appliance.rows.websocket import tail_events_json
from appliance.server.admin_slots import (
    ANSWERING_SLOTS,
    READING_SLOTS,
    TAIL_SUBSCRIBERS,
    WAITING_CONNECTIONS,
    AdminSlots,
    Seat,
)
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo, TcpService
from appliance.server.tail import TailHub, TailSubscription
from pki.authority import CertificateAuthority
from pki.tls import server_context

__all__ = [
    "FIRST_BYTE_TIMEOUT_SECONDS",
    "HEAD_TIMEOUT_SECONDS",
    "KEEPALIVE_IDLE_SECONDS",
    "MAX_OPEN_CONNECTIONS",
    "MAX_REQUESTS_PER_CONNECTION",
    "MAX_REQUEST_HEAD_BYTES",
    "MIN_TOKEN_CHARS",
    "SEND_TIMEOUT_SECONDS",
    "TAIL_HEARTBEAT_SECONDS",
    "TAIL_QUEUE_EVENTS",
    "TAIL_SEND_TIMEOUT_SECONDS",
    "TLS_HANDSHAKE_TIMEOUT_SECONDS",
    "WAL_FAILURE_NOT_READY_SECONDS",
    "AdminError",
    "Check",
    "Readiness",
    "admin_tls_context",
    "read_token",
    "serve_admin",
]

log = get_logger("admin")

#: Sockets open at once, whatever their stage: a backstop above what the
#: stages hold (admin_slots.py), with room for connections being closed.
MAX_OPEN_CONNECTIONS: Final = 2 * (WAITING_CONNECTIONS + READING_SLOTS + ANSWERING_SLOTS)
#: Of those, from one client address (the stages' own shares bind first).
MAX_OPEN_PER_ADDRESS: Final = MAX_OPEN_CONNECTIONS // 2
#: Bytes of a request line and headers, counting every byte read while the
#: head is incomplete, whatever the reads' sizes (more: 431).
MAX_REQUEST_HEAD_BYTES: Final = 16 * 1024
#: Bytes asked of the socket per read.
READ_SIZE_BYTES: Final = 4096
#: Seconds a new connection has for its first byte (the TLS handshake's, or
#: the request's); it waits without a slot meanwhile.
FIRST_BYTE_TIMEOUT_SECONDS: Final = 3.0
#: Seconds a client has for the TLS handshake, from its first byte.
TLS_HANDSHAKE_TIMEOUT_SECONDS: Final = 3.0
#: Seconds from a request's first byte (over TLS: from the handshake's end,
#: for the first request) to the last byte of its head.
HEAD_TIMEOUT_SECONDS: Final = 3.0
#: Seconds a kept-alive connection may wait for its next request.
KEEPALIVE_IDLE_SECONDS: Final = 10.0
#: Seconds one response may take to send.
SEND_TIMEOUT_SECONDS: Final = 10.0
#: Requests one connection may make before it is closed (keep-alive).
MAX_REQUESTS_PER_CONNECTION: Final = 1000
#: Seconds a readiness check (the auth database's ``SELECT 1``) may take.
READY_CHECK_TIMEOUT_SECONDS: Final = 2.0
#: After an error answer, seconds and bytes of the client's leftover input read
#: and dropped before the close, so the close does not reset the connection
#: (and destroy the answer) while the client is still sending.
LINGER_SECONDS: Final = 2.0
LINGER_MAX_BYTES: Final = 1024 * 1024
#: Shortest bearer token accepted in ``token_file``, in characters.
MIN_TOKEN_CHARS: Final = 16
#: Seconds /readyz says not ready after a failed write-ahead log append (disk
#: full, I/O error). Bounded: a node no balancer sends traffic to would never
#: append again to find out that space came back.
WAL_FAILURE_NOT_READY_SECONDS: Final = 30.0
#: Events a ``/tail`` subscriber may have waiting; past it they are dropped and
#: counted (the WebSocket tail's default ``tail_queue_events``).
TAIL_QUEUE_EVENTS: Final = DEFAULT_TAIL_QUEUE_EVENTS
#: Seconds a ``/tail`` send may wait for the client to read: a client that
#: reads nothing for that long is closed (one that reads slowly loses events).
TAIL_SEND_TIMEOUT_SECONDS: Final = 30.0
#: Seconds without an event after which ``/tail`` sends an empty line, so the
#: client (and any proxy) sees the stream is alive.
TAIL_HEARTBEAT_SECONDS: Final = 15.0
#: Bytes of tail lines gathered into one chunk of the response.
TAIL_CHUNK_BYTES: Final = 64 * 1024
#: Seconds the end of a ``/tail`` response may take when the service stops.
TAIL_END_TIMEOUT_SECONDS: Final = 1.0

_JSON: Final = "application/json"
_TEXT: Final = "text/plain; charset=utf-8"
_NDJSON: Final = "application/x-ndjson"
_METHODS: Final = (b"GET", b"HEAD")
_PATHS: Final = (b"/metrics", b"/livez", b"/readyz", b"/tail")


class AdminError(OSError):
    """The admin listener cannot start (its address, its token file); the message says why."""

    def __str__(self) -> str:
        return str(self.strerror)


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed).

    Raises:
        AdminError: the file cannot be read, or the token is empty or short.
    """
    try:
        token = path.read_text(encoding="utf-8").strip()
        info = path.stat()
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminError(
            errno.EINVAL, f"[admin] token_file {path}: cannot read it: {exc}"
        ) from None
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminError(
            errno.EINVAL,
            f"[admin] token_file {path}: the token must have at least {MIN_TOKEN_CHARS} "
            "characters (for example: openssl rand -hex 32)",
        )
    mode = info.st_mode & 0o777
    # Others may never read it, nobody but the owner may change it, and the
    # group may read it only when it is the service's own group: the packaged
    # layout is root:appliance 0640 (docs/observability.md).
    shared_with_group = mode & 0o040 and info.st_gid != os.getegid()
    if mode & 0o027 or shared_with_group:
        raise AdminError(
            errno.EACCES,
            f"[admin] token_file {path}: mode {mode:04o} lets other users read or change "
            "the admin token: chmod 0600 (or 0640 with the service's group, "
            "chown root:appliance)",
        )
    return token


def admin_tls_context(config: Config, ca: CertificateAuthority) -> ssl.SSLContext:
    """The admin listener's server context: the ``[tls]`` certificate, or the generated one.

    Raises:
        pki.errors.PkiError: a certificate or key cannot be read or created.
    """
    cert, key = config.tls.cert_file, config.tls.key_file
    if cert is None or key is None:
        ca.ensure(config.tls.server_names)  # created on first start, as for the listeners
        cert, key = ca.paths.server_cert, ca.paths.server_key
    return server_context(cert, key)


# -- readiness ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check's outcome."""

    name: str
    ok: bool
    #: Why it is not ready (None when ``ok``).
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        return {"ok": self.ok, "reason": self.reason} if not self.ok else {"ok": True}


def _writable(path: str) -> str | None:
    """Why the directory ``path`` refuses new files, or None (it takes them)."""
    if not os.path.isdir(path):
        return f"{path} is missing"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def _ping_database(url: str) -> None:
    """``SELECT 1`` on a fresh connection (blocking; a worker thread runs it)."""
    from auth.engine import ping  # SQLAlchemy loads only when a listener uses the database

    ping(url)


class Readiness:
    """What ``/readyz`` checks, read afresh at each request.

    Args:
        expected_listeners: the names of the configured listeners (after reloads).
        open_listeners: the names of the listeners open now.
        lifecycle: the service's shutdown state.
        writer: the table's writer.
        auth_database_url: the auth database's URL when a listener uses it, else None.
        table_opening: why the table is not open yet (the service is starting:
            an attempt to open it failed and is retried), else None.
    """

    def __init__(
        self,
        *,
        expected_listeners: Callable[[], Iterable[str]],
        open_listeners: Callable[[], Collection[str]],
        lifecycle: Lifecycle,
        writer: LakeWriter,
        auth_database_url: Callable[[], str | None],
        table_opening: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._expected = expected_listeners
        self._open = open_listeners
        self._lifecycle = lifecycle
        self._writer = writer
        self._auth_url = auth_database_url
        self._table_opening = table_opening
        # One probe of the database at a time: a hung database cannot pile up threads.
        self._database_threads = trio.CapacityLimiter(1)

    @property
    def writer(self) -> LakeWriter:
        """The table's writer (the admin listener's ``/tail`` hears its commits)."""
        return self._writer

    def instance(self) -> Instance:
        """Which appliance answers (``/readyz``'s ``instance``; ``appliance status`` checks it)."""
        wal = self._writer.wal
        return Instance.of(self._writer.app_id, None if wal is None else wal.directory)

    async def checks(self) -> list[Check]:
        """Every check, in a fixed order (``wal`` only with ``[lake] ack = "wal"``)."""
        wal = [] if self._writer.wal is None else [self._wal()]
        return [self._listeners(), self._table(), *wal, await self._auth_database()]

    def _listeners(self) -> Check:
        if self._lifecycle.stopping:
            return Check("listeners", False, "the service is stopping")
        open_now = self._open()
        missing = sorted(name for name in self._expected() if name not in open_now)
        if missing:
            return Check("listeners", False, f"not open: {', '.join(missing)}")
        return Check("listeners", True)

    def _table(self) -> Check:
        writer = self._writer
        opening = self._table_opening()
        if opening is not None:
            # At start: no batch is taken before the table's position is known.
            return Check("table", False, f"opening: {opening}")
        path = local_path(writer.table.uri)
        if path is not None:
            for directory in (path, os.path.join(path, "_delta_log")):
                problem = _writable(directory)
                if problem is not None:
                    return Check("table", False, problem)
        if writer.failing is not None:
            return Check("table", False, f"commits are failing: {writer.failing}")
        guard = writer.disk_guard
        refusal = guard.refusal() if guard is not None else None
        if refusal is not None:
            return Check("table", False, refusal)
        return Check("table", True)

    def _wal(self) -> Check:
        wal = self._writer.wal
        assert wal is not None
        failed_at = wal.failed_at
        if (
            wal.failing is not None
            and failed_at is not None
            and trio.current_time() - failed_at < WAL_FAILURE_NOT_READY_SECONDS
        ):
            return Check("wal", False, f"appends are failing: {wal.failing}")
        if wal.at_cap:
            # Backpressure: connections wait for the table to catch up (docs/wal.md).
            return Check(
                "wal", False,
                f"the write-ahead log is at its cap ({wal.settings.max_bytes} bytes): "
                "the table is not keeping up",
            )  # fmt: skip
        return Check("wal", True)

    async def _auth_database(self) -> Check:
        url = self._auth_url()
        if url is None:
            return Check("auth_database", True)
        with trio.move_on_after(READY_CHECK_TIMEOUT_SECONDS) as deadline:
            try:
                await trio.to_thread.run_sync(
                    _ping_database, url, limiter=self._database_threads, abandon_on_cancel=True
                )
            except Exception as exc:  # noqa: BLE001 - any driver error means "not reachable"
                # The message may carry the URL and so a password: only its type.
                return Check("auth_database", False, f"unreachable ({type(exc).__name__})")
        if deadline.cancelled_caught:
            return Check(
                "auth_database", False, f"no answer within {READY_CHECK_TIMEOUT_SECONDS:g}s"
            )
        return Check("auth_database", True)


# -- HTTP -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    body: bytes
    content_type: str = _TEXT
    headers: tuple[tuple[str, str], ...] = ()


class _Closed(Exception):
    """The connection ends (the peer left, or a deadline passed)."""


async def _linger(stream: trio.abc.Stream) -> None:
    """Say "no more" (plain TCP) and drop what the client still sends, within bounds."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        try:
            await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
    drained = 0
    with trio.move_on_after(LINGER_SECONDS):
        try:
            while drained < LINGER_MAX_BYTES:
                data = await stream.receive_some(READ_SIZE_BYTES)
                if not data:
                    return
                drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def _send_bytes(stream: trio.abc.Stream, data: bytes, timeout: float) -> None:
    """Send ``data`` within ``timeout`` seconds.

    Raises:
        _Closed: the peer left, or read too little for the deadline.
    """
    with trio.move_on_after(timeout) as scope:
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise _Closed from None
    if scope.cancelled_caught:
        raise _Closed


class _Http:
    """One admin connection: its h11 state, the bytes read past a head's budget, its seat."""

    def __init__(self, stream: trio.abc.Stream, seat: Seat) -> None:
        self.stream = stream
        self.seat = seat
        # h11 refuses a head still incomplete past max_incomplete_event_size;
        # it is never given more than MAX_REQUEST_HEAD_BYTES of one (_receive),
        # so a head incomplete at that many bytes is refused, whatever the reads.
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES - 1)
        #: Read from the socket, not yet given to h11 (past the head's budget).
        self.held = b""


class _AdminHandler:
    """Serves the admin endpoints on one connection at a time (a TcpService handler)."""

    def __init__(
        self,
        metrics: Metrics,
        readiness: Readiness,
        token: str | None,
        slots: AdminSlots | None = None,
        hub: TailHub | None = None,
    ) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._token = token.encode("utf-8") if token is not None else None
        self._instance = readiness.instance()
        self._slots = slots if slots is not None else AdminSlots()
        self._hub = hub
        metrics.identify(self._instance)

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        with self._slots.connection(info.address, info.peer) as seat:
            http = _Http(stream, seat)
            try:
                await self._serve(http, info)
            except _Closed:
                return

    async def _serve(self, http: _Http, info: ConnectionInfo) -> None:
        conn, stream = http.h11, http.stream
        for number in range(MAX_REQUESTS_PER_CONNECTION):
            try:
                request = await self._receive(http, first=number == 0)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint
                    reason = (
                        f"the request head is larger than {MAX_REQUEST_HEAD_BYTES} bytes"
                        if status == 431
                        else str(exc)
                    )
                    await self._send(conn, stream, _Response(status, f"{reason}\n".encode()))
                    await _linger(stream)
                return
            if request is None:
                return
            head_only = request.method == b"HEAD"
            path = request.target.partition(b"?")[0]
            refusal, tail_filter = self._route(request)
            if refusal is not None:
                await self._send(conn, stream, refusal, head_only=head_only)
                if refusal.status == 401:
                    return  # no second guess on this connection
            elif path == b"/livez":
                # No answering slot: a few bytes, sent at once (admin_slots.py).
                await self._send(conn, stream, _Response(200, b"ok\n"), head_only=head_only)
            elif tail_filter is not None:
                with self._slots.answer(tail=True) as admitted:
                    if admitted:
                        await self._tail(http, tail_filter, info, head_only=head_only)
                        return
                await self._send(conn, stream, self._busy("tail"), head_only=head_only)
            else:
                with self._slots.answer() as admitted:
                    response = await self._answer(request) if admitted else self._busy("answer")
                    await self._send(conn, stream, response, head_only=head_only)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _receive(self, http: _Http, *, first: bool) -> h11.Request | None:
        """The next whole request (a body refused with 413), or None when the peer is done.

        Until its first byte the connection waits without a slot; once the
        head has begun and did not arrive whole, it takes a reading slot
        until the head is complete (admin_slots.py).
        """
        conn, seat, slots = http.h11, http.seat, self._slots
        request: h11.Request | None = None
        deadline: float | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if request is not None:
                    raise _Closed  # a body, which _refuse_body has answered
                if not http.held:
                    begun = seat.reading or bool(conn.trailing_data[0])
                    if begun:
                        slots.read(seat)
                        if deadline is None:
                            deadline = trio.current_time() + HEAD_TIMEOUT_SECONDS
                        http.held = await self._read(http.stream, deadline)
                    else:
                        http.held = await self._first_bytes(http, first=first)
                        deadline = trio.current_time() + HEAD_TIMEOUT_SECONDS
                    if not http.held:
                        conn.receive_data(b"")  # the end of the stream
                        continue
                # Never more than the head's budget: what h11 holds of it counts.
                room = MAX_REQUEST_HEAD_BYTES - len(conn.trailing_data[0])
                if room <= 0:  # h11 refuses such a head itself; never feed it b"" (the end)
                    raise h11.RemoteProtocolError("head too long", error_status_hint=431)
                chunk, http.held = http.held[:room], http.held[room:]
                conn.receive_data(chunk)
                continue
            if isinstance(event, h11.Request):
                slots.leave(seat)  # the head is complete
                request = event
                if await self._refuse_body(http, event):
                    raise _Closed
            elif isinstance(event, h11.Data):
                await self._refuse_body(http, None)
                raise _Closed
            elif isinstance(event, h11.EndOfMessage):
                return request
            else:  # ConnectionClosed; h11.PAUSED cannot happen before the response is sent
                return None

    async def _first_bytes(self, http: _Http, *, first: bool) -> bytes:
        """The first bytes of the next request, read in the waiting room (b"": the end).

        Raises:
            _Closed: nothing came within the deadline, or the peer broke off.
        """
        self._slots.wait(http.seat)
        timeout = FIRST_BYTE_TIMEOUT_SECONDS if first else KEEPALIVE_IDLE_SECONDS
        return await self._read(http.stream, trio.current_time() + timeout)

    @staticmethod
    async def _read(stream: trio.abc.Stream, deadline: float) -> bytes:
        with trio.move_on_at(deadline):
            try:
                return bytes(await stream.receive_some(READ_SIZE_BYTES))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise _Closed from None
        raise _Closed  # a request not finished within its deadline (or an idle keep-alive)

    async def _refuse_body(self, http: _Http, request: h11.Request | None) -> bool:
        """Answer 413 to a request with a body (``request``: check its head); whether it had one."""
        if request is not None:
            names = {name for name, _ in request.headers}
            length = next((v for n, v in request.headers if n == b"content-length"), b"0")
            if b"transfer-encoding" not in names and length.strip() in (b"0", b""):
                return False
        if http.h11.our_state is h11.SEND_RESPONSE:
            await self._send(
                http.h11, http.stream, _Response(413, b"admin requests have no body\n")
            )
            await _linger(http.stream)
        return True

    async def _send(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        response: _Response,
        *,
        head_only: bool = False,
    ) -> None:
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("cache-control", "no-store"),
            *response.headers,
        ]
        data = conn.send(h11.Response(status_code=response.status, headers=headers))
        if response.body and not head_only:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        await _send_bytes(stream, data, SEND_TIMEOUT_SECONDS)

    @staticmethod
    def _busy(what: str) -> _Response:
        if what == "tail":
            text = f"{TAIL_SUBSCRIBERS} tails are open (the most at once); try again later\n"
        else:
            text = f"{ANSWERING_SLOTS} requests are being answered; try again\n"
        return _Response(503, text.encode(), headers=(("retry-after", "1"),))

    def _authorized(self, request: h11.Request) -> bool:
        if self._token is None:
            return True
        for name, value in request.headers:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    given.strip(), self._token
                )
        return False

    def _route(self, request: h11.Request) -> tuple[_Response | None, TailFilter | None]:
        """A refusal of ``request``, or None; and the tail filter when it asks for ``/tail``."""
        path = request.target.partition(b"?")[0]
        if not self._authorized(request):
            return _Response(
                401, b"a bearer token is required\n",
                headers=(("www-authenticate", 'Bearer realm="appliance"'),),
            ), None  # fmt: skip
        if path not in _PATHS:
            return _Response(404, b"endpoints: " + b" ".join(_PATHS) + b"\n"), None
        if request.method not in _METHODS:
            return _Response(405, b"GET or HEAD\n", headers=(("allow", "GET, HEAD"),)), None
        if path != b"/tail":
            return None, None
        try:
            _, tail_filter = parse_target(request.target.decode("latin-1"))
        except MessageError as exc:
            return _Response(400, f"{exc.reason}\n".encode()), None
        return None, tail_filter

    async def _answer(self, request: h11.Request) -> _Response:
        """The answer to an authorised ``/readyz`` or ``/metrics``."""
        if request.target.partition(b"?")[0] == b"/readyz":
            checks = await self._readiness.checks()
            ready = all(check.ok for check in checks)
            body = orjson.dumps(
                {
                    "status": "ready" if ready else "not ready",
                    "checks": {check.name: check.to_json() for check in checks},
                    "instance": self._instance.to_json(),
                }
            )
            return _Response(200 if ready else 503, body + b"\n", _JSON)
        accept = next((v for n, v in request.headers if n == b"accept"), b"")
        body, content_type = self._metrics.exposition(accept.decode("latin-1"))
        return _Response(200, body, content_type)

    # -- /tail ------------------------------------------------------------------------------

    async def _tail(
        self, http: _Http, tail_filter: TailFilter, info: ConnectionInfo, *, head_only: bool
    ) -> None:
        """Stream the committed events to the client until it leaves or the service stops."""
        conn, stream = http.h11, http.stream
        if self._hub is None:
            await self._send(conn, stream, _Response(503, b"no tail on this listener\n"))
            return
        headers = [
            ("content-type", _NDJSON),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
        ]
        # No content-length: h11 frames the body chunked (close-delimited for HTTP/1.0).
        head = conn.send(h11.Response(status_code=200, headers=headers))
        if head_only:
            await _send_bytes(stream, head + conn.send(h11.EndOfMessage()), SEND_TIMEOUT_SECONDS)
            return
        await _send_bytes(stream, head, SEND_TIMEOUT_SECONDS)
        log.info("admin.tail_open", peer=info.peer, tag=tail_filter.tag_prefix,
                 protocol=tail_filter.protocol)  # fmt: skip
        reason = "the service stopped"
        with self._hub.subscribe(tail_filter, TAIL_QUEUE_EVENTS) as sub:
            try:
                async with trio.open_nursery() as nursery:

                    async def watch_client() -> None:
                        nonlocal reason
                        await _client_done(stream)
                        reason = "the client left"
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(watch_client)
                    reason = await _push(conn, stream, sub)
                    nursery.cancel_scope.cancel()
            finally:
                if conn.our_state is h11.SEND_BODY:
                    # The end of the body (the last chunk), even when the service stops.
                    with (
                        trio.CancelScope(shield=True),
                        trio.move_on_after(TAIL_END_TIMEOUT_SECONDS),
                        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                    ):
                        await stream.send_all(conn.send(h11.EndOfMessage()))
                log.info("admin.tail_closed", peer=info.peer, reason=reason,
                         dropped=sub.dropped_total)  # fmt: skip


async def _client_done(stream: trio.abc.Stream) -> None:
    """Return when a tail's client closes (or sends anything: a tail takes no more requests)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.receive_some(READ_SIZE_BYTES)


async def _push(conn: h11.Connection, stream: trio.abc.Stream, sub: TailSubscription) -> str:
    """Send ``sub``'s events as lines until the client stops reading; why it ended."""
    while True:
        found: list[tuple[RowBlock, list[int]]] = []
        dropped = 0
        with trio.move_on_after(TAIL_HEARTBEAT_SECONDS):
            found, dropped = await sub.next()
        lines = [text for block, rows in found for text in tail_events_json(block, rows)]
        if dropped:
            lines.append(dropped_json(dropped))
        # Nothing for a while: an empty line, so the client knows the stream is alive.
        chunks = _chunks(lines) if lines else [b"\n"]
        try:
            for chunk in chunks:
                data = conn.send(h11.Data(data=chunk))
                await _send_bytes(stream, data, TAIL_SEND_TIMEOUT_SECONDS)
        except _Closed:
            return f"the client read nothing for {TAIL_SEND_TIMEOUT_SECONDS:g}s, or left"


def _chunks(lines: list[str]) -> list[bytes]:
    """``lines`` as newline-terminated UTF-8, gathered into chunks of about TAIL_CHUNK_BYTES."""
    chunks: list[bytes] = []
    current = bytearray()
    for line in lines:
        current += line.encode()
        current += b"\n"
        if len(current) >= TAIL_CHUNK_BYTES:
            chunks.append(bytes(current))
            current.clear()
    if current:
        chunks.append(bytes(current))
    return chunks


class _AdminService(TcpService):
    """The admin listener's transport: a TLS handshake starts only after the client's first byte.

    Before it, the connection waits in the waiting room; from it, it holds a
    reading slot (admin_slots.py), so a client that connects and sends
    nothing never holds one.
    """

    def __init__(
        self, handler: _AdminHandler, slots: AdminSlots, ssl_context: ssl.SSLContext | None
    ) -> None:
        super().__init__(
            "admin", handler, ssl_context=ssl_context,
            tls_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_SECONDS,
            max_connections=MAX_OPEN_CONNECTIONS, max_connections_per_address=MAX_OPEN_PER_ADDRESS,
        )  # fmt: skip
        self._slots = slots

    async def _serve_connection(
        self, sock: trio.SocketStream, context: ssl.SSLContext | None, info: ConnectionInfo
    ) -> None:
        handed_on = False
        try:
            with self._slots.connection(info.address, info.peer) as seat:
                if context is not None:
                    self._slots.wait(seat)
                    with trio.move_on_after(FIRST_BYTE_TIMEOUT_SECONDS) as silent:
                        await trio.lowlevel.wait_readable(sock.socket)
                    if silent.cancelled_caught:
                        log.info(
                            "admin.connection_closed", peer=info.peer, stage="waiting",
                            reason=f"no byte within {FIRST_BYTE_TIMEOUT_SECONDS:g}s",
                        )  # fmt: skip
                        return
                    self._slots.read(seat)  # the handshake holds a reading slot
                handed_on = True
                await super()._serve_connection(sock, context, info)
        finally:
            if not handed_on:
                await trio.aclose_forcefully(sock)


async def serve_admin(
    settings: AdminConfig,
    metrics: Metrics,
    readiness: Readiness,
    ssl_context: ssl.SSLContext | None,
    *,
    attach: Callable[[TcpService], None] | None = None,
    task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin endpoints until cancelled; reports the bound port.

    ``attach`` is given the listener's service once it exists, so that a TLS
    reload (``cert rotate-server``, ``cert import``, SIGHUP) can give it a new
    context as it does the other listeners
    (:meth:`~appliance.server.tls.TlsManager.attach_admin`).

    The default address (:data:`~appliance.config.DEFAULT_ADMIN_BIND`) is
    shared by every appliance on a machine: when it is taken, the service
    logs ``admin.unavailable`` and runs without it (reports None). An address
    the operator configured must be free.

    Raises:
        AdminError: the configured address cannot be bound, or the token file
            cannot be read.
    """
    token = read_token(settings.token_file) if settings.token_file is not None else None
    try:
        sockets = await trio.open_tcp_listeners(settings.port, host=settings.host)
    except OSError as exc:
        if settings.bind == DEFAULT_ADMIN_BIND and exc.errno == errno.EADDRINUSE:
            log.error(
                "admin.unavailable", bind=settings.bind, reason=exc.strerror,
                advice="set [admin] bind to a free address (or enabled = false)",
            )  # fmt: skip
            task_status.started(None)
            return
        raise AdminError(
            exc.errno, f"the admin listener cannot bind {settings.bind}: {exc.strerror}"
        ) from exc
    port: int = sockets[0].socket.getsockname()[1]
    hub = TailHub()
    readiness.writer.commit_listeners.append(hub.publish)
    slots = AdminSlots()
    service = _AdminService(
        _AdminHandler(metrics, readiness, token, slots, hub), slots, ssl_context
    )
    if attach is not None:
        attach(service)
    log.info(
        # Not "token=...": the log masks any field named like a secret, and
        # whether one is required is no secret.
        "admin.ready", bind=f"{settings.host}:{port}", tls=ssl_context is not None,
        bearer_required=token is not None,
    )  # fmt: skip
    try:
        async with trio.open_nursery() as connections:
            task_status.started(port)
            await service.serve(sockets, connections)
    finally:
        readiness.writer.commit_listeners.remove(hub.publish)
