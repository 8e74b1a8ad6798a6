"""The log never locks its own volume: segment size fitted to the volume, committed bytes freed.

* ``segment_bytes`` larger than a quarter of the volume under the log is
  lowered at open, with a ``wal.segment_bytes_lowered`` line;
* a wholly committed active segment of ``COMMITTED_SEGMENT_REPLACE_BYTES``
  or more is replaced at the commit by an empty one at the same position;
* a rollover deletes the old segment at once when the table holds all of it;
* a write that finds the disk full while the active segment holds only
  committed records replaces it and tries once more.

Each keeps the invariant that the log's next position survives a restart.
tests/appliance/wal/test_small_volume_tmpfs.py does the same on a real 32 MiB volume.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.wal.errors import WalWriteError
from appliance.wal.frame import KIND_ROW_BLOCK, encode_key
from appliance.wal.log import open_wal
from appliance.wal.segments import Entry, SegmentStore, segment_name
from appliance.wal.settings import (
    COMMITTED_SEGMENT_REPLACE_BYTES,
    MIN_SEGMENT_BYTES,
    SEGMENT_VOLUME_DIVISOR,
    WalSettings,
    segment_bytes_for_volume,
)

from .walsupport import logged, segment_files

MIB = 1024 * 1024
#: Records of this many body bytes: a few make a segment of the replacement size.
BODY_BYTES = 128 * 1024


def entry(i: int, size: int = BODY_BYTES) -> Entry:
    return Entry(KIND_ROW_BLOCK, encode_key(("p", "s", str(i))), 1, bytes([i % 256]) * size)


def write(store: SegmentStore, entries: list[Entry]) -> list[int]:
    lsns: list[int] = []
    while len(lsns) < len(entries):
        lsns += store.write_group(entries[len(lsns) :]).lsns
    return lsns


def fake_volume(monkeypatch: pytest.MonkeyPatch, total_bytes: int) -> None:
    """``os.statvfs`` reports a volume of ``total_bytes`` (4 KiB blocks)."""
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> object:
        found = real(path)
        return SimpleNamespace(
            f_frsize=4096, f_bsize=4096, f_blocks=total_bytes // 4096,
            f_bavail=found.f_bavail, f_bfree=found.f_bfree,
        )  # fmt: skip

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_the_rule_is_a_quarter_of_the_volume() -> None:
    assert SEGMENT_VOLUME_DIVISOR == 4
    assert segment_bytes_for_volume(64 * MIB, 32 * MIB) == 8 * MIB
    assert segment_bytes_for_volume(64 * MIB, 1024 * 1024 * MIB) == 64 * MIB
    assert segment_bytes_for_volume(64 * MIB, 256 * MIB) == 64 * MIB
    assert segment_bytes_for_volume(64 * MIB, 8192) == MIN_SEGMENT_BYTES


def test_a_segment_too_large_for_the_volume_is_lowered_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_volume(monkeypatch, 2 * MIB)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, MIB)
    assert store.segment_bytes == recovery.segment_bytes == 512 * 1024
    (line,) = logged(caplog, "wal.segment_bytes_lowered")
    assert line["configured"] == MIB
    assert line["segment_bytes"] == 512 * 1024
    assert line["volume_bytes"] == 2 * MIB
    assert line["directory"] == str(tmp_path)
    # The store rolls over at the lowered size.
    write(store, [entry(i, 100_000) for i in range(12)])
    store.close()
    files = segment_files(tmp_path)
    assert len(files) >= 3
    assert all(p.stat().st_size <= 512 * 1024 for p in files)


def test_a_segment_that_fits_is_kept_and_no_line_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_volume(monkeypatch, 4 * MIB)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, MIB)
    store.close()
    assert store.segment_bytes == recovery.segment_bytes == MIB
    assert not logged(caplog, "wal.segment_bytes_lowered")


def test_a_volume_that_cannot_be_measured_keeps_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(path: str | os.PathLike[str]) -> object:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "statvfs", refuse)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, _ = SegmentStore.open(tmp_path, 0, MIB)
    store.close()
    assert store.segment_bytes == MIB
    assert logged(caplog, "wal.volume_unknown")


@pytest.mark.trio
async def test_the_log_says_which_segment_size_it_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_volume(monkeypatch, 32 * MIB)
    settings = WalSettings()
    async with open_wal(tmp_path, 0, settings) as wal:
        assert settings.segment_bytes == 64 * MIB
        assert wal.segment_bytes == 8 * MIB


def test_a_wholly_committed_active_segment_is_replaced_at_the_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = SegmentStore.open(tmp_path, 0, 16 * MIB)
    count = COMMITTED_SEGMENT_REPLACE_BYTES // BODY_BYTES + 1
    write(store, [entry(i) for i in range(count)])
    end = store.durable_end
    (active,) = store.segments()
    assert active.file_bytes >= COMMITTED_SEGMENT_REPLACE_BYTES
    # Committed up to a record inside it: nothing is replaced.
    store.delete_committed(end - entry(0).size)
    assert store.segments() == [active]
    # Committed wholly: an empty segment at the next position replaces it.
    assert store.delete_committed(end) == 0
    (replacement,) = store.segments()
    assert (replacement.base, replacement.file_bytes) == (end, 0)
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(end)]
    # Appends go on at the same position...
    (lsn,) = store.write_group([entry(99, 10)]).lsns
    assert lsn == end
    store.close()
    # ...and the next position survived for a restart too.
    store, recovery = SegmentStore.open(tmp_path, end, 16 * MIB)
    assert recovery.durable_end == end + entry(99, 10).size
    assert [f.lsn for f in store.replay(end)] == [end]
    store.close()


def test_a_small_committed_active_segment_is_kept(tmp_path: Path) -> None:
    """Below the replacement size a new file at every commit would cost more than it frees."""
    store, _ = SegmentStore.open(tmp_path, 0, 16 * MIB)
    write(store, [entry(i, 1000) for i in range(5)])
    end = store.durable_end
    store.delete_committed(end)
    (active,) = store.segments()
    assert (active.base, active.end) == (0, end)
    store.close()
    # Nothing uncommitted: the next position survives the restart.
    store, recovery = SegmentStore.open(tmp_path, end, 16 * MIB)
    assert recovery.durable_end == end
    store.close()


def test_a_large_committed_active_segment_is_replaced_at_open(tmp_path: Path) -> None:
    """A log stopped with everything committed frees it at the next start."""
    store, _ = SegmentStore.open(tmp_path, 0, 16 * MIB)
    write(store, [entry(i) for i in range(COMMITTED_SEGMENT_REPLACE_BYTES // BODY_BYTES + 1)])
    end = store.durable_end
    store.close()
    store, recovery = SegmentStore.open(tmp_path, end, 16 * MIB)
    assert recovery.durable_end == end
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(end)]
    assert store.total_bytes == 0
    store.close()


def test_a_rollover_deletes_a_wholly_committed_segment_at_once(tmp_path: Path) -> None:
    store, _ = SegmentStore.open(tmp_path, 0, 4096)
    write(store, [entry(i, 1000) for i in range(3)])
    end = store.durable_end
    store.delete_committed(end)  # small: kept as the active segment
    assert len(store.segments()) == 1
    write(store, [entry(9, 3000)])  # does not fit: a new segment, the old one goes
    assert [s.base for s in store.segments()] == [end]
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(end)]
    store.close()


def failing_once(monkeypatch: pytest.MonkeyPatch, code: int) -> Callable[[], int]:
    """The next ``os.pwrite`` fails with ``code``; returns how many failed so far."""
    real = os.pwrite
    failed = [0]

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if not failed[0]:
            failed[0] += 1
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return lambda: failed[0]


def test_a_full_disk_with_a_committed_active_segment_replaces_it_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = SegmentStore.open(tmp_path, 0, 16 * MIB)
    write(store, [entry(i, 1000) for i in range(5)])
    end = store.durable_end
    store.delete_committed(end)  # small: kept
    failed = failing_once(monkeypatch, errno.ENOSPC)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        written = store.write_group([entry(7, 1000)])
    assert failed() == 1
    assert written.lsns == [end]
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(end)]
    assert logged(caplog, "wal.segment_replaced")[0]["reason"] == "disk full"
    store.close()
    store, recovery = SegmentStore.open(tmp_path, end, 16 * MIB)
    assert [f.body for f in store.replay(end)] == [entry(7, 1000).body]
    assert recovery.truncated_bytes == 0
    store.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_with_uncommitted_records_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Uncommitted records are never given up for room; an I/O error is no lack of room."""
    store, _ = SegmentStore.open(tmp_path, 0, 16 * MIB)
    write(store, [entry(i, 1000) for i in range(5)])
    end = store.durable_end
    if code == errno.EIO:
        store.delete_committed(end)
    else:
        store.delete_committed(end - entry(0, 1000).size)
    failed = failing_once(monkeypatch, code)
    with pytest.raises(WalWriteError):
        store.write_group([entry(7, 1000)])
    assert failed() == 1
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(0)]
    assert store.durable_end == end
    store.close()
