"""Table maintenance: compaction, checkpoints, vacuum and file statistics (docs/maintenance.md).

Every commit adds a few small files, and a commit's cost grows with the
number of live files, so compaction and checkpoints are part of
ingest. The operations here are blocking and run in a worker thread:

* in the service, :func:`run_maintenance` runs them on the ``[maintenance]``
  schedules through :meth:`LakeWriter.run_exclusive`, so they never overlap
  one of the writer's commits;
* from the CLI (``appliance table ...``), possibly while the service commits
  in another process: there Delta's optimistic concurrency resolves an
  append racing a compaction (an append never conflicts with a compaction's
  ``dataChange=false`` rewrite). Deletes (expire, erase: retention.py) do
  conflict with appends, so the CLI hands those to the running service,
  whose :func:`run_maintenance` serves them.

Both hold :class:`MaintenanceLock`, an exclusive advisory lock file in the
state directory, so maintenance never runs twice at once on one machine.

In the service a step that fails for a transient storage reason (the object
store times out, resets, answers 5xx or ``SlowDown``, refuses access for a
while) is retried with backoff (:mod:`appliance.lake.retry`) for at most
:data:`STEP_RETRY_SECONDS`; one that still fails then is skipped for this
round and logged (``maintenance.failed``), and the schedule goes on. No
maintenance failure ends the service. Between attempts the writer commits.

Vacuum keeps a retention floor of
:data:`appliance.defaults.MIN_VACUUM_RETENTION_HOURS`: Spark readers, the
derived-table jobs (which read the files a commit added, possibly after a
compaction removed them) and time travel need the files a compaction
replaced for that long.
"""

from __future__ import annotations

import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import trio
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from appliance import defaults
from appliance.lake.errors import LakeError
from appliance.lake.lease import MaintenanceLease, lease_applies
from appliance.lake.retry import Backoff, RetriesExhausted, retrying_async, store_options
from appliance.lake.table import EventsTable
from appliance.logs import get_logger

if TYPE_CHECKING:
    from appliance.config import Config
    from appliance.lake.writer import LakeWriter

__all__ = [
    "STEP_BACKOFF",
    "STEP_RETRY_SECONDS",
    "MaintenanceBusy",
    "MaintenanceLock",
    "MaintenanceResult",
    "Progress",
    "TableStats",
    "checkpoint",
    "compact",
    "lock_path",
    "no_progress",
    "run_maintenance",
    "table_stats",
    "vacuum",
]

log = get_logger("maintenance")

#: Seconds one maintenance or retention step of the service's schedule (and a
#: request the CLI handed over) is retried through transient storage failures
#: before it is given up for this round.
STEP_RETRY_SECONDS: Final = 300.0
#: Delays between those attempts: from about 2 s up to a minute.
STEP_BACKOFF: Final = Backoff(initial_seconds=2.0, max_seconds=60.0)


Operation = Literal["compact", "checkpoint", "vacuum", "expire", "erase"]

#: Told ``(step, steps, what)`` as a long operation goes on (the CLI shows it).
Progress = Callable[[int, int, str], None]


def no_progress(step: int, steps: int, what: str) -> None:
    """A :data:`Progress` that shows nothing (the service's)."""


class MaintenanceBusy(LakeError):
    """Another holder has the lock (in this process or another): maintenance, or a job."""


def lock_path(state_dir: Path) -> Path:
    """The lock file that the service and the CLI share."""
    return state_dir / "maintenance.lock"


class MaintenanceLock:
    """An exclusive, non-blocking advisory lock (``flock``) on a file.

    ``flock`` locks belong to the open file, so two holders in one process
    exclude each other as two processes do. The kernel drops the lock when
    the holder exits, so a crash leaves no stale lock behind.
    """

    def __init__(self, path: Path, what: str = "maintenance") -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`MaintenanceBusy` at once."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MaintenanceBusy(f"{self.what} already running (lock held: {self.path})") from None
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the file releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> MaintenanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class TableStats:
    """The live files of a table at one version."""

    version: int
    files: int
    bytes: int
    rows: int | None
    partitions: int
    smallest_file_bytes: int
    largest_file_bytes: int

    @property
    def average_file_bytes(self) -> int:
        """Mean live file size (0 for an empty table)."""
        return self.bytes // self.files if self.files else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {**asdict(self), "average_file_bytes": self.average_file_bytes}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TableStats:
        """The statistics :meth:`to_json` wrote."""
        return cls(**{f: value[f] for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    """What one operation did: statistics before and after, and its own report."""

    operation: Operation
    uri: str
    before: TableStats
    after: TableStats
    details: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "operation": self.operation,
            "table": self.uri,
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "details": self.details,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> MaintenanceResult:
        """The result :meth:`to_json` wrote (handed back by the service)."""
        return cls(
            value["operation"],
            value["table"],
            TableStats.from_json(value["before"]),
            TableStats.from_json(value["after"]),
            dict(value["details"]),
        )


@contextmanager
def _lake_errors(what: str, uri: str) -> Iterator[None]:
    try:
        yield
    except (DeltaError, OSError) as exc:
        raise LakeError(f"{what} of {uri} failed: {exc}") from exc


def _open(uri: str, storage_options: dict[str, str] | None) -> DeltaTable:
    with _lake_errors("opening", uri):
        if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
            raise LakeError(f"no Delta table at {uri}")
        return DeltaTable(uri, storage_options=storage_options)


def _stats(table: DeltaTable) -> TableStats:
    actions = table.get_add_actions(flatten=True)
    sizes = [int(s) for s in actions.column("size_bytes").to_pylist()]
    rows: int | None = None
    if "num_records" in actions.column_names:
        counts = actions.column("num_records").to_pylist()
        rows = None if any(c is None for c in counts) else sum(int(c) for c in counts)
    partition_columns = [n for n in actions.column_names if n.startswith("partition.")]
    if partition_columns:
        keys = zip(*(actions.column(n).to_pylist() for n in partition_columns), strict=True)
        partitions = len(set(keys))
    else:
        partitions = 1 if sizes else 0
    return TableStats(
        version=int(table.version()),
        files=len(sizes),
        bytes=sum(sizes),
        rows=rows,
        partitions=partitions,
        smallest_file_bytes=min(sizes, default=0),
        largest_file_bytes=max(sizes, default=0),
    )


def table_stats(uri: str, storage_options: dict[str, str] | None = None) -> TableStats:
    """File count, sizes and rows of the table's current version.

    Raises:
        LakeError: no table there, or the storage failed.
    """
    table = _open(uri, storage_options)
    with _lake_errors("reading statistics", uri):
        return _stats(table)


def compact(
    uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    target_file_bytes: int = defaults.MAINTENANCE_TARGET_FILE_BYTES,
    progress: Progress = no_progress,
) -> MaintenanceResult:
    """Rewrite small files into files of about ``target_file_bytes``.

    The rewrite commits with ``dataChange=false``: readers see the same rows,
    and appends committed meanwhile by another process do not conflict with it
    (delta-rs retries the commit on top of them).
    """
    table = _open(uri, storage_options)
    with _lake_errors("compaction", uri):
        progress(1, 3, "reading the table's files")
        before = _stats(table)
        progress(2, 3, f"compacting {before.files} file(s) in {before.partitions} partition(s)")
        metrics = table.optimize.compact(target_size=target_file_bytes)
        table.update_incremental()
        after = _stats(table)
        progress(3, 3, "done")
    details: dict[str, Any] = {
        k: metrics[k]
        for k in ("numFilesAdded", "numFilesRemoved", "partitionsOptimized", "totalFilesSkipped")
        if k in metrics
    }
    return MaintenanceResult("compact", uri, before, after, details)


def checkpoint(uri: str, storage_options: dict[str, str] | None = None) -> MaintenanceResult:
    """Write a checkpoint at the current version, then delete expired log files.

    Log files older than ``delta.logRetentionDuration`` (Delta's default: 30
    days) and covered by a checkpoint are removed; time travel cannot go back
    past them.
    """
    table = _open(uri, storage_options)
    with _lake_errors("checkpoint", uri):
        before = _stats(table)
        table.create_checkpoint()
        table.cleanup_metadata()
        table.update_incremental()
        after = _stats(table)
    return MaintenanceResult(
        "checkpoint", uri, before, after, {"checkpoint_version": after.version}
    )


def vacuum(
    uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    retention_hours: int = defaults.VACUUM_RETENTION_HOURS,
    allow_short_retention: bool = False,
    dry_run: bool = False,
    progress: Progress = no_progress,
) -> MaintenanceResult:
    """Delete files no version younger than ``retention_hours`` refers to.

    Raises:
        ValueError: ``retention_hours`` is below the floor and not allowed.
        LakeError: the storage failed.
    """
    defaults.check_retention(retention_hours, allow_short=allow_short_retention)
    table = _open(uri, storage_options)
    with _lake_errors("vacuum", uri):
        progress(1, 3, "reading the table's files")
        before = _stats(table)
        progress(2, 3, "listing and deleting unreferenced files" if not dry_run else "listing")
        deleted = table.vacuum(
            retention_hours=retention_hours,
            dry_run=dry_run,
            # The floor above is the appliance's; below the table's own
            # deletedFileRetentionDuration delta-rs refuses unless told.
            enforce_retention_duration=not allow_short_retention,
        )
        table.update_incremental()
        after = _stats(table)
        progress(3, 3, "done")
    details = {
        "retention_hours": retention_hours,
        "dry_run": dry_run,
        "files_deleted" if not dry_run else "files_to_delete": len(deleted),
    }
    return MaintenanceResult("vacuum", uri, before, after, details)


# -- the service's schedule ----------------------------------------------------


def _locked(
    lock: Path, lease: MaintenanceLease | None, fn: Callable[[], MaintenanceResult]
) -> MaintenanceResult:
    with MaintenanceLock(lock):
        if lease is not None:
            refusal = lease.acquire()
            if refusal is not None:
                raise MaintenanceBusy(refusal)
        return fn()


def _next_due(intervals: dict[Operation, float], last: dict[Operation, float]) -> Operation:
    return min(intervals, key=lambda op: last[op] + intervals[op])


async def run_maintenance(writer: LakeWriter, config: Config) -> None:
    """Run compaction, checkpoints, vacuum and retention of ``events`` on schedule, forever.

    One task runs the operations one after another, each through
    :meth:`LakeWriter.run_exclusive` (never alongside a commit) and under
    the maintenance lock: when ``appliance table ...`` holds it, that round
    is skipped and logged. A failed operation is logged and tried again at
    its next turn; a transient storage failure is retried first, for up to
    :data:`STEP_RETRY_SECONDS` (the lease is taken again at each attempt).
    Start it in a nursery that is cancelled at shutdown; an operation
    already running finishes first.

    Retention (``expire``) is one more operation, every ``[retention]
    interval_seconds``, when ``[retention]`` sets a limit.
    """
    from appliance.lake import retention  # retention builds on this module

    settings = config.maintenance
    if not settings.enabled:
        log.info("maintenance.disabled")
        return
    uri = writer.table.uri
    # The object store's client gets bounded timeouts, as the writer's (retry.STORE_DEFAULTS).
    options = store_options(uri, config.lake.storage_options)
    # Shared by a supervisor's workers and the CLI's table commands (Config.home_dir).
    lock = lock_path(config.home_dir)
    operations: dict[Operation, Callable[[], MaintenanceResult]] = {
        "compact": lambda: compact(uri, options, target_file_bytes=settings.target_file_bytes),
        "checkpoint": lambda: checkpoint(uri, options),
        "vacuum": lambda: vacuum(
            uri,
            options,
            retention_hours=settings.vacuum_retention_hours,
            allow_short_retention=settings.allow_short_vacuum_retention,
        ),
    }
    intervals: dict[Operation, float] = {
        "compact": settings.compact_interval_seconds,
        "checkpoint": settings.checkpoint_interval_seconds,
        "vacuum": settings.vacuum_interval_seconds,
    }
    if config.retention.enabled:
        policy = retention.RetentionPolicy.from_config(config.retention)
        operations["expire"] = lambda: retention.expire(
            uri,
            options,
            policy=policy,
            vacuum_retention_hours=settings.vacuum_retention_hours,
        )
        intervals["expire"] = config.retention.interval_seconds
    lease = None
    if lease_applies(settings.lease, uri):
        lease = MaintenanceLease(EventsTable(uri, options), settings.lease_seconds)
        log.info("maintenance.lease", token=lease.token, lease_seconds=settings.lease_seconds)
    async with trio.open_nursery() as nursery:
        # erase and expire handed over by the CLI (retention.hand_off).
        nursery.start_soon(retention.serve_requests, writer, config.state_dir, options)
        await _schedule(writer, lock, lease, operations, intervals)


async def _schedule(
    writer: LakeWriter,
    lock: Path,
    lease: MaintenanceLease | None,
    operations: dict[Operation, Callable[[], MaintenanceResult]],
    intervals: dict[Operation, float],
) -> None:
    start = trio.current_time()
    last: dict[Operation, float] = dict.fromkeys(intervals, start)
    while True:
        operation = _next_due(intervals, last)
        await trio.sleep_until(last[operation] + intervals[operation])
        last[operation] = trio.current_time()
        started = time.monotonic()
        try:
            result = await retrying_async(
                functools.partial(
                    writer.run_exclusive, _locked, lock, lease, operations[operation]
                ),
                what=f"maintenance {operation}",
                backoff=STEP_BACKOFF,
                give_up_after_seconds=STEP_RETRY_SECONDS,
            )
        except MaintenanceBusy as exc:
            log.info("maintenance.skipped", operation=operation, reason=str(exc))
            writer.metrics.maintenance(operation, "skipped", finished_at=time.time(), seconds=0.0)
            continue
        except RetriesExhausted as exc:
            # The store kept failing: this round is skipped, the next comes at its interval.
            log.error(
                "maintenance.failed", operation=operation, attempts=exc.attempts,
                reason=exc.reason, next_in_seconds=intervals[operation],
            )  # fmt: skip
            writer.metrics.maintenance(
                operation, "failed", finished_at=time.time(), seconds=time.monotonic() - started
            )
            continue
        except (LakeError, DeltaError, OSError) as exc:
            # Permanent: not a storage failure a retry could help (logged, tried at its turn).
            log.error("maintenance.failed", operation=operation, reason=str(exc)[:500])
            writer.metrics.maintenance(
                operation, "failed", finished_at=time.time(), seconds=time.monotonic() - started
            )
            continue
        writer.metrics.maintenance(
            operation, "ok", finished_at=time.time(), seconds=time.monotonic() - started
        )
        writer.metrics.lake.table_files.set(result.after.files)
        writer.metrics.lake.table_bytes.set(result.after.bytes)
        log.info(
            "maintenance.done",
            operation=operation,
            version=result.after.version,
            files_before=result.before.files,
            files_after=result.after.files,
            bytes_before=result.before.bytes,
            bytes_after=result.after.bytes,
            **_summary(result),
        )


def _summary(result: MaintenanceResult) -> dict[str, Any]:
    """The log fields of an expire: what went, and what a vacuum must still delete."""
    if result.operation != "expire":
        return {}
    details = result.details
    removed = details.get("partitions_removed") or []
    return {
        "partitions_removed": len(removed),
        "oldest_removed": removed[0] if removed else None,
        "rows_removed": result.before.rows - result.after.rows
        if result.before.rows is not None and result.after.rows is not None
        else None,
        "bytes_awaiting_vacuum": details.get("bytes_awaiting_vacuum"),
    }
