"""TCP listeners with TLS: one task per connection, a handshake deadline, a connection cap.

Modelled on trio's ``serve_listeners``: the accept loop backs off only on
resource exhaustion, and each connection runs in the nursery as its own task
that does its own TLS handshake (so a slow handshake never blocks accept),
under ``tls_handshake_timeout_seconds``. A connection over
``max_connections`` is accepted and closed at once, with a log line, rather
than left hanging in the kernel's backlog.

Resource handling: every accepted stream is closed in ``finally``: politely
(TLS close_notify) within ``CLOSE_TIMEOUT_SECONDS``, then forcefully, so a
peer that does not read cannot stall the close.

Error handling: TLS failures and peers that vanish are logged per connection;
they never reach the listener or the other connections. The one catch-all of
the service sits here, at the connection boundary
(docs/decisions.md#one-catch-all-at-the-connection-boundary): any other
exception from a connection's handler is a bug or an input nothing
anticipated, so it is logged (``connection.failed`` with its type), counted,
and that one connection is closed; the listener and every other connection
carry on. ``trio.Cancelled`` is a ``BaseException`` and
passes through untouched.

Fairness: besides ``max_connections`` per listener, one client address may
hold at most ``max_connections_per_address`` connections, so one host that
opens slow sockets cannot lock every other client out.

Behind a load balancer (``proxy`` settings, :mod:`appliance.server.proxied`):
only the trusted balancers may connect, each connection's PROXY header is
read first (within its own deadline), and from then on the connection is the
client's: its address is the one in ``ConnectionInfo``, the per-address limit
counts it, and its log lines name it (``connection.proxied`` says which
balancer relayed it). Connections still waiting for their header are
bounded by ``max_connections`` and the header deadline.

Several workers (docs/performance.md, "Several processes on one machine"):
with an :class:`~appliance.server.spread.AcceptGate`, the accept loop takes
a pending connection at once only while this worker holds the fewest open
connections, and otherwise leaves it to a less busy worker for up to
``ACCEPT_DEFER_SECONDS``; it accepts one connection per look at the gate,
so a burst is spread too.

Revocation: every connection is registered in the service's
:class:`~appliance.server.revocation.OpenConnections` for as long as it is
served (its :attr:`ConnectionInfo.guard`), with the client certificate it
presented as its first credential; a certificate found on the CRL at a later
check (a TLS reload re-reads the CRL) closes it, as does any credential its
protocol's handshake added.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Final

import trio
from cryptography import x509

from appliance.logs import get_logger
from appliance.metrics import NULL_LISTENER, ListenerMetrics
from appliance.protocols.sniff import SNIFF_BYTES, plaintext_guess
from appliance.server.proxied import ProxyFailure, ProxySettings, is_health_check, read_proxy_header
from appliance.server.revocation import Credential, Guard, OpenConnections, Revoked
from appliance.server.spread import ACCEPT_DEFER_SECONDS, ACCEPT_RECHECK_SECONDS, AcceptGate
from appliance.server.tls_errors import handshake_failure
from pki.tls import peer_subject

__all__ = [
    "ANONYMOUS",
    "CertificateCheck",
    "ConnectionInfo",
    "Handler",
    "TcpService",
    "certificate_credential",
    "describe_failure",
    "peer_name",
]

log = get_logger("listener")

#: accept() errors that mean "out of resources": wait and try again.
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
#: Seconds to wait after such an error (trio's serve_listeners uses the same).
ACCEPT_BACKOFF_SECONDS: Final = 0.1
#: accept() errors of a connection that went away while queued: take the next
#: (as trio's SocketListener.accept does).
_IGNORED_ACCEPT_ERRNOS: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
#: The ``source`` of a peer that nothing authenticated.
ANONYMOUS: Final = "anonymous"
#: Seconds a polite close (TLS close_notify) may take before the socket is dropped.
CLOSE_TIMEOUT_SECONDS: Final = 1.0
#: Characters of an exception's text kept in a ``connection.failed`` line.
_MAX_REASON_CHARS: Final = 200


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """The type name(s) and a short text of an unexpected exception, for one log line.

    The exceptions of a group (a connection's nursery) are listed by type.
    """
    if isinstance(exc, BaseExceptionGroup):
        leaves: list[BaseException] = []
        stack: list[BaseException] = [exc]
        while stack:
            item = stack.pop()
            if isinstance(item, BaseExceptionGroup):
                stack.extend(item.exceptions)
            else:
                leaves.append(item)
        types = ",".join(sorted({type(e).__name__ for e in leaves}))
        text = str(leaves[0]) if leaves else ""
    else:
        types, text = type(exc).__name__, str(exc)
    return types, text.splitlines()[0][:_MAX_REASON_CHARS] if text else ""


def peer_name(address: str, port: int | None) -> str:
    """How logs and the ``peer`` column name a peer: ``address:port``, ``[v6]:port``."""
    if port is None:
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is on the other end of a connection."""

    listener: str
    #: The peer's IP address (``unknown`` when the socket could not tell).
    address: str
    #: The peer's port; None when the socket gave no port.
    port: int | None
    tls: bool
    #: The authenticated principal, or "anonymous" when nothing authenticated the peer.
    source: str = "anonymous"  # ANONYMOUS
    #: The listener's metrics, which its connection handler counts into.
    metrics: ListenerMetrics = field(default=NULL_LISTENER, compare=False, repr=False)
    #: The connection in the service's registry of open connections: a
    #: handshake adds the credentials it checked, which are checked again
    #: until the connection closes (None: not registered, as in some tests).
    guard: Guard | None = field(default=None, compare=False, repr=False)

    @property
    def peer(self) -> str:
        """The peer's name in logs and rows (:func:`peer_name`)."""
        return peer_name(self.address, self.port)


Handler = Callable[[trio.abc.Stream, ConnectionInfo], Awaitable[None]]
#: Why the CRL in force refuses a client certificate, or None when it does not.
CertificateCheck = Callable[[x509.Certificate], str | None]


def certificate_credential(der: bytes, check: CertificateCheck) -> Credential:
    """The credential of a client certificate (DER) verified at the handshake.

    Its id is ``cert:<serial in hex>``, as ``appliance cert list`` shows it.
    """
    certificate = x509.load_der_x509_certificate(der)
    ident = f"cert:{certificate.serial_number:x}"

    def recheck() -> Revoked | None:
        reason = check(certificate)
        return Revoked(ident, reason) if reason is not None else None

    key = ("cert", certificate.issuer.public_bytes(), certificate.serial_number)
    return Credential(ident, key, recheck)


async def _close(stream: trio.abc.Stream) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_SECONDS) as scope:
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()
    if scope.cancelled_caught:
        await trio.aclose_forcefully(stream)


async def _plaintext_guess(sock: trio.SocketStream) -> str | None:
    """Why the client's first bytes say it is not speaking TLS, or None when it may be.

    Peeks without consuming, so the TLS handshake reads the same bytes; what
    they say is :func:`~appliance.protocols.sniff.plaintext_guess`'s to tell.
    """
    try:
        head = await sock.socket.recv(SNIFF_BYTES, socket.MSG_PEEK)
    except OSError:
        return None  # the handshake reports the broken connection
    return plaintext_guess(head)


def _peer_address(sock: trio.SocketStream) -> tuple[str, int | None]:
    """The peer's IP address and port (no port when the socket gives none)."""
    try:
        address = sock.socket.getpeername()
    except OSError:
        return "unknown", None
    if isinstance(address, tuple):
        return str(address[0]), int(address[1])
    return str(address), None


def _pending(sock: socket.socket) -> bool:
    """Whether a connection is queued on the listening ``sock`` now (no wait)."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


class _Backlog:
    """Since when this worker has seen its queue hold a connection (None: seen empty since)."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None


async def _gated_accept(
    listening: trio.socket.SocketType,
    raw: socket.socket,
    gate: AcceptGate,
    backlog: _Backlog,
    has_room: Callable[[], bool],
) -> trio.SocketStream:
    """The next connection this worker should take (module docstring, "Several workers").

    Waits until one is queued; takes it at once while the gate says this
    worker has the fewest open connections, or once it has been queued for
    ``ACCEPT_DEFER_SECONDS`` without a less busy worker taking it. One
    connection per call, so each is weighed against the counts as they are.

    Raises:
        OSError: accept failed (resource exhaustion: the caller backs off).
    """
    while True:
        if _pending(raw):
            await trio.lowlevel.checkpoint()
        else:
            # Nothing queued, or another worker took what was: the next one waits afresh.
            backlog.since = None
            await trio.lowlevel.wait_readable(listening)
        now = trio.current_time()
        if backlog.since is None:
            backlog.since = now
        # The grace runs from when the queue was last seen empty, not per
        # connection: a queue that a stuck least busy worker leaves standing is
        # drained after one grace, not one grace per connection.
        # A worker at its max_connections would only refuse the client: it
        # leaves the connection to one with room, as a busier worker does.
        fewest = gate.may_accept() and has_room()
        if fewest or now - backlog.since >= ACCEPT_DEFER_SECONDS:
            try:
                conn, _ = raw.accept()
            except BlockingIOError:
                continue  # another worker took it
            except OSError as exc:
                if exc.errno in _IGNORED_ACCEPT_ERRNOS:
                    continue
                raise
            if not fewest:
                # A less busy worker did not take it within the grace: slow to
                # wake, stuck, or stopping. Worth a line: many say a worker is.
                log.info(
                    "connection.accepted_after_grace",
                    waited_ms=round((now - backlog.since) * 1000),
                )
            return trio.SocketStream(trio.socket.from_stdlib_socket(conn))
        await trio.sleep(ACCEPT_RECHECK_SECONDS)


class TcpService:
    """Accepts on some listeners and runs ``handler`` for each connection.

    Args:
        name: the listener's name, for logs.
        handler: runs one connection; it owns the stream until it returns.
        ssl_context: TLS server context, or None for plaintext (explicit only).
        tls_handshake_timeout: seconds a client has to complete TLS.
        max_connections: open connections allowed at once.
        max_connections_per_address: open connections allowed at once from one IP address.
        metrics: the listener's metrics, handed on to its connections (default: none).
        proxy: the PROXY protocol settings when the listener sits behind a balancer.
        connections: the service's registry of open connections (default: one of
            this listener's own).
        certificate_check: the CRL in force, for client certificates checked
            again after the handshake (None: they are not).
        gate: the workers' least-connections gate, which counts this worker's
            connections (None: a single process).
        defer: whether the gate may leave a pending connection to a less busy
            worker (the listener's sockets are the supervisor's, shared by all).
    """

    def __init__(
        self,
        name: str,
        handler: Handler,
        *,
        ssl_context: ssl.SSLContext | None,
        tls_handshake_timeout: float,
        max_connections: int,
        max_connections_per_address: int | None = None,
        metrics: ListenerMetrics = NULL_LISTENER,
        proxy: ProxySettings | None = None,
        connections: OpenConnections | None = None,
        certificate_check: CertificateCheck | None = None,
        gate: AcceptGate | None = None,
        defer: bool = False,
    ) -> None:
        self.name = name
        self._handler = handler
        #: Replaced on reload; new connections take the current one.
        self.ssl_context = ssl_context
        self._handshake_timeout = tls_handshake_timeout
        self._max_connections = max_connections
        self._max_per_address = max_connections_per_address or max_connections
        self._per_address: dict[str, int] = {}
        self.active = 0
        self.refused = 0
        #: Connections closed by an unexpected exception (``connection.failed``).
        self.failed = 0
        #: Told each refused TLS handshake (who, reason): the audit log.
        self.on_tls_failure: Callable[[ConnectionInfo, str], None] | None = None
        self.metrics = metrics
        self._proxy = proxy
        self.connections = connections if connections is not None else OpenConnections()
        self._certificate_check = certificate_check
        self._gate = gate
        self._defer = defer and gate is not None

    def update(
        self,
        handler: Handler,
        *,
        tls_handshake_timeout: float,
        max_connections: int,
        max_connections_per_address: int | None = None,
        proxy: ProxySettings | None = None,
    ) -> None:
        """New settings for the connections accepted from now on (a reload).

        Open connections keep the handler and settings they started with.
        """
        self._handler = handler
        self._handshake_timeout = tls_handshake_timeout
        self._max_connections = max_connections
        self._max_per_address = max_connections_per_address or max_connections
        self._proxy = proxy

    async def serve(
        self, listeners: list[trio.SocketListener], connection_nursery: trio.Nursery
    ) -> None:
        """Accept on every listener until cancelled; connections run in ``connection_nursery``.

        Cancelling this call stops accepting; open connections keep running
        in their own nursery, so a shutdown can still drain them.
        """
        try:
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener, connection_nursery)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        gate = self._gate
        if gate is None or not self._defer:
            await self._accept_each(listener.accept, nursery)
            return
        # A non-blocking accept needs the plain socket: a duplicate of the listener's.
        with socket.socket(fileno=os.dup(listener.socket.fileno())) as raw:
            raw.setblocking(False)
            backlog = _Backlog()  # kept across accepts (see _gated_accept)
            await self._accept_each(
                lambda: _gated_accept(listener.socket, raw, gate, backlog, self._has_room),
                nursery,
            )

    def _has_room(self) -> bool:
        """Whether a connection accepted now would be under ``max_connections``."""
        return self.active < self._max_connections

    async def _accept_each(
        self, accept: Callable[[], Awaitable[trio.SocketStream]], nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                stream = await accept()
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRNOS:
                    raise
                log.error("accept.backoff", listener=self.name, reason=exc.strerror)
                await trio.sleep(ACCEPT_BACKOFF_SECONDS)
                continue
            address, port = _peer_address(stream)
            proxy = self._proxy
            refusal = None
            if self.active >= self._max_connections:
                refusal = f"max_connections={self._max_connections} reached"
                self.metrics.connection_refused("max_connections")
            elif proxy is not None and not proxy.trusts(address):
                refusal = "not a trusted proxy (proxy_protocol is on: see trusted_proxies)"
                self.metrics.connection_refused("untrusted_proxy")
            elif proxy is None and not self._admit_address(address):
                refusal = f"max_connections_per_address={self._max_per_address} reached"
            if refusal is not None:
                self._refuse(peer_name(address, port), refusal)
                await trio.aclose_forcefully(stream)
                continue
            self.active += 1
            if self._gate is not None:
                self._gate.opened()
            self.metrics.connections_accepted.inc()
            self.metrics.connections_open.inc()
            nursery.start_soon(self._run_connection, stream, address, port, proxy)

    def _admit_address(self, address: str) -> bool:
        """Count a connection against ``address``'s limit; False (counted nowhere) when full."""
        if self._per_address.get(address, 0) >= self._max_per_address:
            self.metrics.connection_refused("max_connections_per_address")
            return False
        self._per_address[address] = self._per_address.get(address, 0) + 1
        return True

    def _refuse(self, peer: str, reason: str, **fields: str) -> None:
        self.refused += 1
        log.warning("connection.refused", listener=self.name, peer=peer, reason=reason, **fields)

    def _release(self, address: str | None) -> None:
        self.active -= 1
        if self._gate is not None:
            self._gate.closed()
        self.metrics.connections_open.dec()
        if address is None:
            return  # never counted against an address (refused behind a proxy)
        left = self._per_address.get(address, 1) - 1
        if left > 0:
            self._per_address[address] = left
        else:
            self._per_address.pop(address, None)

    async def _proxied_client(
        self, sock: trio.SocketStream, proxy: ProxySettings, address: str, port: int | None
    ) -> tuple[str, int | None] | None:
        """The client a balancer relays (its header read), or None: the connection ends here."""
        via = peer_name(address, port)
        header = await read_proxy_header(sock, proxy)
        if isinstance(header, ProxyFailure):
            log.warning(header.event, listener=self.name, peer=via, reason=header.reason)
            self.metrics.connection_refused("proxy_header")
            return None
        if header.source is None:
            if await is_health_check(sock, header, self._handshake_timeout):
                log.debug("proxy.health_check", listener=self.name, peer=via)
                return None
        else:
            address, port = str(header.source.address), header.source.port
            # A dual-stack balancer may name an IPv4 client as ::ffff:a.b.c.d.
            mapped = getattr(header.source.address, "ipv4_mapped", None)
            if mapped is not None:
                address = str(mapped)
        client = peer_name(address, port)
        if not self._admit_address(address):
            reason = f"max_connections_per_address={self._max_per_address} reached"
            self._refuse(client, reason, via=via)
            return None
        log.info("connection.proxied", listener=self.name, peer=client, via=via)
        return address, port

    async def _run_connection(
        self,
        sock: trio.SocketStream,
        address: str,
        port: int | None,
        proxy: ProxySettings | None = None,
    ) -> None:
        context = self.ssl_context
        counted: str | None = address if proxy is None else None
        info = ConnectionInfo(self.name, address, port, context is not None, metrics=self.metrics)
        try:
            if proxy is not None:
                client = await self._proxied_client(sock, proxy, address, port)
                if client is None:
                    await trio.aclose_forcefully(sock)
                    return
                counted = client[0]
                info = replace(info, address=client[0], port=client[1])
            # A revocation cancels the block: the stream still closes politely.
            with self.connections.watch(self.name, info.peer) as guard:
                await self._serve_connection(sock, context, replace(info, guard=guard))
        except Exception as exc:  # noqa: BLE001 - the connection boundary (module docstring)
            # Cancelled is a BaseException and is not caught here.
            self.failed += 1
            self.metrics.connections_failed.inc()
            types, text = describe_failure(exc)
            log.error(
                "connection.failed", listener=self.name, peer=info.peer, error=types, reason=text
            )
        finally:
            self._release(counted)

    async def _serve_connection(
        self, sock: trio.SocketStream, context: ssl.SSLContext | None, info: ConnectionInfo
    ) -> None:
        stream: trio.abc.Stream = sock
        peer = info.peer
        try:
            if context is not None:
                tls = trio.SSLStream(sock, context, server_side=True)
                stream = tls
                with trio.move_on_after(self._handshake_timeout) as scope:
                    plaintext = await _plaintext_guess(sock)
                    if plaintext is not None:
                        log.warning(
                            "tls.plaintext_client", listener=self.name, peer=peer,
                            reason=plaintext,
                        )  # fmt: skip
                        self.metrics.tls_failure("plaintext")
                        return
                    try:
                        await tls.do_handshake()
                    except trio.BrokenResourceError as exc:
                        reason = handshake_failure(exc.__cause__)
                        log.warning(
                            "tls.handshake_failed", listener=self.name, peer=peer, reason=reason
                        )
                        self.metrics.tls_failure(reason)
                        if self.on_tls_failure is not None:
                            self.on_tls_failure(info, reason)
                        return
                if scope.cancelled_caught:
                    log.warning(
                        "tls.handshake_failed",
                        listener=self.name,
                        peer=peer,
                        reason=f"no handshake within {self._handshake_timeout}s",
                    )
                    self.metrics.tls_failure("no handshake within the deadline")
                    return
                # The certificate was verified in the handshake (CRL included).
                der = tls.getpeercert(binary_form=True)
                subject = peer_subject(der)
                if subject:
                    info = replace(info, source=subject)
                if der and info.guard is not None and self._certificate_check is not None:
                    # Checked again against each CRL a reload brings.
                    info.guard.add(certificate_credential(der, self._certificate_check))
            await self._handler(stream, info)
        finally:
            await _close(stream)
