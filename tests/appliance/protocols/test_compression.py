"""The bounded gzip and zlib decoders: results, errors, and work per input byte.

The work tests count what zlib is handed (bytes fed, bytes it copies into
``unused_data``) through a counting wrapper instead of timing anything: the
old decoder handed zlib the whole rest of the input once per gzip member,
which made many small members quadratic.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from typing import Any

import pytest
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
