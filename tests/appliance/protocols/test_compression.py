"""The bounded gzip, zlib and zstd decoders: results, errors, and work per input byte.

The work tests count what zlib is handed (bytes fed, bytes it copies into
``unused_data``) through a counting wrapper instead of timing anything: the
old decoder handed zlib the whole rest of the input once per gzip member,
which made many small members quadratic. The zstd tests count, the same
way, what libzstd is handed and the output bytes it produces.
"""

from __future__ import annotations

import functools
import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocols import compression
from appliance.protocols.compression import (
    CompressionError,
    InvalidDataError,
    OutputLimitError,
    TruncatedError,
    gunzip,
    inflate,
    unzstd,
)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EMPTY_MEMBER = gzip.compress(b"", mtime=0)


def members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(part, mtime=0) for part in parts)


@dataclass
class Work:
    """What the decoder asked of zlib."""

    streams: int = 0  # decompressobj() calls: one per gzip member or zlib stream
    fed: int = 0  # bytes handed to decompress()
    copied: int = 0  # bytes zlib copied into unused_data at the end of a stream


class _Counting:
    def __init__(self, real: Any, work: Work) -> None:
        self._real = real
        self._work = work

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        self._work.fed += len(data)
        out: bytes = self._real.decompress(data, max_length)
        if self._real.eof:
            self._work.copied += len(self._real.unused_data)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    counted = Work()
    real = zlib.decompressobj

    def counting(*args: Any, **kwargs: Any) -> _Counting:
        counted.streams += 1
        return _Counting(real(*args, **kwargs), counted)

    monkeypatch.setattr(compression.zlib, "decompressobj", counting)
    return counted


# -- results ----------------------------------------------------------------------


def test_one_member() -> None:
    assert gunzip(gzip.compress(b"hello"), 5) == b"hello"


def test_several_members_and_empty_ones() -> None:
    assert gunzip(members(b"ab", b"", b"cd", b""), 4) == b"abcd"
    assert gunzip(EMPTY_MEMBER * 1000, 0) == b""


@pytest.mark.parametrize("size", [0, 1, 43, 44, 45, 63, 64, 65, 127, 128, 129, 1000, 70_000])
def test_member_boundaries_around_the_slice_sizes(size: int) -> None:
    # Incompressible payloads put the end of a member at every offset of the
    # 64, 128, 256 ... byte slices the decoder hands zlib.
    payloads = [bytes((i * 7 + j) % 251 for j in range(size + i)) for i in range(5)]
    data = members(*payloads)
    assert gunzip(data, len(b"".join(payloads))) == b"".join(payloads)


def test_large_member() -> None:
    payload = bytes(range(256)) * 4000
    assert gunzip(members(payload, b"x", payload), 2 * len(payload) + 1) == payload + b"x" + payload


def test_inflate_zlib_and_gzip() -> None:
    payload = b"logjam " * 100
    assert inflate(zlib.compress(payload), len(payload)) == payload
    assert inflate(gzip.compress(payload), len(payload)) == payload
    assert inflate(members(payload, payload), 2 * len(payload)) == payload * 2


# -- errors -----------------------------------------------------------------------------


def test_every_cut_inside_a_member_is_truncated() -> None:
    parts = [b"first member " * 20, b"", b"third"]
    data = members(*parts)
    ends = []
    offset = 0
    for part in parts:
        offset += len(gzip.compress(part, mtime=0))
        ends.append(offset)
    for cut in range(len(data)):
        if cut in ends:
            complete = parts[: ends.index(cut) + 1]
            assert gunzip(data[:cut], 10**6) == b"".join(complete)
        else:
            with pytest.raises(TruncatedError):
                gunzip(data[:cut], 10**6)


def test_empty_input_is_truncated() -> None:
    with pytest.raises(TruncatedError):
        gunzip(b"", 10)
    with pytest.raises(TruncatedError):
        inflate(b"", 10)


@pytest.mark.parametrize(
    "data",
    [b"not gzip at all", zlib.compress(b"zlib, not gzip"), gzip.compress(b"ok") + b"garbage!"],
    ids=["text", "zlib", "member-then-garbage"],
)
def test_gunzip_refuses_what_is_not_gzip(data: bytes) -> None:
    with pytest.raises(InvalidDataError):
        gunzip(data, 10**6)


def test_inflate_refuses_garbage_after_the_body() -> None:
    with pytest.raises(CompressionError, match="garbage"):
        inflate(zlib.compress(b"body") + b"tail", 10**6)
    with pytest.raises(CompressionError, match="garbage"):
        inflate(gzip.compress(b"body") + b"tail", 10**6)


def test_output_limit_exact_and_one_over() -> None:
    data = members(b"a" * 100, b"b" * 100)
    assert gunzip(data, 200) == b"a" * 100 + b"b" * 100
    with pytest.raises(OutputLimitError):
        gunzip(data, 199)
    with pytest.raises(OutputLimitError):
        inflate(zlib.compress(b"z" * 1000), 999)


def test_negative_limit_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="negative"):
        gunzip(EMPTY_MEMBER, -1)


# -- work per input byte ------------------------------------------------------------------


def test_empty_members_cost_a_bounded_amount_each(work: Work) -> None:
    count = 2000
    data = EMPTY_MEMBER * count
    assert gunzip(data, 0) == b""
    assert work.streams == count
    # Each member is handed at most twice its size plus the first slice, and
    # zlib copies at most the rest of one slice: linear in the input. The
    # old decoder handed zlib the rest of the input per member: about
    # count * len(data) / 2 = 40 MB here.
    first = compression._FIRST_SLICE_BYTES
    assert work.fed <= 2 * len(data) + count * first
    assert work.copied <= len(data) + count * first


def test_work_is_linear_for_members_of_every_size(work: Work) -> None:
    parts = [bytes((i * 13 + j) % 256 for j in range(i * 37)) for i in range(200)]
    data = members(*parts)
    assert gunzip(data, 10**7) == b"".join(parts)
    assert work.streams == len(parts)
    first = compression._FIRST_SLICE_BYTES
    assert work.fed <= 2 * len(data) + len(parts) * first
    assert work.copied <= len(data) + len(parts) * first


def test_one_large_member_is_fed_once(work: Work) -> None:
    payload = bytes(range(256)) * 2000
    data = gzip.compress(payload)
    assert gunzip(data, len(payload)) == payload
    assert work.streams == 1
    assert work.fed <= 2 * len(data) + compression._FIRST_SLICE_BYTES
    assert work.copied == 0


# -- hypothesis -------------------------------------------------------------------------


@FAST
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8))
def test_generated_members_round_trip(parts: list[bytes]) -> None:
    expected = b"".join(parts)
    assert gunzip(members(*parts), len(expected)) == expected
    assert inflate(members(*parts), len(expected)) == expected


@FAST
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=500))
def test_arbitrary_bytes_raise_only_compression_errors(data: bytes, limit: int) -> None:
    for decode in (gunzip, inflate):
        try:
            out = decode(data, limit)
        except CompressionError:
            continue
        assert len(out) <= limit


@FAST
@given(st.lists(st.binary(max_size=100), min_size=1, max_size=4), st.data())
def test_corrupted_members_raise_only_compression_errors(parts: list[bytes], data: Any) -> None:
    raw = bytearray(members(*parts))
    index = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    try:
        out = gunzip(bytes(raw), 10**6)
    except CompressionError:
        return
    assert len(out) <= 10**6


# -- zstd ----------------------------------------------------------------------------
#
# Frames as the real senders write them (docs/forward.md): Fluentd's zstd-ruby
# StreamWriter streams one frame per buffer append, without a content size;
# Fluent Bit's flb_zstd_compress is one-shot ZSTD_compress at level 1, with
# the content size (a single-segment frame).


def fluentd_frame(data: bytes) -> bytes:
    """One frame the way zstd-ruby's StreamWriter writes it: write, flush, finish."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    return (
        compressor.compress(data)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    )


def fluent_bit_frame(data: bytes) -> bytes:
    """One frame the way flb_zstd_compress writes it: ZSTD_compress(level 1)."""
    return zstandard.ZstdCompressor(level=1).compress(data)


def frames(*parts: bytes) -> bytes:
    return b"".join(fluentd_frame(part) for part in parts)


#: A skippable frame (RFC 8878 3.1.2) of three bytes: libzstd skips it.
SKIPPABLE = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"


def test_zstd_frame_kinds() -> None:
    payload = b"fluent " * 1000
    for frame in (fluentd_frame(payload), fluent_bit_frame(payload)):
        assert unzstd(frame, len(payload)) == payload
    assert zstandard.get_frame_parameters(fluentd_frame(payload)).content_size == (
        zstandard.CONTENTSIZE_UNKNOWN
    )
    assert zstandard.get_frame_parameters(fluent_bit_frame(payload)).content_size == len(payload)
    checked = zstandard.ZstdCompressor(write_checksum=True).compress(payload)
    assert unzstd(checked, len(payload)) == payload


def test_zstd_several_frames_empty_and_skippable_ones() -> None:
    data = frames(b"ab", b"", b"cd") + SKIPPABLE + fluent_bit_frame(b"ef") + frames(b"")
    assert unzstd(data, 6) == b"abcdef"
    assert unzstd(frames(b"") * 1000, 0) == b""
    assert unzstd(SKIPPABLE, 0) == b""


def test_zstd_large_frames() -> None:
    payload = bytes(range(256)) * 4000  # about 1 MiB, several blocks and reads
    data = frames(payload, b"x") + fluent_bit_frame(payload)
    assert unzstd(data, 2 * len(payload) + 1) == payload + b"x" + payload


def test_zstd_every_cut_inside_a_frame_is_truncated() -> None:
    parts = [
        fluentd_frame(b"first frame " * 20),
        fluentd_frame(b""),
        SKIPPABLE,
        zstandard.ZstdCompressor(write_checksum=True).compress(b"checked " * 30),
        fluent_bit_frame(bytes(range(256)) * 3),
    ]
    outputs = [b"first frame " * 20, b"", b"", b"checked " * 30, bytes(range(256)) * 3]
    data = b"".join(parts)
    ends = [sum(len(part) for part in parts[: i + 1]) for i in range(len(parts))]
    for cut in range(len(data)):
        if cut in ends:
            assert unzstd(data[:cut], 10**6) == b"".join(outputs[: ends.index(cut) + 1])
        else:
            # Never a prefix of the output: a checksum, a last block or a
            # skippable frame cut short is refused like the rest.
            with pytest.raises(TruncatedError):
                unzstd(data[:cut], 10**6)
    assert unzstd(data, 10**6) == b"".join(outputs)


def test_zstd_empty_input_is_truncated() -> None:
    with pytest.raises(TruncatedError):
        unzstd(b"", 10)


@pytest.mark.parametrize(
    "data",
    [
        b"not zstd at all",
        gzip.compress(b"gzip, not zstd"),
        frames(b"ok") + b"garbage!",
        frames(b"ok") + b"\x00",
        b"\x92\x01\x81\xa1a\x01",  # plain msgpack entries
    ],
    ids=["text", "gzip", "frame-then-garbage", "frame-then-one-byte", "msgpack"],
)
def test_unzstd_refuses_what_is_not_zstd(data: bytes) -> None:
    with pytest.raises(InvalidDataError):
        unzstd(data, 10**6)


def test_zstd_bad_checksum_is_invalid() -> None:
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(b"payload " * 10))
    frame[-1] ^= 0xFF
    with pytest.raises(InvalidDataError, match=r"(?i)checksum"):
        unzstd(bytes(frame), 10**6)


def test_zstd_reserved_block_type_is_invalid() -> None:
    # Checked by the frame walk too (libzstd refuses it first in unzstd).
    frame = bytes.fromhex("28b52ffd") + b"\x20\x00" + b"\x07\x00\x00"
    with pytest.raises(InvalidDataError):
        compression._zstd_check_frames(frame)
    with pytest.raises(InvalidDataError):
        unzstd(frame, 10)


def test_zstd_window_is_bounded() -> None:
    # A streamed frame declares its window: up to 8 MiB whatever the limit
    # (zstd's levels 1 to 19), larger only up to the limit (at most 128 MiB).
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = compressor.compress(b"wide window") + compressor.flush()
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 24
    with pytest.raises(InvalidDataError, match="memory"):
        unzstd(frame, 1 << 20)
    assert unzstd(frame, 1 << 24) == b"wide window"
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=23)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = compressor.compress(b"level 19's window") + compressor.flush()
    assert unzstd(frame, 100) == b"level 19's window"


def test_zstd_output_limit_exact_and_one_over() -> None:
    data = frames(b"a" * 100, b"b" * 100)
    assert unzstd(data, 200) == b"a" * 100 + b"b" * 100
    with pytest.raises(OutputLimitError):
        unzstd(data, 199)
    with pytest.raises(OutputLimitError):
        unzstd(fluent_bit_frame(b"z"), 0)
    with pytest.raises(ValueError, match="negative"):
        unzstd(data, -1)


@dataclass
class ZstdWork:
    """What the decoder asked of libzstd."""

    decompressors: int = 0
    sources: list[Any] = field(default_factory=list)  # what each stream_reader reads
    asked: int = 0  # output bytes asked for, over all reads
    largest_ask: int = 0
    produced: int = 0  # output bytes libzstd returned


class _CountingReader:
    def __init__(self, real: Any, work: ZstdWork) -> None:
        self._real = real
        self._work = work

    def __enter__(self) -> _CountingReader:
        self._real.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.__exit__(*exc)

    def read(self, size: int = -1) -> bytes:
        assert size > 0, "never read all: the output must be bounded"
        self._work.asked += size
        self._work.largest_ask = max(self._work.largest_ask, size)
        out: bytes = self._real.read(size)
        self._work.produced += len(out)
        return out


@pytest.fixture
def zstd_work(monkeypatch: pytest.MonkeyPatch) -> ZstdWork:
    counted = ZstdWork()
    real = zstandard.ZstdDecompressor

    class Counting:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            counted.decompressors += 1
            self._real = real(*args, **kwargs)

        def stream_reader(self, source: Any, **kwargs: Any) -> _CountingReader:
            counted.sources.append(source)
            return _CountingReader(self._real.stream_reader(source, **kwargs), counted)

    monkeypatch.setattr(compression.zstandard, "ZstdDecompressor", Counting)
    return counted


@functools.cache
def zstd_bombs() -> tuple[bytes, bytes]:
    """1 GiB of zeros as one frame (about 32 KiB) and as 1024 frames of 1 MiB."""
    compressor = zstandard.ZstdCompressor(level=19).compressobj()
    mebibyte = bytes(1 << 20)
    one = b"".join(compressor.compress(mebibyte) for _ in range(1024)) + compressor.flush()
    return one, frames(mebibyte) * 1024


@pytest.mark.parametrize("limit", [0, 1, 1000, 1 << 20, 64 << 20])
def test_a_zstd_bomb_produces_at_most_the_limit_plus_one_byte(
    zstd_work: ZstdWork, limit: int
) -> None:
    # libzstd is never asked for more than one byte past the room left.
    for bomb in zstd_bombs():
        assert len(bomb) < 1 << 20
        zstd_work.produced = 0
        with pytest.raises(OutputLimitError):
            unzstd(bomb, limit)
        assert limit < zstd_work.produced <= limit + 1
    assert zstd_work.largest_ask <= compression._ZSTD_READ_BYTES


def test_zstd_reads_the_input_once_in_place(zstd_work: ZstdWork) -> None:
    count = 5000
    data = frames(b"") * count + frames(*[bytes([i]) * i for i in range(200)])
    assert unzstd(data, 10**6) == b"".join(bytes([i]) * i for i in range(200))
    # One decoder and one reader for all the frames, reading the input object
    # itself (no copy, no slice per frame); output asked for in bounded reads.
    assert zstd_work.decompressors == 1
    assert len(zstd_work.sources) == 1
    assert zstd_work.sources[0] is data
    assert zstd_work.produced == sum(range(200))


def test_zstd_frame_walk_steps_once_per_frame_and_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # The walk reads each block header once: count the struct reads.
    calls = 0
    real = compression._ZSTD_BLOCK_HEADER

    class Counting:
        size = real.size

        @staticmethod
        def unpack_from(buffer: Any, offset: int = 0) -> tuple[Any, ...]:
            nonlocal calls
            calls += 1
            return real.unpack_from(buffer, offset)

    monkeypatch.setattr(compression, "_ZSTD_BLOCK_HEADER", Counting)
    count = 3000
    compression._zstd_check_frames(frames(b"") * count)
    assert calls == count  # an empty frame is one (last, raw, empty) block
    payload = bytes(range(256)) * 2000  # 512 KB: 4 blocks of 128 KiB
    calls = 0
    compression._zstd_check_frames(fluent_bit_frame(payload))
    assert calls <= len(payload) // (128 * 1024) + 1


@FAST
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8), st.booleans())
def test_generated_zstd_frames_round_trip(parts: list[bytes], one_shot: bool) -> None:
    expected = b"".join(parts)
    frame = fluent_bit_frame if one_shot else fluentd_frame
    assert unzstd(b"".join(frame(part) for part in parts), len(expected)) == expected


@FAST
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=500))
def test_arbitrary_bytes_raise_only_compression_errors_from_unzstd(data: bytes, limit: int) -> None:
    for candidate in (data, compression.ZSTD_MAGIC + data):
        try:
            out = unzstd(candidate, limit)
        except CompressionError:
            continue
        assert len(out) <= limit


@FAST
@given(st.lists(st.binary(max_size=100), min_size=1, max_size=4), st.data())
def test_corrupted_zstd_frames_raise_only_compression_errors(parts: list[bytes], data: Any) -> None:
    raw = bytearray(frames(*parts))
    index = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    try:
        out = unzstd(bytes(raw), 10**6)
    except CompressionError:
        return
    assert len(out) <= 10**6
