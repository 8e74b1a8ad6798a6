"""Tables converted as blocks are logged (appliance/lake/preconvert.py) change no commit's table.

``to_arrow`` with runs converted ahead is held to the commit's own conversion
(``to_arrow`` without them, and ``blocks_to_arrow`` of the whole group):
the same schema and values for groups that leave blocks out (dedupe), hold
blocks read back from the log (equal values, other objects), or cover runs
in part, with slices that span runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
from appliance.lake import committer, preconvert
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.committer import to_arrow
from appliance.lake.log_sink import LogSink
from appliance.lake.preconvert import ConvertedRun, Preconverter, _convert, block_cost
from appliance.wal.blocks import decode_block, encode_block

from .test_writer import block, rows_of
from .test_writer_wal import SMALL_LOG, batch_ids, ids, writing

NOW = 1_767_225_600 * 1_000_000_000

_texts = st.one_of(st.none(), st.text(max_size=5))


@st.composite
def _block(draw: st.DrawFn) -> RowBlock:
    rows = draw(st.integers(0, 4))
    times = st.lists(st.one_of(st.none(), st.integers(0, 2 * NOW)), min_size=rows, max_size=rows)
    per_row = draw(st.booleans())
    tag = draw(st.lists(st.text(max_size=3), min_size=rows, max_size=rows)) if per_row else "t"
    host = draw(st.lists(_texts, min_size=rows, max_size=rows)) if per_row else draw(_texts)
    return RowBlock(
        protocol=draw(st.sampled_from(["forward", "lumberjack"])),
        source=draw(st.text(max_size=4)),
        peer="192.0.2.1:1",
        received_at_ns=NOW + draw(st.integers(-(10**17), 10**12)),
        batch_id=draw(st.one_of(st.none(), st.text(min_size=1, max_size=5))),  # with and without
        tag=tag,
        host=host,
        times_ns=draw(times),
        records=[draw(st.text(max_size=6)) for _ in range(rows)],
    )


def _passes(b: RowBlock) -> bool:
    """Whether the block would be logged (only checked blocks are)."""
    try:
        check_block(b)
    except BlockRefused:
        return False
    return True


def _read_back(b: RowBlock) -> RowBlock:
    """The block as the log's files give it back: equal values, another object."""
    return decode_block(encode_block(b), b.rows)


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[RowBlock], list[ConvertedRun]]:
    """A group of logged blocks and runs converted ahead over the log around it."""
    logged = draw(st.lists(_block().filter(_passes), min_size=0, max_size=14))
    # Runs: consecutive blocks of the log, some blocks in none (the thread was behind).
    runs: list[ConvertedRun] = []
    i = 0
    while i < len(logged):
        size = draw(st.integers(1, 5))
        if draw(st.booleans()):
            runs.append(_convert(tuple(logged[i : i + size])))
        i += size
    # The group: the log in order, less the blocks dedupe left out, some read back.
    group: list[RowBlock] = []
    for b in logged:
        fate = draw(st.sampled_from(["kept", "kept", "dropped", "read back"]))
        if fate == "kept":
            group.append(b)
        elif fate == "read back":
            group.append(_read_back(b))
    return group, runs


def _lookup(runs: list[ConvertedRun]) -> dict[int, tuple[ConvertedRun, int]]:
    """Where each run's blocks are (as Preconverter.lookup gives it, for a group of all of them)."""
    return {id(b): (run, i) for run in runs for i, b in enumerate(run.blocks)}


def _same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema, check_metadata=True)
    assert got.num_rows == want.num_rows
    assert got.equals(want)
    for name in want.column_names:
        assert got.column(name).combine_chunks().equals(want.column(name).combine_chunks()), name


@settings(max_examples=300, deadline=None)
@given(_case(), st.integers(1, 9))
def test_runs_converted_ahead_give_the_commits_table(
    case: tuple[list[RowBlock], list[ConvertedRun]], slice_rows: int
) -> None:
    group, runs = case
    with mock.patch.object(committer, "ARROW_SLICE_ROWS", slice_rows):
        got = to_arrow(group, _lookup(runs))
        old = to_arrow(group)
    _same(got, old)
    _same(got, blocks_to_arrow(group))


def test_a_run_is_taken_where_the_group_holds_its_blocks() -> None:
    """The rows come from the run, not a new conversion (a part of the same table)."""
    blocks = [block(f"b-{i}", rows=2) for i in range(4)]
    run = _convert(tuple(blocks[1:3]))
    with mock.patch.object(committer, "blocks_to_arrow", side_effect=AssertionError):
        assert to_arrow(blocks[1:3], _lookup([run])).equals(run.table)
        assert to_arrow(blocks[2:3], _lookup([run])).equals(run.table.slice(2, 2))


async def _converted(pre: Preconverter, runs: int) -> None:
    with trio.fail_after(30):
        while pre.converted_runs < runs:
            await trio.sleep(0.01)


@pytest.mark.trio
async def test_runs_fill_at_slice_rows_and_leave_with_their_group() -> None:
    pre = Preconverter(max_bytes=1 << 30, slice_rows=5)
    blocks = [block(f"b-{i}", rows=2) for i in range(8)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pre.run)
        for b in blocks:
            pre.add(b)
        await _converted(pre, 2)
        nursery.cancel_scope.cancel()
    first, second = pre.runs()
    assert first.blocks == tuple(blocks[0:3])
    assert first.offsets == (0, 2, 4, 6)
    assert second.blocks == tuple(blocks[3:6])
    costs = sum(block_cost(b) for b in blocks)
    assert pre.nbytes == first.nbytes + second.nbytes + costs
    assert pre.lookup(blocks[2:4]) == {id(blocks[2]): (first, 2), id(blocks[3]): (second, 0)}
    # A group that ends inside the second run: the first leaves, the second keeps its tail.
    pre.forget(blocks[0:4])
    (rest,) = pre.runs()
    assert rest is second
    assert pre.lookup(blocks[0:6]) == {id(blocks[4]): (second, 1), id(blocks[5]): (second, 2)}
    assert to_arrow(blocks[4:6], pre.lookup(blocks[4:6])).equals(blocks_to_arrow(blocks[4:6]))
    # Its buffers stay until it leaves whole, and so do its blocks, committed
    # block 3 too (the run refers to it): counted until then. 4..7 are held.
    assert pre.nbytes == second.nbytes + sum(block_cost(b) for b in blocks[3:8])
    assert pre.held_blocks == 4
    # The next group: blocks 4..7; 6 and 7 were waiting for a run and are dropped too.
    pre.forget(blocks[4:8])
    assert pre.runs() == ()
    assert pre.nbytes == 0
    assert pre.held_blocks == 0
    pre.add(block("c", rows=4))
    assert not pre._ready  # 4 rows: no run yet (blocks 6, 7 are gone)


@pytest.mark.trio
async def test_a_run_of_blocks_that_never_commit_leaves_with_a_later_group() -> None:
    pre = Preconverter(max_bytes=1 << 30, slice_rows=2)
    lost = [block("lost", rows=2)]  # say its append failed
    later = [block("later", rows=2)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pre.run)
        pre.add(lost[0])
        pre.add(later[0])
        await _converted(pre, 2)
        nursery.cancel_scope.cancel()
    pre.forget([block("other")])
    assert len(pre.runs()) == 2  # nothing after it committed yet
    pre.forget(later)
    assert pre.runs() == ()
    assert pre.nbytes == 0


@pytest.mark.trio
async def test_nothing_is_converted_past_the_byte_limit_or_with_the_cache_off() -> None:
    off = Preconverter(max_bytes=0, slice_rows=1)
    off.add(block("a"))
    assert not off._ready
    assert off.runs() == ()
    a, b = block("a"), block("b")
    # Room for block a, not for its table too: the limit counts the blocks held.
    pre = Preconverter(max_bytes=block_cost(a) + 1, slice_rows=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pre.run)
        pre.add(a)
        await _converted(pre, 1)
        assert pre.nbytes == block_cost(a) + pre.runs()[0].nbytes
        pre.add(b)  # the limit is reached: not held, the commit converts it
        nursery.cancel_scope.cancel()
    assert pre.converted_runs == 1
    assert pre.skipped_blocks == 1
    assert pre.held_blocks == 1
    assert len(pre.runs()) == 1


@pytest.mark.trio
async def test_a_logged_group_commits_from_runs_converted_ahead(tmp_path: Path) -> None:
    """Through the writer: runs are converted and used, and the table holds every row once."""
    blocks = [block(f"c-{i}", rows=3) for i in range(40)]
    used: list[int] = []
    real = committer.to_arrow

    def counting(group: list[RowBlock], converted: preconvert.Converted | None = None) -> pa.Table:
        used.append(len(converted or {}))
        return real(group, converted)

    with (
        mock.patch.object(committer, "ARROW_SLICE_ROWS", 10),
        mock.patch("appliance.lake.log_sink.ARROW_SLICE_ROWS", 10),
        mock.patch.object(committer, "to_arrow", counting),
    ):
        async with writing(tmp_path) as writer:
            for b in blocks:
                await (await writer.submit(b)).wait()
            sink = writer._sink
            assert isinstance(sink, LogSink)
            await _converted(sink.preconverter, 10)
    assert used
    assert used[0] >= 10
    assert batch_ids(tmp_path) == ids("c", 40)
    rows = rows_of(tmp_path / "events")
    assert sorted(r["record"] for r in rows) == sorted(r for b in blocks for r in b.records)
    assert sink.preconverter.runs() == ()
    assert sink.preconverter.nbytes == 0
    assert sink.preconverter.held_blocks == 0


class _Ids:
    """Counts ``id()`` calls in a module: the blocks its code looks at."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, obj: object) -> int:
        self.calls += 1
        return id(obj)


@pytest.mark.trio
async def test_a_commit_and_its_forget_look_at_the_group_not_at_every_run() -> None:
    """One-row blocks, many runs kept: the work per commit follows the group's size."""
    pre = Preconverter(max_bytes=1 << 40, slice_rows=10)
    blocks = [block(f"s-{i}", rows=1) for i in range(3000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pre.run)
        for i, b in enumerate(blocks, 1):
            pre.add(b)
            if i % 10 == 0:
                await _converted(pre, i // 10)  # none skipped: the thread keeps up
        nursery.cancel_scope.cancel()
    group = blocks[:100]
    seen = _Ids()
    with (
        mock.patch.object(committer, "id", seen, create=True),
        mock.patch.object(preconvert, "id", seen, create=True),
    ):
        for _ in range(3):
            assert to_arrow(group, pre.lookup(group)).equals(blocks_to_arrow(group))
        pre.forget(group)
    # 3,000 blocks in runs, 100 in the group: a few looks a group block, not one a run block.
    assert seen.calls <= 10 * len(group), seen.calls
    assert pre.held_blocks == 2900
    # The one-block fallback looks up one block a commit.
    seen.calls = 0
    with mock.patch.object(committer, "id", seen, create=True):
        for b in blocks[100:200]:
            (hit,) = pre.lookup([b]).values()
            assert to_arrow([b], {id(b): hit}).equals(blocks_to_arrow([b]))
    assert seen.calls <= 2 * 100, seen.calls


@pytest.mark.trio
async def test_the_one_block_fallback_hands_each_commit_its_own_block_only() -> None:
    """A group whose data fails commits block by block; each looks up its own block alone."""
    from appliance.lake.arrow import DATA_ERRORS
    from appliance.lake.committer import TableCommitter
    from appliance.lake.exactly_once import Outcome

    blocks = [block(f"f-{i}", rows=1) for i in range(6)]
    run = _convert(tuple(blocks[:4]))
    given_lookups: list[int] = []

    async def commit_group(group: list[RowBlock], position: int | None, **kw: object) -> Outcome:
        converted = kw.get("converted")
        assert converted is None or isinstance(converted, dict)
        given_lookups.append(len(converted or {}))
        if len(group) > 1:
            raise DATA_ERRORS[0]("bad data")
        if converted:
            assert converted == {id(group[0]): (run, blocks.index(group[0]))}
        return Outcome(frozenset(), committed=True)

    fake = mock.Mock(commit_group=commit_group)
    stored = await TableCommitter.store(fake, blocks, None, None, converted=_lookup([run]))
    assert stored.refused == {}
    assert given_lookups == [4, 1, 1, 1, 1, 0, 0]


def test_forget_drops_the_queued_runs_it_covers() -> None:
    """The thread is behind: runs of committed blocks are dropped before they are converted."""
    pre = Preconverter(max_bytes=1 << 30, slice_rows=2)
    blocks = [block(f"q-{i}", rows=2) for i in range(3)]
    for b in blocks[:2]:
        pre.add(b)  # two runs queued, no thread to convert them
    assert len(pre._ready) == 2
    pre.forget(blocks[:1])
    assert [span.blocks for span in pre._ready] == [(blocks[1],)]
    pre.add(blocks[2])
    pre.add(blocks[2])  # the same object again: held once
    assert pre.held_blocks == 2
    pre.forget(blocks[1:3])
    assert not pre._ready
    assert pre.held_blocks == 0
    assert pre.nbytes == 0


@pytest.mark.trio
async def test_a_run_that_lands_after_its_blocks_were_committed_is_dropped() -> None:
    import threading

    pre = Preconverter(max_bytes=1 << 30, slice_rows=4)
    blocks = [block(f"l-{i}", rows=2) for i in range(4)]
    started, go = threading.Event(), threading.Event()

    def slow(run: tuple[RowBlock, ...]) -> ConvertedRun:
        started.set()
        go.wait(30)
        return _convert(run)

    with mock.patch.object(preconvert, "_convert", slow):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pre.run)
            for b in blocks:
                pre.add(b)  # two runs: one converting, one queued
            await trio.to_thread.run_sync(started.wait, 30)
            pre.forget(blocks[:3])  # the first run whole, the second in part
            assert [span.blocks for span in pre._ready] == [tuple(blocks[2:4])]
            go.set()
            await _converted(pre, 1)
            nursery.cancel_scope.cancel()
    assert pre.stale_runs == 1
    (run,) = pre.runs()
    assert run.blocks == (blocks[3],)  # converted without the committed block 2
    assert pre.lookup(blocks) == {id(blocks[3]): (run, 0)}
    assert pre.held_blocks == 1
    assert pre.nbytes == run.nbytes + block_cost(blocks[3])


@pytest.mark.trio
async def test_nothing_is_held_while_the_logs_cache_keeps_nothing(tmp_path: Path) -> None:
    """Blocks the cache does not keep are read back at their commit: converting them is
    waste, and holding them would last (the commit releases what it holds by identity).

    The cache is on but smaller than any block: it stays open and empty, keeping none.
    """
    blocks = [block(f"n-{i}", rows=3) for i in range(12)]
    # Smaller than any block as the cache counts it (its nbytes and an entry),
    # while twice it, the preconverter's limit, would hold each.
    tiny = dataclasses.replace(SMALL_LOG, cache_bytes=min(b.nbytes for b in blocks))
    assert all(block_cost(b) <= 2 * tiny.cache_bytes for b in blocks)
    with mock.patch("appliance.lake.log_sink.ARROW_SLICE_ROWS", 3):
        async with writing(tmp_path, wal=tiny) as writer:
            sink = writer._sink
            assert isinstance(sink, LogSink)
            assert sink.preconverter.max_bytes > 0
            for b in blocks:
                await (await writer.submit(b)).wait()
                assert sink.wal.caching  # open: it would keep a block that fits
                assert sink.preconverter.held_blocks == 0
    assert sink.preconverter.converted_runs == 0
    assert sink.preconverter.nbytes == 0
    assert batch_ids(tmp_path) == ids("n", 12)


def test_a_block_logged_twice_does_not_keep_the_blocks_between_its_copies() -> None:
    """The cache keeps A, B, A (one object logged twice, held once at its first place):
    committing all three releases B too."""
    pre = Preconverter(max_bytes=1 << 30, slice_rows=1000)
    a, b = block("twice", rows=2), block("between", rows=2)
    for logged in (a, b, a):
        pre.add(logged)
    assert pre.held_blocks == 2
    pre.forget([a, b, a])
    assert pre.held_blocks == 0
    assert pre.nbytes == 0
