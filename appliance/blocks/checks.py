"""Whether a RowBlock can be stored (:func:`check_block`): every column's value, checked alone.

A block is checked on its own before it joins a commit group, and again when
the write-ahead log reads it back, so a block that cannot be stored (a string
Arrow refuses, a time no int64 holds, a value over its length limit) fails
its own connection and never a commit group. The codecs already check these
fields where they decode them (appliance/blocks/text.py); this is the last
line, and the one place that knows every column's rule.

Pure code: no I/O, no trio, no pyarrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused, InvalidText
from appliance.blocks.text import (
    MAX_BATCH_ID_BYTES,
    MAX_HOST_BYTES,
    MAX_TAG_BYTES,
    check_text,
    is_utf8_text,
)
from appliance.blocks.timefmt import MAX_TIME_NS, MIN_TIME_NS

__all__ = ["MAX_PEER_BYTES", "MAX_SOURCE_BYTES", "check_block"]

#: Longest ``source`` (a user name, certificate subject, CURVE key or token name), in bytes.
MAX_SOURCE_BYTES: Final = 1024
#: Longest ``peer`` (an address and port, or a ZeroMQ peer address), in bytes.
MAX_PEER_BYTES: Final = 128


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
    # The common column passes in C: no None, all ASCII, none over the limit
    # (an ASCII str's length is its UTF-8 size). Anything else is checked value
    # by value below, which names the first refusal.
    if rows and None not in values:
        texts = cast("Sequence[str]", values)
        if max(map(len, texts)) <= limit and "".join(texts).isascii():
            return
    # Each distinct value once, in the order of first appearance (the same
    # first refusal): a window's hosts repeat a handful of names per row.
    for value in dict.fromkeys(values):
        if value is None:
            if not nullable:
                raise BlockRefused(f"{what} is missing")
            continue
        _text(value, what, limit)


def check_block(block: RowBlock) -> int:
    """Check that every value of ``block`` can be stored; returns the bytes it holds.

    The byte count is what the writer's limits see: :attr:`RowBlock.nbytes`,
    counted once, by the block's constructor (appliance/blocks/block.py).

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
