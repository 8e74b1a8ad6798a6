"""``ack = "wal"``: a block is acknowledged once its record is durable in the log.

A ticket (:class:`LoggedTicket`) resolves once the block's record is
fdatasynced in the write-ahead log (a few milliseconds, grouped with other
connections' records). The committer reads the log and commits it in large
groups, every ``commit_interval_seconds`` or as soon as ``commit_max_bytes``
of records wait (sooner once the log's memory cache is half full); each
commit records the log position it covers in the app transaction
``<app_id>#wal`` (:func:`~appliance.lake.committer.wal_app_id`), so a replay
after a crash (:meth:`LogSink.open_log`, before any listener opens) writes
every record exactly once; then the segments wholly committed are deleted.
The log's cap (``[wal] max_bytes``) is the backpressure: at the cap,
``submit`` waits.

Dedupe knows three states of a batch id besides "new": stored (this node's
commits and other writers' that the commit protocol read), durable in the
log but not yet committed (acked again at once), and in flight (its first
copy's append has not returned: the resend waits on that append's
outcome). A resend is never appended while a copy is in flight or durable.
A logged batch that another writer stored meanwhile (a client that resent
it elsewhere) is left out of the commit by the protocol.

A block whose data still fails at commit was acked already: it is logged as
``wal.record_unstorable`` with its position and skipped; the check before
the append (:func:`~appliance.blocks.checks.check_block`) exists so that this
cannot happen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import trio

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.blocks.identity import DedupeKey, batch_digest, dedupe_key
from appliance.lake.commit_info import MAX_COMMIT_BATCH_IDS
from appliance.lake.committer import ARROW_SLICE_ROWS, TableCommitter, wal_app_id
from appliance.lake.preconvert import Preconverter
from appliance.lake.settings import WriterSettings
from appliance.lake.sink import CommitListener
from appliance.logs import get_logger
from appliance.metrics import Metrics, WalSample
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

__all__ = ["CLOCK_SKEW_NS", "LogSink", "LoggedTicket"]

log = get_logger("lake")

#: Nanoseconds by which another node's clock may lag this one's: at replay, a
#: batch it stored is looked for from this long before this node received it.
CLOCK_SKEW_NS: Final = 60 * 1_000_000_000

#: A half-full log cache starts a commit only once 1/this of ``commit_max_bytes``
#: waits (docs/wal.md, "The cache").
_CACHE_COMMIT_FLOOR: Final = 8


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


def _within_id_limit(frames: Sequence[Frame]) -> int:
    """How many of ``frames`` one commit takes: at most MAX_COMMIT_BATCH_IDS with an id."""
    ids = 0
    for i, frame in enumerate(frames):
        if frame.key is not None:
            ids += 1
            if ids > MAX_COMMIT_BATCH_IDS:
                return i
    return len(frames)


class LogSink:
    """Acks from the write-ahead log, commits from it in large groups (``ack = "wal"``)."""

    def __init__(
        self,
        committer: TableCommitter,
        wal: WriteAheadLog,
        settings: WriterSettings,
        metrics: Metrics,
        listeners: list[CommitListener],
    ) -> None:
        self._committer = committer
        self.wal = wal
        self.settings = settings
        self._lake = metrics.lake
        self._listeners = listeners
        self._input_closed = False
        #: Batch ids whose first copy is taking room in the log (before it is in flight there).
        self._claims: dict[DedupeKey, trio.Event] = {}
        self._last_log_commit = 0.0
        #: Replaying the log at start: its batches are also looked for in the table's data.
        self._replaying = False
        self.duplicates = 0
        self.refused_blocks = 0
        #: Logged batches not committed because another writer had stored them.
        self.skipped_duplicates = 0
        #: Log records that were acked but could not be committed (decode or data errors).
        self.lost_records = 0
        #: Commit groups served from the log's memory cache, and those read back.
        self.cached_reads = 0
        self.file_reads = 0
        #: The cached blocks' Arrow tables, converted as the cache keeps them
        #: rather than in one burst at the commit (appliance/lake/preconvert.py).
        #: Within twice the cache's bytes, counting the tables and the blocks
        #: held as the cache counts them (the cache's own objects: a block it
        #: does not keep is read back at its commit as another object, which
        #: no run would match, so it is never held); off with the cache.
        self.preconverter = Preconverter(2 * wal.settings.cache_bytes, ARROW_SLICE_ROWS)
        wal.on_cached = self.preconverter.add
        metrics.watch_wal(self.wal_sample)

    # -- opening and replay ------------------------------------------------------

    async def open_log(self, wal: WriteAheadLog | None = None) -> None:
        """Open and recover the log from the table's position, and commit its backlog (replay)."""
        wal = wal or self.wal
        c = self._committer
        position = await c.read(
            c.table.committed_version, wal_app_id(c.app_id), what="read the log position"
        )
        recovery = await wal.open(position or 0)
        commits, started = c.commits, trio.current_time()
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
                commits=c.commits - commits, position=wal.committed,
                seconds=round(trio.current_time() - started, 3),
            )  # fmt: skip

    # -- the front -----------------------------------------------------------------

    def _logged_duplicate(self, key: DedupeKey) -> LoggedTicket | None:
        """A ticket for a resend whose batch id is stored, durable or in flight; else None."""
        wal = self.wal
        if self._committer.stored.contains(batch_digest(key), trio.current_time()):
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

    async def submit(self, block: RowBlock, nbytes: int) -> LoggedTicket:
        """Dedupe, then take room in the log and queue the block's record (a checked block)."""
        if block.rows == 0:
            return LoggedTicket(None)
        key = dedupe_key(block)
        if key is not None:
            while (claim := self._claims.get(key)) is not None:
                # The first copy is waiting for room in the log: see where it went.
                await claim.wait()
            duplicate = self._logged_duplicate(key)
            if duplicate is not None:
                return duplicate
        if self._input_closed:
            raise trio.ClosedResourceError("the writer takes no more blocks")
        claimed = trio.Event()
        if key is not None:
            self._claims[key] = claimed
        try:
            append = await self.wal.begin_block(block)
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

    async def close_input(self) -> None:
        """Accept no more blocks; :meth:`run` commits what is logged and returns."""
        self._input_closed = True
        await self.wal.close()

    async def run(self) -> None:
        """Run the log's flusher, and commit from it until it is closed and all committed."""
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self.preconverter.run)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.wal.run)
                    nursery.start_soon(self._commit_log_loop, self.wal)
                outer.cancel_scope.cancel()
        finally:
            self.wal.close_files()

    def wal_sample(self) -> WalSample | None:
        """The log's figures for the metrics (None while it is not open)."""
        wal = self.wal
        if not wal.is_open:
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
            records_lost=stats.records_lost, committed=wal.committed,
            oldest_cached=wal.oldest_cached,
        )  # fmt: skip

    # -- the committer ---------------------------------------------------------------

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
        """Commit the next group of records from the log's committed position on.

        A group is up to ``commit_max_bytes`` of records in log order (and at
        most MAX_COMMIT_BATCH_IDS batch ids). Those still in the log's cache
        (appended by this process: their blocks were checked before they were
        logged) are taken from memory, with no read or decode; the others are
        read back from the files and decoded. The cache is one contiguous run
        (appliance/wal/log.py), so a group has at most three parts: records
        read back, the cached run, records read back.
        """
        end = wal.durable_end
        position = wal.committed
        room = self.settings.commit_max_bytes
        kept: list[Frame] = []
        blocks: list[RowBlock] = []
        failed: list[tuple[Frame, str]] = []
        ids_full = False
        while room > 0 and position < end and not ids_full:
            cached = wal.read_cached(position, room)
            if cached is not None:
                frames = [frame for frame, _ in cached]
                taken = _within_id_limit([*kept, *(f for f, _ in failed), *frames])
                taken -= len(kept) + len(failed)
                ids_full = taken < len(frames)
                if taken <= 0:
                    break
                self.cached_reads += 1
                kept += frames[:taken]
                blocks += [block for _, block in cached[:taken]]
                read_end = frames[taken - 1].end
            else:
                # Not cached here: read back up to the first cached record after
                # this position (the cached run after a gap joins the group).
                limit = room
                oldest = wal.oldest_cached
                if oldest is not None and oldest[0] > position:
                    limit = min(limit, oldest[0] - position)
                frames = await wal.read(position, limit)
                taken = _within_id_limit([*kept, *(f for f, _ in failed), *frames])
                taken -= len(kept) + len(failed)
                ids_full = taken < len(frames)
                if taken <= 0:
                    break
                self.file_reads += 1
                frames = frames[:taken]
                more_blocks, more_kept, more_failed = await trio.to_thread.run_sync(
                    _decode_frames, frames
                )
                blocks += more_blocks
                kept += more_kept
                failed += more_failed
                read_end = frames[-1].end
            room -= read_end - position
            position = read_end
        if position > wal.committed:
            await self._commit_frames(wal, position, kept, blocks, failed)
            return
        # Only unreadable bytes (logged as lost at recovery) lie before the end.
        # The table records the position first, so a restart does not find
        # them again and report them lost twice.
        log.warning("wal.skipped", start=wal.committed, end=end)
        await self._committer.commit_group([], end)
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
        group = blocks
        if blocks and self._replaying:
            blocks, kept = await self._without_stored_before(blocks, kept)
        stored = await self._committer.store(
            blocks, [frame.end for frame in kept], end, converted=self.preconverter.lookup(blocks)
        )
        self.preconverter.forget(group)
        committed: list[RowBlock] = []
        for i, (block, frame) in enumerate(zip(blocks, kept, strict=True)):
            if i in stored.refused:
                self._lose(
                    frame, stored.refused[i].reason, protocol=block.protocol, peer=block.peer
                )
            elif i in stored.elsewhere:
                self._skipped(block, "stored by another writer meanwhile")
            else:
                committed.append(block)
        await wal.mark_committed(end)
        for listener in self._listeners:
            listener(committed)

    def _skipped(self, block: RowBlock, reason: str) -> None:
        self.skipped_duplicates += 1
        log.info(
            "wal.duplicate_skipped", batch=block.batch_id, protocol=block.protocol,
            peer=block.peer, reason=reason,
        )  # fmt: skip

    async def _without_stored_before(
        self, blocks: list[RowBlock], frames: list[Frame]
    ) -> tuple[list[RowBlock], list[Frame]]:
        """At replay: ``blocks`` (and frames) less those whose batch the table's data holds.

        A node that logged a chunk and died before its ack was sent leaves the
        client to resend it, perhaps to another node, which stores it. That
        may lie further back than the batches this node learnt at start (the
        dedupe window), so the replay also reads the table's batch ids from
        this node's receive time on. A one-time cost at start; the commits
        themselves are checked by the protocol.
        """
        keys = [dedupe_key(block) for block in blocks]
        wanted = [key for key in keys if key is not None]
        if not wanted:
            return blocks, frames
        since = min(block.received_at_ns for block in blocks) - CLOCK_SKEW_NS
        c = self._committer
        present = await c.read(
            c.table.batch_keys_present, wanted, since, what="read batch ids at replay"
        )
        if not present:
            return blocks, frames
        now = trio.current_time()
        kept_blocks: list[RowBlock] = []
        kept_frames: list[Frame] = []
        for block, frame, key in zip(blocks, frames, keys, strict=True):
            if key is not None and key in present:
                c.stored.add(batch_digest(key), now)
                self._skipped(block, "already in the table (stored by another writer)")
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
