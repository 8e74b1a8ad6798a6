"""A RowBlock as the body of a write-ahead log record, and back (pure: no I/O, no trio).

The body is one msgpack array::

    [1, protocol, source, peer, received_at_ns, batch_id | nil,
     tag | [tag, ...], host | nil | [host | nil, ...],
     [time_ns | nil, ...], [record, ...], nbytes]

Every field of :class:`~appliance.blocks.block.RowBlock` round-trips exactly:
per-block or per-row ``tag`` and ``host``, ``None`` times, ``batch_id``
``None``. Sequences come back as lists, whatever sequence type went in.

Why msgpack and not Arrow IPC: on a 1,000-event block (121 KB of records)
msgpack encodes in 0.04 ms (0.03 ms with msgspec's encoder, which writes
the same bytes) and decodes to the block's Python lists in
0.06 ms, Arrow IPC in 0.09 ms and 0.08 ms (docs/wal.md); the block is made
of Python lists, and the writer builds its Arrow columns from them anyway.

Decoding trusts nothing, although the record's CRC verified (a bug, or a
forged file, can make a CRC-valid body): msgpack's limits are bounded by the
body's length (no container or string longer than the bytes that hold it;
at worst a few tens of Python bytes per body byte), every field's type is
checked, ``bool`` is not taken for an int, extension types are refused, and
the strings and times are re-checked by the table's own rules
(:func:`~appliance.blocks.checks.check_block`). Any failure is a
:class:`~appliance.wal.errors.RecordDecodeError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

import msgpack
import msgspec

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
from appliance.wal.errors import RecordDecodeError

__all__ = ["BLOCK_FORMAT", "decode_block", "encode_block"]

#: The first element of every encoded block: the layout's version.
BLOCK_FORMAT: Final = 1
_FIELDS: Final = 11
#: Packs a body: msgspec's encoder writes the same msgpack as ``msgpack.packb``
#: (``use_bin_type``; smallest int and str formats) for these str, int, nil
#: and array values in about half the time: 0.03-0.05 against 0.06-0.10 µs an
#: event on a 1,000-event block
#: (docs/performance.md#the-fifth-pass-on-forward-throughput). Thread-safe:
#: one is shared by every caller.
_ENCODER: Final = msgspec.msgpack.Encoder()


def _listed(values: Sequence[object]) -> list[object] | tuple[object, ...]:
    """msgpack packs lists and tuples; any other sequence is copied into a list."""
    return values if isinstance(values, list | tuple) else list(values)


def encode_block(block: RowBlock) -> bytes:
    """The record body of ``block`` (a block that passed ``check_block``)."""
    tag = block.tag if isinstance(block.tag, str) else _listed(block.tag)
    host = block.host if block.host is None or isinstance(block.host, str) else _listed(block.host)
    body: bytes = _ENCODER.encode(
        [
            BLOCK_FORMAT,
            block.protocol,
            block.source,
            block.peer,
            block.received_at_ns,
            block.batch_id,
            tag,
            host,
            _listed(block.times_ns),
            _listed(block.records),
            block.nbytes,
        ]
    )
    return body


def _refuse_ext(code: int, data: bytes) -> object:
    raise RecordDecodeError(f"msgpack extension type {code}")


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise RecordDecodeError(f"{what} is not an integer")
    return value


def _str(value: object, what: str) -> str:
    if type(value) is not str:
        raise RecordDecodeError(f"{what} is not a string")
    return value


def _strs(value: object, what: str) -> list[str]:
    if type(value) is not list:
        raise RecordDecodeError(f"{what} is not a list")
    for item in value:
        if type(item) is not str:
            raise RecordDecodeError(f"{what} holds a value that is not a string")
    return cast(list[str], value)


def _optional_strs(value: object, what: str) -> list[str | None]:
    if type(value) is not list:
        raise RecordDecodeError(f"{what} is not a list")
    for item in value:
        if item is not None and type(item) is not str:
            raise RecordDecodeError(f"{what} holds a value that is not a string or nil")
    return cast(list[str | None], value)


def decode_block(body: bytes | memoryview, rows: int | None = None) -> RowBlock:
    """The RowBlock a record body holds, checked as the writer checks a new block.

    Args:
        body: the record's body.
        rows: the row count the record's header states, checked when given.

    Raises:
        RecordDecodeError: the body is not an encoded block, or the block
            fails ``check_block``.
    """
    try:
        # Without max_*_len, msgpack bounds every container and string by len(body).
        value = msgpack.unpackb(
            body, raw=False, use_list=True, strict_map_key=True, ext_hook=_refuse_ext
        )
    except RecordDecodeError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # UnicodeDecodeError, ExtraData, FormatError and StackError are ValueErrors.
        raise RecordDecodeError(f"not a msgpack block: {type(exc).__name__}") from None
    if type(value) is not list or len(value) != _FIELDS:
        raise RecordDecodeError("not a block array")
    (fmt, protocol, source, peer, received, batch_id, tag, host, times, records, nbytes) = value
    if type(fmt) is not int or fmt != BLOCK_FORMAT:
        raise RecordDecodeError("unknown block format")
    if batch_id is not None:
        _str(batch_id, "batch_id")
    tag_value = tag if type(tag) is str else _strs(tag, "tag")
    host_value = host if host is None or type(host) is str else _optional_strs(host, "host")
    if type(times) is not list:
        raise RecordDecodeError("times is not a list")
    for ns in times:
        if ns is not None and type(ns) is not int:
            raise RecordDecodeError("a time is not an integer")
    block = RowBlock(
        protocol=_str(protocol, "protocol"),
        source=_str(source, "source"),
        peer=_str(peer, "peer"),
        received_at_ns=_int(received, "received_at_ns"),
        batch_id=batch_id,
        tag=tag_value,
        host=host_value,
        times_ns=times,
        records=_strs(records, "records"),
    )
    if rows is not None and block.rows != rows:
        raise RecordDecodeError(f"the header says {rows} rows, the body holds {block.rows}")
    try:
        check_block(block)
    except BlockRefused as exc:
        raise RecordDecodeError(f"block refused: {exc.reason}") from None
    # RowBlock counts its own bytes; a record whose count disagrees was not
    # written by encode_block (or was by another accounting): refuse it.
    if block.nbytes != _int(nbytes, "nbytes"):
        raise RecordDecodeError("the recorded byte count does not match the rows")
    return block
