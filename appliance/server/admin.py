"""The admin HTTP listener (``[admin]``): ``/metrics``, ``/livez`` and ``/readyz``.

A small HTTP/1.1 server: h11 parses and frames (sans-IO), this module holds
the socket and the clock. Transport is the listeners' own
:class:`~appliance.server.listener.TcpService`: a connection cap, the TLS
handshake under a deadline, the plaintext-client check and the connection
boundary that logs and closes a connection that fails. Docs:
docs/observability.md.

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
  (``instance``: node id, state directory, pid, version, worker).

With a ``token_file`` every request needs ``Authorization: Bearer <token>``
(compared in constant time), else 401. Off the loopback interface the
config insists on TLS and a token (:class:`~appliance.config.AdminConfig`).

Bounds: every read has a deadline (:data:`REQUEST_TIMEOUT_SECONDS` from
waiting for a request to its last byte), every send too
(:data:`SEND_TIMEOUT_SECONDS`); a request head is at most
:data:`MAX_REQUEST_HEAD_BYTES` (h11's cap on an incomplete event), a request
body is refused (413), and a connection serves at most
:data:`MAX_REQUESTS_PER_CONNECTION` requests. At most
:data:`MAX_CONNECTIONS` connections are open at once.
"""

from __future__ import annotations

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

from appliance.config import DEFAULT_ADMIN_BIND, AdminConfig, Config
from appliance.lake.diskguard import local_path
from appliance.lake.writer import LakeWriter
from appliance.logs import get_logger
from appliance.metrics import Instance, Metrics
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo, TcpService
from pki.authority import CertificateAuthority
from pki.tls import server_context

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_REQUESTS_PER_CONNECTION",
    "MAX_REQUEST_HEAD_BYTES",
    "MIN_TOKEN_CHARS",
    "REQUEST_TIMEOUT_SECONDS",
    "SEND_TIMEOUT_SECONDS",
    "WAL_FAILURE_NOT_READY_SECONDS",
    "AdminError",
    "Check",
    "Readiness",
    "admin_tls_context",
    "read_token",
    "serve_admin",
]

log = get_logger("admin")

#: Connections open at once (Prometheus, a probe, ``appliance status``); more are closed.
MAX_CONNECTIONS: Final = 16
#: Bytes of a request line and headers (h11's ``max_incomplete_event_size``).
MAX_REQUEST_HEAD_BYTES: Final = 16 * 1024
#: Bytes asked of the socket per read.
READ_SIZE_BYTES: Final = 4096
#: Seconds from waiting for a request (keep-alive idle included) to its last byte.
REQUEST_TIMEOUT_SECONDS: Final = 10.0
#: Seconds one response may take to send.
SEND_TIMEOUT_SECONDS: Final = 10.0
#: Seconds a client has for the TLS handshake.
TLS_HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0
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

_JSON: Final = "application/json"
_TEXT: Final = "text/plain; charset=utf-8"
_METHODS: Final = (b"GET", b"HEAD")


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


class _AdminHandler:
    """Serves the admin endpoints on one connection at a time (a TcpService handler)."""

    def __init__(self, metrics: Metrics, readiness: Readiness, token: str | None) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._token = token.encode("utf-8") if token is not None else None
        self._instance = readiness.instance()
        metrics.identify(self._instance)

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)
        try:
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                try:
                    request = await self._receive(conn, stream)
                except h11.RemoteProtocolError as exc:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        body = f"bad request: {exc}\n".encode()
                        await self._send(conn, stream, _Response(exc.error_status_hint, body))
                        await _linger(stream)
                    return
                if request is None:
                    return
                response = await self._answer(request)
                await self._send(conn, stream, response, head_only=request.method == b"HEAD")
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except _Closed:
            return

    async def _receive(self, conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
        """The next whole request (its body refused), or None when the peer is done."""
        request: h11.Request | None = None
        with trio.move_on_after(REQUEST_TIMEOUT_SECONDS):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive_some(READ_SIZE_BYTES)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        raise _Closed from None
                    conn.receive_data(bytes(data))
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    if conn.our_state is h11.SEND_RESPONSE:
                        await self._send(
                            conn, stream, _Response(413, b"admin requests have no body\n")
                        )
                        await _linger(stream)
                    raise _Closed
                elif isinstance(event, h11.EndOfMessage):
                    return request
                elif isinstance(event, h11.ConnectionClosed):
                    return None
                else:  # h11.PAUSED cannot happen before the response is sent
                    return None
        raise _Closed  # a request not finished within its deadline (or an idle keep-alive)

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
        with trio.move_on_after(SEND_TIMEOUT_SECONDS) as scope:
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise _Closed from None
        if scope.cancelled_caught:
            raise _Closed

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

    async def _answer(self, request: h11.Request) -> _Response:
        path = request.target.partition(b"?")[0]
        if not self._authorized(request):
            return _Response(
                401, b"a bearer token is required\n",
                headers=(("www-authenticate", 'Bearer realm="appliance"'),),
            )  # fmt: skip
        if path not in (b"/metrics", b"/livez", b"/readyz"):
            return _Response(404, b"endpoints: /metrics /livez /readyz\n")
        if request.method not in _METHODS:
            return _Response(405, b"GET or HEAD\n", headers=(("allow", "GET, HEAD"),))
        if path == b"/livez":
            return _Response(200, b"ok\n")
        if path == b"/readyz":
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
    service = TcpService(
        "admin",
        _AdminHandler(metrics, readiness, token),
        ssl_context=ssl_context,
        tls_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_SECONDS,
        max_connections=MAX_CONNECTIONS,
        max_connections_per_address=MAX_CONNECTIONS,
    )
    if attach is not None:
        attach(service)
    log.info(
        # Not "token=...": the log masks any field named like a secret, and
        # whether one is required is no secret.
        "admin.ready", bind=f"{settings.host}:{port}", tls=ssl_context is not None,
        bearer_required=token is not None,
    )  # fmt: skip
    async with trio.open_nursery() as connections:
        task_status.started(port)
        await service.serve(sockets, connections)
