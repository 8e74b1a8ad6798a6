"""The trio-facing log (appliance/wal/log.py): group commit, adaptive delay, errors, cap, commit."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance.blocks.identity import batch_digest, dedupe_key
from appliance.wal.blocks import decode_block
from appliance.wal.errors import RecordTooLarge, WalClosed, WalFull, WalWriteError
from appliance.wal.log import WriteAheadLog, _cache_cost, open_wal
from appliance.wal.segments import Entry, SegmentStore, Written
from appliance.wal.settings import WalSettings

from .walsupport import install_sync_spy, logged, sample_block

SMALL = WalSettings(segment_bytes=64 * 1024, max_record_bytes=32 * 1024, max_bytes=1 << 20)


def key(i: int) -> tuple[str, str, str]:
    return ("forward", "user1", f"chunk-{i}")


@pytest.mark.trio
async def test_each_append_returns_only_after_its_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = install_sync_spy(monkeypatch)
    problems: list[str] = []
    async with open_wal(tmp_path, 0, SMALL) as wal:

        async def appender(i: int) -> None:
            for n in range(5):
                body = bytes([i]) * (100 + n)
                lsn = await wal.append(body, key=key(i * 10 + n), rows=1)
                seen = list(spy.events)
                # The bytes of this record were written, and an fdatasync followed.
                covering = [
                    at
                    for at, (kind, _fd, offset, size) in enumerate(seen)
                    if kind == "pwrite" and offset <= lsn < offset + size
                ]
                synced = covering and any(e[0] == "fdatasync" for e in seen[covering[-1] :])
                if not synced:
                    problems.append(f"lsn {lsn} returned before its fdatasync")

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(appender, i)
        assert wal.stats.appends == 40
        frames = await wal.read(0, 1 << 30)
    assert not problems
    assert len(frames) == 40
    # Group commit: eight appenders never cost forty fdatasyncs.
    assert spy.syncs == wal.stats.groups < 40


@pytest.mark.trio
async def test_concurrent_appends_share_one_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = install_sync_spy(monkeypatch)
    async with open_wal(tmp_path, 0, SMALL) as wal:
        lsns: list[int] = []

        async def one(i: int) -> None:
            lsns.append(await wal.append(b"x" * 200, key=key(i)))

        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(one, i)
    assert len(set(lsns)) == 16
    # The flusher may take the first append alone (it can run before the
    # others joined); everything else arrives while that group is written.
    assert spy.syncs <= 2


@pytest.mark.trio
async def test_an_idle_append_is_not_delayed(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The clock only moves if every task waits a whole real second: a flush
    # that waited for its delay would show as a jump.
    mock_clock.autojump_threshold = 1.0
    settings = WalSettings(flush_delay_seconds=0.01)
    async with open_wal(tmp_path, 0, settings) as wal:
        start = trio.current_time()
        for i in range(3):
            await wal.append(b"x", key=key(i))
        assert trio.current_time() == start
        assert wal.stats.groups == 3


def gate_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make every group write wait (in its worker thread) until the returned event is set."""
    gate = threading.Event()
    gate.set()
    real = SegmentStore.write_group

    def write_group(self: SegmentStore, entries: list[Entry]) -> Written:
        assert gate.wait(10)
        return real(self, entries)

    monkeypatch.setattr(SegmentStore, "write_group", write_group)
    return gate


async def make_busy(wal: WriteAheadLog, gate: threading.Event, records: int) -> None:
    """Appends arrive while a write is under way: the next group has ``records`` records."""
    gate.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wal.append, b"first")
        await trio.testing.wait_all_tasks_blocked()
        for i in range(records):
            nursery.start_soon(partial(wal.append, b"x", key=key(i)))
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert wal.stats.last_group == records


@asynccontextmanager
async def busy_wal(
    tmp_path: Path,
    clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    settings: WalSettings,
) -> AsyncIterator[WriteAheadLog]:
    """A log whose last group had four records, under a clock that moves only
    when every task has waited a whole real second (so a flush that waited
    for its delay shows as a jump, and one that did not leaves the clock still)."""
    clock.autojump_threshold = 1.0
    gate = gate_writes(monkeypatch)
    async with open_wal(tmp_path, 0, settings) as wal:
        await make_busy(wal, gate, 4)
        yield wal


@pytest.mark.trio
async def test_under_load_a_group_waits_at_most_the_delay(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay = 0.01
    settings = WalSettings(flush_delay_seconds=delay)
    async with busy_wal(tmp_path, mock_clock, monkeypatch, settings) as wal:
        start = trio.current_time()
        # Appends keep coming: the next group waits for four records, or the delay.
        await wal.append(b"y")
        waited = trio.current_time() - start
        assert delay <= waited < 1.0 + delay
        assert wal.stats.last_group == 1
        # A lone append after that is idle again (the last group had one record).
        start = trio.current_time()
        await wal.append(b"z")
        assert trio.current_time() == start


@pytest.mark.trio
async def test_pending_bytes_flush_without_waiting(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = WalSettings(flush_delay_seconds=0.01, flush_bytes=1000)
    async with busy_wal(tmp_path, mock_clock, monkeypatch, settings) as wal:
        start = trio.current_time()
        await wal.append(b"y" * 1000)
        assert trio.current_time() == start


@pytest.mark.trio
async def test_cancelled_append_makes_no_claim(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = WalSettings(flush_delay_seconds=0.01)
    async with busy_wal(tmp_path, mock_clock, monkeypatch, settings) as wal:
        result: list[int] = []
        with trio.CancelScope() as scope:
            scope.cancel()  # cancelled at its first wait: after it joined the pending group
            result.append(await wal.append(b"cancelled", key=key(99)))
        assert scope.cancelled_caught
        assert not result
        # The record may still be written (at-least-once): here it is, after the delay.
        await wal.append(b"after")
        bodies = [f.body for f in await wal.read(0, 1 << 20)]
    assert bodies[-2:] == [b"cancelled", b"after"]


@pytest.mark.trio
async def test_io_error_fails_the_group_and_the_log_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = os.fdatasync
    failures = {"left": 1}

    def flaky(fd: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    async with open_wal(tmp_path, 0, SMALL) as wal:
        first = await wal.append(b"before", key=key(1))
        monkeypatch.setattr(os, "fdatasync", flaky)
        with pytest.raises(WalWriteError) as caught:
            await wal.append(b"lost", key=key(2))
        assert caught.value.errno == errno.EIO
        assert wal.uncommitted_lsn(key(2)) is None
        after = await wal.append(b"after", key=key(3))
        assert after > first
        assert [f.body for f in await wal.read(0, 1 << 20)] == [b"before", b"after"]
    assert logged(caplog, "wal.append_failed")[0]["errno"] == errno.EIO
    store, recovery = SegmentStore.open(tmp_path, 0, SMALL.segment_bytes)
    assert [f.body for f in store.replay(0)] == [b"before", b"after"]
    assert recovery.truncated_bytes == 0
    store.close()


@pytest.mark.trio
async def test_record_too_large(tmp_path: Path) -> None:
    async with open_wal(tmp_path, 0, SMALL) as wal:
        with pytest.raises(RecordTooLarge):
            await wal.append(b"x" * SMALL.max_record_bytes)
        assert wal.stats.appends == 0


CAPPED = WalSettings(
    segment_bytes=4096, max_record_bytes=4096, max_bytes=8192, full_wait_seconds=5.0
)


@pytest.mark.trio
async def test_cap_applies_backpressure_until_a_commit(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 1.0
    async with open_wal(tmp_path, 0, CAPPED) as wal:
        for i in range(7):
            await wal.append(b"x" * 1000, key=key(i))
        assert wal.total_bytes <= CAPPED.max_bytes
        done: list[int] = []

        async def blocked() -> None:
            done.append(await wal.append(b"y" * 1500, key=key(100)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked)
            await trio.testing.wait_all_tasks_blocked()
            assert not done
            assert wal.stats.cap_waits == 1
            await wal.mark_committed(wal.durable_end)
        assert done
        assert wal.total_bytes <= CAPPED.max_bytes


@pytest.mark.trio
async def test_cap_fails_after_its_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_wal(tmp_path, 0, CAPPED) as wal:
        for i in range(7):
            await wal.append(b"x" * 1000, key=key(i))
        start = trio.current_time()
        with pytest.raises(WalFull):
            await wal.append(b"y" * 1500)
        assert trio.current_time() - start >= CAPPED.full_wait_seconds
        assert wal.stats.cap_refusals == 1
        # What fits still goes in.
        await wal.append(b"z" * 10)


@pytest.mark.trio
async def test_key_cap(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    settings = WalSettings(max_keys=3, full_wait_seconds=1.0)
    async with open_wal(tmp_path, 0, settings) as wal:
        for i in range(3):
            await wal.append(b"x", key=key(i))
        with pytest.raises(WalFull):
            await wal.append(b"x", key=key(3))
        await wal.append(b"no key")  # records without a key are not counted
        await wal.mark_committed(wal.durable_end)
        await wal.append(b"x", key=key(3))


@pytest.mark.trio
async def test_uncommitted_keys_and_replay_after_reopen(tmp_path: Path) -> None:
    blocks = [sample_block(i) for i in range(10)]
    async with open_wal(tmp_path, 0, SMALL) as wal:
        lsns = [await wal.append_block(b) for b in blocks]
        frames = await wal.read(0, 1 << 20)
        await wal.mark_committed(frames[3].end)
        assert wal.uncommitted_digests() == {
            batch_digest(k) for b in blocks[4:] if (k := dedupe_key(b))
        }
        assert wal.uncommitted_lsn(dedupe_key(blocks[0])) is None  # type: ignore[arg-type]
        assert wal.uncommitted_lsn(dedupe_key(blocks[5])) == lsns[5]  # type: ignore[arg-type]
        committed = wal.committed
    async with open_wal(tmp_path, committed, SMALL) as wal:
        assert wal.uncommitted_digests() == {
            batch_digest(k) for b in blocks[4:] if (k := dedupe_key(b))
        }
        assert wal.uncommitted_bytes == wal.durable_end - committed
        frames = await wal.read(wal.committed, 1 << 20)
        assert [decode_block(f.body, f.rows) for f in frames] == blocks[4:]
        assert wal.uncommitted_lsn(dedupe_key(blocks[5])) == lsns[5]  # type: ignore[arg-type]


@pytest.mark.trio
async def test_a_writer_loop_and_ack_commit(tmp_path: Path) -> None:
    """The integration's shape: appenders, a committer reading the log, ``ack = "commit"``."""
    committed_bodies: list[bytes] = []
    async with open_wal(tmp_path, 0, SMALL) as wal:

        async def committer() -> None:
            position = wal.committed
            while True:
                await wal.wait_durable(position)
                frames = await wal.read(position, 2000)
                committed_bodies.extend(f.body for f in frames)
                position = frames[-1].end
                await wal.mark_committed(position)

        async def client(i: int) -> None:
            lsn = await wal.append(b"%d" % i, key=key(i))
            await wal.wait_committed(lsn)  # ack = "commit"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer)
            async with trio.open_nursery() as clients:
                for i in range(20):
                    clients.start_soon(client, i)
            nursery.cancel_scope.cancel()
        assert wal.uncommitted_bytes == 0
        assert len(wal.segments()) == 1
    assert sorted(committed_bodies) == sorted(b"%d" % i for i in range(20))


@pytest.mark.trio
async def test_close_writes_what_is_pending_then_refuses(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, SMALL)
    await wal.open(0)
    results: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wal.run)

        async def one(i: int) -> None:
            results.append(await wal.append(b"x", key=key(i)))

        for i in range(5):
            nursery.start_soon(one, i)
        await trio.testing.wait_all_tasks_blocked()
        await wal.close()
    assert len(results) == 5
    with pytest.raises(WalClosed):
        await wal.append(b"late")
    with pytest.raises(WalClosed):
        await wal.wait_committed(results[0])
    wal.close_files()


@pytest.mark.trio
async def test_mark_committed_checks_its_position(tmp_path: Path) -> None:
    async with open_wal(tmp_path, 0, SMALL) as wal:
        await wal.append(b"x")
        with pytest.raises(ValueError, match="past the durable end"):
            await wal.mark_committed(wal.durable_end + 1)
        await wal.mark_committed(wal.durable_end)
        await wal.mark_committed(0)  # going back is ignored
        assert wal.committed == wal.durable_end


@pytest.mark.trio
async def test_the_cache_serves_what_read_returns_without_reading(tmp_path: Path) -> None:
    blocks = [sample_block(i) for i in range(8)]
    async with open_wal(tmp_path, 0, SMALL) as wal:
        for b in blocks:
            await (await wal.begin_block(b)).wait()
        for after, max_bytes in [(0, 1 << 20), (0, 1), (0, 700)]:
            cached = wal.read_cached(after, max_bytes)
            assert cached is not None
            # The same records as from the files (kept without their bodies),
            # and the very blocks that were logged.
            read = await wal.read(after, max_bytes)
            assert [f for f, _ in cached] == [replace(f, body=b"") for f in read]
            assert all(got is sent for (_, got), sent in zip(cached, blocks, strict=False))
        frames = await wal.read(0, 1 << 20)
        middle = frames[3].lsn
        cached = wal.read_cached(middle, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == blocks[3:]
        # Not a record boundary, or nothing durable after it: read() decides.
        assert wal.read_cached(middle + 1, 1 << 20) is None
        assert wal.read_cached(wal.durable_end, 1 << 20) is None
        await wal.mark_committed(frames[5].end)
        cached = wal.read_cached(wal.committed, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == blocks[6:]
        # A record appended without its block is not cached: the cached run
        # stops before it, and read() serves it.
        await wal.append(b"raw body")
        cached = wal.read_cached(wal.committed, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == blocks[6:]
        await wal.mark_committed(cached[-1][0].end)
        assert wal.read_cached(wal.committed, 1 << 20) is None
        assert len(await wal.read(wal.committed, 1 << 20)) == 1


@pytest.mark.trio
async def test_the_cache_stays_one_run_after_a_record_is_left_out(tmp_path: Path) -> None:
    """After a record that does not fit, no later one is kept until the commits empty the cache.

    A small record after a large one left out would fit the room left, but
    keeping it would put a gap inside the cache, where every commit group
    would stop (appliance/wal/log.py, ``_cache_record``).
    """
    small = [sample_block(i) for i in range(4)]
    large = sample_block(9, events=200)
    limit = 2 * _cache_cost(small[0]) + _cache_cost(small[0]) // 2
    assert _cache_cost(large) > limit
    async with open_wal(tmp_path, 0, replace(SMALL, cache_bytes=limit)) as wal:
        assert wal.caching
        for b in (small[0], large, small[1]):
            await (await wal.begin_block(b)).wait()
        assert not wal.caching  # closed: what is appended now is read back
        frames = await wal.read(0, 1 << 20)
        cached = wal.read_cached(0, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == [small[0]]  # small[1] would fit, but after the gap
        assert wal.read_cached(frames[2].lsn, 1 << 20) is None
        # Committed up to the cached run's end, the cache is empty and keeps again.
        await wal.mark_committed(frames[0].end)
        assert wal.cache_bytes == 0
        assert wal.caching
        for b in small[2:]:
            await (await wal.begin_block(b)).wait()
        later = await wal.read(frames[-1].end, 1 << 20)
        cached = wal.read_cached(later[0].lsn, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == small[2:]


@pytest.mark.trio
async def test_on_cached_hears_of_exactly_the_blocks_the_cache_keeps_in_log_order(
    tmp_path: Path,
) -> None:
    """The writer converts ahead only what it will commit from memory: the cache's own blocks."""
    small = [sample_block(i) for i in range(4)]
    large = sample_block(9, events=200)
    limit = 2 * _cache_cost(small[0]) + _cache_cost(small[0]) // 2
    heard: list[object] = []
    async with open_wal(tmp_path, 0, replace(SMALL, cache_bytes=limit)) as wal:
        wal.on_cached = heard.append
        # Alone and too large: left out while the cache stays open and empty.
        await (await wal.begin_block(large)).wait()
        assert wal.caching
        assert heard == []
        for b in (small[0], small[1], large, small[2]):
            await (await wal.begin_block(b)).wait()
        cached = wal.read_cached(wal.committed, 1 << 20)
        assert cached is None  # the first record, left out, starts the uncommitted log
        assert heard == small[:2]  # small[2] fits, but comes after a record left out
        assert all(a is b for a, b in zip(heard, small, strict=False))


@pytest.mark.trio
async def test_the_cache_keeps_the_oldest_records_within_its_bytes(tmp_path: Path) -> None:
    """A full cache keeps what the next commit reads first; a commit makes room again.

    Records that do not fit are left out (a gap the writer reads back once),
    not the oldest evicted: evicting them made every later group of a busy
    log be read back once a slow commit had let the backlog pass the cache.
    """
    blocks = [sample_block(i) for i in range(10)]
    limit = 1500
    async with open_wal(tmp_path, 0, replace(SMALL, cache_bytes=limit)) as wal:
        for b in blocks:
            await (await wal.begin_block(b)).wait()
        frames = await wal.read(0, 1 << 20)
        # Each record counts its block (the Python objects it keeps) and its entry.
        costs = [_cache_cost(b) for b in blocks]
        assert costs == [b.nbytes + 256 for b in blocks]
        assert sum(costs) > limit
        held = [i for i, f in enumerate(frames) if wal.read_cached(f.lsn, 1 << 20) is not None]
        kept = len(held)
        assert held == list(range(kept))
        assert 0 < kept < 10
        assert sum(costs[:kept]) <= limit < sum(costs[: kept + 1])  # as many as fit
        cached = wal.read_cached(0, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == blocks[:kept]
        # Committed, they make room: the next records are cached after a gap.
        await wal.mark_committed(frames[kept - 1].end)
        assert wal.cache_bytes == 0
        more = [sample_block(10)]
        for b in more:
            await (await wal.begin_block(b)).wait()
        assert wal.read_cached(wal.committed, 1 << 20) is None  # the gap: read() serves it
        oldest = wal.oldest_cached
        assert oldest is not None
        gap = await wal.read(wal.committed, oldest[0] - wal.committed)
        assert [f.lsn for f in gap] == [f.lsn for f in frames[kept:]]
        await wal.mark_committed(gap[-1].end)
        cached = wal.read_cached(wal.committed, 1 << 20)
        assert cached is not None
        assert [b for _, b in cached] == more
    async with open_wal(tmp_path, 0, replace(SMALL, cache_bytes=0)) as wal:
        assert not wal.caching
        await (await wal.begin_block(sample_block(11))).wait()
        assert wal.read_cached(wal.committed, 1 << 20) is None


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        WalSettings(segment_bytes=1 << 20, max_record_bytes=1 << 20, max_bytes=1 << 20)
    with pytest.raises(ValueError, match="flush_delay_seconds"):
        WalSettings(flush_delay_seconds=1.0)
    with pytest.raises(ValueError, match="segment_bytes"):
        WalSettings(segment_bytes=10)
    with pytest.raises(ValueError, match="cache_bytes"):
        WalSettings(cache_bytes=-1)
    with pytest.raises(ValueError, match="max_record_bytes"):
        WalSettings(max_record_bytes=2 << 30)
