"""check_block's per-row rules on both of its paths, and blocks_to_arrow's per-block columns.

The times and records of a block are checked in C when they can be (no
receive-time None among the times; every record ASCII) and row by row
otherwise; both paths must refuse the same values.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.lake.blocks import MAX_TIME_NS, MIN_TIME_NS, blocks_to_arrow, check_block
from appliance.lake.errors import BlockRefused
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.rows.block import RowBlock

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


# -- blocks_to_arrow: per-block columns by run-end decoding -------------------------------

_texts = st.one_of(st.none(), st.text(max_size=5))


@st.composite
def _blocks(draw: st.DrawFn) -> list[RowBlock]:
    blocks = []
    for _ in range(draw(st.integers(0, 5))):
        rows = draw(st.integers(0, 4))
        times = st.lists(
            st.one_of(st.none(), st.integers(0, 2 * NOW)), min_size=rows, max_size=rows
        )
        per_row = draw(st.booleans())
        tag = draw(st.lists(st.text(max_size=3), min_size=rows, max_size=rows)) if per_row else "t"
        host = draw(st.lists(_texts, min_size=rows, max_size=rows)) if per_row else draw(_texts)
        blocks.append(
            RowBlock(
                protocol=draw(st.sampled_from(["forward", "lumberjack"])),
                source=draw(st.text(max_size=4)),
                peer="192.0.2.1:1",
                received_at_ns=NOW + draw(st.integers(0, 10**12)),
                batch_id=draw(_texts),
                tag=tag,
                host=host,
                times_ns=draw(times),
                records=['{"n":1}'] * rows,
            )
        )
    return blocks


def _row_by_row(blocks: list[RowBlock], attr: str) -> list[object]:
    """A column as one Python value per row (the reference)."""
    out: list[object] = []
    for b in blocks:
        value = getattr(b, attr)
        out.extend(value if isinstance(value, list) else [value] * b.rows)
    return out


@settings(max_examples=200, deadline=None)
@given(_blocks())
def test_per_block_columns_repeat_each_block_value_over_its_rows(blocks: list[RowBlock]) -> None:
    table = blocks_to_arrow(blocks)
    assert table.schema == EVENTS_SCHEMA
    assert table.num_rows == sum(b.rows for b in blocks)
    for attr in ("protocol", "source", "peer", "batch_id", "tag", "host"):
        assert table.column(attr).to_pylist() == _row_by_row(blocks, attr), attr
    received = [b.received_at_ns // 1000 for b in blocks for _ in range(b.rows)]
    column = table.column("received_at").cast(pa.int64()).to_pylist()
    assert column == received
