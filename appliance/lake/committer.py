"""One node's commits to the ``events`` table: open, store groups, keep the lease.

:class:`TableCommitter` is what both batch sinks (appliance/lake/commit_sink.py
for ``ack = "commit"``, appliance/lake/log_sink.py for ``ack = "wal"``) commit
through. It opens the table and claims the node's app id, then stores groups
of blocks with the commit-and-check protocol of
appliance/lake/exactly_once.py, so no batch id is stored twice whatever other
writers do; it converts the blocks to Arrow in worker threads (in slices, so
the event loop keeps running), retries storage failures with capped,
jittered exponential backoff until they succeed (no ack meanwhile), and
keeps the app id's lease while no data commits.

Data cannot stop it: should a group still fail to convert or write for a
reason in its data (:func:`data_errors`), its blocks are stored one by one
and only those that fail are refused.

One worker thread at a time touches the table (one committer per table per
node: docs/decisions.md#one-committer-per-table-per-node): every table call
holds the same one-token limiter, which table maintenance shares through
:meth:`TableCommitter.run_exclusive`. A commit attempt holds it once for its
check and its put together (:meth:`_GroupStorage.exclusive`), so neither
maintenance nor a lease renewal moves the table between the two.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar, TypeVarTuple, Unpack

import trio

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.blocks.identity import BatchDigest, batch_digest, dedupe_key
from appliance.lake.arrow import blocks_to_arrow, data_errors
from appliance.lake.commit_info import commit_metadata
from appliance.lake.dedupe import StoredBatches
from appliance.lake.errors import AppIdInUse, CommitConflict, CommitError, LakeError
from appliance.lake.exactly_once import FREE_CONFLICTS, ExactlyOnce, Outcome
from appliance.lake.preconvert import Converted
from appliance.lake.retry import REASON_MAX_CHARS, Backoff, describe
from appliance.lake.schema import events_schema
from appliance.lake.settings import WriterSettings
from appliance.lake.table import EventsTable, TableChanges
from appliance.logs import get_logger
from appliance.metrics import NULL_METRICS, Metrics

if TYPE_CHECKING:
    # pyarrow loads at the first conversion (docs/performance.md#idle-memory).
    import pyarrow as pa

__all__ = [
    "ARROW_SLICE_ROWS",
    "Stored",
    "TableCommitter",
    "block_digest",
    "to_arrow",
    "wal_app_id",
]

log = get_logger("lake")

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


#: A writer that lost several races in a row waits a random time below
#: ``CONFLICT_BACKOFF_BASE_SECONDS * 2**n`` (n: its extra losses), capped at
#: ``CONFLICT_BACKOFF_MAX_SECONDS``: long enough for the winner's next commit
#: to pass, short against the commit interval. A lost race is not a failure:
#: readiness and the failure counters do not see it.
CONFLICT_BACKOFF_BASE_SECONDS: Final = 0.02
CONFLICT_BACKOFF_MAX_SECONDS: Final = 1.0

#: Rows converted to Arrow per call in a commit's worker thread. The conversion
#: from Python lists holds the GIL for its whole call (about 0.2 µs a row),
#: so a 500,000-row group converted at once would stall the event loop, and
#: every ack, for a tenth of a second; in slices the loop runs between them.
ARROW_SLICE_ROWS: Final = 20_000


def wal_app_id(app_id: str) -> str:
    """The app transaction id whose version is the log position ``app_id``'s commits cover.

    Every commit from the write-ahead log records ``(<app_id>#wal, end)``,
    ``end`` being the position just past its last record; at start the log
    is replayed from there (docs/wal.md, docs/table.md).
    """
    return f"{app_id}#wal"


def block_digest(block: RowBlock) -> BatchDigest | None:
    """The digest of a block's batch identity, None for a batch without an id."""
    key = dedupe_key(block)
    return None if key is None else batch_digest(key)


def to_arrow(blocks: Sequence[RowBlock], converted: Converted | None = None) -> pa.Table:
    """:func:`blocks_to_arrow` of ``blocks``, converted a slice of blocks at a time.

    ``converted``: where blocks were converted ahead (``id(block) -> (run,
    index)``, :meth:`~appliance.lake.preconvert.Preconverter.lookup`);
    where ``blocks`` holds a run's very objects in its order, those rows
    are taken from it instead of converted again. The table is the same
    either way. Only the blocks of ``blocks`` are looked up: the work
    follows the group, not what else was converted ahead.
    """
    import pyarrow as pa

    parts: list[pa.Table] = []
    start = rows = 0
    count = len(blocks)
    i = 0
    while i < count:
        hit = converted.get(id(blocks[i])) if converted else None
        if hit is not None and hit[0].blocks[hit[1]] is blocks[i]:
            if start < i:
                parts.append(blocks_to_arrow(blocks[start:i]))
            run, first = hit
            stop = first
            while stop < len(run.blocks) and i < count and blocks[i] is run.blocks[stop]:
                stop += 1
                i += 1
            parts.append(run.rows(first, stop))
            start, rows = i, 0
            continue
        rows += blocks[i].rows
        i += 1
        if rows >= ARROW_SLICE_ROWS or i == count:
            parts.append(blocks_to_arrow(blocks[start:i]))
            start, rows = i, 0
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts) if parts else blocks_to_arrow(blocks)


def _empty_table() -> pa.Table:
    """An ``events`` table of no rows (``Schema.empty_table`` would import pandas)."""
    import pyarrow as pa

    return pa.Table.from_batches([], schema=events_schema())


@dataclass(frozen=True, slots=True)
class Stored:
    """What :meth:`TableCommitter.store` did with a group, by block index."""

    #: Blocks that cannot be stored, and why (their data).
    refused: dict[int, BlockRefused]
    #: Blocks left out because another writer's commit holds their batch.
    elsewhere: frozenset[int]


def _timed_commit(
    table: EventsTable,
    data: pa.Table,
    app_id: str,
    version: int,
    token: int,
    now_ms: int,
    also: Sequence[tuple[str, int]],
    read_version: int,
    metadata: dict[str, object],
) -> tuple[float, int]:
    """:meth:`EventsTable.commit` (worker thread): its seconds and the table's version after it."""
    started = time.perf_counter()
    table.commit(
        data, app_id, version, token, now_ms, also, read_version=read_version, metadata=metadata
    )
    return time.perf_counter() - started, table.version()


class _GroupStorage:
    """The :class:`~appliance.lake.exactly_once.Storage` of one group's commit."""

    def __init__(
        self,
        committer: TableCommitter,
        blocks: Sequence[RowBlock],
        position: int | None,
        what: str,
        converted: Converted | None = None,
    ) -> None:
        self._c = committer
        self._blocks = blocks
        self._converted_ahead = converted
        self._position = position
        self._what = what
        self._converted: tuple[tuple[int, ...], pa.Table] | None = None
        #: What this group's worker threads take: the table's limiter, or
        #: within :meth:`exclusive` (which holds that) the attempt's own.
        self._limiter = committer.limiter
        #: The lost races of this group's commit when one was last logged, and
        #: that commit's sequence (said again once it gets through).
        self._conflicts_logged = 0
        self._conflict_commit = 0

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the table's limiter for one attempt: its check and its put run in one turn."""
        c = self._c
        async with c.limiter:
            self._limiter = c.attempt_threads
            try:
                yield
            finally:
                self._limiter = c.limiter

    async def convert(self, wanted: tuple[int, ...]) -> pa.Table:
        """The Arrow table of the blocks ``wanted`` (converted once per set)."""
        if self._converted is None or self._converted[0] != wanted:
            blocks = [self._blocks[i] for i in wanted]
            data = (
                await trio.to_thread.run_sync(
                    to_arrow, blocks, self._converted_ahead, limiter=self._limiter
                )
                if blocks
                else _empty_table()
            )
            self._converted = (wanted, data)
        return self._converted[1]

    async def changes_since(self, checked: int) -> TableChanges:
        c = self._c
        return await trio.to_thread.run_sync(
            c.table.changes_since, checked, c.app_id, limiter=self._limiter
        )

    async def write(
        self, keep: Sequence[int], read_version: int, sequence: int, digests: list[BatchDigest]
    ) -> None:
        c = self._c
        data = await self.convert(tuple(keep))
        also = [] if self._position is None else [(wal_app_id(c.app_id), self._position)]
        metadata = commit_metadata(digests, c.app_id, sequence)
        try:
            seconds, table_version = await trio.to_thread.run_sync(
                _timed_commit, c.table, data, c.app_id, sequence, c.token,
                time.time_ns() // 1_000_000, also, read_version, metadata, limiter=self._limiter,
            )  # fmt: skip
        except CommitConflict:
            c.metrics.lake.commit_conflicts.inc()
            raise
        c.committed(sequence, data, seconds, table_version)

    async def failed(self, error: LakeError, attempt: int) -> None:
        await self._c.failed(error, attempt, self._what)

    async def conflicted(self, conflicts: int, error: CommitConflict) -> None:
        ceiling = min(CONFLICT_BACKOFF_BASE_SECONDS * 2**conflicts, CONFLICT_BACKOFF_MAX_SECONDS)
        delay = random.uniform(0, ceiling)  # noqa: S311 (jitter, not a secret)
        # Not a failure (readiness does not see it), but a commit that keeps
        # losing is said, each time: never a silent retry.
        self._conflicts_logged = conflicts + FREE_CONFLICTS
        self._conflict_commit = self._c.protocol.sequence
        log.warning(
            "commit.conflict", op=self._what, commit=self._conflict_commit,
            lost_races=self._conflicts_logged, retry_in_seconds=round(delay, 3),
            reason=" ".join(str(error).split())[:REASON_MAX_CHARS],
        )  # fmt: skip
        await trio.sleep(delay)

    def recovered(self) -> None:
        if self._conflicts_logged:
            log.info(
                "commit.ok_after_conflicts", op=self._what, commit=self._conflict_commit,
                lost_races=self._conflicts_logged,
            )  # fmt: skip
            self._conflicts_logged = 0
        self._c.recovered()


class TableCommitter:
    """The single committer of one node to its ``events`` table.

    Args:
        table: the table, driven only from this committer's worker thread.
        app_id: the node's stable id, used as the Delta app transaction id.
        settings: thresholds and limits.
        token: this writer's identity in the app id's lease.
        metrics: the service's metrics.
    """

    def __init__(
        self,
        table: EventsTable,
        app_id: str,
        settings: WriterSettings,
        token: int,
        metrics: Metrics | None = None,
    ) -> None:
        self.table = table
        self.app_id = app_id
        self.settings = settings
        self.token = token
        self.metrics = metrics or NULL_METRICS
        self._lake = self.metrics.lake
        # One worker thread at a time touches the table.
        self.limiter = trio.CapacityLimiter(1)
        #: The worker thread of a commit attempt, which holds ``limiter``
        #: for its check and its put together (_GroupStorage.exclusive).
        self.attempt_threads = trio.CapacityLimiter(1)
        #: Batches known as stored: this node's commits, the table's at start,
        #: and those other writers' commits named since.
        self.stored = StoredBatches(settings.dedupe_window_seconds, settings.dedupe_max_keys)
        self._lake.dedupe_keys.set_function(lambda: len(self.stored))
        self._lake.dedupe_evicted.set_function(lambda: self.stored.evicted)
        self._protocol: ExactlyOnce | None = None
        self._backoff = Backoff(settings.retry_initial_seconds, settings.retry_max_seconds)
        self.last_commit = 0.0
        self.last_data_commit = time.monotonic()
        #: Counters for logs, tests and benchmarks.
        self.commits = 0
        self.rows_committed = 0
        self.failed_attempts = 0
        #: Batches not committed because another writer's commit holds them.
        self.stored_elsewhere = 0
        #: Why the last attempt failed, while it is being retried; else None.
        self.failing: str | None = None
        self._failing_since = 0.0

    @property
    def protocol(self) -> ExactlyOnce:
        if self._protocol is None:
            raise LakeError("the table is not open")
        return self._protocol

    @property
    def next_sequence(self) -> int:
        """The sequence the next commit under the app id records."""
        return self.protocol.sequence

    @property
    def lost_races(self) -> int:
        """Commits that lost their version to another writer and were checked again."""
        return 0 if self._protocol is None else self._protocol.lost_races

    async def open(self) -> int:
        """Open or create the table, claim the app id, and learn the recent batches.

        Returns:
            How many batch ids the table holds from the dedupe window.

        Raises:
            AppIdInUse: another live appliance commits under this app id.
            LakeError: the table cannot be opened.
        """
        await trio.to_thread.run_sync(self.table.open_or_create, limiter=self.limiter)
        lease_ms = int(self.settings.lease_seconds * 1000)
        await trio.to_thread.run_sync(
            self.table.claim, self.app_id, self.token, time.time_ns() // 1_000_000, lease_ms,
            limiter=self.limiter,
        )  # fmt: skip
        self.last_commit = trio.current_time()
        done = await trio.to_thread.run_sync(
            self.table.committed_version, self.app_id, limiter=self.limiter
        )
        checked = await trio.to_thread.run_sync(self.table.version, limiter=self.limiter)
        # received_at is wall-clock time, so the cutoff is too. The scan reads
        # the table as of ``checked`` or later, and the protocol reads every
        # commit after ``checked``: no commit falls between the two.
        cutoff_ns = time.time_ns() - int(self.settings.dedupe_window_seconds * 1e9)
        keys = await trio.to_thread.run_sync(
            self.table.recent_batch_keys, cutoff_ns, limiter=self.limiter
        )
        now = trio.current_time()
        self.stored.add_all((batch_digest(key) for key in keys), now)
        self._protocol = ExactlyOnce(
            self.app_id,
            self.stored,
            checked=checked,
            sequence=(done or 0) + 1,
            clock=trio.current_time,
            token=self.token,
        )
        self.last_data_commit = time.monotonic()
        return len(keys)

    async def run_exclusive(self, fn: Callable[[Unpack[_Args]], _T], *args: *_Args) -> _T:
        """Run the blocking ``fn(*args)`` in a worker thread, never alongside a commit."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def read(self, fn: Callable[[Unpack[_Args]], _T], *args: *_Args, what: str) -> _T:
        """Run the blocking table read ``fn(*args)`` exclusively, retrying storage failures."""
        attempt = 0
        while True:
            try:
                result = await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)
            except LakeError as exc:
                attempt += 1
                await self.failed(exc, attempt, what)
                continue
            self.recovered()
            return result

    async def commit_group(
        self,
        blocks: Sequence[RowBlock],
        position: int | None = None,
        *,
        digests: Sequence[BatchDigest | None] | None = None,
        what: str = "commit",
        converted: Converted | None = None,
    ) -> Outcome:
        """Commit ``blocks`` once (less those stored elsewhere), retrying storage failures.

        ``position``: the write-ahead log position the commit covers; with
        one, a commit is made even when no block is left, to record it.
        ``converted``: where some of ``blocks`` were converted ahead (:func:`to_arrow`).

        Raises:
            AppIdInUse: another writer committed under this app id.
            A :func:`data_errors` error: a block's data cannot be converted.
        """
        if digests is None:
            digests = [block_digest(block) for block in blocks]
        storage = _GroupStorage(self, blocks, position, what, converted)
        # Converted before the check, not between the check and the put: the
        # shorter that gap, the fewer races are lost to other writers.
        await storage.convert(tuple(range(len(blocks))))
        try:
            outcome = await self.protocol.commit(digests, storage, must_commit=position is not None)
        except AppIdInUse as exc:
            # Never ack on a version another writer may have written: stop.
            log.error("writer.app_id_in_use", app_id=self.app_id, reason=str(exc))
            raise
        if outcome.stored_elsewhere:
            self.stored_elsewhere += len(outcome.stored_elsewhere)
            self._lake.batches_stored_elsewhere.inc(len(outcome.stored_elsewhere))
        return outcome

    async def store(
        self,
        blocks: Sequence[RowBlock],
        ends: Sequence[int] | None = None,
        position: int | None = None,
        converted: Converted | None = None,
    ) -> Stored:
        """Commit ``blocks`` in one commit, or one by one if their data fails.

        ``ends``: with a write-ahead log, each block's record's end;
        ``position``: the log position the group covers (recorded also when
        blocks are refused or stored elsewhere); ``converted``: where blocks
        were converted ahead (:func:`to_arrow`).
        """
        digests = [block_digest(block) for block in blocks]
        rows = sum(block.rows for block in blocks)
        try:
            outcome = await self.commit_group(
                blocks, position, digests=digests, converted=converted
            )
        except data_errors() as exc:
            # check_block lets nothing through that Arrow refuses; should a
            # block still fail, it fails alone and the rest commit.
            log.error("commit.data_error", rows=rows, error=type(exc).__name__)
            self._lake.commit_failures_data.inc()
        else:
            return Stored({}, outcome.stored_elsewhere)
        refused: dict[int, BlockRefused] = {}
        elsewhere: set[int] = set()
        for i, block in enumerate(blocks):
            try:
                # Only this block's own entry: each one-block commit looks up one block.
                hit = converted.get(id(block)) if converted else None
                one = await self.commit_group(
                    [block], None if ends is None else ends[i], digests=[digests[i]],
                    converted=None if hit is None else {id(block): hit},
                )  # fmt: skip
            except data_errors() as exc:
                refused[i] = BlockRefused(f"cannot be stored: {type(exc).__name__}")
                continue
            if one.stored_elsewhere:
                elsewhere.add(i)
        if position is not None:
            await self.commit_group([], position)
        return Stored(refused, frozenset(elsewhere))

    # -- called by the protocol's storage --------------------------------------

    def committed(self, sequence: int, data: pa.Table, seconds: float, table_version: int) -> None:
        """Count a successful commit."""
        rows = data.num_rows
        self.last_commit = trio.current_time()
        self.commits += 1
        self.rows_committed += rows
        self.last_data_commit = time.monotonic()
        lake = self._lake
        lake.commits.inc()
        lake.committed_rows.inc(rows)
        lake.committed_bytes.inc(data.nbytes)
        lake.commit_duration.observe(seconds)
        lake.table_version.set(table_version)
        lake.last_commit_time.set(time.time())
        log.debug("commit.ok", commit=sequence, rows=rows, version=table_version)

    async def failed(self, error: LakeError, attempt: int, what: str) -> None:
        """A failed table operation: count it, say why, and wait out the backoff.

        No ack for anything in the group until a retry succeeds; clients
        that time out resend, and the resend is deduped.
        """
        if attempt == 1 and self.failing is None:
            self._failing_since = trio.current_time()
        self.failed_attempts += 1
        reason = describe(error)
        self.failing = reason
        self._lake.commit_failures_storage.inc()
        self._lake.commit_retrying.set(1)
        delay = self._backoff.delay(attempt)
        log.error(
            "commit.failed", op=what, attempt=attempt,
            commit=None if self._protocol is None else self._protocol.sequence,
            retry_in_seconds=round(delay, 3), reason=reason,
        )  # fmt: skip
        await trio.sleep(delay)

    def recovered(self) -> None:
        """The operation succeeded: clear the failure, and say so if there was one."""
        if self.failing is not None:
            seconds = round(trio.current_time() - self._failing_since, 3)
            log.info("commit.recovered", after_seconds=seconds, last_reason=self.failing)
            self.failing = None
            self._lake.commit_retrying.set(0)

    # -- the lease ---------------------------------------------------------------

    async def renew_loop(self) -> None:
        """Keep the app id's lease while no data commits (an idle node)."""
        interval = self.settings.lease_seconds / 3
        while True:
            await trio.sleep_until(self.last_commit + interval)
            if trio.current_time() < self.last_commit + interval:
                continue  # a data commit renewed it meanwhile
            try:
                await trio.to_thread.run_sync(
                    self.table.renew, self.app_id, self.token, time.time_ns() // 1_000_000,
                    limiter=self.limiter,
                )  # fmt: skip
            except CommitError as exc:
                log.warning("lease.renew_failed", app_id=self.app_id, reason=str(exc)[:300])
                await trio.sleep(min(interval, self.settings.retry_max_seconds))
                continue
            self.last_commit = trio.current_time()
            await self._keep_checked()

    async def _keep_checked(self) -> None:
        """Read the other writers' commits while idle, so no check lags far behind.

        A writer that commits nothing for days would otherwise read days of
        commits at its next commit, some perhaps already removed by log
        clean-up (then its commits wait: ``changes_since`` refuses a partial
        view).
        """
        protocol = self.protocol
        try:
            changes = await trio.to_thread.run_sync(
                self.table.changes_since, protocol.checked, self.app_id, limiter=self.limiter
            )
        except LakeError as exc:
            log.warning("table.read_failed", op="idle check", reason=str(exc)[:300])
            return
        # A commit may have moved the check meanwhile: only ever forward.
        if changes.version > protocol.checked:
            protocol.absorb(changes)
