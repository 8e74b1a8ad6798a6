"""The lake writer: where connections submit blocks, by ``[lake] ack`` mode.

Connections :meth:`LakeWriter.submit` a :class:`~appliance.blocks.block.RowBlock`
and get a ticket whose ``wait()`` returns once the block is durable; only
then does the connection acknowledge. The writer checks each block on its
own (:func:`~appliance.blocks.checks.check_block`) and the table's disk
(:class:`~appliance.lake.diskguard.DiskGuard`), then hands it to its sink:

* ``ack = "commit"``: :class:`~appliance.lake.commit_sink.CommitSink`, an
  ack after the Delta commit;
* ``ack = "wal"``: :class:`~appliance.lake.log_sink.LogSink`, an ack once
  the block is fdatasynced in the write-ahead log, committed from there.

Both commit through one :class:`~appliance.lake.committer.TableCommitter`,
whose commit-and-check protocol (appliance/lake/exactly_once.py) stores
every batch id once, whatever other writers of the table do. How the
pieces fit: docs/architecture.md.

Data cannot stop the writer: a block that fails its check fails its own
connection and never joins a group or the log.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

import trio

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
from appliance.lake.arrow import load_arrow
from appliance.lake.commit_sink import CommitSink, CommitTicket
from appliance.lake.committer import ARROW_SLICE_ROWS, TableCommitter, wal_app_id
from appliance.lake.diskguard import DiskGuard
from appliance.lake.log_sink import LoggedTicket, LogSink
from appliance.lake.settings import WriterSettings
from appliance.lake.sink import CommitListener
from appliance.lake.table import EventsTable
from appliance.logs import get_logger
from appliance.metrics import NULL_METRICS, Metrics
from appliance.wal.log import WriteAheadLog

__all__ = [
    "ARROW_SLICE_ROWS",
    "CommitListener",
    "CommitTicket",
    "LakeWriter",
    "LoggedTicket",
    "WriterSettings",
    "wal_app_id",
]

log = get_logger("lake")

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


class LakeWriter:
    """The single writer of one appliance node to its ``events`` table.

    Args:
        table: the table, driven only from this writer's worker thread.
        app_id: the node's stable id, used as the Delta app transaction id.
        settings: thresholds and limits.
        token: this writer's identity in the app id's lease; a restart of the
            same node must pass the same one to reclaim its app id at once.
        metrics: the service's metrics (default: none counted).
        wal: the write-ahead log to acknowledge from (ack = "wal"), not yet
            open: :meth:`open` opens and replays it, :meth:`run` runs it.
            None: acknowledge after the commit (ack = "commit").
    """

    def __init__(
        self,
        table: EventsTable,
        app_id: str,
        settings: WriterSettings | None = None,
        *,
        token: int | None = None,
        metrics: Metrics | None = None,
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.table = table
        self.app_id = app_id
        self.settings = settings or WriterSettings()
        #: The service's metrics (table maintenance counts into them too).
        self.metrics = metrics or NULL_METRICS
        self._lake = self.metrics.lake
        #: The write-ahead log blocks go to (ack = "wal"), or None (ack = "commit").
        self.wal = wal
        #: Called after every successful commit with its blocks (see CommitListener).
        self.commit_listeners: list[CommitListener] = []
        self.committer = TableCommitter(
            table,
            app_id,
            self.settings,
            token if token is not None else secrets.randbits(62) + 1,
            self.metrics,
        )
        self._sink: CommitSink | LogSink = (
            CommitSink(self.committer, self.settings, self.metrics, self.commit_listeners)
            if wal is None
            else LogSink(self.committer, wal, self.settings, self.metrics, self.commit_listeners)
        )
        self._lake.last_commit_age.set_function(
            lambda: time.monotonic() - self.committer.last_data_commit
        )
        #: Set by the first block with rows: the Arrow library then loads (see run).
        self._first_rows = trio.Event()
        #: Refuses new blocks while the table's disk is nearly full (None: off).
        self.disk_guard: DiskGuard | None = (
            DiskGuard.for_table(
                table.uri, self.settings.min_free_bytes, self.settings.min_free_percent
            )
            if self.settings.disk_guard
            else None
        )

    # -- counters for logs, tests and benchmarks ---------------------------------

    @property
    def commits(self) -> int:
        return self.committer.commits

    @property
    def rows_committed(self) -> int:
        return self.committer.rows_committed

    @property
    def failed_attempts(self) -> int:
        return self.committer.failed_attempts

    @property
    def failing(self) -> str | None:
        """Why the last table operation failed, while it is being retried; else None."""
        return self.committer.failing

    @property
    def duplicates(self) -> int:
        return self._sink.duplicates

    @property
    def refused_blocks(self) -> int:
        return self._sink.refused_blocks

    @property
    def lost_races(self) -> int:
        """Commits that lost their table version to another writer and were checked again."""
        return self.committer.lost_races

    @property
    def skipped_duplicates(self) -> int:
        """Logged batches not committed because another writer had stored them."""
        if isinstance(self._sink, LogSink):
            return self._sink.skipped_duplicates
        return self.committer.stored_elsewhere

    @property
    def lost_records(self) -> int:
        return self._sink.lost_records if isinstance(self._sink, LogSink) else 0

    @property
    def cached_reads(self) -> int:
        return self._sink.cached_reads if isinstance(self._sink, LogSink) else 0

    @property
    def file_reads(self) -> int:
        return self._sink.file_reads if isinstance(self._sink, LogSink) else 0

    # -- life cycle ----------------------------------------------------------------

    async def open(self) -> None:
        """Open or create the table, claim the app id, learn the recent batches, replay the log.

        Raises:
            AppIdInUse: another live appliance commits under this app id.
        """
        keys = await self.committer.open()
        log.info(
            "table.open",
            uri=self.table.uri,
            app_id=self.app_id,
            next_commit=self.committer.next_sequence,
            dedupe_keys=keys,
        )
        if isinstance(self._sink, LogSink):
            await self._sink.open_log()

    async def drain_log(self, wal: WriteAheadLog) -> None:
        """Open ``wal``, commit every record it holds to the table, and close it.

        For ack = "commit" when a log is left from ack = "wal": what it holds
        was acknowledged, so it is committed before any listener opens.
        Call after :meth:`open`.
        """
        sink = LogSink(self.committer, wal, self.settings, NULL_METRICS, self.commit_listeners)
        try:
            await sink.open_log()
        finally:
            wal.close_files()

    async def run_exclusive(self, fn: Callable[[Unpack[_Args]], _T], *args: *_Args) -> _T:
        """Run the blocking ``fn(*args)`` in a worker thread, never alongside a commit.

        Table maintenance (compaction, checkpoints, vacuum) goes through here
        so that it is serialized with this writer's commits: both hold the
        same one-token limiter. A commit that is due waits until ``fn``
        returns. Cancellation waits for ``fn`` too: a thread cannot be stopped.
        """
        return await self.committer.run_exclusive(fn, *args)

    async def submit(self, block: RowBlock) -> CommitTicket | LoggedTicket:
        """Check a block and hand it to the sink; waits while the sink is full (backpressure).

        A block with no rows resolves at once: there is nothing to write, and
        its batch may be acknowledged.

        Raises:
            BlockRefused: the block cannot be stored (checked before it joins
                a commit group, so no other batch is affected), or the table's
                disk is nearly full (``disk nearly full: ...``), or (with a
                log) it is over ``max_record_bytes`` or waited too long for
                room under the log's cap.
            trio.ClosedResourceError: the writer no longer accepts blocks (shutdown).
        """
        try:
            nbytes = check_block(block)
        except BlockRefused:
            self._lake.blocks_refused.inc()
            raise
        if self.disk_guard is not None and block.rows:
            self.disk_guard.check()
        if block.rows:
            self._first_rows.set()
        return await self._sink.submit(block, nbytes)

    async def _load_arrow_at_first_rows(self) -> None:
        """Import pyarrow (in a worker thread) once the first rows arrive, not at the first commit.

        pyarrow stays out of an idle process (docs/performance.md#idle-memory),
        so the first commit used to load it: about a second on a busy two-core
        machine, in which a full load let the write-ahead log's backlog pass its
        cache, and the records left out were read back and decoded later. Loaded
        as the first rows are logged, it is ready by the first commit.
        """
        await self._first_rows.wait()
        await trio.to_thread.run_sync(load_arrow)

    async def close_input(self) -> None:
        """Accept no more blocks; :meth:`run` makes what is queued or logged durable and returns."""
        await self._sink.close_input()

    async def run(self) -> None:
        """Run the sink until :meth:`close_input` and every accepted block is committed."""
        async with trio.open_nursery() as outer:
            outer.start_soon(self.committer.renew_loop)
            outer.start_soon(self._load_arrow_at_first_rows)
            await self._sink.run()
            outer.cancel_scope.cancel()  # the lease ends with the last commit
