"""RFC 3339 text and epoch nanoseconds (appliance/blocks/timefmt.py), both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.blocks.timefmt import MAX_TIME_NS, MIN_TIME_NS, rfc3339_ns, rfc3339_text


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "1970-01-01T00:00:00.000000000Z"),
        (1, "1970-01-01T00:00:00.000000001Z"),
        (-1, "1969-12-31T23:59:59.999999999Z"),
        (951_782_400 * 10**9, "2000-02-29T00:00:00.000000000Z"),
        (MIN_TIME_NS, "1677-09-21T00:12:43.145224192Z"),
        (MAX_TIME_NS, "2262-04-11T23:47:16.854775807Z"),
    ],
)
def test_text_of_known_instants(ns: int, text: str) -> None:
    assert rfc3339_text(ns) == text
    assert rfc3339_ns(text) == ns


@given(st.integers(min_value=MIN_TIME_NS, max_value=MAX_TIME_NS))
def test_text_is_the_inverse_of_parsing(ns: int) -> None:
    assert rfc3339_ns(rfc3339_text(ns)) == ns


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00Z", "2026-11-22T10:00:0²Z", 17, None])
def test_unusable_times_are_none(text: object) -> None:
    assert rfc3339_ns(text) is None
