"""Arrow tables of logged blocks, converted while they arrive instead of at their commit.

A commit of the write-ahead log's cached records converts about 246,000
rows to Arrow (:func:`~appliance.lake.committer.to_arrow`). That conversion
builds its columns from Python lists and holds the GIL for all of it: about
a tenth of a second in one burst per commit, while the event loop (TLS
reads, acks) waits for the GIL; with ``workers = 2`` that burst was most of
the p99 (docs/performance.md, "The p99 with two workers: the commits").

:class:`Preconverter` converts the blocks as :class:`~appliance.lake.log_sink.LogSink`
logs them: once the blocks not yet converted reach
:data:`~appliance.lake.committer.ARROW_SLICE_ROWS` rows, one worker thread
converts that run (:data:`PRECONVERT_JOBS` at a time) and keeps the table
with the very block objects it covers (:class:`ConvertedRun`). At the
commit, ``to_arrow`` takes a run's rows wherever the group holds those same
objects in the same order, and converts the rest as before; a group read
back from the log's files holds new objects and matches nothing. Nothing
but speed depends on a run matching: the table is the same either way
(tests/appliance/lake/test_preconvert.py holds it to the commit's own
conversion).

Memory: the runs' tables count against their own limit, ``[wal]
cache_bytes`` (the budget of the blocks they mirror); past it no run is
queued until commits free room (those queued already, at most
:data:`PRECONVERT_QUEUED_RUNS` and the one converting, still land), and with
the cache off nothing is converted ahead.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from appliance.blocks.block import RowBlock
from appliance.lake.arrow import blocks_to_arrow
from appliance.logs import get_logger

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PRECONVERT_JOBS", "PRECONVERT_QUEUED_RUNS", "ConvertedRun", "Preconverter"]

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
    #: What the run holds in memory (its table's buffers), counted against the limit.
    nbytes: int

    def rows(self, first: int, stop: int) -> pa.Table:
        """The rows of ``blocks[first:stop]`` (zero-copy)."""
        start = self.offsets[first]
        return self.table.slice(start, self.offsets[stop] - start)


def _convert(blocks: tuple[RowBlock, ...]) -> ConvertedRun:
    """Convert ``blocks`` (worker thread)."""
    table = blocks_to_arrow(blocks)
    offsets = (0, *itertools.accumulate(block.rows for block in blocks))
    return ConvertedRun(blocks, offsets, table, table.get_total_buffer_size())


class Preconverter:
    """Converts logged blocks in runs of ``slice_rows`` rows, within ``max_bytes`` of tables.

    :meth:`add` each block in log order as it is logged; run :meth:`run` in
    a nursery; pass :meth:`runs` to the commit's conversion and
    :meth:`forget` the group once it is committed.
    """

    def __init__(self, max_bytes: int, slice_rows: int) -> None:
        self.max_bytes = max_bytes
        self.slice_rows = slice_rows
        self._runs: deque[ConvertedRun] = deque()
        self._bytes = 0
        #: Blocks logged since the last run was taken, and their rows.
        self._waiting: list[RowBlock] = []
        self._waiting_rows = 0
        #: Runs of ``slice_rows`` waiting for the thread, at most PRECONVERT_QUEUED_RUNS.
        self._ready: deque[tuple[RowBlock, ...]] = deque()
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(PRECONVERT_JOBS)
        #: Counters for tests and benchmarks.
        self.converted_runs = 0
        self.skipped_runs = 0

    @property
    def nbytes(self) -> int:
        """The bytes of the tables kept."""
        return self._bytes

    def add(self, block: RowBlock) -> None:
        """A block was logged (taken by the log, in log order)."""
        if self.max_bytes <= 0:
            return
        self._waiting.append(block)
        self._waiting_rows += block.rows
        if self._waiting_rows < self.slice_rows:
            return
        run = tuple(self._waiting)
        self._waiting.clear()
        self._waiting_rows = 0
        if len(self._ready) >= PRECONVERT_QUEUED_RUNS or self._bytes >= self.max_bytes:
            self.skipped_runs += 1
            return
        self._ready.append(run)
        self._wake.set()

    def runs(self) -> tuple[ConvertedRun, ...]:
        """The runs kept now, oldest first (a snapshot for the commit's thread)."""
        return tuple(self._runs)

    def forget(self, group: Sequence[RowBlock]) -> None:
        """The blocks of ``group`` are committed (or will never be): drop what covers them.

        Runs are kept in log order, so a run before the last one that holds
        a block of ``group`` covers only blocks that came before the group's
        end and were not in it (a failed append, a record the cache did not
        keep): none of them will be committed from memory. The last such run
        keeps the blocks after the group's. Blocks waiting for a run are
        dropped the same way.
        """
        done = {id(block) for block in group}
        last = -1
        for i, run in enumerate(self._runs):
            if any(id(block) in done for block in run.blocks):
                last = i
        for _ in range(last):
            self._bytes -= self._runs.popleft().nbytes
        if last >= 0:
            run = self._runs.popleft()
            keep = 0
            for i, block in enumerate(run.blocks):
                if id(block) in done:
                    keep = i + 1
            if keep < len(run.blocks):
                # Still counted whole: the slice keeps the table's buffers.
                self._runs.appendleft(
                    ConvertedRun(
                        run.blocks[keep:],
                        tuple(o - run.offsets[keep] for o in run.offsets[keep:]),
                        run.table.slice(run.offsets[keep]),
                        run.nbytes,
                    )
                )
            else:
                self._bytes -= run.nbytes
        if any(id(block) in done for block in self._waiting):
            keep = max(i + 1 for i, block in enumerate(self._waiting) if id(block) in done)
            del self._waiting[:keep]
            self._waiting_rows = sum(block.rows for block in self._waiting)

    async def run(self) -> None:
        """Convert the runs as they fill (one worker thread), until cancelled."""
        # Imported here: the committer imports this module.
        from appliance.lake.committer import data_errors

        while True:
            while not self._ready:
                await self._wake.wait()
                self._wake = trio.Event()
            blocks = self._ready.popleft()
            try:
                run = await trio.to_thread.run_sync(_convert, blocks, limiter=self._limiter)
            except data_errors() as exc:
                # The commit converts these blocks itself and handles the error there.
                log.warning("preconvert.failed", error=type(exc).__name__)
                continue
            self._runs.append(run)
            self._bytes += run.nbytes
            self.converted_runs += 1
