"""The write-ahead log for trio tasks: group commit, adaptive flush delay, cap, committed position.

Tasks and bounds::

    append() x N --(reserve room under max_bytes / max_keys: wait, or WalFull)-->
        pending list --flusher task: gather (adaptive delay) --> worker thread:
        pwrite + fdatasync of the group (SegmentStore.write_group) --> each append returns its LSN

An append returns only once its record is durable. The flusher writes one
group at a time; while it runs, new appends gather for the next group, so
under load a group is whatever arrived during one fdatasync. The delay
adapts (docs/wal.md, "Group commit"): a group is written at once when the
log was idle (nothing appended within one delay of the last flush) or when
``flush_bytes`` are pending; otherwise the flusher waits, at most
``flush_delay_seconds`` after the group's first append, for as many records
as the last group had.

A caller cancelled while it waits gets no LSN and must not ack: its record
may still become durable and be committed (at-least-once; a resend with the
same batch id is deduplicated by the writer). An append that fails
(:class:`~appliance.wal.errors.WalWriteError`: disk full, I/O error) fails
with every other record of its group; the log stays valid and later appends
try again.

The writer owns the committed position: it commits what :meth:`read`
returns to the table, records the last record's ``end`` in the commit's app
transaction, then calls :meth:`mark_committed`, which deletes the segments
wholly before it (and replaces a large, wholly committed active segment by
an empty one) and frees room under the cap.

Acknowledged records that recovery found lost to damage when the log opened
are counted in ``stats.records_lost`` (the metric
``appliance_wal_records_lost_total``); each loss is also an error line
(appliance/wal/segments.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from appliance.blocks.block import RowBlock
from appliance.blocks.identity import BatchDigest, DedupeKey, batch_digest, dedupe_key
from appliance.logs import get_logger
from appliance.wal.blocks import encode_block
from appliance.wal.errors import RecordTooLarge, WalClosed, WalError, WalFull, WalWriteError
from appliance.wal.frame import KIND_ROW_BLOCK, Frame, encode_key
from appliance.wal.segments import Entry, Recovery, SegmentInfo, SegmentStore, Written
from appliance.wal.settings import WalSettings

__all__ = ["PendingAppend", "WalStats", "WriteAheadLog", "open_wal"]

log = get_logger("wal")


@dataclass(slots=True, eq=False)
class PendingAppend:
    """One record on its way to durability: :meth:`wait` returns its LSN once it is durable.

    From :meth:`WriteAheadLog.begin`. Any number of tasks may wait on it (a
    resend of the same batch waits on the first copy's append).
    """

    entry: Entry
    key: DedupeKey | None
    #: The block the record encodes (from :meth:`WriteAheadLog.begin_block`), kept in
    #: the log's cache once durable so the writer need not read and decode it back.
    block: RowBlock | None = None
    done: trio.Event = field(default_factory=trio.Event)
    lsn: int | None = None
    error: WalError | None = None

    @property
    def size(self) -> int:
        """Bytes the record takes in the log."""
        return self.entry.size

    async def wait(self) -> int:
        """Wait until the record is durable; returns its LSN.

        Raises:
            WalWriteError: the write or its fdatasync failed (disk full, I/O error).
            WalClosed: the log stopped before the record was written.
        """
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.lsn is not None
        return self.lsn


class _Signal:
    """Wakes every task waiting on it; a waiter re-checks its condition after each wake."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def wake(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


#: What a cached record costs beyond its block's ``nbytes``: the frame without
#: its body (80 bytes), the (frame, block) tuple (56), the frame's integers
#: and the deque's slot (sys.getsizeof, rounded up).
_CACHE_ENTRY_BYTES = 256


@dataclass(slots=True)
class WalStats:
    """Counters of one log since it opened (for logs, tests and benchmarks)."""

    appends: int = 0
    #: Groups written, each with one fdatasync.
    groups: int = 0
    bytes_written: int = 0
    failed_groups: int = 0
    #: Appends that waited for room under the cap, and those that gave up (WalFull).
    cap_waits: int = 0
    cap_refusals: int = 0
    #: Records in the last group written.
    last_group: int = 0
    #: Seconds from the first append of each group to its durability, summed (and the groups).
    group_wait_seconds: float = 0.0
    #: Acknowledged records lost to damage that recovery found at open (torn or damaged
    #: segments beyond what a crash during a write explains): at least this many.
    records_lost: int = 0


class WriteAheadLog:
    """One node's write-ahead log in ``directory`` (``<state_dir>/wal``).

    Use :func:`open_wal`, or :meth:`open`, then :meth:`run` in a nursery and
    :meth:`close` at shutdown.
    """

    def __init__(self, directory: Path, settings: WalSettings | None = None) -> None:
        self.directory = directory
        self.settings = settings or WalSettings()
        self._store: SegmentStore | None = None
        #: Writes and deletions, one at a time; reads have their own thread.
        self._io_limiter = trio.CapacityLimiter(1)
        self._read_limiter = trio.CapacityLimiter(1)
        self._pending: deque[PendingAppend] = deque()
        self._pending_bytes = 0
        self._pending_since = 0.0
        #: Bytes of records appended but not yet written (pending or being written).
        self._reserved = 0
        self._reserved_keys = 0
        #: Wakes the flusher (an append arrived, or close), waiters for room
        #: under the cap, for new durable records, for a new committed position.
        self._work = _Signal()
        self._space = _Signal()
        self._durable = _Signal()
        self._committed_signal = _Signal()
        self._closing = False
        self._stopped = False
        self._last_group = 0
        self._last_flush_end = -float("inf")
        self._committed = 0
        self._durable_end = 0
        #: Batches of durable, uncommitted records, by the 16-byte digest of their
        #: dedupe key (about 150 bytes an entry, whatever the id's length): digest
        #: -> LSN, and (LSN, digest) in log order.
        self._keys: dict[BatchDigest, int] = {}
        self._key_order: deque[tuple[int, BatchDigest]] = deque()
        #: Batches of records appended but not yet durable: digest -> its append.
        self._in_flight: dict[BatchDigest, PendingAppend] = {}
        #: Durable, uncommitted records appended by this process, with the blocks
        #: they encode, in log order: what :meth:`read_cached` serves without a
        #: read or a decode. At most ``settings.cache_bytes``, counting each
        #: record's block and entry (:func:`_cache_cost`): a record that does not
        #: fit is not kept (the oldest stay: the next commit's), so the cache
        #: may have gaps, which are read from the files. The frames are kept
        #: without their bodies.
        self._cache: deque[tuple[Frame, RowBlock]] = deque()
        self._cache_bytes = 0
        #: A record was left out of a non-empty cache: keep no more until it empties.
        self._cache_closed = False
        #: Called with each block the cache keeps, in log order, as it keeps it
        #: (the writer converts those to Arrow ahead of their commit).
        self.on_cached: Callable[[RowBlock], None] | None = None
        #: Appends waiting for room under the cap now (the log is at its cap while > 0).
        self._cap_waiters = 0
        #: Why the last group failed, until a group succeeds again (None: writing works),
        #: and when (trio's clock).
        self.failing: str | None = None
        self.failed_at: float | None = None
        self.stats = WalStats()

    @property
    def _segments(self) -> SegmentStore:
        if self._store is None:
            raise WalClosed("the write-ahead log is not open")
        return self._store

    # -- life cycle ----------------------------------------------------------

    async def open(self, committed: int) -> Recovery:
        """Open and recover the log (in a worker thread); ``committed`` is the table's position.

        Returns:
            What recovery found: the committed position used (a record
            boundary), the durable end, the uncommitted keys, what was
            truncated or lost.

        Raises:
            OSError: the directory cannot be created or read.
        """
        settings = self.settings
        store, recovery = await trio.to_thread.run_sync(
            partial(
                SegmentStore.open, self.directory, committed, settings.segment_bytes,
                group_max_bytes=settings.group_max_bytes,
                max_record_bytes=settings.max_record_bytes,
            ),
            limiter=self._io_limiter,
        )  # fmt: skip
        self._store = store
        self.stats.records_lost += recovery.records_lost
        self._committed = recovery.committed
        self._durable_end = recovery.durable_end
        for lsn, key in recovery.keys:
            digest = batch_digest(key)
            self._keys[digest] = lsn
            self._key_order.append((lsn, digest))
        return recovery

    async def run(self) -> None:
        """The flusher: write groups until :meth:`close` and the last pending append are done."""
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    await self._work.wait()
                    continue
                await self._gather()
                await self._flush()
        finally:
            self._stopped = True
            self._fail_pending(WalClosed("the write-ahead log stopped"))
            self._wake_all()

    async def close(self) -> None:
        """Take no more appends; :meth:`run` writes what is pending and returns."""
        self._closing = True
        self._work.wake()
        self._wake_all()
        await trio.lowlevel.checkpoint()

    def close_files(self) -> None:
        """Close the active segment's file (after :meth:`run` returned)."""
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- appending -----------------------------------------------------------

    async def append(
        self,
        body: bytes,
        *,
        key: DedupeKey | None = None,
        rows: int = 0,
        kind: int = KIND_ROW_BLOCK,
    ) -> int:
        """Append one record and wait until it is durable; returns its LSN.

        Args:
            body: the record's body (for a block: :func:`~appliance.wal.blocks.encode_block`).
            key: the batch's dedupe key, if it has one (reported by
                :meth:`uncommitted_lsn` until committed).
            rows: rows the body holds (kept in the header).
            kind: the record kind.

        Raises:
            RecordTooLarge: the record is over ``max_record_bytes``.
            WalFull: no room under ``max_bytes`` / ``max_keys`` within ``full_wait_seconds``.
            WalWriteError: the write or its fdatasync failed (disk full, I/O error).
            WalClosed: the log is closed or stopped before the record was durable.
        """
        pending = await self.begin(body, key=key, rows=rows, kind=kind)
        # Cancelled here: no LSN, no ack; the record may still be written.
        return await pending.wait()

    async def begin(
        self,
        body: bytes,
        *,
        key: DedupeKey | None = None,
        rows: int = 0,
        kind: int = KIND_ROW_BLOCK,
    ) -> PendingAppend:
        """Take room for one record and queue it for the next group; do not wait for it.

        The first half of :meth:`append`: it waits only for room under the
        cap (backpressure), then the record is the flusher's, whether or not
        the caller waits on the returned :class:`PendingAppend`. Until it is
        durable, :meth:`in_flight` finds it by ``key``.

        Raises:
            RecordTooLarge: the record is over ``max_record_bytes``.
            WalFull: no room under ``max_bytes`` / ``max_keys`` within ``full_wait_seconds``.
            WalClosed: the log is closed or stopped.
        """
        return await self._begin(Entry(kind, encode_key(key), rows, body), key, None)

    async def _begin(
        self, entry: Entry, key: DedupeKey | None, block: RowBlock | None
    ) -> PendingAppend:
        if self._closing or self._stopped:
            raise WalClosed("the write-ahead log is closed")
        if entry.size > self.settings.max_record_bytes:
            raise RecordTooLarge(
                f"a record of {entry.size} bytes is over the limit of "
                f"{self.settings.max_record_bytes}"
            )
        await self._reserve(entry.size, keyed=key is not None)
        if self._stopped:
            # The flusher ended while this append waited for room: nobody would write it.
            self._reserved -= entry.size
            self._reserved_keys -= key is not None
            raise WalClosed("the write-ahead log is closed")
        item = PendingAppend(entry, key, block)
        if not self._pending:
            self._pending_since = trio.current_time()
        self._pending.append(item)
        self._pending_bytes += item.size
        if key is not None:
            self._in_flight[batch_digest(key)] = item
        self.stats.appends += 1
        self._work.wake()
        return item

    async def append_block(self, block: RowBlock) -> int:
        """Append a checked RowBlock (encoded on the calling task) and wait until it is durable.

        Raises: as :meth:`append`.
        """
        return await self.append(encode_block(block), key=dedupe_key(block), rows=block.rows)

    async def begin_block(self, block: RowBlock) -> PendingAppend:
        """:meth:`begin` for a checked RowBlock (encoded on the calling task).

        Once durable, the record and ``block`` stay in the log's cache for
        :meth:`read_cached` (within ``cache_bytes``): the block must not be
        changed after this call.

        Raises: as :meth:`begin`.
        """
        key = dedupe_key(block)
        entry = Entry(KIND_ROW_BLOCK, encode_key(key), block.rows, encode_block(block))
        return await self._begin(entry, key, block)

    def _has_room(self, size: int, keyed: bool) -> bool:
        used = self._segments.total_bytes + self._reserved
        if used + size > self.settings.max_bytes:
            return False
        return not keyed or len(self._key_order) + self._reserved_keys < self.settings.max_keys

    async def _reserve(self, size: int, keyed: bool) -> None:
        if not self._has_room(size, keyed):
            self.stats.cap_waits += 1
            log.debug("wal.cap_wait", bytes=size, used=self._segments.total_bytes)
            self._cap_waiters += 1
            try:
                with trio.move_on_after(self.settings.full_wait_seconds):
                    while not self._has_room(size, keyed):
                        if self._closing or self._stopped:
                            raise WalClosed("the write-ahead log is closed")
                        await self._space.wait()
            finally:
                self._cap_waiters -= 1
            if not self._has_room(size, keyed):
                self.stats.cap_refusals += 1
                raise WalFull(
                    f"the write-ahead log is at its cap ({self.settings.max_bytes} bytes, "
                    f"{self.settings.max_keys} keys) and the table did not catch up within "
                    f"{self.settings.full_wait_seconds:g}s"
                )
        self._reserved += size
        self._reserved_keys += keyed

    # -- the flusher ---------------------------------------------------------

    def _expected_group(self) -> int:
        """Records worth waiting for: the last group's size while appends keep coming, else 1."""
        if self._pending_since - self._last_flush_end <= self.settings.flush_delay_seconds:
            return max(1, self._last_group)
        return 1

    def _group_ready(self, expected: int) -> bool:
        return (
            self._closing
            or len(self._pending) >= expected
            or self._pending_bytes >= self.settings.flush_bytes
        )

    async def _gather(self) -> None:
        """Wait, at most the flush delay after the first pending append, for the group to fill."""
        expected = self._expected_group()
        deadline = self._pending_since + self.settings.flush_delay_seconds
        while not self._group_ready(expected) and trio.current_time() < deadline:
            with trio.move_on_at(deadline):
                await self._work.wait()

    def _take_group(self) -> list[PendingAppend]:
        group: list[PendingAppend] = []
        nbytes = 0
        limit = self.settings.group_max_bytes
        while self._pending and (not group or nbytes + self._pending[0].size <= limit):
            item = self._pending.popleft()
            group.append(item)
            nbytes += item.size
        self._pending_bytes -= nbytes
        return group

    def _put_back(self, items: list[PendingAppend]) -> None:
        """Return items not written to the front of the pending list, in order."""
        if not items:
            return
        if not self._pending:
            self._pending_since = trio.current_time()
        self._pending.extendleft(reversed(items))
        self._pending_bytes += sum(item.size for item in items)

    async def _flush(self) -> None:
        started = self._pending_since
        group = self._take_group()
        written: Written | None = None
        failed = False
        try:
            written = await trio.to_thread.run_sync(
                self._segments.write_group, [item.entry for item in group],
                limiter=self._io_limiter,
            )  # fmt: skip
        except WalWriteError as exc:
            failed = True
            self._fail(group, exc)
        finally:
            if written is None and not failed:
                # Cancelled before the thread started: nothing was written.
                self._put_back(group)
        if written is None:
            return
        count = len(written.lsns)
        for item, lsn in zip(group, written.lsns, strict=False):
            item.lsn = lsn
            self._cache_record(item, lsn)
            if item.key is not None:
                digest = batch_digest(item.key)
                self._keys[digest] = lsn
                self._key_order.append((lsn, digest))
                self._reserved_keys -= 1
                self._forget_in_flight(item)
            self._reserved -= item.size
            self.stats.bytes_written += item.size
            item.done.set()
        self._put_back(group[count:])
        self._durable_end = written.end
        self._last_group = count
        now = trio.current_time()
        self._last_flush_end = now
        self.failing = None
        self.stats.groups += 1
        self.stats.last_group = count
        self.stats.group_wait_seconds += now - started
        self._durable.wake()

    def _cache_record(self, item: PendingAppend, lsn: int) -> None:
        """Keep a durable record and its block for :meth:`read_cached`, within ``cache_bytes``.

        The cache is one contiguous run of uncommitted records. Once a record
        is left out (it does not fit, or has no block), no later one is kept
        until the commits have emptied the cache: the records already cached
        stay, as they are the oldest uncommitted ones, what the next commit
        reads first, and the cache never has a gap inside it (a gap would cut
        every commit group there). Evicting the oldest instead made an
        overflow last: once a slow commit (the first one loads pyarrow) let
        the backlog pass the cache, every later group had left it before its
        commit and was read back and decoded, which slowed the commits and
        kept the backlog past the cache for as long as the load lasted
        (docs/wal.md, "The cache"). What was left out is read from the files
        once, in the same group as the cached run after it.
        """
        if self._cache_closed:
            return
        cost = 0 if item.block is None else _cache_cost(item.block)
        if item.block is None or self._cache_bytes + cost > self.settings.cache_bytes:
            # Reopened once the commits have emptied the cache (mark_committed).
            self._cache_closed = bool(self._cache)
            return
        if self._cache and self._cache[-1][0].end != lsn:
            # Not contiguous (appends are cached in log order, so not expected):
            # never a gap inside the cache.
            self._cache_closed = True
            return
        # Without its body: the block stands for it, and the writer never
        # reads a cached frame's body (so the cache holds blocks, not bytes twice).
        entry = item.entry
        frame = Frame(lsn, entry.size, entry.kind, entry.rows, item.key, b"")
        self._cache.append((frame, item.block))
        self._cache_bytes += cost
        if self.on_cached is not None:
            self.on_cached(item.block)

    def _forget_in_flight(self, item: PendingAppend) -> None:
        if item.key is None:
            return
        digest = batch_digest(item.key)
        if self._in_flight.get(digest) is item:
            del self._in_flight[digest]

    def _fail(self, group: list[PendingAppend], error: WalWriteError) -> None:
        self.stats.failed_groups += 1
        self.failing = error.reason
        self.failed_at = trio.current_time()
        log.error(
            "wal.append_failed", records=len(group), bytes=sum(i.size for i in group),
            reason=error.reason, errno=error.errno, disk_full=error.disk_full,
        )  # fmt: skip
        for item in group:
            self._release(item, error)
        self._space.wake()

    def _release(self, item: PendingAppend, error: WalError) -> None:
        self._reserved -= item.size
        self._reserved_keys -= item.key is not None
        self._forget_in_flight(item)
        item.error = error
        item.done.set()

    def _fail_pending(self, error: WalError) -> None:
        while self._pending:
            self._release(self._pending.popleft(), error)
        self._pending_bytes = 0

    def _wake_all(self) -> None:
        self._space.wake()
        self._durable.wake()
        self._committed_signal.wake()

    # -- the committed position ---------------------------------------------

    @property
    def committed(self) -> int:
        """Position up to which the table holds the log: replay starts here."""
        return self._committed

    @property
    def durable_end(self) -> int:
        """Position just past the last durable record."""
        return self._durable_end

    @property
    def uncommitted_bytes(self) -> int:
        """Bytes of durable records not yet committed to the table."""
        return self._durable_end - self._committed

    @property
    def cache_bytes(self) -> int:
        """What the cache holds, counted as ``cache_bytes`` counts it (:func:`_cache_cost`)."""
        return self._cache_bytes

    @property
    def caching(self) -> bool:
        """Whether the cache keeps records now: it is on, not closed, and has room.

        False from a record it left out (it did not fit) until the commits
        have emptied it; a record appended now is then read back from the
        files at its commit (the writer converts nothing ahead for it).
        """
        limit = self.settings.cache_bytes
        return limit > 0 and not self._cache_closed and self._cache_bytes < limit

    @property
    def oldest_cached(self) -> tuple[int, int] | None:
        """``(LSN, receive time in Unix ns)`` of the oldest record in the cache; None if empty.

        The cache holds only uncommitted records: when the LSN is
        :attr:`committed`, this is the oldest uncommitted record (the metric
        ``appliance_wal_oldest_uncommitted_age_seconds``); else older ones
        were not cached (appended by an earlier run, without their block, or
        while the cache was full).
        """
        if not self._cache:
            return None
        frame, block = self._cache[0]
        return frame.lsn, block.received_at_ns

    @property
    def cache_half_full(self) -> bool:
        """Whether the cache holds half its bytes (all of them uncommitted records).

        The committer commits then, before ``commit_interval_seconds`` or
        ``commit_max_bytes`` would have it: the records logged while that
        commit runs need the other half, so the next group is still served
        from memory. Without this, at full load the oldest uncommitted
        records left the cache before their commit, and every group was
        read back and decoded (docs/wal.md, "The cache"). Always false with
        the cache off. The writer acts on it only past its floor (an eighth
        of ``commit_max_bytes`` waiting, appliance/lake/writer.py).
        """
        limit = self.settings.cache_bytes
        return limit > 0 and self._cache_bytes * 2 >= limit

    @property
    def total_bytes(self) -> int:
        """Bytes of the log's segment files (what the cap counts, with pending appends)."""
        return self._segments.total_bytes

    def segments(self) -> list[SegmentInfo]:
        """The segment files, oldest first."""
        return self._segments.segments()

    @property
    def segment_bytes(self) -> int:
        """The segment size in use: ``settings.segment_bytes``, lowered on a small volume."""
        return self._segments.segment_bytes

    async def mark_committed(self, position: int) -> None:
        """Record that the table holds every record before ``position`` (a record's ``end``).

        Deletes the segments wholly before it and frees their room under the
        cap; the active segment, when wholly committed and of
        ``COMMITTED_SEGMENT_REPLACE_BYTES`` or more, is replaced by an empty
        one at the same position. A position at or before the current one is
        ignored.

        Raises:
            ValueError: ``position`` is past the durable end.
        """
        if position > self._durable_end:
            raise ValueError(f"position {position} is past the durable end {self._durable_end}")
        if position <= self._committed:
            return
        self._committed = position
        while self._cache and self._cache[0][0].lsn < position:
            _, old_block = self._cache.popleft()
            self._cache_bytes -= _cache_cost(old_block)
        if not self._cache:
            self._cache_closed = False
        while self._key_order and self._key_order[0][0] < position:
            lsn, key = self._key_order.popleft()
            if self._keys.get(key) == lsn:
                del self._keys[key]
        self._committed_signal.wake()
        await trio.to_thread.run_sync(
            self._segments.delete_committed, position, limiter=self._io_limiter
        )
        self._space.wake()

    def uncommitted_lsn(self, key: DedupeKey) -> int | None:
        """The LSN of a durable, uncommitted record with dedupe key ``key``, if there is one."""
        return self._keys.get(batch_digest(key))

    def in_flight(self, key: DedupeKey) -> PendingAppend | None:
        """The append of a record with dedupe key ``key`` that is not yet durable, if any."""
        return self._in_flight.get(batch_digest(key))

    @property
    def at_cap(self) -> bool:
        """True while an append waits for room under ``max_bytes`` / ``max_keys``."""
        return self._cap_waiters > 0

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close_files`."""
        return self._store is not None

    @property
    def stopped(self) -> bool:
        """True once the flusher has ended (closed or cancelled): nothing more is written."""
        return self._stopped

    @property
    def pending_bytes(self) -> int:
        """Bytes of records taken but not yet durable (queued or being written)."""
        return self._reserved

    def uncommitted_digests(self) -> frozenset[BatchDigest]:
        """Digests of the batches of durable records not yet committed (from headers)."""
        return frozenset(self._keys)

    # -- waiting and reading -------------------------------------------------

    async def _wait_for(self, done: Callable[[], bool], signal: _Signal, what: str) -> None:
        while not done():
            if self._stopped:
                raise WalClosed(f"the write-ahead log stopped before {what}")
            await signal.wait()

    async def wait_durable(self, after: int) -> None:
        """Wait until a durable record ends past position ``after`` (new records to read).

        Raises:
            WalClosed: the log stopped first.
        """
        await self._wait_for(lambda: self._durable_end > after, self._durable, "new records")

    async def wait_committed(self, lsn: int) -> None:
        """Wait until the record at ``lsn`` is committed to the table (``ack = "commit"``).

        Raises:
            WalClosed: the log stopped first.
        """
        await self._wait_for(lambda: self._committed > lsn, self._committed_signal, "the commit")

    def read_cached(self, after: int, max_bytes: int) -> list[tuple[Frame, RowBlock]] | None:
        """What :meth:`read` would return, with each record's block, from memory; else None.

        Served when the record at ``after`` is in the cache (this process
        appended it while the cache had room): no read, no CRC, no decode.
        The same records as :meth:`read`: from ``after`` to the one that
        reaches ``max_bytes``, or to the last before a record the cache did
        not keep; their frames come without their bodies (``body`` is
        empty: the block is what the body encodes). None: read them with
        :meth:`read` and decode them.
        """
        if not self._cache or self._cache[0][0].lsn > after or after >= self._durable_end:
            return None
        out: list[tuple[Frame, RowBlock]] = []
        nbytes = 0
        for frame, block in self._cache:
            if frame.lsn < after:
                continue
            if not out and frame.lsn != after:
                return None  # not a record boundary of the cache: let read() say why
            if out and frame.lsn != out[-1][0].end:
                break  # a record the cache did not keep: read() takes it next
            out.append((frame, block))
            nbytes += frame.size
            if nbytes >= max_bytes:
                break  # as read(): the record that reaches max_bytes is the last
        return out or None

    async def read(self, after: int, max_bytes: int) -> list[Frame]:
        """Durable records from the boundary ``after`` on (worker thread), about ``max_bytes``.

        At least one record when there is one. The writer reads from its
        committed position, commits, and calls :meth:`mark_committed` with
        the last record's ``end``.

        Raises:
            ValueError: ``after`` is past the durable end or not a record boundary.
            WalCorrupt: bytes recovery verified no longer verify.
        """
        return await trio.to_thread.run_sync(
            self._segments.read, after, max_bytes, self._durable_end, limiter=self._read_limiter
        )


def _cache_cost(block: RowBlock) -> int:
    """What one cached record counts against ``cache_bytes``: its block, and the entry.

    ``block.nbytes`` is the block's own estimate of its memory (its strings
    plus a per-row overhead, appliance/blocks/block.py), so small records,
    whose Python objects outweigh their bytes, count for what they hold.
    The record's encoded body is not kept (the frame is cached without it).
    """
    return block.nbytes + _CACHE_ENTRY_BYTES


@asynccontextmanager
async def open_wal(
    directory: Path, committed: int, settings: WalSettings | None = None
) -> AsyncIterator[WriteAheadLog]:
    """Open and recover the log, run its flusher, and on exit write what is pending and close.

    Args:
        directory: the log's directory (``<state_dir>/wal``).
        committed: the position the table's app transaction records (0 for a new table).
        settings: limits and timings.
    """
    wal = WriteAheadLog(directory, settings)
    await wal.open(committed)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wal.run)
            try:
                yield wal
            finally:
                await wal.close()
    finally:
        wal.close_files()
