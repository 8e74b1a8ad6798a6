"""The RowBlock record codec (appliance/wal/blocks.py): exact round trips, nothing trusted."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.timefmt import MAX_TIME_NS, MIN_TIME_NS
from appliance.wal.blocks import BLOCK_FORMAT, decode_block, encode_block
from appliance.wal.errors import RecordDecodeError

from .walsupport import RECEIVED_AT_NS, sample_block


def as_lists(block: RowBlock) -> RowBlock:
    """``block`` with every sequence field as a list (what decode gives back)."""

    def listed(value: object) -> object:
        return value if value is None or isinstance(value, str) else list(value)  # type: ignore[call-overload]

    return replace(
        block,
        tag=listed(block.tag),  # type: ignore[arg-type]
        host=listed(block.host),  # type: ignore[arg-type]
        times_ns=list(block.times_ns),
        records=list(block.records),
    )


VARIANTS = [
    sample_block(),
    sample_block(batch_id=None),
    replace(sample_block(), host=None),
    replace(sample_block(events=3), tag=["a", "b", "c"], host=["h1", None, "h3"]),
    replace(sample_block(events=2), times_ns=(None, None), records=("{}", '{"ü": "☃"}')),
    replace(sample_block(events=0), times_ns=[], records=[], tag=[], host=[]),
    replace(sample_block(events=1), times_ns=[MIN_TIME_NS], received_at_ns=MAX_TIME_NS),
]


@pytest.mark.parametrize("block", VARIANTS)
def test_round_trip_is_exact(block: RowBlock) -> None:
    decoded = decode_block(encode_block(block), rows=block.rows)
    assert decoded == as_lists(block)
    assert type(decoded.tag) is type(as_lists(block).tag)


times = st.one_of(st.none(), st.integers(MIN_TIME_NS, MAX_TIME_NS))


@st.composite
def blocks(draw: st.DrawFn) -> RowBlock:
    rows = draw(st.integers(0, 8))
    safe = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
    short = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
    tag = draw(st.one_of(short, st.lists(short, min_size=rows, max_size=rows)))
    host = draw(
        st.one_of(
            st.none(), short, st.lists(st.one_of(st.none(), short), min_size=rows, max_size=rows)
        )
    )
    return RowBlock(
        protocol=draw(short),
        source=draw(short),
        peer=draw(short),
        received_at_ns=draw(st.integers(MIN_TIME_NS, MAX_TIME_NS)),
        batch_id=draw(st.one_of(st.none(), short.filter(bool))),
        tag=tag,
        host=host,
        times_ns=draw(st.lists(times, min_size=rows, max_size=rows)),
        records=draw(st.lists(safe, min_size=rows, max_size=rows)),
    )


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_round_trip_property(block: RowBlock) -> None:
    check_block(block)
    assert decode_block(encode_block(block)) == as_lists(block)


def _packb_body(block: RowBlock) -> bytes:
    """The body as ``msgpack.packb`` wrote it before msgspec's encoder did (same layout)."""
    tag = block.tag if isinstance(block.tag, str) else list(block.tag)
    host = block.host if block.host is None or isinstance(block.host, str) else list(block.host)
    fields = [
        BLOCK_FORMAT, block.protocol, block.source, block.peer, block.received_at_ns,
        block.batch_id, tag, host, list(block.times_ns), list(block.records), block.nbytes,
    ]  # fmt: skip
    return msgpack.packb(fields, use_bin_type=True)


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_body_is_msgpack_packb_bytes(block: RowBlock) -> None:
    """Logs written before and after the encoder changed hold the same bytes for a block."""
    check_block(block)
    assert encode_block(block) == _packb_body(block)


@pytest.mark.parametrize("chars", [0, 31, 32, 255, 256, 65535, 65536])
@pytest.mark.parametrize("rows", [0, 15, 16, 65535, 65536])
def test_body_is_msgpack_packb_bytes_at_format_bounds(chars: int, rows: int) -> None:
    """str and array headers change format at these lengths, ints at these values (msgpack spec)."""
    ints = [MIN_TIME_NS, -(2**31) - 1, -129, -33, -32, -1, 0, 127, 128, 2**16, 2**32, MAX_TIME_NS]
    block = RowBlock(
        protocol="forward", source="s" * chars, peer="p", received_at_ns=MAX_TIME_NS,
        batch_id=None, tag="t", host=None, times_ns=(ints * rows)[:rows], records=["r"] * rows,
    )  # fmt: skip
    assert encode_block(block) == _packb_body(block)


def _pack(values: list[object]) -> bytes:
    return msgpack.packb(values, use_bin_type=True)


def _fields(block: RowBlock) -> list[object]:
    return msgpack.unpackb(encode_block(block), raw=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f[:5], "not a block array"),
        (lambda f: [2, *f[1:]], "unknown block format"),
        (lambda f: [True, *f[1:]], "unknown block format"),
        (lambda f: [*f[:1], b"forward", *f[2:]], "protocol is not a string"),
        (lambda f: [*f[:4], True, *f[5:]], "received_at_ns is not an integer"),
        (lambda f: [*f[:4], 1.5, *f[5:]], "received_at_ns is not an integer"),
        (lambda f: [*f[:5], 7, *f[6:]], "batch_id is not a string"),
        (lambda f: [*f[:6], ["a", None, "c"], *f[7:]], "tag holds"),
        (lambda f: [*f[:7], [1, 2, 3], *f[8:]], "host holds"),
        (lambda f: [*f[:8], [1, "x", None], *f[9:]], "a time is not an integer"),
        (lambda f: [*f[:8], [1, True, None], *f[9:]], "a time is not an integer"),
        (lambda f: [*f[:9], ["{}", None, "{}"], *f[10:]], "records holds"),
        (lambda f: [*f[:9], ["{}"], *f[10:]], "block refused"),
        (lambda f: [*f[:8], [2**63, None, None], *f[9:]], "block refused"),
        (lambda f: [*f[:6], "t" * 2000, *f[7:]], "block refused"),
        (lambda f: [*f[:5], "", *f[6:]], "block refused"),
        (lambda f: {"not": "a list"}, "not a block array"),
    ],
)
def test_decode_refuses_what_was_never_encoded(change, message: str) -> None:  # type: ignore[no-untyped-def]
    body = _pack(change(_fields(sample_block())))
    with pytest.raises(RecordDecodeError, match=message):
        decode_block(body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xc1",
        b"\x9b",  # an 11-array with nothing in it
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
        b"\xdb\xff\xff\xff\xff",  # a str claiming 4 GiB
        _pack([BLOCK_FORMAT]) + b"trailing",
        msgpack.packb([msgpack.ExtType(5, b"x")] * 11),
        # a str that is not UTF-8
        b"\x9b\x01\xa2\xff\xfe" + b"\xc0" * 9,
    ],
)
def test_decode_refuses_garbage(body: bytes) -> None:
    with pytest.raises(RecordDecodeError):
        decode_block(body)


def test_rows_must_match_the_header() -> None:
    with pytest.raises(RecordDecodeError, match="header says 5 rows"):
        decode_block(encode_block(sample_block(events=3)), rows=5)


def test_decode_memory_is_bounded_by_the_body() -> None:
    """msgpack's worst ratio (many tiny strings): memory stays a small multiple of the body."""
    rows = 100_000
    body = _pack(
        [
            BLOCK_FORMAT,
            "p",
            "s",
            "x",
            RECEIVED_AT_NS,
            None,
            "t",
            None,
            [None] * rows,
            ["{}"] * rows,
            RowBlock("p", "s", "x", RECEIVED_AT_NS, None, "t", None, [None], ["{}"]).nbytes * rows,
        ]
    )
    tracemalloc.start()
    try:
        decode_block(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * len(body), (peak, len(body))


def test_sequences_of_other_types_are_encoded() -> None:
    block = replace(sample_block(events=3), records=tuple(sample_block(events=3).records))
    assert decode_block(encode_block(block)).records == list(block.records)
