"""Rfc3339Cache.times_ns is rfc3339_ns, value for value (appliance/blocks/timecache.py)."""

from __future__ import annotations

import numpy  # noqa: F401  (loaded, as pyarrow loads it in the service: the vector path runs)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks import timecache
from appliance.blocks.timecache import Rfc3339Cache
from appliance.blocks.timefmt import rfc3339_ns

_DIGITS = st.sampled_from("0123456789")
_ODD = st.sampled_from(["²", "٣", " ", "-", ":", "T", "t", "Z", "z", ".", "+", "x", "0", "9"])


@st.composite
def stamps(draw: st.DrawFn) -> str:
    """Times near the cached shape: edge years, bad dates, odd characters, fractions."""
    year = draw(st.sampled_from(["1677", "1678", "2262", "2261", "0001", "9999", "2026", "1970"]))
    month = draw(st.sampled_from(["01", "02", "09", "12", "13", "00"]))
    day = draw(st.sampled_from(["01", "21", "22", "29", "30", "31", "32", "00"]))
    clock = draw(st.sampled_from(["00:00:00", "23:59:59", "23:47:16", "24:00:00", "12:60:00"]))
    fraction = draw(st.sampled_from(["", ".", ".1", ".123", ".854775807", ".999999999",
                                     ".1234567891", "." + "9" * 12]))  # fmt: skip
    suffix = draw(st.sampled_from(["Z", "z", "", "+00:00", "Z "]))
    text = f"{year}-{month}-{day}T{clock}{fraction}{suffix}"
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(_ODD | _DIGITS) + text[i + 1 :]
    return text


values = stamps() | st.text(max_size=32) | st.none() | st.integers() | st.floats()


@settings(max_examples=1000)
@given(st.lists(values, max_size=20))
def test_times_ns_is_rfc3339_ns(batch: list[object]) -> None:
    cache = Rfc3339Cache()
    expected = [rfc3339_ns(v) for v in batch]
    assert cache.times_ns(batch) == expected
    assert cache.times_ns(batch) == expected  # now from the cache


def test_the_range_edges() -> None:
    cache = Rfc3339Cache()
    batch = [
        "2262-04-11T23:47:16.854775807Z",  # MAX_TIME_NS
        "2262-04-11T23:47:16.854775808Z",  # one past it
        "1677-09-21T00:12:43.145224192Z",  # MIN_TIME_NS: its second alone is out of range
        "1677-09-21T00:12:43.145224191Z",
        "2026-02-30T00:00:00Z",
        "2026-11-22T10:00:07.Z",
    ]
    assert cache.times_ns(batch) == [rfc3339_ns(v) for v in batch]
    assert cache.times_ns(batch)[0] == 2**63 - 1


def test_the_cache_is_bounded() -> None:
    cache = Rfc3339Cache()
    stamps_ = [f"2026-11-22T10:{m:02d}:{s:02d}.5Z" for m in range(60) for s in range(60)]
    limit = timecache.CACHED_SECONDS
    assert cache.times_ns(stamps_ * 2) == [rfc3339_ns(v) for v in stamps_ * 2]
    assert len(cache._seconds) <= limit


@st.composite
def uniform_batches(draw: st.DrawFn) -> list[str]:
    """Batches of one length (the column checks), now and then a value that breaks the shape."""
    digits = draw(st.sampled_from([None, 0, 1, 3, 6, 9]))
    fraction = "" if digits is None else "." + "7" * digits
    batch = []
    for _ in range(draw(st.integers(8, 24))):
        year = draw(st.sampled_from(["2026", "1677", "2262", "1970", "0001"]))
        day = draw(st.sampled_from(["22", "30", "21", "11"]))
        month = draw(st.sampled_from(["11", "02", "09", "04"]))
        clock = draw(st.sampled_from(["10:00:07", "23:47:16", "00:12:43", "24:00:00"]))
        text = f"{year}-{month}-{day}T{clock}{fraction}Z"
        if draw(st.integers(0, 9)) == 0:
            i = draw(st.integers(0, len(text) - 1))
            text = text[:i] + draw(_ODD | _DIGITS) + text[i + 1 :]
        batch.append(text)
    return batch


@settings(max_examples=1000)
@given(uniform_batches())
def test_batches_of_one_length_are_rfc3339_ns(batch: list[str]) -> None:
    cache = Rfc3339Cache()
    expected = [rfc3339_ns(v) for v in batch]
    assert cache.times_ns(batch) == expected
    assert cache.times_ns(batch) == expected


def test_a_beats_window_is_read_in_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [f"2026-11-22T10:00:{s:02d}.{s:03d}Z" for s in range(60)]
    cache = Rfc3339Cache()
    assert cache._uniform(batch) == [rfc3339_ns(v) for v in batch]


@settings(max_examples=1000)
@given(uniform_batches())
def test_the_vector_path_is_the_dict_path(batch: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timecache, "loaded_numpy", lambda: None)
        plain = Rfc3339Cache().times_ns(batch)
    assert Rfc3339Cache().times_ns(batch) == plain == [rfc3339_ns(v) for v in batch]


@st.composite
def digit_batches(draw: st.DrawFn) -> list[str]:
    """Batches of one shape whose every digit is drawn: valid dates, and now and then any."""
    digits = draw(st.integers(0, 9))
    fraction = "." + "".join(draw(_DIGITS) for _ in range(digits)) if digits else ""
    wild = draw(st.booleans())  # fields out of range too (most such batches go to the dict)
    ranges = ((1, 12), (1, 31 if wild else 28), (0, 23), (0, 59), (0, 59))
    century = draw(st.sampled_from(["19", "20", "21", "22", "16", "00", "99"]))
    batch = []
    for _ in range(draw(st.integers(8, 16))):
        year = century + "".join(draw(_DIGITS) for _ in range(2))
        month, day, hour, minute, second = (
            draw(st.integers(0, 99) if wild and draw(st.integers(0, 9)) == 0 else st.integers(*r))
            for r in ranges
        )
        clock = f"{hour:02d}:{minute:02d}:{second:02d}"
        batch.append(f"{year}-{month:02d}-{day:02d}T{clock}{fraction}Z")
    return batch


@settings(max_examples=2000)
@given(digit_batches())
def test_any_date_in_columns_is_rfc3339_ns(batch: list[str]) -> None:
    assert Rfc3339Cache().times_ns(batch) == [rfc3339_ns(v) for v in batch]


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-02-29T12:00:00.5Z",  # a leap day
        "2000-02-29T00:00:00Z",  # 2000 is a leap year, 1900 is not
        "1900-02-29T00:00:00Z",
        "1970-01-01T00:00:00.000000001Z",
        "1969-12-31T23:59:59.999Z",
        "2262-04-11T23:47:15.999999999Z",  # the last second the vector path takes
        "2262-04-11T23:47:16.854775807Z",  # MAX_TIME_NS
        "1677-09-21T00:12:44.000Z",
        "1677-09-21T00:12:43.145224192Z",  # MIN_TIME_NS
        "2026-04-31T00:00:00Z",
        "2026-12-31T23:59:60Z",
        "0000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
    ],
)
def test_calendar_edges_in_columns(stamp: str) -> None:
    batch = [stamp] * 9
    assert Rfc3339Cache().times_ns(batch) == [rfc3339_ns(stamp)] * 9


def test_a_beats_window_needs_no_prefix_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parse(self: Rfc3339Cache, prefix: str) -> int | None:
        raise AssertionError(prefix)

    monkeypatch.setattr(Rfc3339Cache, "_prefix_ns", no_parse)
    batch = [f"2026-11-22T10:{s:02d}:{s:02d}.{s:03d}Z" for s in range(60)]
    assert Rfc3339Cache().times_ns(batch) == [rfc3339_ns(v) for v in batch]


@settings(max_examples=500)
@given(uniform_batches() | st.lists(values, max_size=20))
def test_a_complete_column_holds_no_none(batch: list[object]) -> None:
    times, complete = Rfc3339Cache().column_ns(batch)
    assert times == [rfc3339_ns(v) for v in batch]
    assert not complete or None not in times


def test_a_beats_window_is_complete() -> None:
    batch = [f"2026-11-22T10:00:{s:02d}.{s:03d}Z" for s in range(60)]
    assert Rfc3339Cache().column_ns(batch)[1]
