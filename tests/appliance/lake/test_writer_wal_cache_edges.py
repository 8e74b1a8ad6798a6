"""The log's cache at its edges: a record left out of it never cuts a commit group.

The cache is one contiguous run of the oldest uncommitted records
(appliance/wal/log.py), and a commit group takes, in log order, what was
read back from the files and what the cache kept (appliance/lake/log_sink.py):
records of mixed sizes, some too large for the cache, still commit in one
group, within one commit interval.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio

from appliance.lake.writer import WriterSettings
from appliance.wal.log import _cache_cost
from appliance.wal.settings import WalSettings

from .test_writer import block
from .test_writer_wal import batch_ids, writing

LOG = WalSettings(segment_bytes=1 << 16, max_record_bytes=1 << 16, max_bytes=1 << 20)


def _ids(blocks: list) -> list[str]:
    return sorted(str(b.batch_id) for b in blocks for _ in range(b.rows))


@pytest.mark.trio
async def test_mixed_sizes_do_not_turn_into_a_commit_per_record(tmp_path: Path) -> None:
    """Small chunks that fit the cache, interleaved with windows that do not fit it at all.

    A cache that kept each small record and left each large one out would
    have a gap at every large one, and a group that stopped at each gap
    would make every record its own Delta commit.
    """
    small = [block(f"s-{i}", rows=3) for i in range(10)]
    big = [block(f"b-{i}", rows=200) for i in range(10)]
    assert 10 * _cache_cost(small[0]) < _cache_cost(big[0])
    wal = replace(LOG, cache_bytes=_cache_cost(big[0]) - 1)  # a big one never fits
    settings = WriterSettings(commit_interval_seconds=3600)  # commit_max_bytes 64 MiB
    async with writing(tmp_path, settings, wal=wal) as writer:
        for s, b in zip(small, big, strict=False):
            await (await writer.submit(s)).wait()
            await (await writer.submit(b)).wait()
        assert writer.commits == 0
    assert batch_ids(tmp_path) == _ids(small + big)
    # 20 records, 40 KB of log, commit_max_bytes 64 MiB: one or two commits at most.
    assert writer.commits <= 2, (writer.commits, writer.cached_reads, writer.file_reads)


@pytest.mark.trio
async def test_a_nearly_full_cache_fragments_under_mixed_sizes(tmp_path: Path) -> None:
    """Same, with large records that do fit an empty cache: a few commits, not one per record.

    The cache has room for one large record and some small ones; once it
    holds one large record the room left takes small records but no large
    one, which would make it alternate cached / left out.
    """
    small = [block(f"s-{i}", rows=3) for i in range(10)]
    big = [block(f"b-{i}", rows=200) for i in range(11)]
    wal = replace(LOG, cache_bytes=_cache_cost(big[0]) + 12 * _cache_cost(small[0]))
    settings = WriterSettings(commit_interval_seconds=3600)
    async with writing(tmp_path, settings, wal=wal) as writer:
        await (await writer.submit(big[10])).wait()
        for s, b in zip(small, big, strict=False):
            await (await writer.submit(s)).wait()
            await (await writer.submit(b)).wait()
    assert batch_ids(tmp_path) == _ids(small + big)
    assert writer.commits <= 3, (writer.commits, writer.cached_reads, writer.file_reads)


@pytest.mark.trio
async def test_a_gap_does_not_hold_rows_back_for_extra_intervals(tmp_path: Path) -> None:
    """docs/wal.md: rows are in the table within ``commit_interval_seconds`` of the ack.

    A group that stopped where the cache does (the cached run, then an
    interval later the record left out, then the next cached run) would put
    the third record below in the table three intervals after its ack.
    """

    small = [block(f"s-{i}", rows=3) for i in range(2)]
    big = block("b-0", rows=200)
    wal = replace(LOG, cache_bytes=_cache_cost(big) - 1)  # the window never fits the cache
    interval = 1.0
    settings = WriterSettings(commit_interval_seconds=interval)
    async with writing(tmp_path, settings, wal=wal) as writer:
        for b in (small[0], big, small[1]):
            await (await writer.submit(b)).wait()
        acked = trio.current_time()
        with trio.fail_after(30):
            while writer.commits == 0:
                await trio.sleep(0.02)
            # Give the commit loop time for anything due right after the first commit.
            await trio.sleep(interval / 2)
        in_table = batch_ids(tmp_path)
        elapsed = trio.current_time() - acked
    assert in_table == _ids([*small, big]), (writer.commits, round(elapsed, 2))
