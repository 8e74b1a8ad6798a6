"""The service's periodic maintenance and retention of ``events`` (docs/maintenance.md).

:func:`run_maintenance` runs compaction, checkpoints, vacuum
(:mod:`~appliance.lake.maintenance`) and expire
(:mod:`~appliance.lake.retention`) on their ``[maintenance]`` and
``[retention]`` intervals, one at a time, each through
:meth:`LakeWriter.run_exclusive` (never alongside one of the writer's
commits), under the maintenance lock and, on a shared table, the lease
(:mod:`~appliance.lake.lease`). Beside it, it serves the deletes the CLI
hands over (:mod:`~appliance.lake.table_requests`). Only the service
imports this module.

A step that fails for a transient storage reason (the object store times
out, resets, answers 5xx or ``SlowDown``, refuses access for a while) is
retried with backoff (:mod:`appliance.lake.retry`) for at most
:data:`STEP_RETRY_SECONDS`; one that still fails then is skipped for this
round and logged (``maintenance.failed``), and the schedule goes on. No
maintenance failure ends the service. Between attempts the writer commits.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from deltalake.exceptions import DeltaError

from appliance.lake import maintenance, retention
from appliance.lake.errors import LakeError
from appliance.lake.lease import MaintenanceLease, lease_applies
from appliance.lake.operations import (
    STEP_BACKOFF,
    STEP_RETRY_SECONDS,
    MaintenanceBusy,
    MaintenanceLock,
    MaintenanceResult,
    Operation,
    lock_path,
)
from appliance.lake.retry import RetriesExhausted, retrying_async, store_options
from appliance.lake.table import EventsTable
from appliance.lake.table_requests import serve_requests
from appliance.logs import get_logger

if TYPE_CHECKING:
    from appliance.config import Config
    from appliance.lake.writer import LakeWriter

__all__ = ["run_maintenance"]

log = get_logger("maintenance")


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
        "compact": lambda: maintenance.compact(
            uri, options, target_file_bytes=settings.target_file_bytes
        ),
        "checkpoint": lambda: maintenance.checkpoint(uri, options),
        "vacuum": lambda: maintenance.vacuum(
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
        # erase and expire handed over by the CLI (table_requests.hand_off).
        nursery.start_soon(serve_requests, writer, config.state_dir, options)
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
