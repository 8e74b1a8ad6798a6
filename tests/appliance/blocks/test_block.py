"""RowBlock's byte accounting (appliance/blocks/block.py): one count, in its constructor."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.blocks.block import ROW_OVERHEAD_BYTES, RowBlock
from appliance.blocks.checks import check_block


def expected_bytes(block: RowBlock) -> int:
    """The accounting written out longhand, row by row: what Arrow stores per row."""
    total = 0
    for i, record in enumerate(block.records):
        strings = [block.protocol, block.source, block.peer, block.batch_id or "", record]
        strings.append(block.tag if isinstance(block.tag, str) else block.tag[i])
        host = block.host if block.host is None or isinstance(block.host, str) else block.host[i]
        strings.append(host or "")
        total += ROW_OVERHEAD_BYTES + sum(map(len, strings))
    return total


def test_shared_strings_count_once_per_row() -> None:
    block = RowBlock(
        protocol="forward", source="CN=a", peer="192.0.2.1:5000", received_at_ns=1,
        batch_id="c" * 200, tag="t" * 1000, host="h" * 100,
        times_ns=[None, None], records=['{"a":1}', '{"a":2}'],
    )  # fmt: skip
    strings = len("forward") + len("CN=a") + len("192.0.2.1:5000") + 200 + 1000 + 100
    assert block.nbytes == 2 * len('{"a":1}') + 2 * (ROW_OVERHEAD_BYTES + strings)


def test_per_row_tags_and_hosts_count_each_value_and_no_null() -> None:
    block = RowBlock(
        "courier", "s", "p", 1, None, ["ab", "cde"], ["h", None], [None, 7], ["{}", "{}"]
    )
    per_row = ROW_OVERHEAD_BYTES + len("courier") + len("s") + len("p")
    assert block.nbytes == 2 * per_row + len("ab") + len("cde") + len("h") + 2 * len("{}")


def test_an_empty_block_holds_nothing() -> None:
    assert RowBlock("forward", "s", "p", 1, None, "t", None, [], []).nbytes == 0


def test_the_count_cannot_be_passed_in() -> None:
    with pytest.raises(TypeError):
        RowBlock("forward", "s", "p", 1, None, "t", None, [None], ["{}"], 10)  # type: ignore[call-arg]


def test_the_count_is_what_the_writer_checks() -> None:
    block = RowBlock("lumberjack", "s", "p", 1, None, ["t", "u"], None, [None, None], ["{}", "[]"])
    assert check_block(block) == block.nbytes == expected_bytes(block)


TEXT = st.text(max_size=20)


@st.composite
def blocks(draw: st.DrawFn) -> RowBlock:
    rows = draw(st.integers(min_value=0, max_value=5))
    per_row_tag = draw(st.booleans())
    tag: str | Sequence[str] = (
        draw(st.lists(TEXT, min_size=rows, max_size=rows)) if per_row_tag else draw(TEXT)
    )
    host_kind = draw(st.sampled_from(["none", "one", "per_row"]))
    host: str | Sequence[str | None] | None = None
    if host_kind == "one":
        host = draw(TEXT)
    elif host_kind == "per_row":
        host = draw(st.lists(st.none() | TEXT, min_size=rows, max_size=rows))
    return RowBlock(
        protocol=draw(TEXT), source=draw(TEXT), peer=draw(TEXT), received_at_ns=1,
        batch_id=draw(st.none() | TEXT), tag=tag, host=host, times_ns=[None] * rows,
        records=draw(st.lists(TEXT, min_size=rows, max_size=rows)),
    )  # fmt: skip


@given(blocks())
def test_the_count_is_every_row_s_strings_plus_the_overhead(block: RowBlock) -> None:
    assert block.nbytes == expected_bytes(block)
