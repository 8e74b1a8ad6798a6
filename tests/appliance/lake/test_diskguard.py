"""The disk guard (appliance/lake/diskguard.py): unit tests and the writer's refusal.

The end-to-end test on a real small filesystem is test_diskguard_tmpfs.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from deltalake import DeltaTable

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.config import ConfigError, LakeConfig, parse_config, settings_from
from appliance.lake import diskguard
from appliance.lake.diskguard import DiskGuard, DiskSpace
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from tests.appliance.lake.logcapture import logged

MIB = 1024**2
PATIENCE_SECONDS = 60


class Disk:
    """A filesystem whose free space the test sets, and a clock the test moves."""

    def __init__(self, total: int, free: int) -> None:
        self.total = total
        self.free = free
        self.now = 0.0
        self.measured = 0

    def measure(self, path: str) -> DiskSpace:
        self.measured += 1
        return DiskSpace(self.total, self.free)

    def clock(self) -> float:
        return self.now


def test_below_the_watermark_refuses_and_above_it_resumes(
    info_log: pytest.LogCaptureFixture,
) -> None:
    disk = Disk(total=1000 * MIB, free=500 * MIB)
    guard = DiskGuard("/t", 100 * MIB, 5.0, clock=disk.clock, measure=disk.measure)
    assert guard.refusal() is None
    guard.check()

    disk.free = 99 * MIB
    disk.now += diskguard.CHECK_INTERVAL_SECONDS
    with pytest.raises(BlockRefused, match=r"^disk nearly full: 99\.0 MiB free") as refused:
        guard.check()
    assert "watermark of 100.0 MiB" in refused.value.reason
    assert guard.refused == 1

    disk.free = 200 * MIB
    disk.now += diskguard.CHECK_INTERVAL_SECONDS
    guard.check()
    assert guard.reason is None
    # One line when entering the state, one when leaving it.
    assert len(logged(info_log, "disk_guard.refusing")) == 1
    resumed = logged(info_log, "disk_guard.resumed")
    assert len(resumed) == 1
    assert resumed[0]["refused_batches"] == 1


def test_the_larger_watermark_wins() -> None:
    space = DiskSpace(total=100 * 1024 * MIB, free=0)
    assert space.watermark(1024 * MIB, 5.0) == 5 * 1024 * MIB  # 5% of 100 GiB
    assert space.watermark(10 * 1024 * MIB, 5.0) == 10 * 1024 * MIB
    disk = Disk(total=100 * 1024 * MIB, free=4 * 1024 * MIB)  # 4 GiB: above 1 GiB, below 5%
    guard = DiskGuard("/t", 1024 * MIB, 5.0, clock=disk.clock, measure=disk.measure)
    assert guard.refusal() is not None


def test_statvfs_runs_at_most_once_per_interval() -> None:
    disk = Disk(total=1000 * MIB, free=500 * MIB)
    guard = DiskGuard("/t", MIB, 1.0, clock=disk.clock, measure=disk.measure)
    for _ in range(1000):
        guard.check()
    assert disk.measured == 1
    disk.free = 0
    guard.check()  # the cached answer is still used
    disk.now += diskguard.CHECK_INTERVAL_SECONDS
    with pytest.raises(BlockRefused):
        guard.check()
    assert disk.measured == 2


def test_a_failing_statvfs_does_not_refuse() -> None:
    def broken(path: str) -> DiskSpace:
        raise OSError(5, "Input/output error")

    guard = DiskGuard("/t", MIB, 1.0, measure=broken)
    assert guard.refusal() is None


def test_object_storage_has_no_guard(info_log: pytest.LogCaptureFixture) -> None:
    assert DiskGuard.for_table("s3://bucket/events", MIB, 5.0) is None
    assert logged(info_log, "disk_guard.off")[0]["table"] == "s3://bucket/events"
    assert diskguard.local_path("file:///var/lake/events") == "/var/lake/events"
    assert diskguard.local_path("/var/lake/events") == "/var/lake/events"
    assert diskguard.local_path("gs://b/events") is None
    local = DiskGuard.for_table("/var/lake/events", MIB, 5.0)
    assert local is not None
    assert local.path == "/var/lake/events"


def test_the_real_statvfs_of_a_table_not_yet_created(tmp_path: Path) -> None:
    space = diskguard.disk_space(str(tmp_path / "not" / "yet" / "events"))
    assert 0 < space.free <= space.total


def test_settings_and_config() -> None:
    lake = LakeConfig()
    assert lake.disk_guard is True
    assert lake.min_free_bytes == 1024**3
    assert lake.min_free_percent == 5.0
    settings = settings_from(lake, WriterSettings)
    assert (settings.disk_guard, settings.min_free_bytes, settings.min_free_percent) == (
        True,
        1024**3,
        5.0,
    )
    # A writer built without the config has no guard.
    assert WriterSettings().disk_guard is False
    config = parse_config("[lake]\nmin_free_bytes = 10485760\nmin_free_percent = 0.5\n")
    assert config.lake.min_free_bytes == 10 * MIB
    assert config.lake.min_free_percent == 0.5
    with pytest.raises(ConfigError, match="min_free_percent must be below 100"):
        parse_config("[lake]\nmin_free_percent = 100\n")
    unguarded = parse_config("[lake]\ndisk_guard = false\n").lake
    assert settings_from(unguarded, WriterSettings).disk_guard is False
    with pytest.raises(ValueError, match="min_free_percent"):
        DiskGuard("/t", 0, 100.0)


def block(n: int) -> RowBlock:
    now = time.time_ns()
    return RowBlock(
        protocol="forward",
        source="s",
        peer="127.0.0.1:1",
        received_at_ns=now,
        batch_id=f"b-{n}",
        tag="t",
        host=None,
        times_ns=[now],
        records=[f'{{"n":{n}}}'],
    )


@pytest.mark.trio
async def test_the_writer_refuses_new_blocks_but_commits_the_accepted_ones(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    settings = WriterSettings(
        commit_max_delay_seconds=0.05, disk_guard=True, min_free_bytes=MIB, min_free_percent=1.0
    )
    writer = LakeWriter(EventsTable(uri), "node-a", settings)
    assert writer.disk_guard is not None
    assert writer.disk_guard.path == uri
    disk = Disk(total=1000 * MIB, free=500 * MIB)
    writer.disk_guard = DiskGuard(uri, MIB, 1.0, clock=disk.clock, measure=disk.measure)
    await writer.open()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        accepted = await writer.submit(block(1))  # queued before the disk fills
        disk.free = MIB // 2
        disk.now += diskguard.CHECK_INTERVAL_SECONDS
        with pytest.raises(BlockRefused, match="disk nearly full"):
            await writer.submit(block(2))
        with trio.fail_after(PATIENCE_SECONDS):
            await accepted.wait()
        # An empty block writes nothing: it is not refused.
        empty = RowBlock("forward", "s", "p", time.time_ns(), None, "t", None, [], [])
        assert (await writer.submit(empty)).done
        disk.free = 500 * MIB
        disk.now += diskguard.CHECK_INTERVAL_SECONDS
        again = await writer.submit(block(2))
        with trio.fail_after(PATIENCE_SECONDS):
            await again.wait()
        await writer.close_input()
    batches = sorted(r["batch_id"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist())
    assert batches == ["b-1", "b-2"]


def test_the_refusal_names_the_settings_and_the_fix() -> None:
    disk = Disk(total=1000 * MIB, free=50 * MIB)
    guard = DiskGuard("/t", 100 * MIB, 5.0, clock=disk.clock, measure=disk.measure)
    assert guard.refusal() == (
        "disk nearly full: 50.0 MiB free on the table's filesystem, below the watermark of "
        "100.0 MiB ([lake] min_free_bytes = 104857600, min_free_percent = 5): expire or erase "
        "old data and vacuum, or add space"
    )


def test_a_disk_smaller_than_the_watermark_says_to_lower_the_setting() -> None:
    """A 64 MiB volume under a 100 MiB min_free_bytes: clean-up cannot help."""
    disk = Disk(total=64 * MIB, free=60 * MIB)
    guard = DiskGuard("/t", 100 * MIB, 5.0, clock=disk.clock, measure=disk.measure)
    reason = guard.refusal()
    assert reason is not None
    assert "holds 64.0 MiB in all" in reason
    assert "lower min_free_bytes or min_free_percent" in reason
