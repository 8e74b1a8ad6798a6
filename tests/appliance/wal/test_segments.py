"""The segment store (appliance/wal/segments.py): durable groups, cut-back, recovery, reads."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import pytest

from appliance.wal.errors import WalCorrupt, WalWriteError
from appliance.wal.frame import HEADER_BYTES, KIND_ROW_BLOCK, encode_key
from appliance.wal.segments import Entry, SegmentStore, segment_name

from .walsupport import install_sync_spy, logged, record_bytes, segment_files

SEGMENT = 4096


def entry(i: int, size: int = 100, keyed: bool = True) -> Entry:
    key = ("forward", "user1", f"chunk-{i}") if keyed else None
    return Entry(KIND_ROW_BLOCK, encode_key(key), 1, bytes([i % 256]) * size)


def open_store(directory: Path, committed: int = 0, segment: int = SEGMENT):
    return SegmentStore.open(directory, committed, segment)


def write_all(store: SegmentStore, entries: list[Entry]) -> list[int]:
    lsns: list[int] = []
    while len(lsns) < len(entries):
        lsns += store.write_group(entries[len(lsns) :]).lsns
    return lsns


def bodies(store: SegmentStore, after: int = 0) -> list[bytes]:
    return [f.body for f in store.replay(after)]


def test_new_log_and_file_modes(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "wal"
    store, recovery = open_store(directory, committed=777)
    assert recovery.committed == recovery.durable_end == 777
    assert [p.name for p in segment_files(directory)] == [segment_name(777)]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    store.write_group([entry(0)])
    assert stat.S_IMODE(segment_files(directory)[0].stat().st_mode) == 0o600
    store.close()


def test_group_is_written_then_synced_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = open_store(tmp_path)
    spy = install_sync_spy(monkeypatch)
    written = store.write_group([entry(i) for i in range(5)])
    assert len(written.lsns) == 5
    assert [e[0] for e in spy.events] == ["pwrite", "fdatasync"]
    assert written.end == sum(entry(i).size for i in range(5)) == store.durable_end
    store.close()


def test_segments_roll_over_and_replay_in_order(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    entries = [entry(i, size=700) for i in range(20)]
    lsns = write_all(store, entries)
    assert len(segment_files(tmp_path)) > 3
    for path in segment_files(tmp_path):
        assert path.stat().st_size <= SEGMENT
    assert [f.lsn for f in store.replay(0)] == lsns
    assert bodies(store) == [e.body for e in entries]
    # A record larger than a segment fills one alone.
    big = entry(99, size=3 * SEGMENT)
    (lsn,) = store.write_group([big]).lsns
    assert (tmp_path / segment_name(lsn)).stat().st_size == big.size
    store.close()


def test_read_from_a_boundary_and_by_bytes(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    lsns = write_all(store, [entry(i, size=500) for i in range(30)])
    frames = store.read(lsns[7], max_bytes=1)
    assert [f.lsn for f in frames] == [lsns[7]]
    frames = store.read(lsns[7], max_bytes=10_000)
    assert frames[0].lsn == lsns[7]
    assert sum(f.size for f in frames[:-1]) < 10_000
    assert [f.lsn for f in store.read(0, 1 << 30)] == lsns
    assert store.read(store.durable_end, 100) == []
    with pytest.raises(ValueError, match="not a record boundary"):
        store.read(lsns[3] + 1, 100)
    with pytest.raises(ValueError, match="past the durable end"):
        store.read(store.durable_end + 1, 100)
    store.close()


def test_reopen_replays_from_the_committed_position(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    entries = [entry(i, size=600) for i in range(25)]
    lsns = write_all(store, entries)
    end = store.durable_end
    store.close()
    committed = lsns[12]
    store, recovery = open_store(tmp_path, committed=committed)
    assert recovery.committed == committed
    assert recovery.durable_end == end
    assert recovery.records == 13
    assert [k for _, k in recovery.keys] == [
        ("forward", "user1", f"chunk-{i}") for i in range(12, 25)
    ]
    assert bodies(store, committed) == [e.body for e in entries[12:]]
    # Segments wholly before the committed position were deleted at open.
    assert segment_files(tmp_path)[0].name <= segment_name(committed)
    # Appends continue after the last record.
    (lsn,) = store.write_group([entry(99)]).lsns
    assert lsn == end
    store.close()


def test_delete_committed_keeps_the_active_segment(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    lsns = write_all(store, [entry(i, size=900) for i in range(20)])
    before = store.segments()
    store.delete_committed(lsns[10])
    after = store.segments()
    assert all(s.end > lsns[10] for s in after)
    assert len(after) < len(before)
    store.delete_committed(store.durable_end)
    (active,) = store.segments()
    assert active.end == store.durable_end
    assert store.total_bytes == active.file_bytes
    store.close()
    # Nothing uncommitted: the next position survives the restart.
    store, recovery = open_store(tmp_path, committed=active.end)
    assert recovery.durable_end == active.end
    assert recovery.records == 0
    store.close()


def test_torn_tail_truncated_at_every_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash mid-write of the last group: every cut keeps each whole record before it."""
    source = tmp_path / "source"
    store, _ = open_store(source, segment=1 << 20)
    entries = [entry(i, size=40) for i in range(4)]
    lsns = write_all(store, entries)
    store.close()
    data = (source / segment_name(0)).read_bytes()
    ends = [*lsns[1:], len(data)]
    tail_start = lsns[1]  # cut everywhere in the last three records
    for cut in range(tail_start, len(data) + 1):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / segment_name(0)).write_bytes(data[:cut])
        with caplog.at_level(logging.WARNING, logger="appliance.wal"):
            caplog.clear()
            store, recovery = open_store(directory, segment=1 << 20)
        whole = [e.body for e, stop in zip(entries, ends, strict=True) if stop <= cut]
        assert bodies(store) == whole, cut
        good_end = max(stop for stop in [0, *ends] if stop <= cut)
        assert recovery.durable_end == good_end
        assert (directory / segment_name(0)).stat().st_size == good_end
        if cut != good_end:
            assert recovery.truncated_bytes == cut - good_end
            (line,) = logged(caplog, "wal.tail_truncated")
            assert line["offset"] == good_end
            assert line["bytes"] == cut - good_end
            assert line["reason"] in ("short header", "short record")
        # The log takes appends again where it now ends.
        assert store.write_group([entry(9)]).lsns == [good_end]
        store.close()


def test_bit_flip_in_the_last_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, _ = open_store(tmp_path, segment=1 << 20)
    entries = [entry(i, size=50) for i in range(5)]
    lsns = write_all(store, entries)
    store.close()
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[lsns[2] + HEADER_BYTES + 30] ^= 0x10  # a body: skipped, the rest kept
    path.write_bytes(data)
    with caplog.at_level(logging.ERROR, logger="appliance.wal"):
        store, recovery = open_store(tmp_path, segment=1 << 20)
    assert bodies(store) == [e.body for i, e in enumerate(entries) if i != 2]
    assert recovery.damaged_records == 1
    assert [line["lsn"] for line in logged(caplog, "wal.record_damaged")] == [lsns[2]]
    store.close()
    data[lsns[3] + 5] ^= 0x01  # now a header: the log ends before it
    path.write_bytes(data)
    store, recovery = open_store(tmp_path, segment=1 << 20)
    assert bodies(store) == [e.body for e in entries[:2]]
    assert path.stat().st_size == lsns[2]  # the skipped record is part of the cut tail
    store.close()


def test_damage_in_an_older_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not a torn write: a damaged body is skipped; a damaged header loses the segment's rest."""
    store, _ = open_store(tmp_path)
    entries = [entry(i, size=900) for i in range(12)]
    lsns = write_all(store, entries)
    store.close()
    first = segment_files(tmp_path)[0]
    size = first.stat().st_size
    data = bytearray(first.read_bytes())
    in_first = [i for i, lsn in enumerate(lsns) if lsn < size]
    assert len(in_first) >= 3
    data[lsns[0] + HEADER_BYTES + 100] ^= 0x01  # body of record 0
    data[lsns[2] + 3] ^= 0x01  # header (magic) of record 2
    first.write_bytes(data)
    with caplog.at_level(logging.ERROR, logger="appliance.wal"):
        store, recovery = open_store(tmp_path)
    lost = set(in_first[2:]) | {0}
    assert bodies(store) == [e.body for i, e in enumerate(entries) if i not in lost]
    assert recovery.lost_ranges == [(lsns[2], size)]
    assert "wal.segment_damaged" in caplog.text
    assert "wal.record_damaged" in caplog.text
    assert first.stat().st_size == size  # left for inspection
    # Reads of the damaged segment stop where it stopped verifying.
    assert [f.lsn for f in store.read(0, 1 << 30)] == [lsns[1]] + [
        lsns[i] for i in range(len(entries)) if i > in_first[-1]
    ]
    store.close()


def test_abandoned_segment_is_superseded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write and its cut-back fail: the next append opens a new segment at the same position."""
    store, _ = open_store(tmp_path, segment=1 << 20)
    entries = [entry(i) for i in range(3)]
    lsns = write_all(store, entries)
    real_fdatasync, real_ftruncate = os.fdatasync, os.ftruncate

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    with pytest.raises(WalWriteError) as caught:
        store.write_group([entry(7), entry(8)])
    assert caught.value.errno == errno.EIO
    assert not caught.value.disk_full
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)
    end = store.durable_end
    # The failed bytes are still in the old file (its cut-back failed)...
    assert (tmp_path / segment_name(0)).stat().st_size > end
    (lsn,) = store.write_group([entry(9)]).lsns
    assert lsn == end
    assert (tmp_path / segment_name(end)).exists()
    store.close()
    # ...and recovery drops them: the next segment starts where they began.
    store, recovery = open_store(tmp_path, segment=1 << 20)
    assert bodies(store) == [e.body for e in entries] + [entry(9).body]
    assert (tmp_path / segment_name(0)).stat().st_size == end
    assert recovery.truncated_bytes > 0
    assert not recovery.lost_ranges
    assert [f.lsn for f in store.replay(0)] == [*lsns, end]
    store.close()


def test_failed_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = open_store(tmp_path, segment=1 << 20)
    write_all(store, [entry(0)])
    end = store.durable_end
    calls = {"n": 0}
    real_pwrite = os.pwrite

    def half_then_full(fd: int, data: bytes, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", half_then_full)
    with pytest.raises(WalWriteError) as caught:
        store.write_group([entry(1, size=5000)])
    assert caught.value.disk_full
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert (tmp_path / segment_name(0)).stat().st_size == end == store.durable_end
    assert store.write_group([entry(2)]).lsns == [end]
    store.close()


def test_log_behind_the_table_starts_at_the_committed_position(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = open_store(tmp_path)
    write_all(store, [entry(i) for i in range(3)])
    end = store.durable_end
    store.close()
    with caplog.at_level(logging.WARNING, logger="appliance.wal"):
        store, recovery = open_store(tmp_path, committed=end + 5000)
    assert "wal.behind_table" in caplog.text
    assert recovery.committed == recovery.durable_end == end + 5000
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(end + 5000)]
    store.close()


def test_committed_inside_a_record_moves_to_its_end(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    lsns = write_all(store, [entry(i) for i in range(3)])
    store.close()
    store, recovery = open_store(tmp_path, committed=lsns[1] + 3)
    assert recovery.committed == lsns[2]
    assert recovery.records == 1
    store.close()


def test_missing_segments_are_a_logged_gap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = open_store(tmp_path)
    lsns = write_all(store, [entry(i, size=900) for i in range(12)])
    store.close()
    files = segment_files(tmp_path)
    files[1].unlink()
    with caplog.at_level(logging.ERROR, logger="appliance.wal"):
        store, recovery = open_store(tmp_path)
    start, stop = int(files[0].stem) + files[0].stat().st_size, int(files[2].stem)
    assert recovery.lost_ranges == [(start, stop)]
    assert "wal.segment_damaged" in caplog.text
    assert [f.lsn for f in store.replay(0)] == [lsn for lsn in lsns if not start <= lsn < stop]
    store.close()
    # The table's position before the first segment: the missing range is reported.
    files[0].unlink()
    store, recovery = open_store(tmp_path, committed=0)
    assert recovery.lost_ranges[0] == (0, stop)
    assert recovery.committed == stop
    store.close()


def test_unknown_files_are_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with caplog.at_level(logging.WARNING, logger="appliance.wal"):
        store, _ = open_store(tmp_path)
    assert "wal.unknown_file" in caplog.text
    assert (tmp_path / "notes.txt").exists()
    store.close()


def test_verified_bytes_changed_underneath_are_corrupt(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path, segment=1 << 20)
    lsns = write_all(store, [entry(i) for i in range(3)])
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[lsns[1] + 1] ^= 0xFF
    path.write_bytes(data)
    with pytest.raises(WalCorrupt):
        store.read(0, 1 << 30)
    store.close()


def test_record_bytes_helper_matches_the_store(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    e = entry(3)
    store.write_group([e])
    store.close()
    key = ("forward", "user1", "chunk-3")
    assert (tmp_path / segment_name(0)).read_bytes() == record_bytes(0, e.body, key, rows=1)
