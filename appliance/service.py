"""``appliance serve``: state directory, certificates, writer, listeners, graceful stop.

Shutdown (SIGTERM or SIGINT, or ``stop`` set by a caller), all under
``shutdown_timeout_seconds``:

1. stop accepting;
2. stop reading on every connection (nothing new is taken in);
3. close the writer's input: it commits what is queued, in groups as usual;
4. each connection sends the acks of its committed requests, then closes.

Past the deadline whatever is left is abandoned unacknowledged; clients
resend it and the resend is deduplicated.
"""

from __future__ import annotations

import os
import signal
import ssl
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import trio

from appliance.config import Config, ForwardListenerConfig
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter
from appliance.logs import get_logger
from appliance.server.forward_driver import ForwardHandler
from appliance.server.heartbeat import serve_udp_heartbeat
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import TcpService
from pki.authority import PkiPaths, ensure_ca_and_server
from pki.tls import server_context

__all__ = ["Running", "node_id", "prepare_state", "serve"]

log = get_logger("service")


@dataclass(slots=True)
class Running:
    """What a started service reports: bound ports by listener name, and its parts."""

    ports: dict[str, int] = field(default_factory=dict)
    ca_file: Path | None = None
    writer: LakeWriter | None = None
    services: dict[str, TcpService] = field(default_factory=dict)


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


def _tls_context(config: Config) -> tuple[ssl.SSLContext | None, Path | None]:
    if not any(listener.tls for listener in config.listeners):
        return None, None
    if config.tls.cert_file and config.tls.key_file:
        return server_context(config.tls.cert_file, config.tls.key_file), None
    paths = PkiPaths(config.pki_dir)
    if ensure_ca_and_server(paths, config.tls.server_names):
        log.info("pki.created", ca=str(paths.ca_cert.resolve()))
    return server_context(paths.server_cert, paths.server_key), paths.ca_cert.resolve()


async def _wait_for_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("service.stopping", signal=signal.Signals(signum).name)
            stop.set()
            return


async def serve(
    config: Config,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the appliance until ``stop`` is set, or SIGTERM/SIGINT when ``stop`` is None."""
    prepare_state(config)
    context, ca_file = _tls_context(config)
    writer = LakeWriter(
        EventsTable(config.table_uri, config.lake.storage_options or None),
        node_id(config),
        config.lake.writer_settings(),
    )
    await writer.open()
    lifecycle = Lifecycle()
    running = Running(ca_file=ca_file, writer=writer)
    stop_event = stop if stop is not None else trio.Event()
    shutdown = trio.CancelScope()
    with shutdown:
        async with trio.open_nursery() as writer_nursery:
            writer_nursery.start_soon(writer.run)
            async with trio.open_nursery() as connections:
                accepting = trio.CancelScope()
                async with trio.open_nursery() as acceptors:
                    for listener in config.listeners:
                        await acceptors.start(
                            _start_listener,
                            listener,
                            context,
                            writer,
                            lifecycle,
                            connections,
                            running,
                            accepting,
                        )
                    if stop is None:
                        acceptors.start_soon(_wait_for_signal, stop_event)
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
                    accepting.cancel()
                    acceptors.cancel_scope.cancel()
                lifecycle.stop_reading()
                await lifecycle.wait_no_readers()
                await writer.close_input()
    if shutdown.cancelled_caught:
        log.error("service.stopped", reason="shutdown timeout: in-flight batches left unacked")
    else:
        log.info("service.stopped", commits=writer.commits, rows=writer.rows_committed)


async def _start_listener(
    listener: ForwardListenerConfig,
    context: ssl.SSLContext | None,
    writer: LakeWriter,
    lifecycle: Lifecycle,
    connections: trio.Nursery,
    running: Running,
    accepting: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    handler = ForwardHandler(listener, writer, lifecycle)
    service = TcpService(
        listener.name,
        handler,
        ssl_context=context if listener.tls else None,
        tls_handshake_timeout=listener.tls_handshake_timeout_seconds,
        max_connections=listener.max_connections,
    )
    sockets = await trio.open_tcp_listeners(listener.port, host=listener.host)
    port = sockets[0].socket.getsockname()[1]
    running.ports[listener.name] = port
    running.services[listener.name] = service
    if not listener.tls:
        log.warning("listener.plaintext", listener=listener.name, bind=listener.bind)
    with accepting:
        async with trio.open_nursery() as nursery:
            if listener.udp_heartbeat:
                await nursery.start(serve_udp_heartbeat, listener.host, port)
            nursery.start_soon(service.serve, sockets, connections)
            task_status.started()
