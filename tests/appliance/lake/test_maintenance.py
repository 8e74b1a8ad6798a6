"""Table maintenance: compaction, checkpoints, vacuum, the lock and the service's schedule.

Real Delta tables on disk and trio's real clock (the writer waits on worker
threads). Nothing asserts a duration: waits are bounded only to fail a hung test.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from deltalake import DeltaTable

from appliance.blocks.block import RowBlock
from appliance.config import Config, ConfigError, MaintenanceConfig, SparkConfig, parse_config
from appliance.lake import maintenance, operations, schedule
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.errors import LakeError
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from tests.appliance.lake.logcapture import logged
from tests.support.cli import run_cli

FAST = WriterSettings(
    commit_max_delay_seconds=0.01, retry_initial_seconds=0.05, retry_max_seconds=0.2
)
#: Bound on waits for something the test expects to happen.
PATIENCE_SECONDS = 60


def block(n: int, rows: int = 3) -> RowBlock:
    now = time.time_ns()
    return RowBlock(
        protocol="forward",
        source="s",
        peer="127.0.0.1:1",
        received_at_ns=now,
        batch_id=f"chunk-{n}",
        tag=f"t{n % 3}",
        host=None,
        times_ns=[now + i for i in range(rows)],
        records=[f'{{"n":{n},"i":{i}}}' for i in range(rows)],
    )


def sorted_rows(uri: str, version: int | None = None) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, version=version).to_pyarrow_table()
    return sorted(tuple(r.values()) for r in table.to_pylist())


@pytest.fixture
def small_files(tmp_path: Path) -> str:
    """An events table of twelve one-commit files."""
    table = EventsTable(str(tmp_path / "events"))
    table.open_or_create()
    for n in range(12):
        assert table.commit(blocks_to_arrow([block(n)]), "node", n + 1)
    return table.uri


def test_compaction_reduces_files_and_keeps_rows(small_files: str) -> None:
    rows = sorted_rows(small_files)
    result = maintenance.compact(small_files)
    assert result.before.files == 12
    assert result.after.files < result.before.files
    assert result.after.rows == result.before.rows == 36
    assert result.after.version == result.before.version + 1
    assert result.details["numFilesRemoved"] == 12
    assert sorted_rows(small_files) == rows
    # Still reader 1 / writer 2 for every Spark with delta-spark.
    protocol = DeltaTable(small_files).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)


def test_stats_count_files_bytes_and_partitions(small_files: str) -> None:
    stats = maintenance.table_stats(small_files)
    sizes = [os.path.getsize(p) for p in DeltaTable(small_files).file_uris()]
    assert stats.files == 12
    assert stats.bytes == sum(sizes)
    assert stats.smallest_file_bytes == min(sizes)
    assert stats.largest_file_bytes == max(sizes)
    assert stats.partitions == 1
    assert stats.rows == 36
    with pytest.raises(LakeError, match="no Delta table"):
        maintenance.table_stats(str(Path(small_files).parent / "missing"))


def test_checkpoint_writes_a_checkpoint(small_files: str) -> None:
    result = maintenance.checkpoint(small_files)
    log_dir = Path(small_files) / "_delta_log"
    assert (log_dir / f"{result.after.version:020d}.checkpoint.parquet").exists()
    assert (log_dir / "_last_checkpoint").exists()
    assert result.after.files == result.before.files


def test_vacuum_keeps_the_retention_floor(small_files: str) -> None:
    maintenance.compact(small_files)
    replaced = 12
    with pytest.raises(ValueError, match="below the floor of 168 h"):
        maintenance.vacuum(small_files, retention_hours=1)
    # At the floor, the files the compaction replaced just now are kept.
    kept = maintenance.vacuum(small_files)
    assert kept.details["files_deleted"] == 0
    dry = maintenance.vacuum(
        small_files, retention_hours=0, allow_short_retention=True, dry_run=True
    )
    assert dry.details["files_to_delete"] == replaced
    done = maintenance.vacuum(small_files, retention_hours=0, allow_short_retention=True)
    assert done.details["files_deleted"] == replaced
    assert sorted_rows(small_files)  # the live files are untouched


def test_the_lock_is_exclusive_even_within_one_process(tmp_path: Path) -> None:
    path = operations.lock_path(tmp_path)
    busy = pytest.raises(operations.MaintenanceBusy, match="maintenance already running")
    with operations.MaintenanceLock(path), busy:
        operations.MaintenanceLock(path).acquire()
    with operations.MaintenanceLock(path):  # released, so it can be taken again
        pass


def test_cli_refuses_while_maintenance_runs_elsewhere(small_files: str, tmp_path: Path) -> None:
    state = Path(small_files).parent
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{state}"\n[lake]\npath = "{small_files}"\n')

    cli = functools.partial(run_cli, "table", config=config)

    with operations.MaintenanceLock(operations.lock_path(state)):
        busy = cli("compact")
    assert busy.returncode == 1
    assert "maintenance already running" in busy.stderr
    assert DeltaTable(small_files).version() == 12, "nothing was compacted"

    done = cli("compact")
    assert done.returncode == 0, done.stderr
    assert "before" in done.stdout
    assert "after" in done.stdout
    assert maintenance.table_stats(small_files).files < 12

    short = cli("vacuum", "--retention-hours", "1")
    assert short.returncode == 1
    assert "below the floor" in short.stderr
    stats = cli("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert '"files": 1' in stats.stdout


async def _writer(nursery: trio.Nursery, uri: str) -> LakeWriter:
    writer = LakeWriter(EventsTable(uri), "node-a", FAST)
    await writer.open()
    nursery.start_soon(writer.run)
    return writer


@pytest.mark.trio
async def test_run_exclusive_never_overlaps_a_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    started = threading.Event()
    release = threading.Event()

    def maintenance_job(result: str) -> str:
        started.set()
        assert release.wait(PATIENCE_SECONDS)
        return result

    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        async with trio.open_nursery() as inner:
            outcome: list[str] = []

            async def exclusive() -> None:
                outcome.append(await writer.run_exclusive(maintenance_job, "done"))

            inner.start_soon(exclusive)
            await trio.to_thread.run_sync(started.wait)
            ticket = await writer.submit(block(1))
            # The group is sealed and due, but the commit needs the limiter
            # that the maintenance job holds.
            await trio.sleep(0.2)
            assert not ticket.done
            assert writer.commits == 0
            release.set()
        assert outcome == ["done"]
        with trio.fail_after(PATIENCE_SECONDS):
            await ticket.wait()
        assert writer.commits == 1
        await writer.close_input()


@pytest.mark.trio
async def test_compaction_through_the_writer_while_ingest_continues(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        tickets = []
        for n in range(10):
            tickets.append(await writer.submit(block(n)))
            with trio.fail_after(PATIENCE_SECONDS):
                await tickets[-1].wait()
        files_before = maintenance.table_stats(uri).files
        compaction: list[operations.MaintenanceResult] = []

        async def compact() -> None:
            compaction.append(await writer.run_exclusive(maintenance.compact, uri))

        nursery.start_soon(compact)
        for n in range(10, 40):
            tickets.append(await writer.submit(block(n)))
        with trio.fail_after(PATIENCE_SECONDS):
            for ticket in tickets:
                await ticket.wait()
        await writer.close_input()
    assert compaction[0].after.files < files_before
    assert compaction[0].after.files < compaction[0].before.files
    table = DeltaTable(uri)
    assert table.count() == 40 * 3
    assert len({r["batch_id"] for r in table.to_pyarrow_table().to_pylist()}) == 40


@pytest.mark.trio
async def test_the_schedule_runs_every_operation_and_skips_while_locked(
    tmp_path: Path, info_log: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "events")
    config = Config(
        state_dir=tmp_path,
        maintenance=MaintenanceConfig(
            compact_interval_seconds=0.05,
            checkpoint_interval_seconds=0.07,
            vacuum_interval_seconds=0.09,
        ),
    )
    config = replace(config, lake=replace(config.lake, path=uri))
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        for n in range(6):
            ticket = await writer.submit(block(n))
            with trio.fail_after(PATIENCE_SECONDS):
                await ticket.wait()
        # While the CLI (here: this test) holds the lock, rounds are skipped.
        with operations.MaintenanceLock(operations.lock_path(tmp_path)):
            nursery.start_soon(schedule.run_maintenance, writer, config)
            with trio.fail_after(PATIENCE_SECONDS):
                while not logged(info_log, "maintenance.skipped"):
                    await trio.sleep(0.01)
            # Version 0 creates the table, 1 is the writer's claim on its app id.
            assert DeltaTable(uri).version() == 7
        with trio.fail_after(PATIENCE_SECONDS):
            while {e.get("operation") for e in logged(info_log, "maintenance.done")} != {
                "compact",
                "checkpoint",
                "vacuum",
            }:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert maintenance.table_stats(uri).files == 1
    assert (Path(uri) / "_delta_log" / "_last_checkpoint").exists()
    assert not logged(info_log, "maintenance.failed")


@pytest.mark.trio
async def test_a_disabled_schedule_returns_at_once(tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path, maintenance=MaintenanceConfig(enabled=False))
    writer = LakeWriter(EventsTable(str(tmp_path / "events")), "node-a", FAST)
    with trio.fail_after(PATIENCE_SECONDS):
        await schedule.run_maintenance(writer, config)


def test_config_sections_and_the_retention_floor(tmp_path: Path) -> None:
    config = parse_config(
        "[maintenance]\ncompact_interval_seconds = 600\ntarget_file_bytes = 1048576\n"
        '[spark]\nremote = "sc://spark.example:15002"\nderived_path = "s3://bucket/derived"\n'
    )
    assert config.maintenance.compact_interval_seconds == 600
    assert config.maintenance.target_file_bytes == 1_048_576
    assert config.maintenance.vacuum_retention_hours == 168
    assert config.spark.remote == "sc://spark.example:15002"
    assert config.derived_table_uri("events_per_minute") == "s3://bucket/derived/events_per_minute"
    assert Config(state_dir=tmp_path).derived_table_uri("x") == f"{tmp_path}/lake/x"

    with pytest.raises(ConfigError, match=r"maintenance: vacuum retention of 24 h is below"):
        parse_config("[maintenance]\nvacuum_retention_hours = 24\n", "a.toml")
    allowed = parse_config(
        "[maintenance]\nvacuum_retention_hours = 24\nallow_short_vacuum_retention = true\n"
    )
    assert allowed.maintenance.vacuum_retention_hours == 24
    with pytest.raises(ConfigError, match="spark: remote must be a Spark Connect URL"):
        parse_config('[spark]\nremote = "http://x"\n')
    with pytest.raises(ValueError, match="Spark Connect"):
        SparkConfig(remote="localhost:15002")
