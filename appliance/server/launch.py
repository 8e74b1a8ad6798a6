"""Opening a listener: what the service hands every listener's start, and the start of a TCP one.

:mod:`appliance.server.registry` says which start a protocol's listener
takes; this module holds the parts that know no protocol. A start records
what it opened in the service's :class:`Registrar` (the ports it really
bound, so a ``bind`` with port 0 reports the port it got), and runs its
accept loop in the acceptors nursery, where a stop or a reload cancels it;
connections run in the connections nursery, which outlives the accept loops
so that in-flight batches are still acknowledged after a stop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from appliance.config import Config, ListenerConfig
from appliance.logs import get_logger
from appliance.server.binding import open_tcp_listeners
from appliance.server.context import ServiceContext
from appliance.server.listener import Handler, TcpService
from appliance.server.proxied import ProxySettings
from appliance.server.tls import TlsManager
from appliance.server.tls_audit import TlsRefusalAudit
from pki.errors import PkiError

__all__ = ["START_ERRORS", "Beside", "BindError", "ListenerSite", "Registrar", "serve_tcp"]

#: The service's logger: these lines were the service's before they moved here.
log = get_logger("service")

#: Started beside a TCP listener, in its nursery, with the port it bound
#: (forward: the UDP heartbeat on the same port). Returns once started.
Beside = Callable[[Any, int, trio.Nursery], Awaitable[None]]

#: What a listener's start raises when that listener cannot start: its
#: sockets or what starts beside them (OSError, BindError) or its TLS
#: context (PkiError: a file missing or broken, the PKI lock held). A reload
#: catches these for the one listener and goes on serving.
START_ERRORS: tuple[type[Exception], ...] = (OSError, PkiError)


class BindError(OSError):
    """A listener cannot bind its address; the message names the listener and address."""

    def __str__(self) -> str:
        return str(self.strerror)


class Registrar(Protocol):
    """Where a start records what it opened (the service's ``Running``)."""

    #: The port each listener bound, by name (a Logjam PULL socket as ``<name>-pull``).
    ports: dict[str, int]
    #: The TCP services, by listener name (a TLS reload hands them new contexts).
    services: dict[str, TcpService]
    #: What stops a listener's accept loop, by name (a reload that removes it).
    accepting: dict[str, trio.CancelScope]
    #: Certificates refused at the handshake, into the audit log (mutual TLS only).
    tls_audit: TlsRefusalAudit | None


@dataclass(frozen=True, slots=True)
class ListenerSite:
    """What the service hands a listener's start: its parts, nurseries and records."""

    context: ServiceContext
    #: The configuration the listener comes from (the state directory, the auth database).
    config: Config
    tls: TlsManager
    #: Accept loops: cancelled first at a stop.
    acceptors: trio.Nursery
    #: Connections (and the Logjam listener, which replies after the writer drains).
    connections: trio.Nursery
    running: Registrar


async def serve_tcp(
    listener: ListenerConfig,
    handler: Handler,
    site: ListenerSite,
    beside: Beside | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``listener``'s TCP sockets and accept connections for ``handler`` until cancelled.

    Run it with ``site.acceptors.start``: it reports started once the
    sockets are bound and recorded in ``site.running``.

    Raises:
        BindError: the address, or what starts beside it (the forward
            listener's UDP heartbeat), cannot be bound; the message names
            the listener.
        PkiError: the listener's TLS context cannot be built.
    """
    context = site.context
    share = context.share
    try:
        # A worker serves the sockets its supervisor bound (one queue for every
        # worker); one a reload added or moved it binds itself, sharing the port.
        inherited = share.sockets.take(listener.name, listener.bind) if share else None
        sockets = inherited or await open_tcp_listeners(
            listener.port, listener.host, reuse_port=listener.reuse_port
        )
    except OSError as exc:
        # Name the listener and its address: "address already in use" alone
        # does not say which of several listeners failed.
        raise BindError(
            exc.errno, f"listener {listener.name!r} cannot bind {listener.bind}: {exc.strerror}"
        ) from exc
    except UnicodeError as exc:
        # A host the resolver cannot encode (configuration checks refuse it first).
        raise BindError(
            None, f"listener {listener.name!r} cannot bind {listener.bind}: {exc}"
        ) from exc
    # Until service.serve owns them (it closes them when it ends), the sockets
    # are this call's: a start that fails before (a TLS context that cannot be
    # built, a heartbeat that cannot bind) closes them, so no port stays bound
    # with a queue that nobody accepts from, and takes back what it recorded,
    # so that a later reload does not take the listener for open.
    running = site.running
    handed = False
    scope: trio.CancelScope | None = None
    try:
        try:
            ssl_context = site.tls.context_for(listener) if listener.tls else None
        except PkiError as exc:
            raise PkiError(f"listener {listener.name!r}: {exc}") from exc
        service = TcpService(
            listener.name,
            handler,
            ssl_context=ssl_context,
            tls_handshake_timeout=listener.tls_handshake_timeout_seconds,
            max_connections=listener.max_connections,
            max_connections_per_address=listener.max_connections_per_address,
            metrics=context.metrics.listener(listener.name, listener.protocol),
            proxy=ProxySettings.of(listener),
            connections=context.connections,
            certificate_check=site.tls.certificate_revocation,
            gate=share.gate if share else None,
            # Only a queue every worker accepts from is worth leaving to another.
            defer=inherited is not None,
        )
        port = sockets[0].socket.getsockname()[1]
        running.ports[listener.name] = port
        running.services[listener.name] = service
        if running.tls_audit is not None and listener.client_auth != "off":
            service.on_tls_failure = running.tls_audit.note
        if not listener.tls:
            log.warning("listener.plaintext", listener=listener.name, bind=listener.bind, port=port)
        scope = trio.CancelScope()
        running.accepting[listener.name] = scope
        beside_failed: OSError | None = None
        with scope:
            async with trio.open_nursery() as nursery:
                if beside is not None:
                    try:
                        await beside(listener, port, nursery)
                    except OSError as exc:
                        # Raised out of the nursery, it would leave wrapped in an
                        # ExceptionGroup, which a reload's ``except OSError`` does
                        # not catch: the service would end for a busy UDP port.
                        beside_failed = exc
                        nursery.cancel_scope.cancel()
                if beside_failed is None:
                    nursery.start_soon(service.serve, sockets, site.connections)
                    handed = True
                    task_status.started()
        if beside_failed is not None:
            raise BindError(
                beside_failed.errno,
                f"listener {listener.name!r} cannot start beside port {port}: "
                f"{beside_failed.strerror or beside_failed}",
            ) from beside_failed
    finally:
        if not handed:
            for opened in sockets:
                opened.socket.close()
            if scope is not None and running.accepting.get(listener.name) is scope:
                del running.accepting[listener.name]
                running.services.pop(listener.name, None)
                running.ports.pop(listener.name, None)
