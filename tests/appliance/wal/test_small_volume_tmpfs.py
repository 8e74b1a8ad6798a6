"""The log with its default settings on a real 32 MiB volume: it never locks itself.

The test mounts a tmpfs (it needs root; it is skipped, saying why, when it
cannot mount one). With 64 MiB segments and no rule, the first segment
filled the volume before it was ever closed, and as the active segment it
was never deleted: appends failed with ENOSPC for good, although every
record was committed, and still after a restart. Now:

* ``segment_bytes`` is lowered to a quarter of the volume at open (8 MiB);
* filled to three quarters, committed and refilled three times, with a
  restart in between: no append is refused, and each commit gives the
  space back;
* committing as it goes, three volumes' worth of records go through;
* a volume filled by something else while the active segment holds only
  committed records: the append replaces that segment and goes through.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.wal.log import WriteAheadLog, open_wal
from appliance.wal.settings import COMMITTED_SEGMENT_REPLACE_BYTES, WalSettings
from tests.faults import small_tmpfs

from .walsupport import logged, segment_files

MIB = 1024 * 1024
TMPFS_BYTES = 32 * MIB
#: A record's body: a few hundred make a volume.
RECORD_BYTES = 256 * 1024
#: What each round appends: three quarters of the volume.
FILL_BYTES = TMPFS_BYTES * 3 // 4
#: Fills of the volume, each committed before the next.
ROUNDS = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mountpoint:
        yield mountpoint


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


async def fill_and_commit(wal: WriteAheadLog, first: int, mountpoint: Path) -> int:
    """Append three quarters of the volume, then commit it all; returns the records appended."""
    body = bytes(RECORD_BYTES)
    count = FILL_BYTES // RECORD_BYTES
    for i in range(first, first + count):
        # A refused append (WalWriteError) fails the test here.
        await wal.append(body, key=("p", "s", str(i)), rows=1)
    assert len(wal.segments()) > 1, "the segments never rolled over"
    await wal.mark_committed(wal.durable_end)
    # The commit gave the space back: at most a small active segment is left.
    assert wal.uncommitted_bytes == 0
    assert wal.total_bytes < COMMITTED_SEGMENT_REPLACE_BYTES
    assert free_bytes(mountpoint) > TMPFS_BYTES - 2 * MIB
    return count


@pytest.mark.trio
async def test_filled_committed_and_refilled_three_times_with_a_restart(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = small_disk / "wal"
    settings = WalSettings()
    assert settings.segment_bytes == 64 * MIB  # the defaults: larger than the volume
    appended = 0
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        async with open_wal(directory, 0, settings) as wal:
            assert wal.segment_bytes == TMPFS_BYTES // 4
            for _ in range(2):
                appended += await fill_and_commit(wal, appended, small_disk)
            assert wal.stats.failed_groups == 0
            committed = wal.committed
        # A restart: the log comes back at the committed position and takes a third volume.
        async with open_wal(directory, committed, settings) as wal:
            assert wal.durable_end == committed
            appended += await fill_and_commit(wal, appended, small_disk)
            assert wal.stats.failed_groups == 0
    assert appended * RECORD_BYTES >= ROUNDS * FILL_BYTES
    lowered = logged(caplog, "wal.segment_bytes_lowered")
    assert len(lowered) == 2  # once per open
    assert lowered[0]["configured"] == 64 * MIB
    assert lowered[0]["segment_bytes"] == 8 * MIB
    assert lowered[0]["volume_bytes"] == TMPFS_BYTES


@pytest.mark.trio
async def test_committing_as_it_goes_three_volumes_go_through(small_disk: Path) -> None:
    """The measured case: every acked record committed soon after; the volume never fills."""
    directory = small_disk / "wal"
    body = bytes(RECORD_BYTES)
    count = 3 * TMPFS_BYTES // RECORD_BYTES
    async with open_wal(directory, 0, WalSettings()) as wal:
        for i in range(count):
            await wal.append(body, key=("p", "s", str(i)), rows=1)
            if i % 8 == 7:
                await wal.mark_committed(wal.durable_end)
        assert wal.stats.failed_groups == 0
        await wal.mark_committed(wal.durable_end)
        end = wal.durable_end
    # And after a clean restart.
    async with open_wal(directory, end, WalSettings()) as wal:
        lsns = [await wal.append(body, rows=1) for _ in range(8)]
        assert lsns[0] == end
        assert wal.stats.failed_groups == 0


@pytest.mark.trio
async def test_a_full_volume_and_a_committed_active_segment_the_append_goes_through(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Something else filled the volume: the committed active segment's bytes are freed."""
    directory = small_disk / "wal"
    body = bytes(RECORD_BYTES)
    async with open_wal(directory, 0, WalSettings()) as wal:
        # Under the replacement size, so the commit keeps the segment.
        for i in range(3):
            await wal.append(body, key=("p", "s", str(i)), rows=1)
        await wal.mark_committed(wal.durable_end)
        end = wal.durable_end
        assert wal.total_bytes == end
        filler = small_disk / "filler"
        with filler.open("wb", buffering=0) as out:
            while (left := free_bytes(small_disk)) > 0:
                out.write(bytes(min(left, 64 * 1024)))
        assert free_bytes(small_disk) < RECORD_BYTES
        with caplog.at_level(logging.INFO, logger="appliance.wal"):
            lsn = await wal.append(body, key=("p", "s", "after"), rows=1)
        assert lsn == end
        assert [p.name for p in segment_files(directory)] == [f"{end:020d}.wal"]
        assert logged(caplog, "wal.segment_replaced")[0]["reason"] == "disk full"
        assert [f.lsn for f in await wal.read(end, 1 << 30)] == [end]
