"""Group commit of every connection's batches into the ``events`` table (DESIGN §2).

Connections :meth:`LakeWriter.submit` a :class:`~appliance.rows.block.RowBlock`
and get a ticket whose ``wait()`` returns once the block is durable; only
then does the connection acknowledge. What "durable" means is the writer's
mode (``[lake] ack``, docs/wal.md):

* **ack = "commit"** (no log): the ticket is a :class:`CommitTicket`, which
  resolves once the rows are in a successful Delta commit. Described below.
* **ack = "wal"** (a :class:`~appliance.wal.log.WriteAheadLog` given): the
  ticket is a :class:`LoggedTicket`, which resolves once the block's record
  is fdatasynced in the log (a few milliseconds, grouped with other
  connections' records). The committer reads the log and commits it in large
  groups, every ``commit_interval_seconds`` or as soon as
  ``commit_max_bytes`` of records wait; each commit records the log position
  it covers in the app transaction ``<app_id>#wal`` (:func:`wal_app_id`), so
  a replay after a crash (at :meth:`LakeWriter.open`, before any listener
  opens) writes every record exactly once; then the segments wholly
  committed are deleted. The log's cap (``[wal] max_bytes``) is the
  backpressure: at the cap, ``submit`` waits.

Tasks and bounds of ack = "commit"::

    submit() --(bounded channel: queue_blocks)--> collector
        collector: dedupe, open group (<= commit_max_rows / commit_max_bytes,
                   sealed after commit_max_delay_seconds)
        --(channel of 1 sealed group)--> committer
        committer: Arrow + deltalake in a worker thread (one at a time),
                   retried with capped exponential backoff until it succeeds

At most one group commits, one waits sealed and one is open, so memory is
bounded and a slow disk fills the channel, which stops connections reading
(TCP backpressure), never grows memory.

Deduplication: a batch with a globally unique id (Fluentd chunk, Courier
nonce, ...) that was committed within ``dedupe_window_seconds`` is acked
again without a second write; one that is still pending is attached to the
pending commit. Ids are unique within their sender's scope
(:func:`~appliance.lake.blocks.dedupe_scope`).

The ticket contract, one for every driver: :meth:`CommitTicket.wait` returns
only once the block is in a successful commit, and raises
:class:`~appliance.lake.errors.BlockRefused` when the block cannot be stored.
It has no "not committed" outcome: at shutdown the writer commits everything
queued, and a driver that is cancelled first simply sends nothing.

Data cannot stop the writer: :meth:`LakeWriter.submit` checks each block on
its own (:func:`~appliance.lake.blocks.check_block`) before it joins a group
or the log, and should a group still fail to convert or write for a reason
in its data, the committer retries its blocks one by one and refuses only the
blocks that fail, so one connection's bad block never costs another
connection its ack. (With ack = "wal" such a block was acked already: it is
logged as ``wal.record_unstorable`` with its position and skipped; the check
before the append exists so that this cannot happen.)

Dedupe with ack = "wal" knows three states of a batch id besides "new":
committed (the table's recent ids, as above), durable in the log but not yet
committed (acked again at once), and in flight (its first copy's append has
not returned: the resend waits on that append's outcome). A resend is never
appended while a copy is in flight or durable.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar, TypeVarTuple, Unpack

import pyarrow as pa
import trio

from appliance import defaults
from appliance.lake.blocks import DedupeKey, blocks_to_arrow, check_block, dedupe_key
from appliance.lake.diskguard import DiskGuard
from appliance.lake.errors import AppIdInUse, BlockRefused, CommitError
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.lake.table import EventsTable, shared_with_others
from appliance.logs import get_logger
from appliance.metrics import NULL_METRICS, Metrics, WalSample
from appliance.rows.block import RowBlock
from appliance.wal.blocks import decode_block
from appliance.wal.errors import (
    RecordDecodeError,
    RecordTooLarge,
    WalClosed,
    WalError,
    WalFull,
    WalWriteError,
)
from appliance.wal.frame import Frame
from appliance.wal.log import PendingAppend, WriteAheadLog

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


#: Errors that a block's data, not the table's storage, causes while a group
#: is converted to Arrow or written: the blocks are then tried one by one.
_DATA_ERRORS: Final = (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError)

#: Nanoseconds by which another node's clock may lag this one's: a batch it
#: stored is looked for from this long before this node received it.
CLOCK_SKEW_NS: Final = 60 * 1_000_000_000


def wal_app_id(app_id: str) -> str:
    """The app transaction id whose version is the log position ``app_id``'s commits cover.

    Every commit from the write-ahead log records ``(<app_id>#wal, end)``,
    ``end`` being the position just past its last record; at start the log
    is replayed from there (docs/wal.md, docs/table.md).
    """
    return f"{app_id}#wal"


#: Rows converted to Arrow per call in a commit's worker thread. The conversion
#: from Python lists holds the GIL for its whole call (about 0.2 µs a row),
#: so a 500,000-row group converted at once would stall the event loop, and
#: every ack, for a tenth of a second; in slices the loop runs between them.
ARROW_SLICE_ROWS: Final = 20_000


#: A half-full log cache starts a commit only once 1/this of ``commit_max_bytes``
#: waits (docs/wal.md, "The cache").
_CACHE_COMMIT_FLOOR: Final = 8


def _to_arrow(blocks: Sequence[RowBlock]) -> pa.Table:
    """:func:`blocks_to_arrow` of ``blocks``, converted a slice of blocks at a time."""
    parts: list[pa.Table] = []
    start = rows = 0
    for end, block in enumerate(blocks, 1):
        rows += block.rows
        if rows >= ARROW_SLICE_ROWS or end == len(blocks):
            parts.append(blocks_to_arrow(blocks[start:end]))
            start, rows = end, 0
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts) if parts else blocks_to_arrow(blocks)


#: Told the blocks of each successful commit (the WebSocket live tail). It runs in
#: the committer task, so it must return at once and never raise: it may only
#: hand the blocks on without waiting (``send_nowait``, dropping when full).
CommitListener = Callable[[Sequence[RowBlock]], None]


@dataclass(frozen=True, slots=True)
class WriterSettings:
    """Thresholds and limits of the group-commit writer (config ``[lake]``)."""

    commit_max_rows: int = defaults.LAKE_COMMIT_MAX_ROWS
    commit_max_bytes: int = defaults.LAKE_COMMIT_MAX_BYTES
    commit_max_delay_seconds: float = defaults.LAKE_COMMIT_MAX_DELAY_SECONDS
    #: With a write-ahead log: seconds between commits from it (sooner at commit_max_bytes).
    commit_interval_seconds: float = defaults.LAKE_COMMIT_INTERVAL_SECONDS
    queue_blocks: int = defaults.LAKE_QUEUE_BLOCKS
    retry_initial_seconds: float = defaults.LAKE_RETRY_INITIAL_SECONDS
    retry_max_seconds: float = defaults.LAKE_RETRY_MAX_SECONDS
    dedupe_window_seconds: float = defaults.LAKE_DEDUPE_WINDOW_SECONDS
    dedupe_max_keys: int = defaults.LAKE_DEDUPE_MAX_KEYS
    lease_seconds: float = defaults.LAKE_LEASE_SECONDS
    #: Refuse new blocks while the table's filesystem is below the watermark
    #: (appliance/lake/diskguard.py); off unless asked for ([lake] turns it on).
    disk_guard: bool = False
    min_free_bytes: int = 0
    min_free_percent: float = 0.0
    #: Other processes write the table too ("auto": when it is on object storage):
    #: each group from the log is checked against the table's recent batch ids.
    shared: Literal["auto", "on", "off"] = "auto"


class CommitTicket:
    """Resolves when a block's rows are committed; refused when they cannot be stored."""

    __slots__ = ("_done", "duplicate", "refused")

    def __init__(self) -> None:
        self._done = trio.Event()
        #: True when the batch had been committed before and was not written again.
        self.duplicate = False
        #: Why the block cannot be stored, once the writer refused it.
        self.refused: BlockRefused | None = None

    def _resolve(self, *, duplicate: bool = False) -> None:
        self.duplicate = duplicate
        self._done.set()

    def _refuse(self, error: BlockRefused) -> None:
        self.refused = error
        self._done.set()

    @property
    def done(self) -> bool:
        """Whether the ticket has resolved (committed or refused)."""
        return self._done.is_set()

    async def wait(self) -> None:
        """Wait until the block is committed: then, and only then, acknowledge it.

        Raises:
            BlockRefused: the block cannot be stored; do not acknowledge it.
        """
        await self._done.wait()
        if self.refused is not None:
            raise self.refused


class LoggedTicket:
    """Resolves when a block's record is durable in the write-ahead log (ack = "wal")."""

    __slots__ = ("_append", "duplicate")

    def __init__(self, append: PendingAppend | None, *, duplicate: bool = False) -> None:
        self._append = append
        #: True when the batch was in the table or the log already and was not appended again.
        self.duplicate = duplicate

    @property
    def done(self) -> bool:
        """Whether the append has finished (durable or failed)."""
        return self._append is None or self._append.done.is_set()

    async def wait(self) -> None:
        """Wait until the block is durable in the log: then, and only then, acknowledge it.

        Raises:
            BlockRefused: the append failed (disk full, an I/O error, the log
                stopped); nothing of it may be acknowledged.
        """
        if self._append is None:
            return
        try:
            await self._append.wait()
        except WalError as exc:
            raise _not_logged(exc) from None


def _not_logged(exc: WalError) -> BlockRefused:
    """The refusal a connection gets when its block did not become durable in the log."""
    if isinstance(exc, WalWriteError) and exc.disk_full:
        return BlockRefused(f"write-ahead log: disk full ({exc.reason})")
    if isinstance(exc, WalFull):
        return BlockRefused("write-ahead log full: the table is not keeping up")
    return BlockRefused(f"write-ahead log: {exc}")


@dataclass(slots=True)
class _Group:
    blocks: list[RowBlock] = field(default_factory=list)
    #: Per block: its ticket, or None when its dedupe key holds the tickets.
    tickets: list[CommitTicket | None] = field(default_factory=list)
    keys: list[DedupeKey | None] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    deadline: float = math.inf


def _timed_commit(
    table: EventsTable,
    data: pa.Table,
    app_id: str,
    version: int,
    token: int,
    now_ms: int,
    also: Sequence[tuple[str, int]],
) -> tuple[bool, float, int]:
    """:meth:`EventsTable.commit` (worker thread), its seconds, and the table's version after it."""
    started = time.perf_counter()
    wrote = table.commit(data, app_id, version, token, now_ms, also)
    return wrote, time.perf_counter() - started, table.version()


def _decode_frames(
    frames: Sequence[Frame],
) -> tuple[list[RowBlock], list[Frame], list[tuple[Frame, str]]]:
    """The blocks of ``frames`` (worker thread), the frames they came from, and the failures."""
    blocks: list[RowBlock] = []
    kept: list[Frame] = []
    failed: list[tuple[Frame, str]] = []
    for frame in frames:
        try:
            blocks.append(decode_block(frame.body, frame.rows))
        except RecordDecodeError as exc:
            failed.append((frame, exc.reason))
            continue
        kept.append(frame)
    return blocks, kept, failed


class LakeWriter:
    """The single committer of one appliance node to its ``events`` table.

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
        #: The write-ahead log blocks go to (ack = "wal"), or None (ack = "commit").
        self.wal = wal
        #: Replaying the log at start: its batches are checked against the table first.
        self._replaying = False
        #: Logged batches not committed because another node had stored them (fleet resends).
        self.skipped_duplicates = 0
        #: Commit groups served from the log's memory cache (no read back, no
        #: decode), and those read back from the files and decoded.
        self.cached_reads = 0
        self.file_reads = 0
        self._input_closed = False
        #: Batch ids whose first copy is taking room in the log (before it is in flight there).
        self._claims: dict[DedupeKey, trio.Event] = {}
        self._last_log_commit = 0.0
        self.app_id = app_id
        self.settings = settings or WriterSettings()
        #: A table other nodes may write too (object storage, or worker processes): every
        #: group from the log is checked against the table's recent batch ids before it is
        #: committed.
        self._shared_table = shared_with_others(self.settings.shared, table.uri)
        self._send, self._receive = trio.open_memory_channel[tuple[RowBlock, int, CommitTicket]](
            self.settings.queue_blocks
        )
        self._sealed_send, self._sealed_receive = trio.open_memory_channel[_Group](1)
        # One worker thread at a time touches the table (DESIGN §3: one
        # committer per table per appliance).
        self._limiter = trio.CapacityLimiter(1)
        self._next_version = 1
        #: The writer token the app id's lease names (table.py): stable across
        #: restarts of one state directory (the service passes it), else random.
        self._token = token if token is not None else secrets.randbits(62) + 1
        self._last_commit = 0.0
        self._committed: OrderedDict[DedupeKey, float] = OrderedDict()
        self._pending: dict[DedupeKey, list[CommitTicket]] = {}
        #: Counters for logs, tests and benchmarks.
        self.commits = 0
        self.rows_committed = 0
        self.duplicates = 0
        self.failed_attempts = 0
        self.refused_blocks = 0
        #: Log records that were acked but could not be committed (decode or data errors).
        self.lost_records = 0
        #: Called after every successful commit with its blocks (see CommitListener).
        self.commit_listeners: list[CommitListener] = []
        #: Why the last commit attempt failed, while it is being retried; else None.
        self.failing: str | None = None
        #: The service's metrics (table maintenance counts into them too).
        self.metrics = metrics or NULL_METRICS
        self._lake = self.metrics.lake
        self._last_data_commit = time.monotonic()
        self._lake.queue_capacity.set(self.settings.queue_blocks)
        self._lake.queue_blocks.set_function(lambda: self._send.statistics().current_buffer_used)
        self._lake.last_commit_age.set_function(lambda: time.monotonic() - self._last_data_commit)
        if wal is not None:
            self.metrics.watch_wal(self._wal_sample)
        #: Refuses new blocks while the table's disk is nearly full (None: off).
        self.disk_guard: DiskGuard | None = (
            DiskGuard.for_table(
                table.uri, self.settings.min_free_bytes, self.settings.min_free_percent
            )
            if self.settings.disk_guard
            else None
        )

    async def open(self) -> None:
        """Open or create the table, claim the app id, recover the sequence and dedupe keys.

        Raises:
            AppIdInUse: another live appliance commits under this app id.
        """
        await trio.to_thread.run_sync(self.table.open_or_create, limiter=self._limiter)
        lease_ms = int(self.settings.lease_seconds * 1000)
        await trio.to_thread.run_sync(
            self.table.claim, self.app_id, self._token, time.time_ns() // 1_000_000, lease_ms,
            limiter=self._limiter,
        )  # fmt: skip
        self._last_commit = trio.current_time()
        last = await trio.to_thread.run_sync(
            self.table.committed_version, self.app_id, limiter=self._limiter
        )
        self._next_version = (last or 0) + 1
        # received_at is wall-clock time, so the cutoff is too.
        cutoff_ns = time.time_ns() - int(self.settings.dedupe_window_seconds * 1e9)
        keys = await trio.to_thread.run_sync(
            self.table.recent_batch_keys, cutoff_ns, limiter=self._limiter
        )
        now = trio.current_time()
        for key in keys:
            self._remember(key, now)
        self._last_data_commit = time.monotonic()
        log.info(
            "table.open",
            uri=self.table.uri,
            app_id=self.app_id,
            next_commit=self._next_version,
            dedupe_keys=len(keys),
        )
        if self.wal is not None:
            await self._open_log(self.wal)

    async def drain_log(self, wal: WriteAheadLog) -> None:
        """Open ``wal``, commit every record it holds to the table, and close it.

        For ack = "commit" when a log is left from ack = "wal": what it holds
        was acknowledged, so it is committed before any listener opens.
        Call after :meth:`open`.
        """
        try:
            await self._open_log(wal)
        finally:
            wal.close_files()

    async def _open_log(self, wal: WriteAheadLog) -> None:
        """Open and recover ``wal`` from the table's position, and commit its backlog (replay)."""
        position = await trio.to_thread.run_sync(
            self.table.committed_version, wal_app_id(self.app_id), limiter=self._limiter
        )
        recovery = await wal.open(position or 0)
        commits, started = self.commits, trio.current_time()
        self._replaying = True
        try:
            while wal.uncommitted_bytes > 0:
                await self._commit_log_once(wal)
        finally:
            self._replaying = False
        self._last_log_commit = trio.current_time()
        if recovery.records or recovery.truncated_bytes or recovery.lost_ranges:
            log.info(
                "wal.replayed", records=recovery.records, bytes=recovery.record_bytes,
                commits=self.commits - commits, position=wal.committed,
                seconds=round(trio.current_time() - started, 3),
            )  # fmt: skip

    async def run_exclusive(self, fn: Callable[[Unpack[_Args]], _T], *args: *_Args) -> _T:
        """Run the blocking ``fn(*args)`` in a worker thread, never alongside a commit.

        Table maintenance (compaction, checkpoints, vacuum) goes through here
        so that it is serialized with this writer's commits: both hold the
        same one-token limiter. A commit that is due waits until ``fn``
        returns. Cancellation waits for ``fn`` too: a thread cannot be stopped.
        """
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def submit(self, block: RowBlock) -> CommitTicket | LoggedTicket:
        """Check a block and queue it for commit; waits while the queue is full (backpressure).

        A block with no rows resolves at once: there is nothing to write, and
        its batch may be acknowledged.

        With a write-ahead log the wait is for room under its cap, and the
        ticket is a :class:`LoggedTicket`.

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
        if self.wal is not None:
            return await self._submit_logged(self.wal, block)
        ticket = CommitTicket()
        if block.rows == 0:
            ticket._resolve()
            return ticket
        await self._send.send((block, nbytes, ticket))
        return ticket

    async def close_input(self) -> None:
        """Accept no more blocks; :meth:`run` commits what is queued (or logged) and returns."""
        if self.wal is None:
            await self._send.aclose()
            return
        self._input_closed = True
        await self.wal.close()

    async def run(self) -> None:
        """Collect and commit until :meth:`close_input` and every queued block is done.

        With a write-ahead log: run its flusher, and commit from it until it
        is closed and everything it holds is committed.
        """
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._renew_loop)
                async with trio.open_nursery() as nursery:
                    if self.wal is None:
                        nursery.start_soon(self._collect)
                        nursery.start_soon(self._commit_loop)
                    else:
                        nursery.start_soon(self.wal.run)
                        nursery.start_soon(self._commit_log_loop, self.wal)
                outer.cancel_scope.cancel()  # the lease ends with the last commit
        finally:
            if self.wal is not None:
                self.wal.close_files()

    def _wal_sample(self) -> WalSample | None:
        """The log's figures for the metrics (None while it is not open)."""
        wal = self.wal
        if wal is None or not wal.is_open:
            return None
        stats = wal.stats
        return WalSample(
            file_bytes=wal.total_bytes, max_bytes=wal.settings.max_bytes,
            uncommitted_bytes=wal.uncommitted_bytes, segments=len(wal.segments()),
            at_cap=wal.at_cap, appends=stats.appends, syncs=stats.groups,
            failed_syncs=stats.failed_groups, written_bytes=stats.bytes_written,
            cap_waits=stats.cap_waits, cap_refusals=stats.cap_refusals,
            sync_wait_seconds=stats.group_wait_seconds, cache_bytes=wal.cache_bytes,
            groups_from_cache=self.cached_reads, groups_read_back=self.file_reads,
        )  # fmt: skip

    # -- ack = "wal": the front ------------------------------------------------

    def _logged_duplicate(self, wal: WriteAheadLog, key: DedupeKey) -> LoggedTicket | None:
        """A ticket for a resend whose batch id is committed, durable or in flight; else None."""
        if self._already_committed(key, trio.current_time()):
            state, counter, ticket = "committed", self._lake.dedupe_committed, LoggedTicket(None)
        elif wal.uncommitted_lsn(key) is not None:
            state, counter, ticket = "logged", self._lake.dedupe_logged, LoggedTicket(None)
        else:
            first = wal.in_flight(key)
            if first is None:
                return None
            state, counter, ticket = "pending", self._lake.dedupe_pending, LoggedTicket(first)
        self.duplicates += 1
        counter.inc()
        ticket.duplicate = True
        log.info("batch.duplicate", protocol=key[0], batch_id=key[2], state=state)
        return ticket

    async def _submit_logged(self, wal: WriteAheadLog, block: RowBlock) -> LoggedTicket:
        """Dedupe, then take room in the log and queue the block's record (a checked block)."""
        if block.rows == 0:
            return LoggedTicket(None)
        key = dedupe_key(block)
        if key is not None:
            while (claim := self._claims.get(key)) is not None:
                # The first copy is waiting for room in the log: see where it went.
                await claim.wait()
            duplicate = self._logged_duplicate(wal, key)
            if duplicate is not None:
                return duplicate
        if self._input_closed:
            raise trio.ClosedResourceError("the writer takes no more blocks")
        claimed = trio.Event()
        if key is not None:
            self._claims[key] = claimed
        try:
            append = await wal.begin_block(block)
        except RecordTooLarge as exc:
            self._lake.blocks_refused.inc()
            raise BlockRefused(f"cannot be logged: {exc}") from None
        except WalFull as exc:
            raise _not_logged(exc) from None
        except WalClosed:
            raise trio.ClosedResourceError("the writer takes no more blocks") from None
        finally:
            if key is not None:
                del self._claims[key]
            claimed.set()
        return LoggedTicket(append)

    # -- ack = "wal": the committer ---------------------------------------------

    async def _commit_log_loop(self, wal: WriteAheadLog) -> None:
        """Commit from the log when due, until it is closed and everything in it is committed."""
        while True:
            await self._log_commit_due(wal)
            if wal.uncommitted_bytes == 0:
                return  # the log stopped, and the table holds all of it
            await self._commit_log_once(wal)
            self._last_log_commit = trio.current_time()

    async def _log_commit_due(self, wal: WriteAheadLog) -> None:
        """Return once a commit is due: interval passed, bytes reached, the cache half
        full (:attr:`WriteAheadLog.cache_half_full`) with at least an eighth of
        ``commit_max_bytes`` waiting, or the log stopped.

        The eighth is a floor: a ``cache_bytes`` too small for the load must
        not turn into a commit per record (the records it cannot keep are
        read back instead).
        """
        interval = self.settings.commit_interval_seconds
        max_bytes = self.settings.commit_max_bytes
        while True:
            waiting = wal.uncommitted_bytes
            if (
                wal.stopped
                or waiting >= max_bytes
                or (wal.cache_half_full and waiting * _CACHE_COMMIT_FLOOR >= max_bytes)
            ):
                return
            due = self._last_log_commit + interval if waiting else math.inf
            if trio.current_time() >= due:
                return
            with trio.move_on_at(due):
                try:
                    await wal.wait_durable(wal.durable_end)
                except WalClosed:
                    return

    async def _commit_log_once(self, wal: WriteAheadLog) -> None:
        """Commit the next group of records from the log's committed position on."""
        end = wal.durable_end
        cached = wal.read_cached(wal.committed, self.settings.commit_max_bytes)
        if cached is not None:
            # Appended by this process and still in memory: the blocks were
            # checked before they were logged, so nothing is read or decoded.
            self.cached_reads += 1
            frames = [frame for frame, _ in cached]
            await self._commit_frames(wal, frames[-1].end, frames, [b for _, b in cached], [])
            return
        frames = await wal.read(wal.committed, self.settings.commit_max_bytes)
        if frames:
            self.file_reads += 1
            blocks, kept, failed = await trio.to_thread.run_sync(_decode_frames, frames)
            await self._commit_frames(wal, frames[-1].end, kept, blocks, failed)
            return
        # Only unreadable bytes (logged as lost at recovery) lie before the end.
        log.warning("wal.skipped", start=wal.committed, end=end)
        await wal.mark_committed(end)

    async def _commit_frames(
        self,
        wal: WriteAheadLog,
        end: int,
        kept: list[Frame],
        blocks: list[RowBlock],
        failed: list[tuple[Frame, str]],
    ) -> None:
        """Commit records read from the log (in log order) and the position ``end``; mark them.

        ``end``: the position just past the last record read. ``kept`` and
        ``blocks``: the records that decoded, and their blocks; ``failed``:
        those that did not, and why (they are lost, and logged).
        """
        for frame, reason in failed:
            self._lose(frame, reason, protocol=None, peer=None)
        if blocks and (self._replaying or self._shared_table):
            blocks, kept = await self._without_stored_elsewhere(blocks, kept)
        refused: dict[int, BlockRefused] = {}
        if blocks:
            refused = await self._store(blocks, [frame.end for frame in kept])
        committed: list[RowBlock] = []
        recorded = 0  # the position the table now records
        now = trio.current_time()
        for i, (block, frame) in enumerate(zip(blocks, kept, strict=True)):
            if i in refused:
                self._lose(frame, refused[i].reason, protocol=block.protocol, peer=block.peer)
                continue
            committed.append(block)
            recorded = frame.end
            if frame.key is not None:
                # Known as committed before the log forgets it: no gap for dedupe.
                self._remember(frame.key, now)
        if recorded < end:
            # The last records could not be stored: a commit of no rows moves the
            # table's position past them, so a restart does not read them again.
            await self._write(EVENTS_SCHEMA.empty_table(), 0, end)
        await wal.mark_committed(end)
        for listener in self.commit_listeners:
            listener(committed)

    async def _without_stored_elsewhere(
        self, blocks: list[RowBlock], frames: list[Frame]
    ) -> tuple[list[RowBlock], list[Frame]]:
        """``blocks`` (and their frames) less those whose batch the table already holds.

        A node that logged a chunk and died before its ack was sent leaves the
        client to resend it, perhaps to another node of the fleet, which
        stores it; this node's replay must then not store it again. And on a
        shared table a chunk this node logged may have been stored by another
        node meanwhile (docs/fleet.md, "Exactly once across nodes").
        """
        keys = [dedupe_key(block) for block in blocks]
        wanted = [key for key in keys if key is not None]
        if not wanted:
            return blocks, frames
        since = min(block.received_at_ns for block in blocks) - CLOCK_SKEW_NS
        present = await trio.to_thread.run_sync(
            self.table.batch_keys_present, wanted, since, limiter=self._limiter
        )
        if not present:
            return blocks, frames
        now = trio.current_time()
        kept_blocks: list[RowBlock] = []
        kept_frames: list[Frame] = []
        for block, frame, key in zip(blocks, frames, keys, strict=True):
            if key is not None and key in present:
                self.skipped_duplicates += 1
                self._remember(key, now)
                log.info(
                    "wal.duplicate_skipped", batch=key[2], protocol=block.protocol,
                    peer=block.peer, reason="already in the table (stored by another node)",
                )  # fmt: skip
                continue
            kept_blocks.append(block)
            kept_frames.append(frame)
        return kept_blocks, kept_frames

    def _lose(self, frame: Frame, reason: str, *, protocol: str | None, peer: str | None) -> None:
        """A logged (and acked) record that cannot be committed: say which, and go on."""
        self.lost_records += 1
        self._lake.log_records_lost.inc()
        log.error(
            "wal.record_unstorable", lsn=frame.lsn, rows=frame.rows, protocol=protocol,
            peer=peer, reason=reason,
        )  # fmt: skip

    async def _renew_loop(self) -> None:
        """Keep the app id's lease while no data commits (an idle node)."""
        interval = self.settings.lease_seconds / 3
        while True:
            await trio.sleep_until(self._last_commit + interval)
            if trio.current_time() < self._last_commit + interval:
                continue  # a data commit renewed it meanwhile
            try:
                await trio.to_thread.run_sync(
                    self.table.renew, self.app_id, self._token, time.time_ns() // 1_000_000,
                    limiter=self._limiter,
                )  # fmt: skip
            except CommitError as exc:
                log.warning("lease.renew_failed", app_id=self.app_id, reason=str(exc)[:300])
                await trio.sleep(min(interval, self.settings.retry_max_seconds))
                continue
            self._last_commit = trio.current_time()

    # -- collector -----------------------------------------------------------

    def _remember(self, key: DedupeKey, now: float) -> None:
        self._committed[key] = now
        self._committed.move_to_end(key)
        while len(self._committed) > self.settings.dedupe_max_keys:
            self._committed.popitem(last=False)

    def _already_committed(self, key: DedupeKey, now: float) -> bool:
        stamp = self._committed.get(key)
        if stamp is None:
            return False
        if now - stamp > self.settings.dedupe_window_seconds:
            del self._committed[key]
            return False
        return True

    def _admit(self, group: _Group, block: RowBlock, nbytes: int, ticket: CommitTicket) -> None:
        now = trio.current_time()
        key = dedupe_key(block)
        if key is not None:
            if self._already_committed(key, now):
                self.duplicates += 1
                self._lake.dedupe_committed.inc()
                log.info("batch.duplicate", protocol=key[0], batch_id=key[2], state="committed")
                ticket._resolve(duplicate=True)
                return
            waiting = self._pending.get(key)
            if waiting is not None:
                self.duplicates += 1
                self._lake.dedupe_pending.inc()
                log.info("batch.duplicate", protocol=key[0], batch_id=key[2], state="pending")
                waiting.append(ticket)
                return
            self._pending[key] = [ticket]
            group.keys.append(key)
            group.tickets.append(None)
        else:
            group.keys.append(None)
            group.tickets.append(ticket)
        if not group.blocks:
            group.deadline = now + self.settings.commit_max_delay_seconds
        group.blocks.append(block)
        group.rows += block.rows
        group.nbytes += nbytes

    def _full(self, group: _Group) -> bool:
        return (
            group.rows >= self.settings.commit_max_rows
            or group.nbytes >= self.settings.commit_max_bytes
        )

    async def _collect(self) -> None:
        group = _Group()
        async with self._sealed_send:
            while True:
                item: tuple[RowBlock, int, CommitTicket] | None = None
                # Only the receive runs under the group's deadline, so a
                # timeout can never cancel a hand-over half done.
                with trio.move_on_at(group.deadline):
                    try:
                        item = await self._receive.receive()
                    except trio.EndOfChannel:
                        break
                if item is not None:
                    self._admit(group, *item)
                    if not self._full(group):
                        continue
                if group.blocks:
                    await self._sealed_send.send(group)
                    group = _Group()
            if group.blocks:
                await self._sealed_send.send(group)

    # -- committer -----------------------------------------------------------

    async def _commit_loop(self) -> None:
        async for group in self._sealed_receive:
            await self._commit(group)

    async def _commit(self, group: _Group) -> None:
        refused = await self._store(group.blocks)
        for i, error in refused.items():
            self._refuse(group, i, error)
        self._settle(group, [i for i in range(len(group.blocks)) if i not in refused])

    async def _store(
        self, blocks: Sequence[RowBlock], ends: Sequence[int] | None = None
    ) -> dict[int, BlockRefused]:
        """Commit ``blocks`` in one commit, or one by one if their data fails; the refused ones.

        ``ends``: with a write-ahead log, each block's record's end, the log
        position a commit that ends with that block records.
        """
        rows = sum(block.rows for block in blocks)
        try:
            data = await trio.to_thread.run_sync(_to_arrow, blocks, limiter=self._limiter)
            await self._write(data, rows, None if ends is None else ends[-1])
        except _DATA_ERRORS as exc:
            # check_block lets nothing through that Arrow refuses; should a
            # block still fail, it fails alone and the rest commit.
            log.error("commit.data_error", rows=rows, error=type(exc).__name__)
            self._lake.commit_failures_data.inc()
        else:
            return {}
        refused: dict[int, BlockRefused] = {}
        for i, block in enumerate(blocks):
            try:
                data = await trio.to_thread.run_sync(
                    blocks_to_arrow, [block], limiter=self._limiter
                )
                await self._write(data, block.rows, None if ends is None else ends[i])
            except _DATA_ERRORS as exc:
                refused[i] = BlockRefused(f"cannot be stored: {type(exc).__name__}")
        return refused

    async def _write(self, data: pa.Table, rows: int, position: int | None = None) -> None:
        """Commit ``data`` as the next version, retrying storage failures until it succeeds.

        ``position``: the write-ahead log position the commit covers, recorded
        under :func:`wal_app_id` in the same commit.
        """
        version = self._next_version
        also = [] if position is None else [(wal_app_id(self.app_id), position)]
        backoff = self.settings.retry_initial_seconds
        while True:
            try:
                wrote, seconds, table_version = await trio.to_thread.run_sync(
                    _timed_commit, self.table, data, self.app_id, version, self._token,
                    time.time_ns() // 1_000_000, also, limiter=self._limiter,
                )  # fmt: skip
            except AppIdInUse as exc:
                # Never ack on a version another writer may have written: stop.
                log.error("writer.app_id_in_use", app_id=self.app_id, reason=str(exc))
                raise
            except CommitError as exc:
                # No ack for anything in the group until a retry succeeds;
                # clients that time out resend, and the resend is deduped.
                self.failed_attempts += 1
                reason = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__
                self.failing = reason
                self._lake.commit_failures_storage.inc()
                self._lake.commit_retrying.set(1)
                log.error(
                    "commit.failed",
                    commit=version,
                    rows=rows,
                    retry_in_seconds=round(backoff, 3),
                    reason=reason,
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_max_seconds)
                continue
            break
        self._next_version = version + 1
        self._last_commit = trio.current_time()
        self.commits += 1
        self.rows_committed += rows
        self.failing = None
        self._last_data_commit = time.monotonic()
        lake = self._lake
        lake.commit_retrying.set(0)
        lake.commits.inc()
        lake.committed_rows.inc(rows)
        lake.committed_bytes.inc(data.nbytes)
        lake.commit_duration.observe(seconds)
        lake.table_version.set(table_version)
        lake.last_commit_time.set(time.time())
        log.debug("commit.ok", commit=version, rows=rows, wrote=wrote)

    def _settle(self, group: _Group, indexes: Sequence[int] | range) -> None:
        """Resolve the tickets of the committed blocks ``indexes`` and tell the listeners."""
        now = trio.current_time()
        committed: list[RowBlock] = []
        for i in indexes:
            committed.append(group.blocks[i])
            ticket, key = group.tickets[i], group.keys[i]
            if ticket is not None:
                ticket._resolve()
            if key is not None:
                self._remember(key, now)
                for waiting in self._pending.pop(key, []):
                    waiting._resolve()
        for listener in self.commit_listeners:
            listener(committed)

    def _refuse(self, group: _Group, index: int, error: BlockRefused) -> None:
        block = group.blocks[index]
        self.refused_blocks += 1
        self._lake.blocks_refused.inc()
        log.warning(
            "block.refused", protocol=block.protocol, peer=block.peer, rows=block.rows,
            reason=error.reason,
        )  # fmt: skip
        ticket, key = group.tickets[index], group.keys[index]
        if ticket is not None:
            ticket._refuse(error)
        if key is not None:
            for waiting in self._pending.pop(key, []):
                waiting._refuse(error)
