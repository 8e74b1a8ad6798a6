"""Losing acknowledged records at recovery is loud: an error line and a counter.

The last segment's tail is cut off at the first damage. Only the group being
written when the process or machine stopped may go quietly (a warning: it
was never acked); when whole, CRC-valid records follow the damage, or more
bytes than one group can hold are cut, acked records were lost:
``wal.tail_damaged`` at error level with the segment, the range and the
count, and ``records_lost`` (``WalStats.records_lost``, the metric
``appliance_wal_records_lost_total``). Damage in older segments and gaps
count the same way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from appliance.metrics import Metrics, WalSample
from appliance.wal.frame import HEADER_BYTES, KIND_ROW_BLOCK, encode_key
from appliance.wal.log import WriteAheadLog, open_wal
from appliance.wal.segments import Entry, SegmentStore, segment_name
from appliance.wal.settings import WalSettings

from .walsupport import segment_files

SEGMENT = 4096
#: One segment holds every record of these tests (the damage is in the last one).
BIG_SEGMENT = 1 << 20
SETTINGS = WalSettings(segment_bytes=BIG_SEGMENT, max_record_bytes=4096, max_bytes=4 << 20)


def entry(i: int, size: int = 100) -> Entry:
    return Entry(
        KIND_ROW_BLOCK, encode_key(("forward", "user1", f"chunk-{i}")), 1, bytes([i]) * size
    )


def write(directory: Path, count: int, size: int = 100, segment: int = BIG_SEGMENT) -> list[int]:
    """``count`` records, durable (each write_group is an fdatasync: acked); their LSNs."""
    store, _ = SegmentStore.open(directory, 0, segment)
    lsns: list[int] = []
    entries = [entry(i, size) for i in range(count)]
    while len(lsns) < count:
        lsns += store.write_group(entries[len(lsns) :]).lsns
    store.close()
    return lsns


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(data)


def lines(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, dict[str, Any]]]:
    """(level, fields) of every captured line named ``name``."""
    return [(r.levelno, getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == name]


def test_a_damaged_header_with_acked_records_after_it_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The measured case: one flipped header byte, and the five acked records after it."""
    lsns = write(tmp_path, 10)
    path = tmp_path / segment_name(0)
    size = path.stat().st_size
    flip(path, lsns[4] + 9)  # in the LSN field: the header CRC fails
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, BIG_SEGMENT)
    assert [f.lsn for f in store.replay(0)] == lsns[:4]
    store.close()
    ((level, line),) = lines(caplog, "wal.tail_damaged")
    assert level == logging.ERROR
    assert line["segment"] == segment_name(0)
    assert (line["lost_from"], line["lost_to"]) == (lsns[4], size)
    # The damaged record and the five whole ones after it.
    assert line["records"] == 6
    assert line["whole_records"] == 5
    assert not lines(caplog, "wal.tail_truncated")
    assert recovery.records_lost == 6
    assert recovery.lost_ranges == [(lsns[4], size)]
    # The log goes on where it now ends, and says so at open.
    assert path.stat().st_size == lsns[4] == recovery.durable_end
    # The last open is the recovery's (the one that wrote the log may be captured too).
    _, opened = lines(caplog, "wal.open")[-1]
    assert opened["records_lost"] == 6


@pytest.mark.trio
async def test_the_loss_reaches_the_stats_and_the_metric(tmp_path: Path) -> None:
    lsns = write(tmp_path, 8)
    flip(tmp_path / segment_name(0), lsns[2] + 3)  # the magic
    metrics = Metrics(process=False)
    wal = WriteAheadLog(tmp_path, SETTINGS)

    def sample() -> WalSample | None:
        # As LakeWriter._wal_sample builds it, with the one field it passes on.
        stats = wal.stats
        return WalSample(
            file_bytes=wal.total_bytes, max_bytes=wal.settings.max_bytes,
            uncommitted_bytes=wal.uncommitted_bytes, segments=len(wal.segments()),
            at_cap=wal.at_cap, appends=stats.appends, syncs=stats.groups,
            failed_syncs=stats.failed_groups, written_bytes=stats.bytes_written,
            cap_waits=stats.cap_waits, cap_refusals=stats.cap_refusals,
            sync_wait_seconds=stats.group_wait_seconds, cache_bytes=wal.cache_bytes,
            groups_from_cache=0, groups_read_back=0, records_lost=stats.records_lost,
        )  # fmt: skip

    metrics.watch_wal(sample)
    await wal.open(0)
    try:
        assert wal.stats.records_lost == 6
        text = metrics.exposition()[0].decode()
        assert "appliance_wal_records_lost_total 6.0" in text
    finally:
        wal.close_files()


def test_the_metric_defaults_to_zero() -> None:
    """A WalSample built without the field (the writer before it passes it on) counts 0."""
    found = WalSample(
        file_bytes=0, max_bytes=1, uncommitted_bytes=0, segments=1, at_cap=False, appends=0,
        syncs=0, failed_syncs=0, written_bytes=0, cap_waits=0, cap_refusals=0,
        sync_wait_seconds=0.0, cache_bytes=0, groups_from_cache=0, groups_read_back=0,
    )  # fmt: skip
    metrics = Metrics(process=False)
    metrics.watch_wal(lambda: found)
    assert "appliance_wal_records_lost_total 0.0" in metrics.exposition()[0].decode()


@pytest.mark.parametrize(
    "damage", ["cut in the last record", "last record's body", "last record's header"]
)
def test_a_torn_last_group_is_a_warning_and_loses_nothing_acked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """What a crash during the last group's write leaves: no whole record after the damage.

    A damaged last record looks the same, so it goes quietly too (docs/wal.md).
    """
    lsns = write(tmp_path, 6)
    path = tmp_path / segment_name(0)
    data = path.read_bytes()
    if damage == "cut in the last record":
        path.write_bytes(data[:-7])
    elif damage == "last record's body":
        flip(path, len(data) - 7)
    else:
        flip(path, lsns[5] + 20)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, BIG_SEGMENT)
    assert [f.lsn for f in store.replay(0)] == lsns[:5]
    store.close()
    ((level, line),) = lines(caplog, "wal.tail_truncated")
    assert level == logging.WARNING
    assert line["lsn"] == lsns[5]
    assert not lines(caplog, "wal.tail_damaged")
    assert recovery.records_lost == 0
    assert not recovery.lost_ranges
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_more_bytes_than_one_group_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No whole record survives, but the tail is longer than any one write could have been."""
    lsns = write(tmp_path, 40)
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[lsns[5] :] = bytes(len(data) - lsns[5])  # zeroed from record 5 on
    path.write_bytes(data)
    tail = len(data) - lsns[5]
    group = 1024
    assert tail > max(group, 4096)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(
            tmp_path, 0, BIG_SEGMENT, group_max_bytes=group, max_record_bytes=4096
        )
    store.close()
    ((level, line),) = lines(caplog, "wal.tail_damaged")
    assert level == logging.ERROR
    assert (line["lost_from"], line["lost_to"]) == (lsns[5], len(data))
    assert line["whole_records"] == 0
    assert line["records"] == 1  # one stretch: how many records it held is unknown
    assert recovery.records_lost == 1
    # The same zeroes within what one group can be are a torn write.
    caplog.clear()
    path.write_bytes(data)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(
            tmp_path, 0, BIG_SEGMENT, group_max_bytes=tail, max_record_bytes=4096
        )
    store.close()
    assert lines(caplog, "wal.tail_truncated")
    assert recovery.records_lost == 0


def test_a_committed_tail_is_no_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Damage the table already holds loses nothing: no error, nothing counted."""
    lsns = write(tmp_path, 6)
    path = tmp_path / segment_name(0)
    end = path.stat().st_size
    flip(path, lsns[3] + 9)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, end, BIG_SEGMENT)
    store.close()
    assert recovery.records_lost == 0
    assert not lines(caplog, "wal.tail_damaged")
    assert recovery.committed == recovery.durable_end == end
    # Committed up to record 5: only record 5, after the committed position, is lost.
    write(tmp_path / "again", 6)
    path = tmp_path / "again" / segment_name(0)
    flip(path, lsns[3] + 9)
    store, recovery = SegmentStore.open(tmp_path / "again", lsns[5], BIG_SEGMENT)
    store.close()
    assert recovery.records_lost == 1
    assert recovery.lost_ranges == [(lsns[5], end)]


def test_a_damaged_body_followed_by_good_records_names_its_range(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lsns = write(tmp_path, 5)
    flip(tmp_path / segment_name(0), lsns[1] + HEADER_BYTES + 40)
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, BIG_SEGMENT)
    store.close()
    ((level, line),) = lines(caplog, "wal.record_damaged")
    assert level == logging.ERROR
    assert line["segment"] == segment_name(0)
    assert (line["lost_from"], line["lost_to"], line["records"]) == (lsns[1], lsns[2], 1)
    assert recovery.records_lost == 1


def test_damage_in_an_older_segment_counts_the_records_it_hides(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lsns = write(tmp_path, 12, size=900, segment=SEGMENT)
    first = segment_files(tmp_path)[0]
    size = first.stat().st_size
    in_first = [lsn for lsn in lsns if lsn < size]
    assert len(in_first) == 4
    flip(first, in_first[1] + 3)  # the magic of the second record: the rest is unreadable
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, SEGMENT)
    store.close()
    ((level, line),) = lines(caplog, "wal.segment_damaged")
    assert level == logging.ERROR
    assert line["segment"] == first.name
    assert (line["lost_from"], line["lost_to"]) == (in_first[1], size)
    assert (line["records"], line["whole_records"]) == (3, 2)
    assert recovery.records_lost == 3


def test_a_missing_segment_counts_one_record_at_least(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, 12, size=900, segment=SEGMENT)
    files = segment_files(tmp_path)
    files[1].unlink()
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, SEGMENT)
    store.close()
    ((level, line),) = lines(caplog, "wal.segment_damaged")
    assert level == logging.ERROR
    assert line["segment"] == files[0].name
    assert (line["lost_from"], line["lost_to"]) == (int(files[1].stem), int(files[2].stem))
    assert (line["records"], line["whole_records"]) == (1, 0)
    assert recovery.records_lost == 1


def test_a_gap_before_the_log_counts_one_record_at_least(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, 12, size=900, segment=SEGMENT)
    files = segment_files(tmp_path)
    files[0].unlink()
    with caplog.at_level(logging.INFO, logger="appliance.wal"):
        store, recovery = SegmentStore.open(tmp_path, 0, SEGMENT)
    store.close()
    ((level, line),) = lines(caplog, "wal.gap")
    assert level == logging.ERROR
    assert line["next_segment"] == files[1].name
    assert (line["lost_from"], line["lost_to"], line["records"]) == (0, int(files[1].stem), 1)
    assert recovery.records_lost == 1


@pytest.mark.trio
async def test_open_wal_counts_from_zero_without_damage(tmp_path: Path) -> None:
    async with open_wal(tmp_path, 0, SETTINGS) as wal:
        await wal.append(b"x" * 100)
    async with open_wal(tmp_path, 0, SETTINGS) as wal:
        assert wal.stats.records_lost == 0
