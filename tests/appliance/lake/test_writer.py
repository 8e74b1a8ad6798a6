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

from appliance.blocks.block import RowBlock
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
    )


def rows_of(path: Path) -> list[dict[str, object]]:
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


async def start_writer(
    nursery: trio.Nursery, path: Path, settings: WriterSettings = FAST, app_id: str = "node-a"
) -> LakeWriter:
    # One token per app id, as one state directory has: a restart reclaims its app id.
    token = int.from_bytes(app_id.encode()[:7].ljust(7, b"\0"), "big")
    writer = LakeWriter(EventsTable(str(path)), app_id, settings, token=token)
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
async def test_parquet_statistics_only_for_the_indexed_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        await (await writer.submit(block("chunk-1"))).wait()
        await writer.close_input()
    dt = DeltaTable(str(tmp_path / "events"))
    indexed = dt.metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    files = dt.file_uris()
    assert len(files) == 1
    metadata = pq.ParquetFile(files[0]).metadata
    assert metadata.num_rows == 3
    group = metadata.row_group(0)
    with_stats = {
        group.column(i).path_in_schema
        for i in range(group.num_columns)
        if group.column(i).is_stats_set
    }
    # The partition column is in the path, not the file; host is all null here
    # (its statistics are a null count).
    assert with_stats == {name for name in indexed if name != "event_date"}
    assert not {"record", "peer", "batch_id"} & with_stats
    assert group.column(0).compression == "SNAPPY"
    # The Delta statistics of the indexed columns are still written.
    stats = pa.table(dt.get_add_actions(flatten=True)).to_pylist()[0]
    assert stats["max.event_time_ns"] - stats["min.event_time_ns"] == 2  # the block's 3 times
    assert stats["min.tag"] == "t"
    assert "min.record" not in stats


@pytest.mark.trio
async def test_group_commit_puts_many_blocks_in_one_commit(tmp_path: Path) -> None:
    settings = WriterSettings(commit_max_delay_seconds=0.5)
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events", settings)
        tickets = [await writer.submit(block(f"chunk-{i}")) for i in range(20)]
        for ticket in tickets:
            await ticket.wait()
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
            await first.wait()
            await second.wait()
        await writer.close_input()
    assert writer.commits == 1


@pytest.mark.trio
async def test_committed_batch_resent_is_acked_without_second_write(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        await (await writer.submit(block("chunk-1"))).wait()
        again = await writer.submit(block("chunk-1"))
        await again.wait()
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
        await first.wait()
        await second.wait()
        await writer.close_input()
    assert writer.duplicates == 1
    assert len(rows_of(tmp_path / "events")) == 3


@pytest.mark.trio
async def test_same_chunk_from_another_source_is_not_a_duplicate(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        await (await writer.submit(block("chunk-1", source="alice"))).wait()
        await (await writer.submit(block("chunk-1", source="bob"))).wait()
        await writer.close_input()
    assert len(rows_of(tmp_path / "events")) == 6


@pytest.mark.trio
async def test_blocks_without_id_are_never_deduplicated(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, tmp_path / "events")
        for _ in range(2):
            await (await writer.submit(block(None))).wait()
        await writer.close_input()
    assert len(rows_of(tmp_path / "events")) == 6


@pytest.mark.trio
async def test_every_commit_carries_an_app_transaction(tmp_path: Path) -> None:
    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path, app_id="node-7")
        for i in range(3):
            await (await writer.submit(block(f"c{i}"))).wait()
        await writer.close_input()
    dt = DeltaTable(str(path))
    assert dt.transaction_version("node-7") == writer.commits
    # A restarted writer continues the sequence instead of reusing it.
    async with trio.open_nursery() as nursery:
        again = await start_writer(nursery, path, app_id="node-7")
        await (await again.submit(block("c-next"))).wait()
        await again.close_input()
    dt.update_incremental()
    assert dt.transaction_version("node-7") == writer.commits + 1


def test_commit_retried_with_same_version_is_not_applied_twice(tmp_path: Path) -> None:
    from appliance.lake.arrow import blocks_to_arrow

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
        await (await writer.submit(block("chunk-before-restart"))).wait()
        await writer.close_input()
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        ticket = await writer.submit(block("chunk-before-restart"))
        await ticket.wait()
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
        await (await writer.submit(block("warm-up"))).wait()
        with read_only_dir(path / "_delta_log") as fault:
            fault.break_()
            ticket = await writer.submit(block("during-fault"))
            with trio.move_on_after(1.5):
                await ticket.wait()
            assert not ticket.done, "acknowledged while the table could not be written"
            assert writer.failed_attempts >= 2
            fault.heal()
            with trio.fail_after(30):
                await ticket.wait()
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
        await (await writer.submit(block("warm-up"))).wait()
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


def _with(base: RowBlock, **changes: object) -> RowBlock:
    import dataclasses

    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


BAD_BLOCKS = {
    "tag not UTF-8": {"tag": "a\udcffb"},
    "lone surrogate tag": {"tag": "\ud800"},
    "tag over its limit": {"tag": "t" * 1_000_000},
    "host lone surrogate": {"host": "\ud800"},
    "per-row host not UTF-8": {"host": ["h", "\udcff", None]},
    "chunk over its limit": {"batch_id": "c" * 1_000_000},
    "empty chunk": {"batch_id": ""},
    "chunk lone surrogate": {"batch_id": "\ud800"},
    "source lone surrogate": {"source": "\ud800"},
    "time before int64 ns": {"times_ns": [-(2**63) - 1, None, None]},
    "time after int64 ns": {"times_ns": [2**63, None, None]},
    "record not UTF-8": {"records": ["{}", '{"a":"\ud800"}', "{}"]},
    "fewer times than records": {"times_ns": [None]},
}


@pytest.mark.parametrize("changes", BAD_BLOCKS.values(), ids=BAD_BLOCKS.keys())
@pytest.mark.trio
async def test_a_block_that_cannot_be_stored_is_refused_alone(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    """A bad block fails its own submit; the good blocks of the same moment commit."""
    from appliance.blocks.errors import BlockRefused

    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        good_before = await writer.submit(block("good-1"))
        with pytest.raises(BlockRefused):
            await writer.submit(_with(block("bad"), **changes))
        good_after = await writer.submit(block("good-2"))
        await good_before.wait()
        await good_after.wait()
        await writer.close_input()
    assert sorted({r["batch_id"] for r in rows_of(path)}) == ["good-1", "good-2"]


@pytest.mark.trio
async def test_a_group_that_fails_to_convert_refuses_only_the_bad_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: should a block pass the check and still break Arrow, it fails alone."""
    import pyarrow as pa

    from appliance.blocks.errors import BlockRefused
    from appliance.lake import committer as committer_module

    real = committer_module.blocks_to_arrow

    def fragile(blocks: list[RowBlock]) -> pa.Table:
        if any(b.batch_id == "poison" for b in blocks):
            raise pa.ArrowInvalid("offset overflow")
        return real(blocks)

    monkeypatch.setattr(committer_module, "blocks_to_arrow", fragile)
    path = tmp_path / "events"
    settings = WriterSettings(commit_max_delay_seconds=0.3)
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path, settings)
        tickets = [await writer.submit(block(b)) for b in ("a", "poison", "b")]
        await tickets[0].wait()
        await tickets[2].wait()
        with pytest.raises(BlockRefused):
            await tickets[1].wait()
        await writer.close_input()
    assert writer.refused_blocks == 1
    assert sorted({r["batch_id"] for r in rows_of(path)}) == ["a", "b"]


@pytest.mark.trio
async def test_anonymous_peers_do_not_share_a_dedupe_scope(tmp_path: Path) -> None:
    """Two unauthenticated clients that reuse a chunk id each get their rows written."""
    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        writer = await start_writer(nursery, path)
        one = _with(block("chunk-1", source="anonymous"), peer="10.0.0.1:5000")
        other = _with(block("chunk-1", source="anonymous"), peer="10.0.0.2:5000")
        same_host_new_port = _with(block("chunk-1", source="anonymous"), peer="10.0.0.1:6000")
        await (await writer.submit(one)).wait()
        await (await writer.submit(other)).wait()
        resent = await writer.submit(same_host_new_port)
        await resent.wait()
        assert resent.duplicate, "a resend from the same address after reconnecting is a resend"
        await writer.close_input()
    assert len(rows_of(path)) == 6


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("10.0.0.1:5000", "10.0.0.1"),
        ("[2001:db8::5]:5000", "2001:db8::5"),
        ("2001:db8::5", "2001:db8::5"),  # ZeroMQ's Peer-Address has no port
        ("10.0.0.1", "10.0.0.1"),
    ],
)
def test_dedupe_scope_of_anonymous_peers_is_their_address(peer: str, address: str) -> None:
    from appliance.blocks.identity import dedupe_scope

    assert dedupe_scope("anonymous", peer) == f"anonymous@{address}"
    assert dedupe_scope("CN=shipper", peer) == "CN=shipper"
    assert dedupe_scope("anonymous", "2001:db8::6") != dedupe_scope("anonymous", "2001:db8::5")


@pytest.mark.trio
async def test_a_second_writer_with_the_same_app_id_refuses_to_start(tmp_path: Path) -> None:
    from appliance.lake.errors import AppIdInUse

    path = tmp_path / "events"
    async with trio.open_nursery() as nursery:
        first = await start_writer(nursery, path, app_id="shared")
        await (await first.submit(block("a"))).wait()
        clone = LakeWriter(EventsTable(str(path)), "shared", FAST, token=12345)
        with pytest.raises(AppIdInUse, match="app id 'shared' is in use"):
            await clone.open()
        await first.close_input()


@pytest.mark.trio
async def test_a_writer_never_takes_another_writers_version_for_its_own(tmp_path: Path) -> None:
    """Should a duplicate get past the lease, the first writer stops acking."""
    import time as clock

    from appliance.lake.arrow import blocks_to_arrow
    from appliance.lake.errors import AppIdInUse

    path = tmp_path / "events"
    with pytest.raises(BaseExceptionGroup) as caught:  # noqa: PT012 - the writer fails in it
        async with trio.open_nursery() as nursery:
            first = await start_writer(nursery, path, app_id="shared")
            await (await first.submit(block("a"))).wait()
            # Another process under the same app id commits the next version
            # (its lease claim forced through, as after an expired lease).
            other = EventsTable(str(path))
            other.open_or_create()
            other.claim("shared", 999, clock.time_ns() // 1_000_000, lease_ms=0)
            assert other.commit(blocks_to_arrow([block("theirs")]), "shared", 2, 999, 1)
            ticket = await first.submit(block("mine"))
            with trio.move_on_after(10):
                await ticket.wait()
            assert not ticket.done, "acked on a version another writer wrote"
    assert caught.group_contains(AppIdInUse)
    assert "mine" not in {r["batch_id"] for r in rows_of(path)}
