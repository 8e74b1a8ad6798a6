"""blocks_to_arrow's per-block columns (appliance/lake/arrow.py): run-end decoding
gives each block's value over its rows, also around blocks without rows."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.block import RowBlock
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.schema import events_schema

NOW = 1_767_225_600 * 1_000_000_000

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
    assert table.schema == events_schema()
    assert table.num_rows == sum(b.rows for b in blocks)
    for attr in ("protocol", "source", "peer", "batch_id", "tag", "host"):
        assert table.column(attr).to_pylist() == _row_by_row(blocks, attr), attr
    received = [b.received_at_ns // 1000 for b in blocks for _ in range(b.rows)]
    column = table.column("received_at").cast(pa.int64()).to_pylist()
    assert column == received
