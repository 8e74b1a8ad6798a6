"""The writer with a write-ahead log (``ack = "wal"``), against real Delta tables on disk.

Acks come from the log's fdatasync; the table is written from the log in
large groups, each commit recording the log position it covers under
``<app_id>#wal``; a restart replays from that position, so every record is
committed exactly once, whether the process died before a commit, after it,
or with a torn or damaged tail. A "crash" here is the writer's tasks
cancelled with nothing closed: what is on disk is what a SIGKILL leaves
(tests/appliance/test_service_wal.py kills a real process).

Real clock: the writer waits on worker threads.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from deltalake import DeltaTable

from appliance.blocks.errors import BlockRefused
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, LoggedTicket, WriterSettings, wal_app_id
from appliance.metrics import Metrics
from appliance.wal.log import WriteAheadLog
from appliance.wal.settings import WalSettings
from tests.appliance.wal.walsupport import logged, segment_files

from .test_writer import block, rows_of

APP_ID = "node-w"
#: Long enough that nothing commits unless a test closes the writer or reaches the bytes.
SLOW = WriterSettings(commit_interval_seconds=3600, retry_initial_seconds=0.05)
FAST = WriterSettings(commit_interval_seconds=0.1, retry_initial_seconds=0.05)
SMALL_LOG = WalSettings(segment_bytes=4096, max_record_bytes=4096, max_bytes=64 * 1024)


def _token() -> int:
    return int.from_bytes(APP_ID.encode(), "big")


def make_writer(
    state: Path,
    settings: WriterSettings = SLOW,
    wal: WalSettings = SMALL_LOG,
    metrics: Metrics | None = None,
) -> LakeWriter:
    return LakeWriter(
        EventsTable(str(state / "events")), APP_ID, settings, token=_token(), metrics=metrics,
        wal=WriteAheadLog(state / "wal", wal),
    )  # fmt: skip


@asynccontextmanager
async def writing(
    state: Path, settings: WriterSettings = SLOW, *, crash: bool = False, **kwargs: object
) -> AsyncIterator[LakeWriter]:
    """An open, running writer; at the end closed (commits everything), or ``crash``ed."""
    writer = make_writer(state, settings, **kwargs)  # type: ignore[arg-type]
    await writer.open()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        yield writer
        if crash:
            nursery.cancel_scope.cancel()
        else:
            await writer.close_input()


def table_position(state: Path) -> int | None:
    version = DeltaTable(str(state / "events")).transaction_version(wal_app_id(APP_ID))
    return None if version is None else int(version)


def batch_ids(state: Path) -> list[str]:
    return sorted(str(row["batch_id"]) for row in rows_of(state / "events"))


def ids(prefix: str, n: int, rows: int = 3) -> list[str]:
    """The sorted batch ids of ``n`` blocks ``prefix-i`` of ``rows`` rows each, once each."""
    return sorted(f"{prefix}-{i}" for i in range(n) for _ in range(rows))


@pytest.mark.trio
async def test_ack_comes_from_the_log_and_the_table_follows_in_one_group(tmp_path: Path) -> None:
    async with writing(tmp_path) as writer:
        tickets = [await writer.submit(block(f"c-{i}")) for i in range(20)]
        with trio.fail_after(30):
            for ticket in tickets:
                assert isinstance(ticket, LoggedTicket)
                await ticket.wait()
        # Acked, and not in the table yet: the commit interval is an hour.
        assert writer.commits == 0
        assert not rows_of(tmp_path / "events")
        assert writer.wal is not None
        end = writer.wal.durable_end
    # The stop committed the log, in one commit, recording its end.
    assert writer.commits == 1
    assert batch_ids(tmp_path) == ids("c", 20)
    assert table_position(tmp_path) == end
    # Wholly committed segments are gone; the active one stays (it holds the next position).
    assert len(segment_files(tmp_path / "wal")) == 1


@pytest.mark.trio
async def test_commits_come_every_interval_and_at_commit_max_bytes(tmp_path: Path) -> None:
    async with writing(tmp_path, FAST) as writer:
        for i in range(5):
            await (await writer.submit(block(f"t-{i}"))).wait()
        with trio.fail_after(30):
            while writer.commits == 0:
                await trio.sleep(0.02)
        assert len(rows_of(tmp_path / "events")) > 0
    by_bytes = WriterSettings(commit_interval_seconds=3600, commit_max_bytes=700)
    async with writing(tmp_path / "b", by_bytes) as writer:
        for i in range(10):
            await (await writer.submit(block(f"b-{i}"))).wait()
        # Each record is about 190 bytes: the bytes, not the hour, start commits.
        with trio.fail_after(30):
            while writer.commits < 2:
                await trio.sleep(0.02)
    assert batch_ids(tmp_path / "b") == ids("b", 10)


@pytest.mark.trio
@pytest.mark.parametrize("cache_bytes", [64 * 1024, 0])
async def test_commits_come_from_the_cache_or_the_files_alike(
    tmp_path: Path, cache_bytes: int
) -> None:
    """Blocks the log still holds in memory are committed without a read; else they are read.

    With the whole log cached every commit is served from memory; with no
    cache the writer reads the files and decodes them. The table is the same.
    """
    settings = WriterSettings(commit_interval_seconds=3600, commit_max_bytes=1000)
    wal = replace(SMALL_LOG, cache_bytes=cache_bytes)
    async with writing(tmp_path, settings, wal=wal) as writer:
        for i in range(12):
            await (await writer.submit(block(f"m-{i}"))).wait()
        with trio.fail_after(30):
            while writer.commits < 2:
                await trio.sleep(0.02)
    assert batch_ids(tmp_path) == ids("m", 12)
    assert writer.commits == 2  # six records of about 190 bytes reach commit_max_bytes
    assert (writer.cached_reads, writer.file_reads) == ((2, 0) if cache_bytes else (0, 2))


async def record_costs(state: Path) -> tuple[int, int]:
    """What one test block costs in the log's cache, and in the log's bytes."""
    async with writing(state, WriterSettings(commit_interval_seconds=3600)) as writer:
        await (await writer.submit(block("probe-0"))).wait()
        assert writer.wal is not None
        costs = writer.wal.cache_bytes, writer.wal.uncommitted_bytes
    assert min(costs) > 0
    return costs


@pytest.mark.trio
async def test_a_half_full_cache_starts_a_commit_before_its_records_leave_it(
    tmp_path: Path,
) -> None:
    """A busy log commits once its cache is half full, so no group is ever read back.

    Neither the interval (an hour) nor ``commit_max_bytes`` (twenty records)
    would start a commit here; the cache, room for 4.5 records, does once
    three wait (and with them more than an eighth of ``commit_max_bytes``).
    Without the rule the cache would fill with the oldest records and the
    one commit at the stop would read the rest back from the files.
    """
    cost, log_bytes = await record_costs(tmp_path / "probe")
    settings = WriterSettings(commit_interval_seconds=3600, commit_max_bytes=20 * log_bytes)
    wal = replace(SMALL_LOG, cache_bytes=4 * cost + cost // 2)
    async with writing(tmp_path, settings, wal=wal) as writer:
        for round_ in range(4):
            # Three records pass half of 4.5 records' room: a commit is due.
            for i in range(3 * round_, 3 * round_ + 3):
                await (await writer.submit(block(f"h-{i}"))).wait()
            with trio.fail_after(30):
                while writer.commits < round_ + 1:
                    await trio.sleep(0.02)
    assert batch_ids(tmp_path) == ids("h", 12)
    assert (writer.commits, writer.cached_reads, writer.file_reads) == (4, 4, 0)


@pytest.mark.trio
async def test_a_cache_too_small_for_the_load_reads_back_instead_of_committing_per_record(
    tmp_path: Path,
) -> None:
    """Under the floor (an eighth of ``commit_max_bytes``) a half-full cache starts nothing.

    The cache holds two records; twelve wait for the stop, which commits
    them in one group: the two it kept, from memory, and the ten it could not
    keep, read back from the files.
    """
    cost, log_bytes = await record_costs(tmp_path / "probe")
    settings = WriterSettings(commit_interval_seconds=3600, commit_max_bytes=200 * log_bytes)
    wal = replace(SMALL_LOG, cache_bytes=2 * cost)
    async with writing(tmp_path, settings, wal=wal) as writer:
        for i in range(12):
            await (await writer.submit(block(f"s-{i}"))).wait()
        assert writer.commits == 0
    assert batch_ids(tmp_path) == ids("s", 12)
    assert (writer.commits, writer.cached_reads, writer.file_reads) == (1, 1, 1)


@pytest.mark.trio
async def test_a_resend_is_never_logged_twice_in_any_state(tmp_path: Path) -> None:
    metrics = Metrics(process=False)
    async with writing(tmp_path, metrics=metrics) as writer:
        first = await writer.submit(block("dup-1"))
        # In flight: the resend waits on the first copy's append.
        in_flight = await writer.submit(block("dup-1"))
        assert in_flight.duplicate
        await first.wait()
        await in_flight.wait()
        # Durable in the log, not committed: acked again at once.
        logged_again = await writer.submit(block("dup-1"))
        assert logged_again.duplicate
        assert logged_again.done
        assert writer.wal is not None
        assert writer.wal.stats.appends == 1
        assert "appliance_wal_appends_total 1.0" in metrics.exposition()[0].decode()
    async with writing(tmp_path) as writer:
        # Committed (seeded from the table at the restart).
        committed = await writer.submit(block("dup-1"))
        assert committed.duplicate
    assert batch_ids(tmp_path) == ["dup-1"] * 3  # one block of three rows
    text = metrics.exposition()[0].decode()
    assert 'appliance_lake_dedupe_hits_total{state="pending"} 1.0' in text
    assert 'appliance_lake_dedupe_hits_total{state="logged"} 1.0' in text


@pytest.mark.trio
async def test_a_crash_leaves_acked_records_that_the_restart_commits_once(tmp_path: Path) -> None:
    by_bytes = WriterSettings(commit_interval_seconds=3600, commit_max_bytes=1000)
    async with writing(tmp_path, by_bytes, crash=True) as writer:
        for i in range(6):  # about 1,100 bytes: one commit
            await (await writer.submit(block(f"k-{i}"))).wait()
        with trio.fail_after(30):
            while writer.commits < 1:
                await trio.sleep(0.02)
        for i in range(6, 10):  # about 750 bytes: acked, only in the log
            await (await writer.submit(block(f"k-{i}"))).wait()
    # Some records were committed before the crash, some only logged.
    assert batch_ids(tmp_path) == ids("k", 6)
    async with writing(tmp_path) as writer:
        # Replayed at open, before anything new is taken.
        assert batch_ids(tmp_path) == ids("k", 10)
        resent = await writer.submit(block("k-9"))
        assert resent.duplicate
    assert batch_ids(tmp_path) == ids("k", 10)


@pytest.mark.trio
async def test_a_crash_after_the_commit_but_before_the_log_moved_on_writes_nothing_twice(
    tmp_path: Path,
) -> None:
    async with writing(tmp_path, crash=True) as writer:
        for i in range(4):
            await (await writer.submit(block(f"m-{i}"))).wait()
    saved = tmp_path / "saved-wal"
    shutil.copytree(tmp_path / "wal", saved)
    # The next start commits the backlog (its replay) and deletes it...
    async with writing(tmp_path) as writer:
        pass
    assert batch_ids(tmp_path) == ids("m", 4)
    # ...but say the process died right after that commit, before the log
    # forgot the records: they are back on disk, and the table says how far it holds them.
    shutil.rmtree(tmp_path / "wal")
    shutil.copytree(saved, tmp_path / "wal")
    async with writing(tmp_path) as writer:
        assert writer.wal is not None
        assert writer.wal.uncommitted_bytes == 0
    assert batch_ids(tmp_path) == ids("m", 4)


@pytest.mark.trio
@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
async def test_replay_keeps_every_record_before_a_damaged_tail(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with writing(tmp_path, crash=True) as writer:
        for i in range(5):
            await (await writer.submit(block(f"d-{i}"))).wait()
        assert writer.wal is not None
        last = writer.wal.segments()[-1]
    segment = tmp_path / "wal" / last.name
    data = segment.read_bytes()
    assert len(data) == last.valid_bytes
    # The last record (d-4) is torn: cut in its body, or one byte of it flipped.
    if damage == "truncated":
        segment.write_bytes(data[:-7])
    else:
        segment.write_bytes(data[:-7] + bytes([data[-7] ^ 0x40]) + data[-6:])
    with caplog.at_level(logging.INFO):
        async with writing(tmp_path) as writer:
            pass
    assert batch_ids(tmp_path) == ids("d", 4)
    truncated = logged(caplog, "wal.tail_truncated")
    assert len(truncated) == 1
    assert truncated[0]["segment"] == last.name


@pytest.mark.trio
async def test_a_record_that_cannot_be_committed_is_named_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with writing(tmp_path, crash=True) as writer:
        await (await writer.submit(block("ok-1"))).wait()
        assert writer.wal is not None
        # A CRC-valid record whose body is no block (only a bug or a forged file makes one).
        bad = await writer.wal.append(b"\x93not a block", rows=1)
        end = writer.wal.durable_end
    with caplog.at_level(logging.INFO):
        async with writing(tmp_path) as writer:
            assert writer.lost_records == 1
    assert batch_ids(tmp_path) == ["ok-1"] * 3
    assert [f["lsn"] for f in logged(caplog, "wal.record_unstorable")] == [bad]
    # The table's position moved past it (a commit of no rows): no restart reads it again.
    assert table_position(tmp_path) == end


@pytest.mark.trio
async def test_a_bad_block_is_refused_alone_before_the_log(tmp_path: Path) -> None:
    async with writing(tmp_path) as writer:
        good = await writer.submit(block("good"))
        bad = block("bad")
        bad.records[0] = "\ud800"  # a lone surrogate: not UTF-8
        with pytest.raises(BlockRefused):
            await writer.submit(bad)
        big = block("big", rows=300)  # a record over the log's 4096 bytes
        with pytest.raises(BlockRefused, match="cannot be logged"):
            await writer.submit(big)
        await good.wait()
        assert writer.wal is not None
        assert writer.wal.stats.appends == 1
    assert batch_ids(tmp_path) == ["good"] * 3


@pytest.mark.trio
async def test_at_the_cap_submit_waits_for_the_table(tmp_path: Path) -> None:
    settings = WriterSettings(commit_interval_seconds=0.5, retry_initial_seconds=0.05)
    capped = WalSettings(segment_bytes=4096, max_record_bytes=4096, max_bytes=8192)
    async with writing(tmp_path, settings, wal=capped) as writer:
        assert writer.wal is not None
        tickets = []
        with trio.fail_after(60):
            for i in range(100):  # 19 KB of records through an 8 KB log
                tickets.append(await writer.submit(block(f"cap-{i}")))
                assert writer.wal.total_bytes <= capped.max_bytes
            for ticket in tickets:
                await ticket.wait()
        assert writer.wal.stats.cap_waits > 0
    assert batch_ids(tmp_path) == ids("cap", 100)


@pytest.mark.trio
async def test_ack_commit_drains_a_log_left_by_ack_wal(tmp_path: Path) -> None:
    async with writing(tmp_path, crash=True) as writer:
        for i in range(3):
            await (await writer.submit(block(f"left-{i}"))).wait()
    assert not rows_of(tmp_path / "events")
    writer = LakeWriter(EventsTable(str(tmp_path / "events")), APP_ID, SLOW, token=_token())
    await writer.open()
    await writer.drain_log(WriteAheadLog(tmp_path / "wal", SMALL_LOG))
    assert batch_ids(tmp_path) == ids("left", 3)
    # ack = "commit" carries on as before, with the batch ids of the log remembered.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        again = await writer.submit(block("left-0"))
        await again.wait()
        assert again.duplicate
        await writer.close_input()


def test_a_large_group_is_converted_in_slices_to_the_same_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from appliance.lake import committer as committer_module
    from appliance.lake.arrow import blocks_to_arrow

    monkeypatch.setattr(committer_module, "ARROW_SLICE_ROWS", 7)
    blocks = [block(f"s-{i}", rows=1 + i % 4) for i in range(11)]
    sliced = committer_module.to_arrow(blocks)
    assert sliced.num_rows == sum(b.rows for b in blocks)
    assert sliced.equals(blocks_to_arrow(blocks))
    assert sliced.column("record").num_chunks > 1


@pytest.mark.trio
async def test_the_arrow_library_loads_with_the_first_rows_not_at_the_first_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow stays out of an idle writer, and is loaded once rows arrive, before any commit.

    (This test process has pyarrow loaded already: the load is observed as a
    call, made in a worker thread.)
    """
    import threading

    import appliance.lake.writer as writer_module

    loads: list[str] = []
    monkeypatch.setattr(
        writer_module, "load_arrow", lambda: loads.append(threading.current_thread().name)
    )
    async with writing(tmp_path, SLOW) as writer:
        await trio.sleep(1)
        assert loads == []  # idle: nothing loaded
        await (await writer.submit(block("empty", rows=0))).wait()
        await trio.sleep(1)
        assert loads == []  # no rows, nothing to convert
        await (await writer.submit(block("first"))).wait()
        with trio.fail_after(30):
            while not loads:
                await trio.sleep(0.01)
        assert writer.commits == 0  # before the first commit (SLOW: an hour apart)
        await (await writer.submit(block("second"))).wait()
    assert len(loads) == 1
    assert loads[0] != threading.main_thread().name
