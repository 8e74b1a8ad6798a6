"""check_block's per-row rules on both of its paths (appliance/blocks/checks.py).

The times and records of a block are checked in C when they can be (no
receive-time None among the times; every record ASCII) and row by row
otherwise; both paths must refuse the same values.
"""

from __future__ import annotations

import pytest

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
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
