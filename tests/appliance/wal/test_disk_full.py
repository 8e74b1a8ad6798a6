"""Disk full for real: a 1 MiB tmpfs fills up, appends fail by name, the log stays valid, recovers.

The test mounts a tmpfs (it needs root; it is skipped, saying why, when it
cannot mount one). Appends of ~100 KB records go in until the filesystem is
full; then:

* the append that did not fit raises ``WalWriteError`` with ``disk_full``;
  no append that raised is in the log, and every append that returned is;
* the segment files hold exactly the verified records (the partial write
  was cut back), so a restart finds no torn tail;
* once space is freed (the committed segments are deleted), appends succeed again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from appliance.wal.errors import WalWriteError
from appliance.wal.log import open_wal
from appliance.wal.segments import SegmentStore
from appliance.wal.settings import WalSettings
from tests.faults import small_tmpfs

from .walsupport import segment_files

TMPFS_BYTES = 1024 * 1024
RECORD_BYTES = 100_000
SETTINGS = WalSettings(
    segment_bytes=256 * 1024, max_record_bytes=128 * 1024, max_bytes=64 * 1024 * 1024
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mountpoint:
        yield mountpoint


@pytest.mark.trio
async def test_disk_full_fails_by_name_and_recovers(small_disk: Path) -> None:
    directory = small_disk / "wal"
    acked: list[tuple[int, bytes]] = []
    refused: list[bytes] = []
    async with open_wal(directory, 0, SETTINGS) as wal:
        for i in range(40):
            body = os.urandom(RECORD_BYTES)
            try:
                lsn = await wal.append(body, key=("forward", "user1", f"chunk-{i}"), rows=1)
            except WalWriteError as exc:
                refused.append(body)
                full = exc.disk_full
                break
            acked.append((lsn, body))
        assert refused, "the 1 MiB filesystem never filled up"
        assert full
        assert 5 <= len(acked) < 11
        # The failed write was cut back: every file holds only verified records.
        for info in wal.segments():
            assert info.file_bytes == info.valid_bytes
        on_disk = sum(p.stat().st_size for p in segment_files(directory))
        assert on_disk == wal.total_bytes == sum(f.size for f in await wal.read(0, 1 << 30))
        assert [f.body for f in await wal.read(0, 1 << 30)] == [body for _, body in acked]
        # Still full: the next append fails the same way, and the log stays valid.
        with pytest.raises(WalWriteError):
            await wal.append(os.urandom(RECORD_BYTES))
        # The table caught up: committed segments are deleted, space returns.
        full_end = wal.durable_end
        await wal.mark_committed(full_end)
        more = [await wal.append(os.urandom(RECORD_BYTES)) for _ in range(3)]
        assert more[0] == full_end  # failed appends took no position
        end = wal.durable_end
        committed = wal.committed
    # A restart finds a clean log: nothing to truncate, the three new records to replay.
    store, recovery = SegmentStore.open(directory, committed, SETTINGS.segment_bytes)
    assert recovery.truncated_bytes == 0
    assert not recovery.lost_ranges
    assert recovery.durable_end == end
    assert [f.lsn for f in store.replay(committed)] == more
    store.close()


@pytest.mark.trio
async def test_disk_full_under_concurrent_appenders(small_disk: Path) -> None:
    """Many appenders at once: each either returns (and its record is in the log) or raises."""
    directory = small_disk / "wal"
    results: dict[int, int | None] = {}
    bodies = {i: os.urandom(RECORD_BYTES // 2) for i in range(30)}
    async with open_wal(directory, 0, SETTINGS) as wal:

        async def one(i: int) -> None:
            try:
                results[i] = await wal.append(bodies[i], key=("p", "s", str(i)))
            except WalWriteError:
                results[i] = None

        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(one, i)
        frames = {f.lsn: f.body for f in await wal.read(0, 1 << 30)}
    acked = {i: lsn for i, lsn in results.items() if lsn is not None}
    assert acked
    assert len(acked) < 30
    assert {frames[lsn] for lsn in acked.values()} == {bodies[i] for i in acked}
    assert len(frames) == len(acked)
