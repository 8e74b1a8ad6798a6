"""Arrow tables of logged blocks, converted while they arrive instead of at their commit.

A commit of the write-ahead log's cached records converts about 246,000
rows to Arrow (:func:`~appliance.lake.committer.to_arrow`). That conversion
builds its columns from Python lists and holds the GIL for all of it: about
a tenth of a second in one burst per commit, while the event loop (TLS
reads, acks) waits for the GIL; with ``workers = 2`` that burst was most of
the p99 (docs/performance.md, "The p99 with two workers: the commits").

:class:`Preconverter` converts the blocks as the write-ahead log's cache
keeps them (``WriteAheadLog.on_cached``, in log order): once the blocks not yet converted reach
:data:`~appliance.lake.committer.ARROW_SLICE_ROWS` rows, one worker thread
converts that run (:data:`PRECONVERT_JOBS` at a time) and keeps the table
with the very block objects it covers (:class:`ConvertedRun`). At the
commit, ``to_arrow`` takes a run's rows wherever the group holds those same
objects in the same order, and converts the rest as before; a group read
back from the log's files holds new objects and matches nothing. Nothing
but speed depends on a run matching: the table is the same either way
(tests/appliance/lake/test_preconvert.py holds it to the commit's own
conversion).

Memory: the limit (``max_bytes``; the writer gives twice ``[wal]
cache_bytes``) counts the tables and every block held, each as the log's
cache counts it plus our index entries (:func:`block_cost`). A block that
does not fit is not held; tables of runs queued or converting then (at most
:data:`PRECONVERT_QUEUED_RUNS` and the one converting) still land, so what
is counted stays within ``max_bytes`` and those runs' tables. Only the
blocks the cache keeps are added, so the blocks held are the cache's own
objects, and every one of them is committed from memory, as an object
:meth:`Preconverter.forget` knows (a block the cache leaves out is read back
at its commit as another object, which would never be released by
identity). A block stays counted while anything here refers to it: a run
whose first blocks are committed keeps them, and their bytes, until the
whole run goes. With the cache off nothing is converted ahead.

Work: :meth:`Preconverter.add` and a run's landing index each block once
(id -> sequence number, id -> (run, index)); a commit looks up its own
blocks only (:meth:`Preconverter.lookup`), and :meth:`Preconverter.forget`
drops, from the front of the log order, what the group's last held block
covers: per block of the group and per block dropped, never per block held.
Queued runs are cut by ``forget`` too, and a run whose blocks were all
committed while it converted is dropped as it lands.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from appliance.blocks.block import RowBlock
from appliance.lake.arrow import blocks_to_arrow, data_errors
from appliance.logs import get_logger

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "PRECONVERT_BLOCK_BYTES",
    "PRECONVERT_JOBS",
    "PRECONVERT_QUEUED_RUNS",
    "Converted",
    "ConvertedRun",
    "Preconverter",
    "block_cost",
]

log = get_logger("lake")

#: Conversions ahead of the commit running at once: one worker thread, so
#: they spread over time instead of joining the commit's burst.
PRECONVERT_JOBS: Final = 1

#: Full runs waiting for that thread, at most: one more is dropped (the
#: thread is behind, and the commit converts those blocks itself).
PRECONVERT_QUEUED_RUNS: Final = 2


@dataclass(frozen=True, slots=True)
class ConvertedRun:
    """The Arrow table of ``blocks`` (these objects, in this order), as the commit converts them."""

    blocks: tuple[RowBlock, ...]
    #: Where each block's rows start in ``table``, and the end: ``len(blocks) + 1`` offsets.
    offsets: tuple[int, ...]
    table: pa.Table
    #: What the table holds in memory (its buffers), counted against the limit.
    nbytes: int

    def rows(self, first: int, stop: int) -> pa.Table:
        """The rows of ``blocks[first:stop]`` (zero-copy)."""
        start = self.offsets[first]
        return self.table.slice(start, self.offsets[stop] - start)


#: Where a block's rows are converted: its run, and its index in ``run.blocks``.
Converted = Mapping[int, tuple[ConvertedRun, int]]

#: What holding one block costs beyond its ``nbytes``: its entries in the
#: id -> sequence and id -> (run, index) maps (two dict slots, the id and
#: sequence integers, the pair), and its slot in a run's tuple
#: (sys.getsizeof, rounded up).
PRECONVERT_BLOCK_BYTES: Final = 256


def block_cost(block: RowBlock) -> int:
    """What holding ``block`` counts: its ``nbytes`` (as the log's cache counts it), our entries."""
    return block.nbytes + PRECONVERT_BLOCK_BYTES


def _cost(blocks: Sequence[RowBlock]) -> int:
    """What holding ``blocks`` counts (:func:`block_cost` of each)."""
    return sum(map(block_cost, blocks))


def _convert(blocks: tuple[RowBlock, ...]) -> ConvertedRun:
    """Convert ``blocks`` (worker thread)."""
    table = blocks_to_arrow(blocks)
    offsets = (0, *itertools.accumulate(block.rows for block in blocks))
    return ConvertedRun(blocks, offsets, table, table.get_total_buffer_size())


@dataclass(slots=True, eq=False)
class _Span:
    """Consecutive added blocks on their way to a table, or with it (``run``)."""

    #: The sequence number of ``blocks[0]`` (:meth:`Preconverter.add` numbers blocks 0, 1, ...).
    first: int
    blocks: tuple[RowBlock, ...]
    #: What ``blocks`` count (:func:`block_cost`): counted until the span goes,
    #: as it (and its run) refers to every one of them until then.
    cost: int
    #: ``blocks[:start]`` are forgotten (committed): no longer looked up.
    start: int = 0
    run: ConvertedRun | None = None

    @property
    def last(self) -> int:
        """The sequence number of the last block."""
        return self.first + len(self.blocks) - 1


class Preconverter:
    """Converts logged blocks in runs of ``slice_rows`` rows, within ``max_bytes``.

    :meth:`add` each block in log order as it is logged; run :meth:`run` in
    a nursery; pass :meth:`lookup` of the group to the commit's conversion
    and :meth:`forget` the group once it is committed.

    ``max_bytes`` counts the tables and every block held (:func:`block_cost`):
    a block that does not fit is not held, and neither are the blocks
    waiting with it for a run (the commit converts them itself).

    The work is per block added and per block of a group, never per block
    held: :meth:`add` and a run's landing index their blocks (id ->
    sequence number, id -> (run, index)) once, :meth:`lookup` and
    :meth:`forget` look up the group's blocks there, and :meth:`forget`
    drops the front of the log order, each block it drops once.
    """

    def __init__(self, max_bytes: int, slice_rows: int) -> None:
        self.max_bytes = max_bytes
        self.slice_rows = slice_rows
        #: Every block held (waiting, queued, converting, in a run): id -> sequence number.
        self._seq: dict[int, int] = {}
        #: The blocks held in converted runs: id -> (run, index).
        self._where: dict[int, tuple[ConvertedRun, int]] = {}
        self._next = 0
        #: Blocks at or before this sequence number are committed (or never will be).
        self._forgotten = -1
        #: Converted runs, in log order; then the one converting; then those queued.
        self._runs: deque[_Span] = deque()
        self._converting: _Span | None = None
        #: Full runs waiting for the thread, at most PRECONVERT_QUEUED_RUNS.
        self._ready: deque[_Span] = deque()
        #: Blocks held since the last run was taken (consecutive numbers from
        #: ``_waiting_first``), and their rows.
        self._waiting: list[RowBlock] = []
        self._waiting_first = 0
        self._waiting_rows = 0
        self._table_bytes = 0
        self._block_bytes = 0
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(PRECONVERT_JOBS)
        #: Counters for tests and benchmarks.
        self.converted_runs = 0
        self.skipped_runs = 0
        #: Blocks not held as the limit was reached.
        self.skipped_blocks = 0
        #: Runs whose blocks were all committed before they landed (dropped at once).
        self.stale_runs = 0

    @property
    def nbytes(self) -> int:
        """What is counted against ``max_bytes``: the tables, and the blocks held."""
        return self._table_bytes + self._block_bytes

    @property
    def held_blocks(self) -> int:
        """Blocks held now."""
        return len(self._seq)

    def add(self, block: RowBlock) -> None:
        """A block was logged (taken by the log, in log order)."""
        if self.max_bytes <= 0 or id(block) in self._seq:
            # Held already (the same object logged twice): its run serves both.
            return
        seq = self._next
        self._next += 1
        cost = block_cost(block)
        if self.nbytes + cost > self.max_bytes:
            # The waiting blocks go too: a run is consecutive blocks.
            self.skipped_blocks += 1 + len(self._waiting)
            self._release(self._waiting)
            self._waiting = []
            self._waiting_rows = 0
            return
        if not self._waiting:
            self._waiting_first = seq
        self._seq[id(block)] = seq
        self._block_bytes += cost
        self._waiting.append(block)
        self._waiting_rows += block.rows
        if self._waiting_rows < self.slice_rows:
            return
        span = _Span(self._waiting_first, tuple(self._waiting), _cost(self._waiting))
        self._waiting = []
        self._waiting_rows = 0
        if len(self._ready) >= PRECONVERT_QUEUED_RUNS:
            # The thread is behind: the commit converts these blocks itself.
            self.skipped_runs += 1
            self._drop(span)
            return
        self._ready.append(span)
        self._wake.set()

    def runs(self) -> tuple[ConvertedRun, ...]:
        """The runs kept now, oldest first (for tests and benchmarks)."""
        return tuple(span.run for span in self._runs if span.run is not None)

    def lookup(self, group: Sequence[RowBlock]) -> dict[int, tuple[ConvertedRun, int]]:
        """Where ``group``'s blocks were converted ahead, for the commit's ``to_arrow``.

        Only the group's own blocks: the commit's thread reads this dict
        while the runs go on landing (and being forgotten) on the event loop.
        """
        where = self._where
        return {id(b): hit for b in group if (hit := where.get(id(b))) is not None}

    def forget(self, group: Sequence[RowBlock]) -> None:
        """``group`` (in log order) is committed: drop what is held up to its latest held block.

        Blocks are held in log order, so a held block before the group's
        last one and not in the group (a failed append, a block the group
        read back from the files) will never be committed from memory
        either. Runs still queued or converting are cut too; one that lands
        with all its blocks forgotten is dropped at once (:meth:`run`).
        """
        seq = self._seq
        # The latest held block of the group: not always its last held one, as
        # an object logged twice is held once, at its first place in the log.
        mark = max((found for b in group if (found := seq.get(id(b))) is not None), default=-1)
        if mark <= self._forgotten:
            return
        self._forgotten = mark
        while self._runs:
            span = self._runs[0]
            self._cut(span, mark)
            if span.start < len(span.blocks):
                return  # the rest of the log order is after the mark
            self._drop(self._runs.popleft())
        if self._converting is not None:
            self._cut(self._converting, mark)
            if self._converting.start < len(self._converting.blocks):
                return
        while self._ready:
            span = self._ready[0]
            self._cut(span, mark)
            if span.start < len(span.blocks):
                return
            self._drop(self._ready.popleft())
        if self._waiting and self._waiting_first <= mark:
            cut = min(mark - self._waiting_first + 1, len(self._waiting))
            self._release(self._waiting[:cut])
            del self._waiting[:cut]
            self._waiting_first += cut
            self._waiting_rows = sum(block.rows for block in self._waiting)

    def _cut(self, span: _Span, mark: int) -> None:
        """Stop looking up ``span``'s blocks at or before ``mark`` (counted while the span is)."""
        cut = min(mark - span.first + 1, len(span.blocks))
        if cut > span.start:
            self._unindex(span.blocks[span.start : cut])
            span.start = cut

    def _drop(self, span: _Span) -> None:
        """``span`` goes: its blocks and its table stop being held and counted."""
        self._unindex(span.blocks[span.start :])
        span.start = len(span.blocks)
        self._block_bytes -= span.cost
        if span.run is not None:
            self._table_bytes -= span.run.nbytes

    def _unindex(self, blocks: Sequence[RowBlock]) -> None:
        """Forget ``blocks``' entries (on the event loop: a few dict operations a block)."""
        seq, where = self._seq, self._where
        for block in blocks:
            key = id(block)
            del seq[key]
            where.pop(key, None)

    def _release(self, blocks: Sequence[RowBlock]) -> None:
        """Stop holding and counting ``blocks``, which nothing here refers to any more."""
        self._unindex(blocks)
        self._block_bytes -= _cost(blocks)

    async def run(self) -> None:
        """Convert the runs as they fill (one worker thread), until cancelled."""
        while True:
            while not self._ready:
                await self._wake.wait()
                self._wake = trio.Event()
            span = self._ready.popleft()
            if span.start:
                # Its first blocks were committed while it waited: convert the
                # rest, and stop counting those, which nothing refers to now.
                done = span.blocks[: span.start]
                self._block_bytes -= _cost(done)
                span = _Span(
                    span.first + span.start, span.blocks[span.start :], span.cost - _cost(done)
                )
            self._converting = span
            try:
                run = await trio.to_thread.run_sync(_convert, span.blocks, limiter=self._limiter)
            except data_errors() as exc:
                # The commit converts these blocks itself and handles the error there.
                log.warning("preconvert.failed", error=type(exc).__name__)
                self._drop(span)
                continue
            finally:
                self._converting = None
            if span.start == len(span.blocks):
                # Committed while it was converted: nothing to look up in it.
                self.stale_runs += 1
                self._drop(span)
                continue
            span.run = run
            self._runs.append(span)
            self._table_bytes += run.nbytes
            self.converted_runs += 1
            where = self._where
            for i in range(span.start, len(span.blocks)):
                where[id(span.blocks[i])] = (run, i)
