"""What the lake does with a RowBlock before it commits it: checks, dedupe identity, Arrow.

The rows layer (:mod:`appliance.rows`) builds a
:class:`~appliance.rows.block.RowBlock` from a protocol's events; everything
here is about storing it, so it stays with the table: the checks know the
table's columns and limits, the dedupe identity is the writer's and the
table's (:meth:`~appliance.lake.table.EventsTable.recent_batch_keys` rebuilds
it from stored rows), and the conversion needs the schema and pyarrow.

:func:`blocks_to_arrow` turns many blocks into one Arrow table with
vectorised compute, so the per-row Python work stays in the codecs and the
rows layer.

The partition rule (docs/table.md#partition-rule-for-absurd-times): ``event_date`` is the UTC
date of ``event_time`` when that time lies within
``[received_at - PLAUSIBLE_PAST_NS, received_at + PLAUSIBLE_FUTURE_NS]``;
an absurd client time (a clock at 1970, or years ahead) falls back to the
receive date, so one broken client cannot scatter the table over thousands of
partitions. ``event_time`` itself always keeps what the client sent.

Validation (:func:`check_block`): a block is checked on its own before it
joins a commit group, so a block that cannot be stored (a string Arrow
refuses, a time no int64 holds, a value over its length limit) fails its own
connection and never a commit group. The codecs already check these fields
where they decode them (appliance/protocols/text.py); this is the last line,
and the one place that knows the table's columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final, cast

import pyarrow as pa
import pyarrow.compute as pc

from appliance.lake.errors import BlockRefused
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.protocols.text import (
    MAX_BATCH_ID_BYTES,
    MAX_HOST_BYTES,
    MAX_TAG_BYTES,
    InvalidText,
    check_text,
    is_utf8_text,
)
from appliance.rows.block import RowBlock
from appliance.rows.timefmt import MAX_TIME_NS, MIN_TIME_NS

__all__ = [
    "MAX_PEER_BYTES",
    "MAX_SOURCE_BYTES",
    "PLAUSIBLE_FUTURE_NS",
    "PLAUSIBLE_PAST_NS",
    "DedupeKey",
    "block_to_arrow",
    "blocks_to_arrow",
    "check_block",
    "dedupe_key",
    "dedupe_scope",
    "peer_address",
]

_NS_PER_DAY: Final = 86_400 * 1_000_000_000
#: How far back an event time may lie and still pick its own partition.
PLAUSIBLE_PAST_NS: Final = 366 * _NS_PER_DAY
#: How far ahead an event time may lie (clock skew) and still pick its own partition.
PLAUSIBLE_FUTURE_NS: Final = 1 * _NS_PER_DAY

#: Longest ``source`` (a user name, certificate subject, CURVE key or token name), in bytes.
MAX_SOURCE_BYTES: Final = 1024
#: Longest ``peer`` (an address and port, or a ZeroMQ peer address), in bytes.
MAX_PEER_BYTES: Final = 128

#: ``(protocol, dedupe scope, batch id)``: what the writer remembers of a committed batch.
DedupeKey = tuple[str, str, str]

#: The ``source`` of a peer nothing authenticated (appliance.server.listener.ANONYMOUS).
_ANONYMOUS: Final = "anonymous"


def dedupe_scope(source: str, peer: str) -> str:
    """Whose batch ids a batch's id is unique among (docs/table.md#dedupe-scope).

    An authenticated principal is its own scope. Unauthenticated peers must
    not share one (two clients that both number their chunks from 1 would
    each get an ack while only the first is written), so an anonymous peer's
    scope is its IP address: a resend after reconnecting from a new port is
    still recognised.
    """
    if source != _ANONYMOUS:
        return source
    return f"{_ANONYMOUS}@{peer_address(peer)}"


def peer_address(peer: str) -> str:
    """The IP address of a ``peer``: ``host:port``, ``[v6]:port``, or a bare address.

    ZeroMQ gives bare addresses (``2001:db8::5``): only one colon means a port.
    """
    if peer.startswith("["):
        return peer[1:].split("]", 1)[0]
    if peer.count(":") == 1:
        return peer.split(":", 1)[0]
    return peer


def dedupe_key(block: RowBlock) -> DedupeKey | None:
    """A batch's identity for dedupe (docs/table.md#dedupe-scope); None without an id."""
    if block.batch_id is None:
        return None
    return (block.protocol, dedupe_scope(block.source, block.peer), block.batch_id)


def _text(value: str, what: str, limit: int) -> None:
    try:
        check_text(value, what, limit)
    except InvalidText as exc:
        raise BlockRefused(exc.reason) from None


def _per_row_text(
    values: str | Sequence[str | None] | None, rows: int, what: str, limit: int, nullable: bool
) -> None:
    """Checks a per-block or per-row string column."""
    if values is None:
        if not nullable:
            raise BlockRefused(f"{what} is missing")
        return
    if isinstance(values, str):
        _text(values, what, limit)
        return
    if len(values) != rows:
        raise BlockRefused(f"{what} has {len(values)} values for {rows} rows")
    for value in values:
        if value is None:
            if not nullable:
                raise BlockRefused(f"{what} is missing")
            continue
        _text(value, what, limit)


def check_block(block: RowBlock) -> int:
    """Check that every value of ``block`` can be stored; returns the bytes it holds.

    The byte count is what the writer's limits see: :attr:`RowBlock.nbytes`,
    counted once, by the block's constructor (appliance/rows/block.py).

    Raises:
        BlockRefused: naming the column and the rule: a string that is not
            valid UTF-8 or is over its limit, a time outside int64
            nanoseconds, or columns of different lengths.
    """
    rows = len(block.records)
    if len(block.times_ns) != rows:
        raise BlockRefused(f"{len(block.times_ns)} times for {rows} records")
    if not MIN_TIME_NS <= block.received_at_ns <= MAX_TIME_NS:
        raise BlockRefused("receive time out of range")
    times = block.times_ns
    # min() and max() run in C; a None (receive time) needs the loop.
    if rows and None not in times:
        known = cast("Sequence[int]", times)
        if min(known) < MIN_TIME_NS or max(known) > MAX_TIME_NS:
            raise BlockRefused("event time outside int64 nanoseconds")
    else:
        for ns in times:
            if ns is not None and not MIN_TIME_NS <= ns <= MAX_TIME_NS:
                raise BlockRefused("event time outside int64 nanoseconds")
    _text(block.protocol, "protocol", MAX_TAG_BYTES)
    _text(block.source, "source", MAX_SOURCE_BYTES)
    _text(block.peer, "peer", MAX_PEER_BYTES)
    if block.batch_id is not None:
        if not block.batch_id:
            raise BlockRefused("batch id is empty")
        _text(block.batch_id, "batch id", MAX_BATCH_ID_BYTES)
    _per_row_text(block.tag, rows, "tag", MAX_TAG_BYTES, nullable=False)
    _per_row_text(block.host, rows, "host", MAX_HOST_BYTES, nullable=True)
    # record_json always returns valid UTF-8; this guards every other producer.
    # All ASCII (checked in C, the common case) is valid; else each is encoded.
    if not all(map(str.isascii, block.records)):
        for record in block.records:
            if not is_utf8_text(record):
                raise BlockRefused("record is not valid UTF-8")
    return block.nbytes


def _per_block(values: list[object], typ: pa.DataType, runs: _Runs) -> pa.Array:
    """One value per block, as a column of each block's rows.

    Run-end decoding in C: no index of one Python int per row to build and
    take with (a sixth of the conversion's time on 1,000-row blocks,
    docs/performance.md#the-fourth-pass-on-forward-throughput).
    """
    ends, kept = runs
    if len(kept) != len(values):
        values = [values[i] for i in kept]  # blocks without rows have no run
    if not values:
        return pa.array([], type=typ)
    encoded = pa.RunEndEncodedArray.from_arrays(ends, pa.array(values, type=typ))
    return pc.run_end_decode(encoded)


#: Where each block's rows end, and the indices of the blocks with rows.
_Runs = tuple[pa.Array, list[int]]


def _runs(blocks: Sequence[RowBlock]) -> _Runs:
    kept = [i for i, block in enumerate(blocks) if block.rows]
    ends = list(itertools.accumulate(blocks[i].rows for i in kept))
    return pa.array(ends, type=pa.int64()), kept


def _per_row(blocks: Sequence[RowBlock], attr: str, runs: _Runs) -> pa.Array:
    """A column that is either constant per block or given per row."""
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
    utc_us = EVENTS_SCHEMA.field("event_time").type
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
    return pa.Table.from_arrays(list(columns.values()), schema=EVENTS_SCHEMA)
