"""What the table operations share: opening a table, errors, file statistics, results, the lock.

Each verb has its own module on top of this one, as deltalake's API separates
them: :mod:`~appliance.lake.maintenance` (compact, checkpoint, vacuum),
:mod:`~appliance.lake.retention` (expire, erase) and
:mod:`~appliance.lake.usage` (``appliance table stats``). All of it blocks:
it runs in a worker thread. :class:`MaintenanceLock` (a ``flock`` in the
state directory, shared by the service and the CLI) keeps two operations
from running at once on one machine.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from appliance.lake.errors import LakeError
from appliance.lake.retry import Backoff

if TYPE_CHECKING:
    # pyarrow loads at the first maintenance run that reads the file list, not
    # at the service's start (docs/performance.md#idle-memory).
    import pyarrow as pa

__all__ = [
    "SQL_TABLE",
    "STEP_BACKOFF",
    "STEP_RETRY_SECONDS",
    "MaintenanceBusy",
    "MaintenanceLock",
    "MaintenanceResult",
    "Operation",
    "PartitionInfo",
    "Progress",
    "TableStats",
    "add_actions",
    "file_stats",
    "lake_errors",
    "lock_path",
    "no_progress",
    "open_table",
    "partitions",
]

#: Seconds one maintenance or retention step of the service's schedule (and a
#: request the CLI handed over) is retried through transient storage failures
#: before it is given up for this round.
STEP_RETRY_SECONDS: Final = 300.0
#: Delays between those attempts: from about 2 s up to a minute.
STEP_BACKOFF: Final = Backoff(initial_seconds=2.0, max_seconds=60.0)
#: The name the table has in the SQL of counts (QueryBuilder).
SQL_TABLE: Final = "events"


Operation = Literal["compact", "checkpoint", "vacuum", "expire", "erase"]

#: Told ``(step, steps, what)`` as a long operation goes on (the CLI shows it).
Progress = Callable[[int, int, str], None]


def no_progress(step: int, steps: int, what: str) -> None:
    """A :data:`Progress` that shows nothing (the service's)."""


# -- the lock ------------------------------------------------------------------------


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


# -- statistics and the result ---------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One ``event_date`` partition of the current version."""

    event_date: dt.date
    files: int
    bytes: int
    rows: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "event_date": self.event_date.isoformat(),
            "files": self.files,
            "bytes": self.bytes,
            "rows": self.rows,
        }


# -- the table -----------------------------------------------------------------------


@contextmanager
def lake_errors(what: str, uri: str) -> Iterator[None]:
    """Raise deltalake's and the storage's errors inside as :class:`LakeError` naming ``what``."""
    try:
        yield
    except (DeltaError, OSError) as exc:
        raise LakeError(f"{what} of {uri} failed: {exc}") from exc


def open_table(uri: str, storage_options: dict[str, str] | None) -> DeltaTable:
    """The Delta table at ``uri``, for an operation.

    Raises:
        LakeError: no table there, or the storage failed.
    """
    with lake_errors("opening", uri):
        if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
            raise LakeError(f"no Delta table at {uri}")
        return DeltaTable(uri, storage_options=storage_options)


def add_actions(table: DeltaTable) -> pa.Table:
    """The live files of the table's current version, one row each (flattened add actions)."""
    import pyarrow as pa

    return pa.table(table.get_add_actions(flatten=True))


def file_stats(table: DeltaTable) -> TableStats:
    """File count, sizes, rows and partitions of the table's current version."""
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


def partitions(actions: pa.Table) -> list[PartitionInfo]:
    """Files, bytes and rows per ``event_date``, oldest first."""
    found: dict[dt.date, list[int]] = {}
    dates = actions.column("partition.event_date").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    rows = actions.column("num_records").to_pylist()
    for day, size, count in zip(dates, sizes, rows, strict=True):
        entry = found.setdefault(day, [0, 0, 0])
        entry[0] += 1
        entry[1] += int(size)
        entry[2] += int(count or 0)
    return [PartitionInfo(day, *found[day]) for day in sorted(found)]
