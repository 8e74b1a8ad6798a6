"""The record format and its sans-IO scanner (appliance/wal/frame.py).

Every whole record before a cut or a flipped bit survives; the scanner never
raises, whatever the bytes, and returns nothing it did not verify.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.wal.frame import (
    BAD_BODY_CRC,
    BAD_HEADER_CRC,
    BAD_KEY,
    BAD_LENGTH,
    BAD_MAGIC,
    BAD_POSITION,
    BAD_VERSION,
    HEADER_BYTES,
    MAGIC,
    SHORT_HEADER,
    SHORT_RECORD,
    SUPERSEDED,
    Frame,
    FrameScanner,
    ScanEnd,
    SkippedRecord,
    decode_key,
    encode_key,
    frame_header,
)

from .walsupport import record_bytes, segment_bytes

BODIES = [b"first body", b"", b"x" * 300, bytes(range(256))]


def scan(data: bytes, start: int = 0, pieces: list[int] | None = None, limit: int | None = None):
    """All items and the end of a scan of ``data``, fed in pieces of the given sizes."""
    scanner = FrameScanner(start, limit=limit)
    items: list[Frame | SkippedRecord] = []
    at = 0
    for size in pieces or []:
        items += scanner.feed(data[at : at + size])
        at += size
    items += scanner.feed(data[at:])
    return items, scanner.finish()


def frames(items: list[Frame | SkippedRecord]) -> list[Frame]:
    return [i for i in items if isinstance(i, Frame)]


def test_records_round_trip_with_positions_and_keys() -> None:
    data, lsns = segment_bytes(BODIES, base=4096)
    items, end = scan(data, start=4096)
    assert [f.body for f in frames(items)] == BODIES
    assert [f.lsn for f in frames(items)] == lsns
    assert [f.key for f in frames(items)] == [("p", "s", str(i)) for i in range(len(BODIES))]
    assert end == ScanEnd(4096 + len(data), 4096 + len(data), None)
    assert frames(items)[0].end == lsns[1]


def test_key_section_round_trip() -> None:
    assert encode_key(None) == b""
    assert decode_key(b"") is None
    key = ("forward", "anonymous@192.0.2.7", "chunk-ü")
    assert decode_key(encode_key(key)) == key
    for bad in (b"\x00", b"\x00\x05ab", encode_key(key) + b"x", b"\x00\x01\xff\x00\x00\x00\x00"):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            decode_key(bad)
    with pytest.raises(ValueError, match="65535"):
        encode_key(("p", "s", "x" * 70_000))


def test_fed_one_byte_at_a_time() -> None:
    data, _ = segment_bytes(BODIES)
    items, end = scan(data, pieces=[1] * len(data))
    assert [f.body for f in frames(items)] == BODIES
    assert end.reason is None


def test_split_at_every_byte() -> None:
    data, _ = segment_bytes(BODIES)
    for cut in range(len(data) + 1):
        items, end = scan(data, pieces=[cut])
        assert [f.body for f in frames(items)] == BODIES, cut
        assert end.reason is None


def test_truncated_at_every_byte_keeps_every_whole_record_before() -> None:
    data, lsns = segment_bytes(BODIES)
    ends = [*lsns[1:], len(data)]
    for cut in range(len(data) + 1):
        items, end = scan(data[:cut])
        whole = [body for body, stop in zip(BODIES, ends, strict=True) if stop <= cut]
        assert [f.body for f in frames(items)] == whole, cut
        assert end.good_end == max([0] + [stop for stop in ends if stop <= cut])
        if cut in (0, *ends):
            assert end.reason is None
        else:
            assert end.damage_at == end.good_end
            assert end.reason in (SHORT_HEADER, SHORT_RECORD)


def test_every_single_bit_flip_is_caught() -> None:
    """A flip anywhere: the records before it survive, the flipped one is never returned."""
    data, lsns = segment_bytes(BODIES[:3])
    ends = [*lsns[1:], len(data)]
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        items, end = scan(bytes(damaged))
        hit = next(i for i, stop in enumerate(ends) if bit // 8 < stop)
        good = frames(items)
        assert [f.body for f in good[:hit]] == BODIES[:hit], bit
        assert all(f.lsn != lsns[hit] for f in good), bit
        in_header = bit // 8 - lsns[hit] < HEADER_BYTES
        if in_header:
            # The rest of the bytes cannot be framed: the scan stops there.
            assert len(good) == hit, bit
            assert end.damage_at == lsns[hit], bit
        elif hit < len(BODIES[:3]) - 1:
            # A damaged body is skipped by its verified length; later records survive.
            assert [f.body for f in good] == BODIES[:hit] + BODIES[hit + 1 : 3], bit
            assert SkippedRecord(lsns[hit], ends[hit] - lsns[hit], BAD_BODY_CRC) in items
        else:
            # The last record: a torn tail, reported where it starts.
            assert end == ScanEnd(lsns[hit], lsns[hit], BAD_BODY_CRC), bit


def test_skipped_run_at_the_end_is_part_of_the_torn_tail() -> None:
    data, lsns = segment_bytes(BODIES)
    damaged = bytearray(data)
    damaged[lsns[2] + HEADER_BYTES + 10] ^= 0xFF  # third record's body
    damaged += b"\0" * 40  # then zeros where the next header should be
    items, end = scan(bytes(damaged))
    assert [f.body for f in frames(items)] == [*BODIES[:2], BODIES[3]]
    damaged2 = bytearray(data[: lsns[3]])
    damaged2[lsns[2] + HEADER_BYTES + 10] ^= 0xFF
    items, end = scan(bytes(damaged2 + b"\0" * 40))
    assert [f.body for f in frames(items)] == BODIES[:2]
    assert not [i for i in items if isinstance(i, SkippedRecord)]
    assert end == ScanEnd(lsns[2], lsns[2], BAD_MAGIC)


def _reheader(record: bytes, **changes: int) -> bytes:
    """``record`` with header fields changed and its header CRC fixed (a forged, valid header)."""
    layout = struct.Struct(">4sBBHQIIII")
    fields = dict(
        zip(
            ("magic", "version", "kind", "key_len", "lsn", "body_len", "rows", "body_crc", "hcrc"),
            layout.unpack_from(record),
            strict=True,
        )
    )
    fields.update(changes)
    head = layout.pack(*fields.values())[:28]
    return head + zlib.crc32(head).to_bytes(4, "big") + record[HEADER_BYTES:]


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda r: b"\0" * len(r), BAD_MAGIC),
        (lambda r: b"X" + r[1:], BAD_MAGIC),
        (lambda r: r[:8] + b"\xff" + r[9:], BAD_HEADER_CRC),
        (lambda r: _reheader(r, version=2), BAD_VERSION),
        (lambda r: _reheader(r, lsn=12345), BAD_POSITION),
        (lambda r: _reheader(r, body_len=2**31), BAD_LENGTH),
    ],
)
def test_damaged_header_stops_the_scan(mangle, reason: str) -> None:  # type: ignore[no-untyped-def]
    data, lsns = segment_bytes(BODIES)
    second = data[lsns[1] : lsns[2]]
    damaged = data[: lsns[1]] + mangle(second) + data[lsns[2] :]
    items, end = scan(damaged)
    assert [f.body for f in frames(items)] == BODIES[:1]
    assert end == ScanEnd(lsns[1], lsns[1], reason)
    assert scan(damaged, pieces=[1] * len(damaged))[1] == end


def test_bad_key_is_skipped() -> None:
    body = b"payload"
    section = b"\x00\x01\xff\x00\x00\x00\x00"  # not UTF-8, but under the CRC
    record = frame_header(0, 1, section, 1, body) + section + body
    tail = record_bytes(len(record), b"next")
    items, end = scan(record + tail)
    assert items[0] == SkippedRecord(0, len(record), BAD_KEY)
    assert [f.body for f in frames(items)] == [b"next"]
    assert end.reason is None


def test_limit_supersedes_records_past_the_next_segment() -> None:
    data, lsns = segment_bytes(BODIES)
    items, end = scan(data, limit=lsns[2])
    assert [f.body for f in frames(items)] == BODIES[:2]
    assert end == ScanEnd(lsns[2], lsns[2], SUPERSEDED)


def test_a_claimed_length_is_not_allocated() -> None:
    """A verified header claiming 1 GiB over a few bytes: a short record, little memory."""
    record = record_bytes(0, b"x" * 64)
    forged = _reheader(record, body_len=(1 << 30) - HEADER_BYTES - 1)
    scanner = FrameScanner(0)
    assert scanner.feed(forged) == []
    assert scanner.buffered_bytes == len(forged)
    assert scanner.finish().reason == SHORT_RECORD


def test_magic_is_not_utf8() -> None:
    with pytest.raises(UnicodeDecodeError):
        MAGIC.decode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(1, 64), max_size=8))
def test_scanner_never_raises_and_returns_only_verified_records(
    data: bytes, pieces: list[int]
) -> None:
    items, end = scan(data, pieces=pieces)
    position = 0
    for item in items:
        assert item.lsn == position
        position = item.end
        if isinstance(item, Frame):
            assert data[item.lsn : item.end] == record_bytes(
                item.lsn, item.body, item.key, item.rows
            )
    assert end.good_end <= end.damage_at <= len(data)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=6),
    st.data(),
)
def test_any_prefix_keeps_its_whole_records(bodies: list[bytes], data: st.DataObject) -> None:
    log, lsns = segment_bytes(bodies)
    cut = data.draw(st.integers(0, len(log)))
    items, _end = scan(log[:cut], pieces=data.draw(st.lists(st.integers(1, 50), max_size=5)))
    ends = [*lsns[1:], len(log)]
    assert [f.body for f in frames(items)] == [
        b for b, e in zip(bodies, ends, strict=True) if e <= cut
    ]
