"""Fuzz target: the write-ahead log's recovery scanner and record codec (appliance/wal/).

Run: ``python fuzz/fuzz_wal.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; the payload is the bytes of one
segment file whose base is position 0 (what recovery finds on disk after a
crash, a bit flip or a forged file). The scanner is fed the payload as the
harness's reads (up to three pieces, or a byte at a time) and must:

* never raise, and end the same way however the bytes were split;
* return only records that verify: each one's bytes in the payload are
  exactly what ``frame_header`` + key + body encode, at contiguous positions;
* report a stop position inside the payload, after every good record.

Each record of the RowBlock kind is decoded (``decode_block``): it becomes a
block that passes the row checks and converts to Arrow, or raises
``RecordDecodeError`` (the one expected exception); all blocks of a segment
are converted together, as one commit group. Flag bits:

* ``0x01``: also recover the payload through ``SegmentStore.open`` in a
  temporary directory: the file must end up truncated at the damage, and a
  replay must return exactly the scanner's records.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.blocks.block import RowBlock
    from appliance.wal.blocks import decode_block
    from appliance.wal.errors import RecordDecodeError
    from appliance.wal.frame import (
        KIND_ROW_BLOCK,
        Frame,
        FrameScanner,
        ScanEnd,
        SkippedRecord,
        encode_key,
        frame_header,
    )
    from appliance.wal.segments import SegmentStore, segment_name
    from fuzz.harness import FuzzInput, check_group, check_rows, fuzz_main

RECOVER: Final = 0x01
#: Segment size for the recovery flag: larger than any fuzz input, so one segment.
_SEGMENT_BYTES: Final = 1 << 20


def _scan(reads: list[bytes | bytearray]) -> tuple[list[Frame | SkippedRecord], ScanEnd]:
    scanner = FrameScanner(0)
    items: list[Frame | SkippedRecord] = []
    for data in reads:
        items += scanner.feed(data)
    return items, scanner.finish()


def _check_frames(payload: bytes, items: list[Frame | SkippedRecord], end: ScanEnd) -> None:
    position = 0
    for item in items:
        assert item.lsn == position, (item.lsn, position)
        position = item.end
        if isinstance(item, Frame):
            section = encode_key(item.key)
            encoded = frame_header(item.lsn, item.kind, section, item.rows, item.body)
            assert payload[item.lsn : item.end] == encoded + section + item.body
    assert 0 <= end.good_end <= end.damage_at <= len(payload), end
    if end.reason is None:
        assert end.damage_at == len(payload), end


def _decode(frames: list[Frame]) -> None:
    blocks: list[RowBlock] = []
    for frame in frames:
        if frame.kind != KIND_ROW_BLOCK:
            continue
        try:
            block = decode_block(frame.body, frame.rows)
        except RecordDecodeError:
            continue
        assert check_rows(block), "decode_block returned a block check_block refuses"
        blocks.append(block)
    check_group(blocks)


def _recover(payload: bytes, frames: list[Frame], end: ScanEnd) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-wal-") as tmp:
        directory = Path(tmp) / "wal"
        directory.mkdir()
        path = directory / segment_name(0)
        path.write_bytes(payload)
        store, recovery = SegmentStore.open(directory, 0, _SEGMENT_BYTES)
        try:
            assert path.stat().st_size == end.damage_at, (path.stat().st_size, end)
            assert recovery.durable_end == end.damage_at
            replayed = list(store.replay(0))
            assert [(f.lsn, f.body) for f in replayed] == [(f.lsn, f.body) for f in frames]
        finally:
            store.close()


def run_one(data: bytes) -> None:
    """One segment's bytes through the scanner, the block codec and, if flagged, recovery."""
    fuzz = FuzzInput.parse(data)
    items, end = _scan(fuzz.reads())
    whole_items, whole_end = _scan([fuzz.payload])
    assert (items, end) == (whole_items, whole_end), "the scan depends on how bytes were split"
    _check_frames(fuzz.payload, items, end)
    frames = [item for item in items if isinstance(item, Frame)]
    _decode(frames)
    if fuzz.has(RECOVER):
        _recover(fuzz.payload, frames, end)


if __name__ == "__main__":
    fuzz_main(run_one)
