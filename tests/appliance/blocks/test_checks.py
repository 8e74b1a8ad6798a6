"""check_block's per-row rules on both of its paths (appliance/blocks/checks.py).

The times and records of a block are checked in C when they can be (no
receive-time None among the times; every record ASCII) and row by row
otherwise; both paths must refuse the same values.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import _per_row_text, check_block
from appliance.blocks.errors import BlockRefused, InvalidText
from appliance.blocks.text import check_text
from appliance.blocks.timefmt import MAX_TIME_NS, MIN_TIME_NS

NOW = 1_767_225_600 * 1_000_000_000


def block(times: list[int | None], records: list[str] | None = None) -> RowBlock:
    return RowBlock(
        protocol="forward", source="s", peer="192.0.2.1:1", received_at_ns=NOW,
        batch_id=None, tag="t", host=None, times_ns=times,
        records=records if records is not None else ['{"n":1}'] * len(times),
    )  # fmt: skip


@pytest.mark.parametrize("none", [False, True], ids=["all-known", "with-none"])
@pytest.mark.parametrize(
    ("bad", "refused"),
    [
        (MIN_TIME_NS, False),
        (MAX_TIME_NS, False),
        (MIN_TIME_NS - 1, True),
        (MAX_TIME_NS + 1, True),
        (-(2**70), True),
        (2**70, True),
    ],
)
def test_times_outside_int64_are_refused_on_either_path(
    none: bool, bad: int, refused: bool
) -> None:
    times: list[int | None] = [NOW, bad, NOW]
    if none:
        times.append(None)
    candidate = block(times)
    if refused:
        with pytest.raises(BlockRefused, match="outside int64"):
            check_block(candidate)
    else:
        check_block(candidate)


def test_records_that_are_not_utf8_are_refused_among_ascii_ones() -> None:
    check_block(block([NOW] * 3, ['{"a":1}', '{"b":"caf\u00e9 \u2603"}', "{}"]))
    with pytest.raises(BlockRefused, match="not valid UTF-8"):
        check_block(block([NOW] * 3, ['{"a":1}', '{"b":"\ud800"}', "{}"]))
    with pytest.raises(BlockRefused, match="not valid UTF-8"):
        check_block(block([NOW] * 2, ['{"b":"\udcff"}', '{"c":"\u00e9"}']))


_COLUMN_VALUES = st.lists(
    st.sampled_from([None, "web-01", "x" * 20, "x" * 21, "é", "é" * 11, "\ud800", ""]),
    max_size=12,
)


@given(_COLUMN_VALUES, st.booleans())
def test_a_per_row_column_is_refused_as_a_check_of_each_value_in_order_would(
    values: list[str | None], nullable: bool
) -> None:
    """The C-speed pass and the distinct-values loop name the refusal the plain loop names."""

    def reference() -> str | None:
        for value in values:
            if value is None:
                if not nullable:
                    return "host is missing"
                continue
            try:
                check_text(value, "host", 20)
            except InvalidText as exc:
                return exc.reason
        return None

    try:
        _per_row_text(values, len(values), "host", 20, nullable)
        got = None
    except BlockRefused as exc:
        got = exc.reason
    assert got == reference()
