"""``appliance serve``: state directory, certificates, writer, listeners, graceful stop.

Shutdown (SIGTERM or SIGINT, or ``stop`` set by a caller), all under
``shutdown_timeout_seconds``:

1. stop accepting;
2. stop reading on every connection (nothing new is taken in);
3. close the writer's input: it commits what is queued, in groups as usual
   (with ``[lake] ack = "wal"``: the log writes what is pending, and the
   writer commits everything the log holds);
4. each connection sends the acks of its durable requests, then closes.

SIGHUP (or ``appliance cert reload``) reloads the server certificate and the
CRL without dropping open connections, except those whose credentials were
revoked: every open connection's credentials are checked again then, and
every ``RECHECK_INTERVAL_SECONDS`` (appliance/server/revocation.py).

Past the deadline whatever is left is abandoned unacknowledged; clients
resend it and the resend is deduplicated. With ``ack = "wal"``, records in
the log that were not committed yet are replayed at the next start, before
the listeners open.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

from appliance import gc_policy
from appliance.config import Config, ConfigError, ListenerConfig, load_config, settings_from
from appliance.lake.retry import (
    STORAGE_ERRORS,
    Backoff,
    NotRetryable,
    describe,
    retrying_async,
    store_options,
)
from appliance.lake.schedule import run_maintenance
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from appliance.logs import get_logger
from appliance.metrics import Metrics
from appliance.node import (
    drain_left_logs,
    node_id,
    worker_config,
    write_ahead_log,
    writer_token,
)
from appliance.reload_status import ReloadStatus, write_status
from appliance.server.admin import Readiness, admin_tls_context, serve_admin
from appliance.server.context import ServiceContext
from appliance.server.decode_budget import DecodeBudget
from appliance.server.exposure import unauthenticated_listeners
from appliance.server.launch import START_ERRORS, ListenerSite
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo, TcpService
from appliance.server.proxied import ProxySettings
from appliance.server.registry import handler_for, kind_of, start_listener, stores_needed
from appliance.server.reload import FIXED_KEYS as _FIXED_KEYS
from appliance.server.reload import ReloadPlan, plan_reload
from appliance.server.sdnotify import Notifier
from appliance.server.spread import WorkerShare
from appliance.server.tls import TlsManager
from appliance.server.tls_audit import TlsRefusalAudit
from appliance.server.websocket_listener import open_token_verifier
from appliance.state_lock import StateLock
from auth.errors import AuthError
from auth.failure_table import SharedCounts, table_path
from auth.policy import CredentialStore

__all__ = ["Running", "node_id", "prepare_state", "serve", "write_ahead_log"]

log = get_logger("service")

#: Seconds between checks of the CRL's validity and of certificate expiry.
TLS_REFRESH_INTERVAL_SECONDS: Final = 3600.0

#: Delays between attempts to open the table at start (transient failures: a
#: store that times out, resets, answers 5xx): from about a second up to 30 s.
OPEN_BACKOFF: Final = Backoff(initial_seconds=1.0, max_seconds=30.0)


@dataclass(slots=True)
class Running:
    """What a started service reports: bound ports by listener name, and its parts."""

    ports: dict[str, int] = field(default_factory=dict)
    ca_file: Path | None = None
    writer: LakeWriter | None = None
    services: dict[str, TcpService] = field(default_factory=dict)
    tls_manager: TlsManager | None = None
    #: Certificates refused at the handshake, into the audit log (mutual TLS only).
    tls_audit: TlsRefusalAudit | None = None
    #: Stops a listener's accept loop, by name (a reload that removes it).
    accepting: dict[str, trio.CancelScope] = field(default_factory=dict)
    #: Re-read the config file and apply it, as SIGHUP does (set once started).
    reload: Callable[[str], Awaitable[ReloadStatus]] | None = None
    #: The service's metrics (served by the admin listener).
    metrics: Metrics | None = None
    #: The admin listener's port (None: disabled, or its default address was taken).
    admin_port: int | None = None


def prepare_state(config: Config) -> None:
    """Create the state directory (0750, docs/decisions.md#state-belongs-to-the-service-user)."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(config.state_dir, 0o750)  # noqa: S103 -- group read for operators


def _credentials(config: Config) -> CredentialStore | None:
    """The auth database, opened only when a listener runs the forward handshake."""
    if "credentials" not in stores_needed(config.listeners):
        return None
    from auth.database import open_database  # SQLAlchemy loads only when needed

    return open_database(config.auth_settings).credentials


def _changed(plan: ReloadPlan) -> list[ListenerConfig]:
    """The listeners a reload starts, updates or re-opens, with their new settings."""
    return [*plan.start, *plan.update, *plan.reopen]


def _guess_counts(config: Config) -> SharedCounts:
    """The node's shared table of failed handshakes (auth/failure_table.py).

    Under ``<home_dir>``, so that the workers of ``workers = N`` share it;
    opened now when a listener checks handshakes, else at a first use after
    a reload adds one.
    """
    counts = SharedCounts(table_path(config.home_dir))
    if "credentials" in stores_needed(config.listeners):
        counts.open()  # a failure is logged; the counts are then this process's own
    return counts


def _tls_audit(config: Config, context: ServiceContext) -> TlsRefusalAudit | None:
    """The audit of refused client certificates, when any listener asks for them."""
    if not any(listener.tls and listener.client_auth != "off" for listener in config.listeners):
        return None
    from auth.database import open_database

    store = open_database(config.auth_settings).audit

    def write(info: ConnectionInfo, reason: str) -> None:
        store.record_audit(
            "tls.refused", info.address, actor=None,
            detail=f"listener={info.listener} reason={reason}", source_address=info.peer,
        )  # fmt: skip

    return TlsRefusalAudit(write, context.auth_threads)


class _Parts:
    """The parts ``/readyz`` reads that exist only once the table is open (None before)."""

    def __init__(self) -> None:
        self.reloader: _Reloader | None = None
        self.context: ServiceContext | None = None


class _TableOpening:
    """Why the table is not open yet (``/readyz``: ``table``, ``opening: <reason>``), or None.

    Also tells systemd (``STATUS=``) why the start is waiting.
    """

    def __init__(self, notifier: Notifier) -> None:
        self.reason: str | None = "in progress"
        self._notifier = notifier

    def failed(self, reason: str | None) -> None:
        """The reason of a failed attempt (a retry follows); None: an attempt succeeded."""
        if reason is not None:
            self.reason = reason
            self._notifier.notify(f"STATUS=opening the table: {reason}")

    def opened(self) -> None:
        """The table is open."""
        self.reason = None


def _readiness(
    config: Config,
    parts: _Parts,
    running: Running,
    lifecycle: Lifecycle,
    writer: LakeWriter,
    opening: _TableOpening,
) -> Readiness:
    """What ``/readyz`` checks: the current listeners, the table, the auth database.

    Served from before the table is open: until then the listeners are not
    open and the table check says ``opening: <reason>``.
    """

    def expected_listeners() -> list[str]:
        current = parts.reloader.config if parts.reloader is not None else config
        return [listener.name for listener in current.listeners]

    def auth_database_url() -> str | None:
        context = parts.context
        uses = (
            (context is not None and context.credentials is not None)  # also opened by a reload
            or running.tls_audit is not None
            or bool(stores_needed(config.listeners))
        )
        return config.auth_database_url if uses else None

    return Readiness(
        expected_listeners=expected_listeners,
        open_listeners=lambda: running.ports,
        lifecycle=lifecycle,
        writer=writer,
        auth_database_url=auth_database_url,
        table_opening=lambda: opening.reason,
    )


def pid_file(config: Config) -> Path:
    """Where the running service writes its process id (``appliance cert reload`` reads it)."""
    return config.state_dir / "appliance.pid"


async def _handle_signals(
    stop: trio.Event,
    reload: Callable[[str], Awaitable[object]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        # Started only once SIGHUP is caught: the pid file and the first reload
        # status, which tell the CLI it may signal, come after this.
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                await reload("SIGHUP")
                continue
            log.info("service.stopping", signal=signal.Signals(signum).name)
            stop.set()
            return


#: Seconds between a worker's looks at whether its supervisor is still its parent.
SUPERVISOR_CHECK_SECONDS: Final = 1.0


#: Set by a worker's standing SIGTERM handler (:func:`request_stop`): a stop to make.
#: A plain bool: a handler may run again inside itself, and a lock would deadlock.
_stop_requested = False


def request_stop() -> None:
    """Ask the running worker to stop (its SIGTERM handler): see ``_follow_supervisor``."""
    global _stop_requested
    _stop_requested = True


async def _follow_supervisor(supervisor: int, stop: trio.Event) -> None:
    """A worker (``workers = N``) stops, draining as on SIGTERM, once its supervisor is gone.

    ``supervisor`` is the supervisor's pid, given on the command line: the
    worker's parent is another once the supervisor has died, even by
    SIGKILL, even before this worker was ready. A worker left running would
    hold the ports and its state directory, and the next start would fail.
    (``PR_SET_PDEATHSIG`` would do it at once, but it fires when the parent
    *thread* that started the worker exits, and trio starts processes from
    its worker threads, which come and go.) A SIGTERM taken by the worker's
    standing handler (:func:`request_stop`) stops it the same way.
    """
    while os.getppid() == supervisor and not _stop_requested:
        await trio.sleep(SUPERVISOR_CHECK_SECONDS)
    if not _stop_requested:
        log.warning("service.supervisor_gone", supervisor=supervisor)
    stop.set()


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
    supervisor: int | None = None,
    share: WorkerShare | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the appliance until ``stop`` is set, or SIGTERM/SIGINT when ``stop`` is None.

    ``supervisor``: the pid of the supervisor this process is a worker of
    (``workers = N``); it stops once that process is gone. ``share``: the
    listening sockets and connection counts that supervisor hands it.
    """
    prepare_state(config)
    # One process per state directory (docs/table.md): before anything is written.
    # StateLock retries for up to half a second: in a worker thread, not on the loop.
    state_lock = await trio.to_thread.run_sync(StateLock, config.state_dir)
    try:
        await _serve_locked(config, state_lock, stop, supervisor, share, task_status)
    finally:
        # Also when serving failed: a dying worker must not look like the least
        # busy one to the others until the supervisor sees it exit.
        _stop_sharing(share)
        state_lock.release()


def _stop_sharing(share: WorkerShare | None) -> None:
    """A worker that stops accepting: its slot reads absent, its copies of the sockets close.

    Idempotent. The supervisor closes its own copies as it stops, so the port
    refuses new connections as soon as every worker has stopped accepting,
    instead of queueing them through the drain.
    """
    if share is None:
        return
    if share.gate is not None:
        share.gate.leave()
    share.sockets.close()


async def _open_writer(writer: LakeWriter) -> None:
    """:meth:`LakeWriter.open`, for :func:`retrying_async`: repeatable until the log is open.

    Opening the table, claiming the app id and reading the dedupe keys may
    be tried again. Once the write-ahead log is open and its replay begun,
    only the writer can go on from where it stopped (its commits retry by
    themselves): a failure then stops the start, and the next start replays
    from the table's position.
    """
    try:
        await writer.open()
    except STORAGE_ERRORS as exc:
        wal = writer.wal
        if wal is not None and wal.is_open:
            raise NotRetryable(
                f"replaying the write-ahead log into {writer.table.uri} failed: {describe(exc)}"
            ) from exc
        raise


async def _open_table(
    writer: LakeWriter,
    opening: _TableOpening,
    stop: trio.Event,
    *,
    signals: bool,
    supervisor: int | None,
) -> bool:
    """Open the table and replay the log before any listener opens; False when stopped first.

    Transient failures are retried with :data:`OPEN_BACKOFF` for as long as
    it takes (``/readyz`` says ``opening: <reason>`` meanwhile, systemd's
    ``STATUS=`` too); a misconfiguration (the store refuses the credentials,
    the bucket does not exist) or a permanent error stops the start with its
    message. A stop (``stop``, SIGTERM/SIGINT with ``signals``, the
    supervisor gone) ends the wait.
    """
    opened = False
    async with trio.open_nursery() as nursery:

        async def open_it() -> None:
            nonlocal opened
            await retrying_async(
                lambda: _open_writer(writer), what=f"opening the table {writer.table.uri}",
                backoff=OPEN_BACKOFF, on_failure=opening.failed, phase="start",
            )  # fmt: skip
            opened = True
            opening.opened()
            nursery.cancel_scope.cancel()

        async def until_stopped() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(open_it)
        nursery.start_soon(until_stopped)
        if signals:
            await nursery.start(_handle_signals, stop, _reload_later)
        if supervisor is not None:
            nursery.start_soon(_follow_supervisor, supervisor, stop)
    return opened


async def _reload_later(why: str) -> None:
    """A reload asked for before the table is open: the file is read once the service starts."""
    log.warning("config.reload_ignored", trigger=why, reason="the table is not open yet")


async def _serve_admin_in(
    scope: trio.CancelScope,
    config: Config,
    tls: TlsManager,
    metrics: Metrics,
    readiness: Readiness,
    *,
    task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve_admin` under ``scope`` (cancelled when the stop begins)."""
    with scope:
        await serve_admin(
            config.admin, metrics, readiness,
            admin_tls_context(config, tls.ca) if config.admin.tls else None,
            attach=tls.attach_admin if config.admin.tls else None,  # reloads its certificate
            task_status=task_status,
        )  # fmt: skip


async def _serve_locked(
    config: Config,
    state_lock: StateLock,
    stop: trio.Event | None,
    supervisor: int | None,
    share: WorkerShare | None,
    task_status: trio.TaskStatus[Running],
) -> None:
    tls = TlsManager(config)
    ca_file = tls.prepare()
    if config.worker is None:
        # Logs left by workers of an earlier ``workers = N`` run: acked, so committed
        # first. This process runs alone, whatever ``workers`` resolves to here (a
        # test's or an embedding's serve): every worker's log is left, its own is not.
        await drain_left_logs(dataclasses.replace(config, workers=1))
    # Counted only when the admin listener can serve them (docs/observability.md).
    metrics = Metrics(enabled=config.admin.enabled)
    log_wal = config.lake.ack == "wal"
    wal = write_ahead_log(config)
    writer = LakeWriter(
        # Bounded timeouts and retries of the object-store client (retry.STORE_DEFAULTS).
        EventsTable(config.table_uri, store_options(config.table_uri, config.lake.storage_options)),
        node_id(config),
        settings_from(config.lake, WriterSettings),
        token=writer_token(config),
        metrics=metrics,
        wal=wal if log_wal else None,
    )
    lifecycle = Lifecycle()
    running = Running(ca_file=ca_file, writer=writer, tls_manager=tls)
    running.metrics = metrics
    parts = _Parts()
    notifier = Notifier()
    opening = _TableOpening(notifier)
    stop_event = stop if stop is not None else trio.Event()
    # The admin listener runs from before the table opens (/readyz says why it
    # is not ready yet) until the stop begins.
    admin_scope = trio.CancelScope()
    async with trio.open_nursery() as early:
        if config.admin.enabled:
            running.admin_port = await early.start(
                _serve_admin_in, admin_scope, config, tls, metrics,
                _readiness(config, parts, running, lifecycle, writer, opening),
            )  # fmt: skip
        # Before any listener opens: the table is claimed, and the log (if any)
        # recovered and replayed into it (docs/wal.md, "Start-up"). The log can
        # take no batch before the table's position in it is known, so no
        # listener opens until then (docs/fleet.md, "When the object store fails").
        if not await _open_table(
            writer, opening, stop_event, signals=stop is None, supervisor=supervisor
        ):
            admin_scope.cancel()
            if wal is not None:
                wal.close_files()
            log.info("service.stopped", reason="stopped before the table opened")
            return
        if wal is not None and not log_wal:
            await writer.drain_log(wal)  # ack = "commit" now: commit what ack = "wal" left
        context = ServiceContext(
            writer, lifecycle, credentials=_credentials(config), metrics=metrics,
            decode_budget=DecodeBudget(config.decode_budget_bytes), share=share,
        )  # fmt: skip
        parts.context = context
        # The forward handshakes' failures, counted for every worker of the node at once.
        context.guess_counts = await trio.to_thread.run_sync(_guess_counts, config)
        close_tokens: Callable[[], None] | None = None
        if "tokens" in stores_needed(config.listeners):
            # Bearer tokens live in the auth database (only the embedded one upgrades itself).
            context.tokens, close_tokens = await trio.to_thread.run_sync(
                open_token_verifier, config.auth_settings
            )
        for exposed in unauthenticated_listeners(config):
            log.warning(
                "listener.unauthenticated", listener=exposed.name, bind=exposed.bind,
                advice="anyone who reaches this address can write events: require client "
                "certificates (client_auth), the forward handshake (security) or CURVE",
            )  # fmt: skip
        running.tls_audit = tls_audit = _tls_audit(config, context)
        shutdown = trio.CancelScope()
        with shutdown:
            async with trio.open_nursery() as writer_nursery:
                writer_nursery.start_soon(writer.run)
                async with trio.open_nursery() as connections:
                    async with trio.open_nursery() as acceptors:
                        site = ListenerSite(context, config, tls, acceptors, connections, running)
                        for listener in config.listeners:
                            await start_listener(listener, site)
                        gate = share.gate if share is not None else None
                        if gate is not None:
                            gate.join()  # the other workers may leave connections to it now
                            metrics.watch_workers(gate.spread)
                        if tls_audit is not None:
                            acceptors.start_soon(tls_audit.run)
                        reloader = _Reloader(config, tls, context, running, acceptors, connections)
                        parts.reloader = reloader
                        running.reload = reloader.reload
                        if stop is None:
                            await acceptors.start(_handle_signals, stop_event, reloader.reload)
                        if supervisor is not None:
                            acceptors.start_soon(_follow_supervisor, supervisor, stop_event)
                        if ca_file is not None:
                            acceptors.start_soon(_refresh_tls, tls, running)
                        # Compaction, checkpoints and vacuum, serialized with commits;
                        # in acceptors so that a stop ends the schedule.
                        acceptors.start_soon(run_maintenance, writer, config)
                        # Cyclic garbage (closed TLS connections) freed each second.
                        acceptors.start_soon(gc_policy.collect_young)
                        # Revoked credentials close the connections they opened.
                        acceptors.start_soon(context.connections.run)
                        state_lock.write_pid_file()
                        write_status(
                            config.state_dir,
                            ReloadStatus(os.getpid(), 0, ok=True, crl_number=tls.crl_number),
                        )
                        log.info(
                            "service.ready",
                            listeners=",".join(f"{n}:{p}" for n, p in running.ports.items()),
                            table=config.table_uri,
                            ca=str(ca_file) if ca_file else None,
                            admin=running.admin_port,
                        )
                        if ca_file:
                            print(f"CA certificate for clients: {ca_file}", flush=True)
                        # systemd (Type=notify): ready once the listeners are open; the
                        # watchdog is pinged from this event loop (appliance/server/sdnotify.py).
                        notifier.notify("READY=1", f"STATUS=listening: {', '.join(running.ports)}")
                        acceptors.start_soon(notifier.keep_alive)
                        task_status.started(running)
                        await stop_event.wait()
                        notifier.notify("STOPPING=1")
                        shutdown.deadline = trio.current_time() + config.shutdown_timeout_seconds
                        for scope in running.accepting.values():
                            scope.cancel()
                        _stop_sharing(share)
                        acceptors.cancel_scope.cancel()
                        admin_scope.cancel()
                    lifecycle.stop_reading()
                    await lifecycle.wait_no_readers()
                    await writer.close_input()
        admin_scope.cancel()
    if close_tokens is not None:
        close_tokens()
    if shutdown.cancelled_caught:
        reason = "shutdown timeout: in-flight batches left unacked"
        if writer.wal is not None:
            reason += "; the log's uncommitted records are committed at the next start"
        log.error("service.stopped", reason=reason)
    else:
        log.info("service.stopped", commits=writer.commits, rows=writer.rows_committed)


class _Reloader:
    """Applies a re-read configuration to the running service (SIGHUP; reload.py says what)."""

    def __init__(
        self,
        config: Config,
        tls: TlsManager,
        context: ServiceContext,
        running: Running,
        acceptors: trio.Nursery,
        connections: trio.Nursery,
    ) -> None:
        self.config = config
        self._tls = tls
        self._context = context
        self._running = running
        self._acceptors = acceptors
        self._connections = connections
        self._generation = 0
        self._lock = trio.Lock()

    async def reload(self, why: str) -> ReloadStatus:
        """Re-read the config file, apply what can change live, re-read TLS; write the status."""
        async with self._lock:
            self._generation += 1
            status = await self._reload(why)
            # Whatever became of the reload: revoked credentials (and certificates
            # on the CRL just read) close their connections before it is confirmed.
            await self._context.connections.recheck(why)
            try:
                write_status(self.config.state_dir, status)
            except OSError as exc:
                # A full or read-only state directory: the reload still holds;
                # only the CLI's confirmation is missing (it waits, then says so).
                log.error("config.status_unwritten", trigger=why, reason=str(exc))
            return status

    async def _reload(self, why: str) -> ReloadStatus:
        applied: list[str] = []
        restart: list[str] = []
        config = self.config
        if config.source is not None:
            try:
                new = load_config(config.source)
                if config.worker is not None:
                    new = worker_config(new, config.worker)  # what this worker runs with
            except (ConfigError, ValueError) as exc:
                log.error("config.reload_failed", trigger=why, reason=str(exc))
                return ReloadStatus(
                    os.getpid(), self._generation, ok=False, error=str(exc),
                    crl_number=self._tls.crl_number,
                )  # fmt: skip
            # Planned from what really listens: a listener that is not open (its
            # re-open failed and so did the fallback) is started again.
            plan = plan_reload(self._as_running(config), new)
            restart = plan.restart_required
            # The fixed parts stay as they run; the rest is the new file's.
            config = dataclasses.replace(new, **{k: getattr(config, k) for k in _FIXED_KEYS})
            failed = await self._apply(plan, config)
            if plan.listener_changes:
                applied.append("listeners")
            # What the service reports is what it runs: a listener whose change
            # failed keeps its previous settings, a new one that failed is not there.
            config = dataclasses.replace(
                config, listeners=self._effective(config.listeners, failed)
            )
            self.config = config
            if restart:
                log.warning("config.changed", trigger=why, restart_required=restart)
            if failed:
                error = "; ".join(failed.values())
                log.error("config.reload_failed", trigger=why, reason=error, applied=applied)
                self._tls.use_config(config)
                return ReloadStatus(
                    os.getpid(), self._generation, ok=False, applied=applied,
                    restart_required=restart, error=error, crl_number=self._tls.crl_number,
                )  # fmt: skip
        self._tls.use_config(config)
        if not self._tls.reload(self._running.services, why):
            return ReloadStatus(
                os.getpid(), self._generation, ok=False, applied=applied,
                restart_required=restart, error="TLS reload failed: see the service log",
                crl_number=self._tls.crl_number,
            )  # fmt: skip
        applied.append("tls")
        log.info("config.reloaded", trigger=why, applied=applied, restart_required=restart)
        return ReloadStatus(
            os.getpid(), self._generation, ok=True, applied=applied, restart_required=restart,
            crl_number=self._tls.crl_number,
        )  # fmt: skip

    def _as_running(self, config: Config) -> Config:
        """``config`` less the live listeners that are not open now."""
        running = self._running
        listeners = [
            listener
            for listener in config.listeners
            if not kind_of(listener).live_reload or listener.name in running.accepting
        ]
        return dataclasses.replace(config, listeners=listeners)

    def _effective(
        self, wanted: Sequence[ListenerConfig], failed: Mapping[str, str]
    ) -> list[ListenerConfig]:
        """The listeners as they run after a reload in which ``failed`` could not change."""
        before = {listener.name: listener for listener in self.config.listeners}
        effective: list[ListenerConfig] = []
        for listener in wanted:
            if listener.name not in failed:
                effective.append(listener)
            elif listener.name in before:
                effective.append(before[listener.name])
        return effective

    async def _apply(self, plan: ReloadPlan, config: Config) -> dict[str, str]:
        """Apply ``plan``; the listeners that could not change, and why (they keep the old)."""
        running = self._running
        failed: dict[str, str] = {}
        if self._context.credentials is None and "credentials" in stores_needed(config.listeners):
            plan = await self._open_credentials(plan, config, failed)
        for name in plan.stop:
            self._stop_accepting(name)
        if self._context.share is not None:
            # The supervisor's sockets of listeners gone or moved: this worker's copies
            # close too (the supervisor closes its own), so the old port stops queueing.
            self._context.share.sockets.drop({lc.name: lc.bind for lc in config.listeners})
        self._tls.use_config(config)
        for listener in plan.update:
            service = running.services.get(listener.name)
            if service is not None:
                service.update(
                    handler_for(listener, self._context),
                    tls_handshake_timeout=listener.tls_handshake_timeout_seconds,
                    max_connections=listener.max_connections,
                    max_connections_per_address=listener.max_connections_per_address,
                    proxy=ProxySettings.of(listener),
                )
                log.info("listener.updated", listener=listener.name, trigger="reload")
        site = ListenerSite(
            self._context, config, self._tls, self._acceptors, self._connections, running
        )
        old_site = ListenerSite(
            self._context, self.config, self._tls, self._acceptors, self._connections, running
        )
        before = {listener.name: listener for listener in self.config.listeners}
        for listener in plan.start:
            try:
                await start_listener(listener, site)
            except START_ERRORS as exc:
                failed[listener.name] = str(exc)
                log.error("listener.start_failed", listener=listener.name, reason=str(exc))
                continue
            log.info("listener.started", listener=listener.name, trigger="reload")
        for listener in plan.reopen:
            try:
                await self._reopen(listener, before.get(listener.name), site, old_site)
            except START_ERRORS as exc:
                failed[listener.name] = str(exc)
                continue
            log.info("listener.started", listener=listener.name, trigger="reload")
        return failed

    async def _open_credentials(
        self, plan: ReloadPlan, config: Config, failed: dict[str, str]
    ) -> ReloadPlan:
        """Open the auth database a reload's listeners need first (none did before).

        Opened in a worker thread (a remote database may take its connect
        timeout). When it cannot be opened (unreachable, its schema behind),
        the listeners that need it are left as they run, named in ``failed``;
        the rest of the plan goes ahead.
        """
        try:
            self._context.credentials = await trio.to_thread.run_sync(
                _credentials, dataclasses.replace(config, listeners=_changed(plan))
            )
            return plan
        except AuthError as exc:
            reason = f"the auth database cannot be opened: {exc}"
        needing = {
            listener.name
            for listener in _changed(plan)
            if "credentials" in stores_needed([listener])
        }
        for name in sorted(needing):
            failed[name] = f"listener {name!r}: {reason}"
            log.error("listener.start_failed", listener=name, reason=reason)
        return dataclasses.replace(
            plan,
            start=[listener for listener in plan.start if listener.name not in needing],
            update=[listener for listener in plan.update if listener.name not in needing],
            reopen=[listener for listener in plan.reopen if listener.name not in needing],
        )

    def _stop_accepting(self, name: str) -> None:
        running = self._running
        scope = running.accepting.pop(name, None)
        if scope is not None:
            scope.cancel()  # its open connections finish in their own nursery
        running.services.pop(name, None)
        running.ports.pop(name, None)
        log.info("listener.stopped", listener=name, trigger="reload")

    async def _reopen(
        self,
        listener: ListenerConfig,
        old: ListenerConfig | None,
        site: ListenerSite,
        old_site: ListenerSite,
    ) -> None:
        """Re-open ``listener`` with its new settings; on failure the old one keeps serving.

        The new sockets are bound before the old ones close. Only when both
        use the same port (a change of tls or client_auth) must the old close
        first; should the new then fail to open, the old is opened again.

        Raises:
            OSError, PkiError: the new settings could not be opened (the old
                serve on); see ``START_ERRORS``.
        """
        running = self._running
        name = listener.name
        kept = (
            running.accepting.pop(name, None),
            running.services.pop(name, None),
            running.ports.pop(name, None),
        )
        same_port = old is not None and old.port == listener.port and listener.port != 0
        if kept[0] is not None and same_port:
            kept[0].cancel()
            log.info("listener.stopped", listener=name, trigger="reload")
            try:
                await start_listener(listener, site)
            except START_ERRORS as exc:
                log.error("listener.reopen_failed", listener=name, reason=str(exc),
                          kept="the previous settings, opened again")  # fmt: skip
                if old is not None:
                    try:
                        await start_listener(old, old_site)
                    except START_ERRORS as again:
                        log.error("listener.not_open", listener=name, reason=str(again))
                raise
            return
        try:
            await start_listener(listener, site)
        except START_ERRORS as exc:
            # Put the old listener's records back: it never stopped.
            scope, service, port = kept
            if scope is not None:
                running.accepting[name] = scope
            if service is not None:
                running.services[name] = service
            if port is not None:
                running.ports[name] = port
            log.error("listener.reopen_failed", listener=name, reason=str(exc),
                      kept="the previous settings, still serving")  # fmt: skip
            raise
        if kept[0] is not None:
            kept[0].cancel()  # the new one serves: the old stops accepting
            log.info("listener.stopped", listener=name, trigger="reload")
