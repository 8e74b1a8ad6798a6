"""The group-commit writer against a real Delta table on disk.

These tests use trio's real clock: the writer waits on worker threads, and
an autojump clock would jump past a commit that is still running.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from deltalake import DeltaTable

from appliance.lake.rows import RowBlock
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from tests.faults import read_only_dir

FAST = WriterSettings(
    commit_max_delay_seconds=0.05, retry_initial_seconds=0.05, retry_max_seconds=0.2
)


def block(batch_id: str | None, rows: int = 3, tag: str = "t", source: str = "s") -> RowBlock:
    now = time.time_ns()
    return RowBlock(
        protocol="forward",
        source=source,
        peer="127.0.0.1:1",
        received_at_ns=now,
        batch_id=batch_id,
        tag=tag,
        host=None,
        times_ns=[now + i for i in range(rows)],
        records=[f'{{"batch":"{batch_id}","i":{i}}}' for i in range(rows)],
        nbytes=20 * rows,
    )


def rows_of(path: Path) -> list[dict[str, object]]:
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


async def start_writer(
    nursery: trio.Nursery, path: Path, settings: WriterSettings = FAST, app_id: str = "node-a"
) -> LakeWriter:
    writer = LakeWriter(EventsTable(str(path)), app_id, settings)
    await writer.open()
    nursery.start_soon(writer.run)
    return writer


@pytest.mark.trio
async def test_table_is_created_readable_by_every_spark(tmp_path: Path) -> None:
    table = EventsTable(str(tmp_path / "events"))
    await trio.to_thread.run_sync(table.open_or_create)
    dt = DeltaTable(str(tmp_path / "events"))
    protocol = dt.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features
    assert not protocol.writer_features
    assert dt.metadata().partition_columns == ["event_date"]
    config = dt.metadata().configuration
    assert config["delta.appendOnly"] == "true"
    assert "record" not in config["delta.dataSkippingStatsColumns"].split(",")
    assert [f.name for f in EVENTS_SCHEMA] == [f.name for f in dt.schema().fields]


@pytest.mark.trio
async def test_group_commit_puts_many_blocks_in_one_commit(tmp_path: Path) -> None:
    settings = WriterSettings(commit_max_delay_seconds=0.5)
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events", settings)
        tickets = [await writer.submit(block(f"chunk-{i}")) for i in range(20)]
        for ticket in tickets:
            assert await ticket.wait()
        await writer.close_input()
    assert writer.commits < 20
    assert writer.rows_committed == 60
    assert len(rows_of(tmp_path / "events")) == 60


@pytest.mark.trio
async def test_group_is_sealed_at_max_rows(tmp_path: Path) -> None:
    settings = WriterSettings(commit_max_rows=6, commit_max_delay_seconds=60)
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events", settings)
        first = await writer.submit(block("a"))
        second = await writer.submit(block("b"))
        # Two blocks of 3 rows reach commit_max_rows: no 60 s wait.
        with trio.fail_after(30):
            assert await first.wait()
            assert await second.wait()
        await writer.close_input()
    assert writer.commits == 1


@pytest.mark.trio
async def test_committed_batch_resent_is_acked_without_second_write(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        assert await (await writer.submit(block("chunk-1"))).wait()
        again = await writer.submit(block("chunk-1"))
        assert await again.wait()
        assert again.duplicate
        await writer.close_input()
    assert len(rows_of(tmp_path / "events")) == 3


@pytest.mark.trio
async def test_pending_batch_resent_joins_the_pending_commit(tmp_path: Path) -> None:
    settings = WriterSettings(commit_max_delay_seconds=0.3)
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events", settings)
        first = await writer.submit(block("chunk-1"))
        second = await writer.submit(block("chunk-1"))
        assert await first.wait()
        assert await second.wait()
        await writer.close_input()
    assert writer.duplicates == 1
    assert len(rows_of(tmp_path / "events")) == 3


@pytest.mark.trio
async def test_same_chunk_from_another_source_is_not_a_duplicate(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        assert await (await writer.submit(block("chunk-1", source="alice"))).wait()
        assert await (await writer.submit(block("chunk-1", source="bob"))).wait()
        await writer.close_input()
    assert len(rows_of(tmp_path / "events")) == 6


@pytest.mark.trio
async def test_blocks_without_id_are_never_deduplicated(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        for _ in range(2):
            assert await (await writer.submit(block(None))).wait()
        await writer.close_input()
    assert len(rows_of(tmp_path / "events")) == 6


@pytest.mark.trio
async def test_every_commit_carries_an_app_transaction(tmp_path: Path) -> None:
    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path, app_id="node-7")
        for i in range(3):
            assert await (await writer.submit(block(f"c{i}"))).wait()
        await writer.close_input()
    dt = DeltaTable(str(path))
    assert dt.transaction_version("node-7") == writer.commits
    # A restarted writer continues the sequence instead of reusing it.
    async with trio.open_nursery() as nursery:
        again = await start_writer(nursery, path, app_id="node-7")
        assert await (await again.submit(block("c-next"))).wait()
        await again.close_input()
    dt.update_incremental()
    assert dt.transaction_version("node-7") == writer.commits + 1


def test_commit_retried_with_same_version_is_not_applied_twice(tmp_path: Path) -> None:
    from appliance.lake.rows import blocks_to_arrow

    table = EventsTable(str(tmp_path / "events"))
    table.open_or_create()
    data = blocks_to_arrow([block("x")])
    assert table.commit(data, "node-a", 1) is True
    # As after a crash between the commit and its acknowledgement.
    assert table.commit(data, "node-a", 1) is False
    assert table.row_count() == 3


@pytest.mark.trio
async def test_restarted_writer_remembers_recent_batches(tmp_path: Path) -> None:
    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        assert await (await writer.submit(block("chunk-before-restart"))).wait()
        await writer.close_input()
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        ticket = await writer.submit(block("chunk-before-restart"))
        assert await ticket.wait()
        assert ticket.duplicate
        await writer.close_input()
    assert len(rows_of(path)) == 3


@pytest.mark.trio
async def test_failed_commit_is_not_acked_and_is_retried_until_it_succeeds(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        assert await (await writer.submit(block("warm-up"))).wait()
        with read_only_dir(path / "_delta_log") as fault:
            fault.break_()
            ticket = await writer.submit(block("during-fault"))
            with trio.move_on_after(1.5):
                await ticket.wait()
            assert not ticket.done, "acknowledged while the table could not be written"
            assert writer.failed_attempts >= 2
            fault.heal()
            with trio.fail_after(30):
                assert await ticket.wait()
        await writer.close_input()
    batches = [r["batch_id"] for r in rows_of(path)]
    assert batches.count("during-fault") == 3


@pytest.mark.trio
async def test_slow_table_fills_the_queue_and_stops_submitters(tmp_path: Path) -> None:
    path = tmp_path / "events"
    settings = WriterSettings(
        commit_max_rows=1, queue_blocks=1, commit_max_delay_seconds=0.01,
        retry_initial_seconds=0.05, retry_max_seconds=0.1,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path, settings)
        assert await (await writer.submit(block("warm-up"))).wait()
        with read_only_dir(path / "_delta_log") as fault:
            fault.break_()
            accepted = 0
            with trio.move_on_after(2):
                for i in range(50):
                    await writer.submit(block(f"b{i}"))
                    accepted += 1
            # committing + sealed + open group + queue: a handful, never all 50.
            assert accepted < 10
            fault.heal()
        await writer.close_input()
    assert len(rows_of(path)) == 3 * (accepted + 1)
