"""The supervisor of ``workers`` appliance processes on one machine (docs/performance.md).

One Python process uses one core (the GIL), so ``workers = N`` runs N
appliance processes, ``appliance serve --worker k``, each with the
configuration :func:`~appliance.node.worker_config` gives it: its own
state directory (node id, write-ahead log), one table, one PKI, one auth
database, and the listening sockets this process binds. It serves nothing
itself:

* before the workers start, it makes the PKI (CA, server certificate, CRL)
  and opens the auth database once, so that they share them and no two
  create them at once;
* it binds every TCP listener whose kind shares its port once and hands the
  sockets to each worker it starts, with the count file of the workers'
  open connections (appliance/server/spread.py): one accept queue per port,
  taken by the worker with the fewest connections. Bound, not listening:
  the first worker that serves a socket makes it listen. A restarted worker
  gets the same sockets, so the port then stays open while this process
  lives; a reload that removes or moves a listener closes this process's
  socket for it (the workers bind a moved or added one themselves, with
  ``SO_REUSEPORT``, until the next start);
* it starts worker ``k`` and waits until it is ready (its pid file names
  it), restarts one that exits (after 1 s, doubling to 30 s), and tells
  systemd ``READY=1`` once all are up (the workers do not talk to systemd);
* SIGHUP (``appliance cert ...``, ``systemctl reload``) goes to every
  worker, one that is starting or restarting included (it is signalled once
  it is ready: it may have read the files before the change; one that comes
  before all are first ready is run once they are); each must
  answer with a CRL number at least that of the CRL on disk when the signal
  came. The supervisor writes the combined outcome to its own
  ``reload-status.json`` once every worker has answered, or after
  :data:`RELOAD_WAIT_SECONDS` naming each worker that did not;
* SIGTERM or SIGINT stops every worker (each drains and acks as a single
  service does) and ends once they have, killing a worker that takes
  longer than ``shutdown_timeout_seconds`` plus :data:`STOP_GRACE_SECONDS`;
* it re-signs the CRL before it runs out (under the PKI lock, so never over a
  CLI's newer CRL) and has every worker reload it the same way.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio
from cryptography import x509

from appliance.config import Config, ConfigError, ListenerConfig, load_config
from appliance.logs import get_logger
from appliance.node import drain_left_logs
from appliance.reload_status import ReloadStatus, read_status, write_status
from appliance.server.binding import bind_tcp
from appliance.server.launch import BindError
from appliance.server.registry import kind_of, stores_needed
from appliance.server.sdnotify import Notifier
from appliance.server.spread import ABSENT, ConnectionCounts, InheritedSockets, WorkerShare
from appliance.server.tls import TlsManager
from appliance.state_lock import PID_FILE, StateLock
from pki.authority import PkiPaths, crl_number
from pki.errors import PkiError

__all__ = [
    "RELOAD_WAIT_SECONDS",
    "RESTART_INITIAL_SECONDS",
    "RESTART_MAX_SECONDS",
    "STOP_GRACE_SECONDS",
    "WORKER_START_TIMEOUT_SECONDS",
    "WorkerFailed",
    "supervise",
    "worker_command",
]

log = get_logger("supervisor")

#: Longest a worker may take to become ready (open its table, replay its log, bind).
WORKER_START_TIMEOUT_SECONDS: Final = 300.0
#: First wait before a worker that exited is started again, in seconds (doubles).
RESTART_INITIAL_SECONDS: Final = 1.0
#: Longest wait between restarts of a worker that keeps exiting, in seconds.
RESTART_MAX_SECONDS: Final = 30.0
#: Seconds a stopping worker gets beyond its own shutdown_timeout_seconds before SIGKILL.
STOP_GRACE_SECONDS: Final = 30.0
#: Longest the supervisor waits for every worker to answer a reload, a restarting one
#: included, in seconds: under the CLI's own wait (RELOAD_CONFIRM_TIMEOUT_SECONDS,
#: 10 s), so it gets the answer.
RELOAD_WAIT_SECONDS: Final = 8.0
#: Seconds between looks at a worker's pid file or reload status.
POLL_SECONDS: Final = 0.1
#: Seconds between checks that the CRL the workers serve is not about to run out.
CRL_CHECK_SECONDS: Final = 3600.0
#: What the workers must not inherit: systemd talks to the supervisor only.
_SYSTEMD_VARIABLES: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class WorkerFailed(OSError):
    """A worker did not start (the message says which, and its exit code)."""


@dataclass(eq=False)
class _Worker:
    index: int
    process: trio.Process | None = None
    restarts: int = 0
    #: Its current process is ready (its pid file names it) and handles SIGHUP.
    ready: bool = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signum)


@dataclass(eq=False)
class _Shared:
    """What every worker inherits: the shared listening sockets and the connection counts."""

    sockets: InheritedSockets
    counts: ConnectionCounts | None

    def spec(self) -> str:
        counts = self.counts
        return WorkerShare.spec(
            self.sockets.described(),
            None if counts is None else counts.fd,
            0 if counts is None else counts.workers,
        )

    def fds(self) -> list[int]:
        return self.sockets.fds() + ([] if self.counts is None else [self.counts.fd])

    def close(self) -> None:
        self.sockets.close()
        if self.counts is not None:
            self.counts.close()


def shared_listeners(config: Config) -> list[ListenerConfig]:
    """The listeners whose sockets the supervisor binds for every worker (TCP, port shared)."""
    return [
        listener
        for listener in config.listeners
        if kind_of(listener).shares_port and kind_of(listener).start is None
    ]


async def _bind_shared(config: Config) -> _Shared:
    """Bind each shared listener once, and make the count file; the workers inherit both.

    Bound, not listening: the first worker that serves a socket makes it
    listen, so a client is refused (and retries) while the workers start
    rather than queued behind a table that is still opening. From then on
    the socket listens for as long as this process lives. ``SO_REUSEPORT``
    is set all the same: a worker whose reload adds or moves a listener
    binds it itself, and may need the same port meanwhile.

    Raises:
        BindError: an address cannot be bound (the message names the listener).
    """
    bound: dict[str, tuple[str, list[int]]] = {}
    sockets = InheritedSockets.of({})
    made = False
    try:
        for listener in shared_listeners(config):
            try:
                opened = await bind_tcp(listener.port, listener.host)
            except OSError as exc:
                raise BindError(
                    exc.errno,
                    f"listener {listener.name!r} cannot bind {listener.bind}: {exc.strerror}",
                ) from exc
            bound[listener.name] = (listener.bind, [each.detach() for each in opened])
            sockets = InheritedSockets.of(bound)
        shared = _Shared(sockets, ConnectionCounts.create(config.worker_count))
        made = True
        return shared
    finally:
        if not made:  # whatever stopped it (also a cancellation): the sockets close
            sockets.close()


def worker_command(config: Config, index: int, shared: str | None = None) -> list[str]:
    """The command line of worker ``index``: this interpreter, ``appliance serve --worker``.

    ``shared``: what it inherits (:meth:`WorkerShare.spec`), as ``--shared``.
    """
    command = [sys.executable, "-m", "appliance", "serve", "--worker", str(index)]
    command += ["--supervisor", str(os.getpid())]
    if shared is not None:
        command += ["--shared", shared]
    if config.source is not None:
        command += ["--config", str(config.source)]
    return command


def _worker_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _SYSTEMD_VARIABLES}


def ready_status(config: Config, workers: int) -> str:
    """systemd's ``STATUS=`` once every worker is ready: what listens, as one process says it.

    ``systemctl status`` shows it; the same ``listening: <names>`` a single
    process reports (appliance/service.py), and how many workers share them.
    """
    names = ", ".join(listener.name for listener in config.listeners)
    return f"STATUS=listening: {names}; workers: {workers}"


async def supervise(config: Config) -> None:
    """Run ``config.workers`` workers until SIGTERM or SIGINT, then stop them all.

    Raises:
        WorkerFailed: a worker did not become ready at the first start (the
            others are stopped first).
        OSError, PkiError, AuthError, LakeError: the shared PKI, auth
            database or table cannot be prepared.
    """
    config.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(config.state_dir, 0o750)  # noqa: S103 -- as the service's own
    state_lock = await trio.to_thread.run_sync(StateLock, config.state_dir)
    try:
        # Caught from the start: a stop during the workers' start stops them too.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            await _supervise(config, state_lock, signals)
    finally:
        state_lock.release()


async def _prepare(config: Config) -> tuple[TlsManager, Path | None]:
    """What the workers share, made once before any starts; the PKI and its CA file, if any."""
    tls = TlsManager(config)
    ca_file = await trio.to_thread.run_sync(tls.prepare)
    tls_files = config.tls.cert_file and config.tls.key_file
    if config.admin.enabled and config.admin.tls and not tls_files:
        # The workers serve the admin listener with this certificate too.
        await trio.to_thread.run_sync(tls.ca.ensure, config.tls.server_names)
    if stores_needed(config.listeners) or any(
        listener.tls and listener.client_auth != "off" for listener in config.listeners
    ):
        # Created and upgraded once, here, not by N workers at the same moment.
        from auth.database import open_database

        await trio.to_thread.run_sync(open_database, config.auth_settings)
    await drain_left_logs(config)
    return tls, ca_file


async def _supervise(config: Config, state_lock: StateLock, signals: AsyncIterator[int]) -> None:
    tls, ca_file = await _prepare(config)
    shared = await _bind_shared(config)
    try:
        await _supervise_shared(config, state_lock, signals, tls, ca_file, shared)
    finally:
        shared.close()


def _drop_moved(config: Config, shared: _Shared) -> None:
    """Close the sockets of shared listeners that the file now removes or moves (a reload).

    The workers stop accepting on them; without this the port would keep
    queueing connections that no worker takes.
    """
    if config.source is None:
        return
    try:
        new = load_config(config.source)
    except ConfigError:
        return  # each worker reports the broken file; nothing changes
    keep = {listener.name: listener.bind for listener in shared_listeners(new)}
    for name in shared.sockets.drop(keep):
        log.info("supervisor.listener_closed", listener=name, reason="reload")


async def _supervise_shared(
    config: Config,
    state_lock: StateLock,
    signals: AsyncIterator[int],
    tls: TlsManager,
    ca_file: Path | None,
    shared: _Shared,
) -> None:
    workers = [_Worker(index) for index in range(config.worker_count)]
    stopping = trio.Event()
    notifier = Notifier()
    reloads = trio.Lock()
    async with trio.open_nursery() as nursery:
        # The workers start together; a stop signal meanwhile stops them (no wait).
        children = trio.CancelScope()

        async def run_children(*, task_status: trio.TaskStatus[None]) -> None:
            with children:
                async with trio.open_nursery() as inner:
                    for worker in workers:
                        inner.start_soon(_run_worker, config, worker, stopping, shared)
                    task_status.started()

        ready = trio.Event()

        def reload() -> None:
            nursery.start_soon(_reload_serialized, reloads, config, workers, shared)

        def stop(signum: int) -> None:
            log.info("supervisor.stopping", signal=signal.Signals(signum).name)
            notifier.notify("STOPPING=1")
            stopping.set()
            # This process's copies of the shared sockets; each worker closes
            # its own as it stops accepting, so the port refuses at once instead
            # of queueing connections through the drain that nobody accepts.
            shared.sockets.close()
            # Every worker's task then sends its process one SIGTERM (a second
            # would end it without draining) and waits; SIGKILL after the grace.
            children.cancel()
            nursery.cancel_scope.cancel()

        nursery.start_soon(_watch_signals, signals, ready, reload, stop)
        await nursery.start(run_children)
        with trio.move_on_after(WORKER_START_TIMEOUT_SECONDS + 1):
            while not all(worker.ready for worker in workers):
                await trio.sleep(POLL_SECONDS)
        if stopping.is_set():
            return
        late = [worker.index for worker in workers if not worker.ready]
        if late:
            raise WorkerFailed(f"workers {late} were not ready within the start timeout")
        ready.set()
        state_lock.write_pid_file()
        write_status(config.state_dir, ReloadStatus(os.getpid(), 0, ok=True))
        log.info(
            "supervisor.ready",
            workers=len(workers),
            pids=",".join(str(worker.pid) for worker in workers),
            table=config.table_uri,
            ca=str(ca_file) if ca_file else None,
        )
        if ca_file:
            print(f"CA certificate for clients: {ca_file}", flush=True)
        notifier.notify("READY=1", ready_status(config, len(workers)))
        nursery.start_soon(notifier.keep_alive)
        if config.tls.client_ca_file is None:
            nursery.start_soon(_refresh_crl, tls, reloads, config, workers, shared)
    log.info("supervisor.stopped", workers=len(workers))


async def _watch_signals(
    signals: AsyncIterator[int],
    ready: trio.Event,
    reload: Callable[[], None],
    stop: Callable[[int], None],
) -> None:
    """Start a reload on SIGHUP and call ``stop`` on SIGTERM or SIGINT (then return).

    A SIGHUP that comes before every worker is ready is kept, not dropped: a
    worker may have read the files before the change the signal announces
    (``systemctl reload`` or a CLI right after the start). It starts one reload
    once they are all ready; further SIGHUPs meanwhile add nothing to it.
    """
    deferred = False
    async with trio.open_nursery() as waiting:
        async for signum in signals:
            if signum != signal.SIGHUP:
                waiting.cancel_scope.cancel()
                stop(signum)
                return
            if ready.is_set():
                reload()
            elif not deferred:
                deferred = True
                log.info("supervisor.reload_deferred", reason="workers starting")
                waiting.start_soon(_reload_when_ready, ready, reload)


async def _reload_when_ready(ready: trio.Event, reload: Callable[[], None]) -> None:
    await ready.wait()
    reload()


async def _run_worker(
    config: Config, worker: _Worker, stopping: trio.Event, shared: _Shared | None = None
) -> None:
    """Start worker ``worker.index`` and keep it running until stopping.

    Each of its processes inherits ``shared`` (the same sockets every time:
    connections queued while it restarts wait for it or another worker).

    Cancelled (a stop, or another worker failed its first start), it waits
    for its process: SIGTERM, then SIGKILL after the shutdown timeout plus
    :data:`STOP_GRACE_SECONDS`, so no worker outlives the supervisor.

    Raises:
        WorkerFailed: the first start failed.
    """
    backoff = RESTART_INITIAL_SECONDS
    started = False
    grace = config.shutdown_timeout_seconds + STOP_GRACE_SECONDS
    while not stopping.is_set():
        with trio.CancelScope(shield=True):
            # Never cancelled halfway: a process that was spawned is always awaited below.
            process = await trio.lowlevel.open_process(
                worker_command(config, worker.index, shared.spec() if shared else None),
                env=_worker_environment(),
                pass_fds=shared.fds() if shared else (),
            )
        worker.process = process
        try:
            try:
                await _wait_ready(config, worker.index, process)
            except WorkerFailed:
                if not started:
                    raise  # the first start fails the supervisor's start
                log.error("worker.start_failed", worker=worker.index, code=process.returncode)
            else:
                worker.ready = True
                if started:
                    log.info("worker.restarted", worker=worker.index, pid=process.pid)
                    backoff = RESTART_INITIAL_SECONDS
                started = True
            code = await process.wait()
        finally:
            worker.ready = False
            if process.returncode is None:
                with trio.CancelScope(shield=True):
                    await _terminate(process, grace)
                log.info("worker.stopped", worker=worker.index, code=process.returncode)
            if shared is not None and shared.counts is not None:
                # Its count no longer holds the others' minimum down.
                shared.counts.set(worker.index, ABSENT)
        if stopping.is_set():
            log.info("worker.stopped", worker=worker.index, code=code)
            return
        worker.restarts += 1
        log.error(
            "worker.exited", worker=worker.index, code=code, restart_in_seconds=backoff,
            restarts=worker.restarts,
        )  # fmt: skip
        with trio.move_on_after(backoff):
            await stopping.wait()
        backoff = min(backoff * 2, RESTART_MAX_SECONDS)


async def _wait_ready(config: Config, index: int, process: trio.Process) -> None:
    """Return once worker ``index`` has written its pid file (it does so when ready).

    Raises:
        WorkerFailed: it exited first, or took longer than the start timeout.
    """
    pid_path = config.worker_state_dir(index) / PID_FILE
    with trio.move_on_after(WORKER_START_TIMEOUT_SECONDS):
        while process.poll() is None:
            try:
                if pid_path.read_text(encoding="ascii").strip() == str(process.pid):
                    return
            except OSError:
                pass  # not written yet
            await trio.sleep(POLL_SECONDS)
        raise WorkerFailed(f"worker {index} exited with {process.returncode} before it was ready")
    process.kill()
    await process.wait()
    raise WorkerFailed(f"worker {index} was not ready within {WORKER_START_TIMEOUT_SECONDS:g}s")


async def _terminate(process: trio.Process, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it has exited."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        await process.wait()
        return
    process.kill()
    await process.wait()


async def _reload_serialized(
    lock: trio.Lock,
    config: Config,
    workers: Sequence[_Worker],
    shared: _Shared,
    *,
    publish: bool = True,
) -> None:
    """One reload at a time; each published one writes the next generation of the combined status.

    ``publish`` false (the supervisor's own CRL re-sign): the workers reload and
    confirm all the same, but the status the CLI waits on is left alone, so that
    no command takes this reload for the answer to its own signal. Either way
    the workers read the config file again, so a shared listener the file now
    removes or moves stops queueing here too (:func:`_drop_moved`). Also when
    a worker's reload then fails: it fails after it stopped the old listeners
    (a new one that cannot bind, a TLS file) or it refused the file as a whole
    and serves on from its own copies of the sockets; a restarted worker reads
    the new file. So this process's copy would only queue connections.
    """
    async with lock:
        _drop_moved(config, shared)
        previous = read_status(config.state_dir)
        status = await _reload(config, workers, (previous.generation if previous else 0) + 1)
        if publish:
            try:
                write_status(config.state_dir, status)
            except OSError as exc:
                # A full or read-only state directory: the workers reloaded; only
                # the CLI's confirmation is missing (it waits, then says so).
                log.error("supervisor.status_unwritten", reason=str(exc))


def _crl_on_disk(config: Config) -> int | None:
    """The number of the appliance CRL on disk, which every worker must then check, or None."""
    if config.tls.client_ca_file is not None or config.tls.crl_file is not None:
        return None  # the workers check the operator's CRL, which this CA does not number
    try:
        return crl_number(x509.load_pem_x509_crl(PkiPaths(config.pki_dir).crl.read_bytes()))
    except (OSError, ValueError):
        return None


def _confirms(status: ReloadStatus, required: int | None) -> bool:
    """Whether ``status`` answers a reload that must load CRL number ``required`` or later.

    A failed reload answers too (it is reported); an ok one that loaded an older CRL
    was a reload under way before the change, and the signal sent after it brings
    the next.
    """
    if not status.ok or required is None or status.crl_number is None:
        return True
    return status.crl_number >= required


async def _confirm(
    config: Config, worker: _Worker, required: int | None, answers: dict[int, ReloadStatus]
) -> None:
    """Have ``worker`` reload, and put its answer in ``answers``.

    A worker that is starting or restarting is waited for, then signalled: it
    may have read the files before the change (and SIGHUP before it is ready
    would end it). One that restarts before it answers is asked again.
    """
    state_dir = config.worker_state_dir(worker.index)
    while True:
        while not worker.ready:
            await trio.sleep(POLL_SECONDS)
        pid = worker.pid
        # Its start status comes just after its pid file: the generation to go beyond.
        before: int | None = None
        while before is None and worker.ready and worker.pid == pid:
            status = read_status(state_dir)
            if status is not None and status.pid == pid:
                before = status.generation
            else:
                await trio.sleep(POLL_SECONDS)
        if before is None:
            continue  # it stopped meanwhile: its next process is asked
        worker.signal(signal.SIGHUP)
        while worker.ready and worker.pid == pid:
            status = read_status(state_dir)
            if (
                status is not None
                and status.pid == pid
                and status.generation > before
                and _confirms(status, required)
            ):
                answers[worker.index] = status
                return
            await trio.sleep(POLL_SECONDS)


async def _reload(config: Config, workers: Sequence[_Worker], generation: int) -> ReloadStatus:
    """Have every worker reload and confirm it; the combined status (not written here)."""
    required = _crl_on_disk(config)
    answers: dict[int, ReloadStatus] = {}
    with trio.move_on_after(RELOAD_WAIT_SECONDS):
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(_confirm, config, worker, required, answers)
    restart: set[str] = set()
    if config.source is not None:
        try:
            if load_config(config.source).worker_count != config.worker_count:
                restart.add("workers")
        except ConfigError:
            pass  # each worker reports the broken file itself
    errors: list[str] = []
    for worker in workers:
        answer = answers.get(worker.index)
        if answer is None:
            doing = "running" if worker.ready else "restarting"
            errors.append(
                f"worker {worker.index} ({doing}) did not confirm the reload within "
                f"{RELOAD_WAIT_SECONDS:g} s"
            )
        elif not answer.ok:
            errors.append(f"worker {worker.index}: {answer.error or 'its reload failed'}")
    applied = sorted({item for status in answers.values() for item in status.applied})
    for answer in answers.values():
        restart.update(answer.restart_required)
    numbers = [answer.crl_number for answer in answers.values()]
    # Every worker's, or none: the lowest is what the whole service is sure to check.
    combined = (
        min(n for n in numbers if n is not None)
        if len(answers) == len(workers) and numbers and None not in numbers
        else None
    )
    status = ReloadStatus(
        os.getpid(), generation, ok=not errors, applied=applied,
        restart_required=sorted(restart), error="; ".join(errors) or None,
        crl_number=combined,
    )  # fmt: skip
    log.info(
        "supervisor.reloaded", ok=status.ok, applied=applied,
        restart_required=status.restart_required, error=status.error,
        crl_number=combined, required_crl_number=required,
    )  # fmt: skip
    return status


async def _refresh_crl(
    tls: TlsManager,
    reloads: trio.Lock,
    config: Config,
    workers: Sequence[_Worker],
    shared: _Shared,
) -> None:
    """Re-sign the CRL before it runs out, and have every worker reload it, every hour."""
    while True:
        await trio.sleep(CRL_CHECK_SECONDS)
        if not (tls.ca.exists and tls.ca.crl_needs_refresh()):
            continue
        try:
            # Checked again under the PKI lock: a CLI may have signed a newer one meanwhile.
            signed = await trio.to_thread.run_sync(tls.ca.refresh_crl)
        except (PkiError, OSError) as exc:
            # The workers keep serving the current CRL; try again in an hour.
            log.error("supervisor.crl_refresh_failed", reason=str(exc))
            continue
        if signed:
            log.info("supervisor.crl_refreshed", workers=len(workers))
            await _reload_serialized(reloads, config, workers, shared, publish=False)
