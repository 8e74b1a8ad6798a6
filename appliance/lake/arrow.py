"""RowBlocks as one Arrow table in the ``events`` schema, with the partition rule.

:func:`blocks_to_arrow` turns many blocks
(:class:`~appliance.blocks.block.RowBlock`, checked by
:func:`~appliance.blocks.checks.check_block`) into one Arrow table with
vectorised compute, so the per-row Python work stays in the codecs and the
rows layer. It stays with the table: it needs the schema and pyarrow.

The partition rule (docs/table.md#partition-rule-for-absurd-times): ``event_date`` is the UTC
date of ``event_time`` when that time lies within
``[received_at - PLAUSIBLE_PAST_NS, received_at + PLAUSIBLE_FUTURE_NS]``;
an absurd client time (a clock at 1970, or years ahead) falls back to the
receive date, so one broken client cannot scatter the table over thousands of
partitions. ``event_time`` itself always keeps what the client sent.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from appliance.blocks.block import RowBlock
from appliance.lake.schema import events_schema

if TYPE_CHECKING:
    # pyarrow loads at the first conversion, not when the writer is imported
    # at start (docs/performance.md#idle-memory).
    import pyarrow as pa

__all__ = [
    "DATA_ERRORS",
    "PLAUSIBLE_FUTURE_NS",
    "PLAUSIBLE_PAST_NS",
    "block_to_arrow",
    "blocks_to_arrow",
    "data_errors",
    "load_arrow",
]

#: Errors that a block's data, not the table's storage, causes while a group
#: is converted to Arrow or written: the blocks are then tried one by one.
#: With pyarrow's ``ArrowException`` (:func:`data_errors`).
DATA_ERRORS: Final = (ValueError, TypeError, OverflowError, UnicodeError)


def data_errors() -> tuple[type[Exception], ...]:
    """:data:`DATA_ERRORS` and pyarrow's ``ArrowException`` once pyarrow is loaded.

    Before that no Arrow error can have been raised; pyarrow loads at the
    first conversion, not at import (docs/performance.md#idle-memory).
    """
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return DATA_ERRORS
    arrow_exception: type[Exception] = pyarrow.ArrowException
    return (arrow_exception, *DATA_ERRORS)


_NS_PER_DAY: Final = 86_400 * 1_000_000_000
#: How far back an event time may lie and still pick its own partition.
PLAUSIBLE_PAST_NS: Final = 366 * _NS_PER_DAY
#: How far ahead an event time may lie (clock skew) and still pick its own partition.
PLAUSIBLE_FUTURE_NS: Final = 1 * _NS_PER_DAY


def load_arrow() -> None:
    """Import what the conversion uses (blocking: a worker thread's job, once)."""
    import pyarrow
    import pyarrow.compute  # noqa: F401


def _per_block(values: list[object], typ: pa.DataType, runs: _Runs) -> pa.Array:
    """One value per block, as a column of each block's rows.

    Run-end decoding in C: no index of one Python int per row to build and
    take with (a sixth of the conversion's time on 1,000-row blocks,
    docs/performance.md#the-fourth-pass-on-forward-throughput).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    ends, kept = runs
    if len(kept) != len(values):
        values = [values[i] for i in kept]  # blocks without rows have no run
    if not values:
        return pa.array([], type=typ)
    encoded = pa.RunEndEncodedArray.from_arrays(ends, pa.array(values, type=typ))
    return pc.run_end_decode(encoded)


#: Where each block's rows end, and the indices of the blocks with rows.
_Runs = tuple["pa.Array", list[int]]


def _runs(blocks: Sequence[RowBlock]) -> _Runs:
    import pyarrow as pa

    kept = [i for i, block in enumerate(blocks) if block.rows]
    ends = list(itertools.accumulate(blocks[i].rows for i in kept))
    return pa.array(ends, type=pa.int64()), kept


def _per_row(blocks: Sequence[RowBlock], attr: str, runs: _Runs) -> pa.Array:
    """A column that is either constant per block or given per row."""
    import pyarrow as pa

    values = [getattr(b, attr) for b in blocks]
    if all(v is None or isinstance(v, str) for v in values):
        return _per_block(values, pa.string(), runs)
    flat: list[str | None] = []
    for block, value in zip(blocks, values, strict=True):
        if value is None or isinstance(value, str):
            flat.extend([value] * block.rows)
        else:
            flat.extend(value)
    return pa.array(flat, type=pa.string())


def block_to_arrow(block: RowBlock) -> pa.Table:
    """One block alone as an Arrow table (used to find a block a group could not convert)."""
    return blocks_to_arrow([block])


def blocks_to_arrow(blocks: Sequence[RowBlock]) -> pa.Table:
    """One Arrow table, in the ``events`` schema, holding every row of ``blocks``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    times: list[int | None] = []
    records: list[str] = []
    for block in blocks:
        times.extend(block.times_ns)
        records.extend(block.records)
    index = _runs(blocks)
    received_ns = _per_block([b.received_at_ns for b in blocks], pa.int64(), index)
    event_ns = pa.array(times, type=pa.int64())
    if event_ns.null_count:
        event_ns = pc.coalesce(event_ns, received_ns)
    schema = events_schema()
    utc_us = schema.field("event_time").type
    event_time = pc.divide(event_ns, 1000).cast(pa.int64()).cast(utc_us)
    received_at = pc.divide(received_ns, 1000).cast(pa.int64()).cast(utc_us)
    plausible = pc.and_(
        pc.greater_equal(event_ns, pc.subtract(received_ns, PLAUSIBLE_PAST_NS)),
        pc.less_equal(event_ns, pc.add(received_ns, PLAUSIBLE_FUTURE_NS)),
    )
    event_date = pc.if_else(plausible, event_time.cast(pa.date32()), received_at.cast(pa.date32()))
    columns = {
        "event_date": event_date,
        "event_time": event_time,
        "event_time_ns": event_ns,
        "received_at": received_at,
        "protocol": _per_block([b.protocol for b in blocks], pa.string(), index),
        "tag": _per_row(blocks, "tag", index),
        "source": _per_block([b.source for b in blocks], pa.string(), index),
        "peer": _per_block([b.peer for b in blocks], pa.string(), index),
        "host": _per_row(blocks, "host", index),
        "record": pa.array(records, type=pa.string()),
        "batch_id": _per_block([b.batch_id for b in blocks], pa.string(), index),
    }
    return pa.Table.from_arrays(list(columns.values()), schema=schema)
