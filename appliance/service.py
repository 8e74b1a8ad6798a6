"""``appliance serve``: state directory, certificates, writer, listeners, graceful stop.

Shutdown (SIGTERM or SIGINT, or ``stop`` set by a caller), all under
``shutdown_timeout_seconds``:

1. stop accepting;
2. stop reading on every connection (nothing new is taken in);
3. close the writer's input: it commits what is queued, in groups as usual;
4. each connection sends the acks of its committed requests, then closes.

SIGHUP (or ``appliance cert reload``) reloads the server certificate and the
CRL without dropping open connections.

Past the deadline whatever is left is abandoned unacknowledged; clients
resend it and the resend is deduplicated.
"""

from __future__ import annotations

import functools
import os
import signal
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

from appliance.config import (
    Config,
    ForwardListenerConfig,
    ListenerConfig,
    LogjamListenerConfig,
    WebSocketListenerConfig,
)
from appliance.lake.maintenance import run_maintenance
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter
from appliance.logs import get_logger
from appliance.server.context import ServiceContext
from appliance.server.exposure import unauthenticated_listeners
from appliance.server.heartbeat import serve_udp_heartbeat
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import TcpService
from appliance.server.logjam_driver import serve_logjam
from appliance.server.registry import handler_for
from appliance.server.tls import TlsManager
from appliance.server.websocket_driver import open_token_verifier
from auth.policy import CredentialStore

__all__ = ["Running", "node_id", "prepare_state", "serve"]

log = get_logger("service")

#: Seconds between checks of the CRL's validity and of certificate expiry.
TLS_REFRESH_INTERVAL_SECONDS: Final = 3600.0


@dataclass(slots=True)
class Running:
    """What a started service reports: bound ports by listener name, and its parts."""

    ports: dict[str, int] = field(default_factory=dict)
    ca_file: Path | None = None
    writer: LakeWriter | None = None
    services: dict[str, TcpService] = field(default_factory=dict)
    tls_manager: TlsManager | None = None


def prepare_state(config: Config) -> None:
    """Create the state directory (0750) if it is missing."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(config.state_dir, 0o750)  # noqa: S103 -- group read for operators, DESIGN §5


def node_id(config: Config) -> str:
    """This node's stable id: from the config, or generated once into ``<state>/node-id``."""
    if config.node_id:
        return config.node_id
    path = config.state_dir / "node-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        value = f"appliance-{uuid.uuid4().hex}"
        path.write_text(value + "\n", encoding="ascii")
        return value


def _credentials(config: Config) -> CredentialStore | None:
    """The auth database, opened only when a listener runs the forward handshake."""
    needs = any(
        isinstance(listener, ForwardListenerConfig) and listener.security != "off"
        for listener in config.listeners
    )
    if not needs:
        return None
    from auth.schema import prepare  # SQLAlchemy loads only when needed
    from auth.store import SqlCredentialStore

    url = config.auth_database_url
    # The embedded default (SQLite under the state dir) upgrades itself; a
    # configured database must be upgraded by the operator (appliance db upgrade).
    prepare(url, upgrade_in_place=config.auth.database_url is None)
    return SqlCredentialStore(url, config.auth_secret_key_file)


def pid_file(config: Config) -> Path:
    """Where the running service writes its process id (``appliance cert reload`` reads it)."""
    return config.state_dir / "appliance.pid"


async def _handle_signals(stop: trio.Event, reload: Callable[[str], object]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                reload("SIGHUP")
                continue
            log.info("service.stopping", signal=signal.Signals(signum).name)
            stop.set()
            return


async def _refresh_tls(tls: TlsManager, running: Running) -> None:
    """Re-sign the CRL before it runs out, and repeat expiry warnings, every hour."""
    while True:
        await trio.sleep(TLS_REFRESH_INTERVAL_SECONDS)
        if tls.ca.exists and tls.ca.crl_needs_refresh():
            tls.reload(running.services, "crl-refresh")
        else:
            tls.warn_expiring()


async def serve(
    config: Config,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the appliance until ``stop`` is set, or SIGTERM/SIGINT when ``stop`` is None."""
    prepare_state(config)
    tls = TlsManager(config)
    ca_file = tls.prepare()
    writer = LakeWriter(
        EventsTable(config.table_uri, config.lake.storage_options or None),
        node_id(config),
        config.lake.writer_settings(),
    )
    await writer.open()
    lifecycle = Lifecycle()
    context = ServiceContext(writer, lifecycle, credentials=_credentials(config))
    close_tokens: Callable[[], None] | None = None
    if any(isinstance(listener, WebSocketListenerConfig) for listener in config.listeners):
        # Bearer tokens live in the auth database (only the embedded one upgrades itself).
        context.tokens, close_tokens = await trio.to_thread.run_sync(
            open_token_verifier, config.state_dir, config.auth.database_url
        )
    for exposed in unauthenticated_listeners(config):
        log.warning(
            "listener.unauthenticated", listener=exposed.name, bind=exposed.bind,
            advice="anyone who reaches this address can write events: require client "
            "certificates (client_auth), the forward handshake (security) or CURVE",
        )  # fmt: skip
    running = Running(ca_file=ca_file, writer=writer, tls_manager=tls)
    stop_event = stop if stop is not None else trio.Event()
    shutdown = trio.CancelScope()
    with shutdown:
        async with trio.open_nursery() as writer_nursery:
            writer_nursery.start_soon(writer.run)
            async with trio.open_nursery() as connections:
                accepting: list[trio.CancelScope] = []
                async with trio.open_nursery() as acceptors:
                    for listener in config.listeners:
                        if isinstance(listener, LogjamListenerConfig):
                            await _start_logjam(listener, config, context, connections, running)
                            continue
                        await acceptors.start(
                            _start_listener,
                            listener,
                            tls.context_for(listener),
                            context,
                            connections,
                            running,
                            accepting,
                        )
                    if stop is None:
                        acceptors.start_soon(
                            _handle_signals,
                            stop_event,
                            lambda why: tls.reload(running.services, why),
                        )
                    if ca_file is not None:
                        acceptors.start_soon(_refresh_tls, tls, running)
                    # Compaction, checkpoints and vacuum, serialized with commits;
                    # in acceptors so that a stop ends the schedule.
                    acceptors.start_soon(run_maintenance, writer, config)
                    pid_file(config).write_text(f"{os.getpid()}\n", encoding="ascii")
                    log.info(
                        "service.ready",
                        listeners=",".join(f"{n}:{p}" for n, p in running.ports.items()),
                        table=config.table_uri,
                        ca=str(ca_file) if ca_file else None,
                    )
                    if ca_file:
                        print(f"CA certificate for clients: {ca_file}", flush=True)
                    task_status.started(running)
                    await stop_event.wait()
                    shutdown.deadline = trio.current_time() + config.shutdown_timeout_seconds
                    for scope in accepting:
                        scope.cancel()
                    acceptors.cancel_scope.cancel()
                lifecycle.stop_reading()
                await lifecycle.wait_no_readers()
                await writer.close_input()
    pid_file(config).unlink(missing_ok=True)
    if close_tokens is not None:
        close_tokens()
    if shutdown.cancelled_caught:
        log.error("service.stopped", reason="shutdown timeout: in-flight batches left unacked")
    else:
        log.info("service.stopped", commits=writer.commits, rows=writer.rows_committed)


async def _start_logjam(
    listener: LogjamListenerConfig,
    config: Config,
    context: ServiceContext,
    connections: trio.Nursery,
    running: Running,
) -> None:
    """Start a Logjam (ZeroMQ) listener.

    It is no TcpService: it runs in the connections nursery so that its 202
    replies go out after the writer drains, and it stops reading on
    ``lifecycle.stop_reading()`` like the stream connections.
    """
    ports = await connections.start(
        functools.partial(
            serve_logjam,
            listener,
            context,
            config.state_dir,
            # None: the embedded SQLite database, upgraded in place.
            auth_database_url=config.auth.database_url,
        )
    )
    running.ports[listener.name] = ports.router
    if ports.pull is not None:
        running.ports[f"{listener.name}-pull"] = ports.pull


async def _start_listener(
    listener: ListenerConfig,
    tls_context: ssl.SSLContext | None,
    context: ServiceContext,
    connections: trio.Nursery,
    running: Running,
    accepting: list[trio.CancelScope],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    handler = handler_for(listener, context)
    service = TcpService(
        listener.name,
        handler,
        ssl_context=tls_context if listener.tls else None,
        tls_handshake_timeout=listener.tls_handshake_timeout_seconds,
        max_connections=listener.max_connections,
        max_connections_per_address=listener.max_connections_per_address,
    )
    sockets = await trio.open_tcp_listeners(listener.port, host=listener.host)
    port = sockets[0].socket.getsockname()[1]
    running.ports[listener.name] = port
    running.services[listener.name] = service
    if not listener.tls:
        log.warning("listener.plaintext", listener=listener.name, bind=listener.bind)
    scope = trio.CancelScope()
    accepting.append(scope)
    with scope:
        async with trio.open_nursery() as nursery:
            if isinstance(listener, ForwardListenerConfig) and listener.udp_heartbeat:
                await nursery.start(serve_udp_heartbeat, listener.host, port)
            nursery.start_soon(service.serve, sockets, connections)
            task_status.started()
