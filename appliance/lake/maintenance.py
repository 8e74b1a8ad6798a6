"""Table maintenance: compaction, checkpoints, vacuum and their statistics (docs/maintenance.md).

Every commit adds a few small files, and a commit's cost grows with the
number of live files, so compaction and checkpoints are part of ingest. The
service runs these on its schedule (:mod:`appliance.lake.schedule`); the CLI
(``appliance table ...``) may run them while the service commits in another
process, where Delta's optimistic concurrency resolves an append racing a
compaction (an append never conflicts with a compaction's
``dataChange=false`` rewrite).

Vacuum keeps a retention floor of
:data:`appliance.defaults.MIN_VACUUM_RETENTION_HOURS`: Spark readers, the
derived-table jobs (which read the files a commit added, possibly after a
compaction removed them) and time travel need the files a compaction
replaced for that long.
"""

from __future__ import annotations

from typing import Any

from appliance import defaults
from appliance.lake.operations import (
    MaintenanceResult,
    Progress,
    TableStats,
    file_stats,
    lake_errors,
    no_progress,
    open_table,
)

__all__ = ["checkpoint", "compact", "table_stats", "vacuum"]


def table_stats(uri: str, storage_options: dict[str, str] | None = None) -> TableStats:
    """File count, sizes and rows of the table's current version.

    Raises:
        LakeError: no table there, or the storage failed.
    """
    table = open_table(uri, storage_options)
    with lake_errors("reading statistics", uri):
        return file_stats(table)


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
    table = open_table(uri, storage_options)
    with lake_errors("compaction", uri):
        progress(1, 3, "reading the table's files")
        before = file_stats(table)
        progress(2, 3, f"compacting {before.files} file(s) in {before.partitions} partition(s)")
        metrics = table.optimize.compact(target_size=target_file_bytes)
        table.update_incremental()
        after = file_stats(table)
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
    table = open_table(uri, storage_options)
    with lake_errors("checkpoint", uri):
        before = file_stats(table)
        table.create_checkpoint()
        table.cleanup_metadata()
        table.update_incremental()
        after = file_stats(table)
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
    table = open_table(uri, storage_options)
    with lake_errors("vacuum", uri):
        progress(1, 3, "reading the table's files")
        before = file_stats(table)
        progress(2, 3, "listing and deleting unreferenced files" if not dry_run else "listing")
        deleted = table.vacuum(
            retention_hours=retention_hours,
            dry_run=dry_run,
            # The floor above is the appliance's; below the table's own
            # deletedFileRetentionDuration delta-rs refuses unless told.
            enforce_retention_duration=not allow_short_retention,
        )
        table.update_incremental()
        after = file_stats(table)
        progress(3, 3, "done")
    details = {
        "retention_hours": retention_hours,
        "dry_run": dry_run,
        "files_deleted" if not dry_run else "files_to_delete": len(deleted),
    }
    return MaintenanceResult("vacuum", uri, before, after, details)
