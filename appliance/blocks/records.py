"""Turns a decoded event record (a msgpack or JSON map) into the JSON text of ``record``.

Records are arbitrary maps, so the conversion follows one documented
convention (docs/table.md#records-as-json):

* ``str`` values stay text. A msgpack ``str`` that is not valid UTF-8 is
  treated as binary.
* binary values become text when they are valid UTF-8, otherwise
  ``{"$binary": "<base64>"}``;
* map keys that are not text become their JSON text (``1`` -> ``"1"``);
  binary keys that are not UTF-8 are rendered with backslash escapes;
* NaN and infinities become ``null`` (JSON has no such numbers);
* an EventTime inside a record becomes its epoch nanoseconds as an integer;
* any other msgpack extension becomes ``{"$ext": type, "$binary": "<base64>"}``
  (a msgpack timestamp, ext -1, included: ``$binary`` holds its ext payload);
* on the slow walk, a map or array nested more than ``MAX_DEPTH`` levels
  deep becomes ``{"$truncated": "nesting"}``. Records nested deeper than the
  encoder's recursion allows always take the slow walk, so they cannot exhaust
  the interpreter's stack; only a broken or hostile client sends them.

The fast path is one :func:`json.dumps`; only records that need one of the
conversions take the slow walk.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any, Final

import msgpack
import orjson

from appliance.blocks.text import is_utf8_text

__all__ = ["MAX_DEPTH", "oversized_record", "plain_records_json", "record_json", "records_json"]

#: Nesting kept in the JSON text; deeper maps and arrays are replaced by a marker.
MAX_DEPTH: Final = 100
_TRUNCATED: Final = {"$truncated": "nesting"}

_dumps: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=None
).encode


def _raw(value: str) -> bytes:
    """The bytes behind a str that is not valid UTF-8.

    A msgpack str that was not UTF-8 carries surrogateescape code points; a
    lone surrogate from anywhere else (a JSON ``"\\ud800"`` escape) has no
    original bytes and is kept as its surrogatepass encoding.
    """
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def _bytes_value(data: bytes) -> Any:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"$binary": base64.b64encode(data).decode("ascii")}


def _key(key: Any) -> str:
    if type(key) is str:
        return key if is_utf8_text(key) else _raw(key).decode("utf-8", "backslashreplace")
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return _dumps(_plain(key))


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-ready copy of ``value`` under the module's convention."""
    if type(value) is str:
        return value if is_utf8_text(value) else _bytes_value(_raw(value))
    # ExtType is a namedtuple: it must be matched before tuples.
    if isinstance(value, msgpack.ExtType):
        return {"$ext": value.code, "$binary": base64.b64encode(value.data).decode("ascii")}
    if isinstance(value, msgpack.Timestamp):  # the unpacker decodes ext -1 itself
        return {"$ext": -1, "$binary": base64.b64encode(value.to_bytes()).decode("ascii")}
    if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
        return _TRUNCATED
    if isinstance(value, dict):
        return {_key(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return _bytes_value(bytes(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    to_ns = getattr(value, "to_ns", None)
    if to_ns is not None:
        return to_ns()  # EventTime
    if value is None or isinstance(value, bool | int):
        return value
    return str(value)


#: orjson renders non-str keys as JSON text (1 -> "1"), like the convention.
_ORJSON_OPTIONS: Final = orjson.OPT_NON_STR_KEYS


def _orjson_texts(records: Sequence[dict[Any, Any]], option: int) -> list[str] | None:
    """Every record through orjson in one comprehension (no Python call per
    record), or None as soon as orjson refuses one."""
    dumps = orjson.dumps
    try:
        return [dumps(record, option=option).decode() for record in records]
    except (orjson.JSONEncodeError, TypeError):
        return None


def records_json(records: Sequence[dict[Any, Any]]) -> list[str]:
    """:func:`record_json` of each record, in one pass when orjson takes them all.

    The hot path of a 1,000-event chunk; should orjson refuse any record,
    each takes :func:`record_json` (the same text either way).
    """
    texts = _orjson_texts(records, _ORJSON_OPTIONS)
    if texts is None:
        return [record_json(record) for record in records]
    return texts


#: Text keys only, and datetimes refused (a msgspec decoder turns the msgpack
#: timestamp extension into one): the values orjson then accepts are those
#: JSON itself has, which every msgpack decoder builds alike.
_PLAIN_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATETIME


def plain_records_json(records: Sequence[dict[Any, Any]]) -> list[str] | None:
    """:func:`records_json` of ``records`` if every record is plain JSON data, else None.

    Plain: text keys, and values that are text, numbers, booleans, nil,
    arrays and maps of the same, nested less deeply than orjson's limit: no
    bytes, extension values, datetimes or non-text keys, which the
    convention rewrites. For such records any msgpack decoder (msgpack or
    msgspec) builds the same objects, so the text is the same whichever
    decoded them: the PackedForward fast path
    (:mod:`appliance.protocols.forward.fast`) relies on it, and takes its
    slow path on None.
    """
    return _orjson_texts(records, _PLAIN_OPTIONS)


def record_json(record: dict[Any, Any]) -> str:
    """The record as compact JSON text, valid UTF-8, under the module's convention.

    orjson serves the common record (about ten times faster than the stdlib
    encoder, bench/RESULTS.md); it refuses exactly the values the convention
    rewrites (bytes, extension values, lone surrogates, integers beyond
    64 bits, nesting past its limit), and those take the slow path.
    """
    try:
        return orjson.dumps(record, option=_ORJSON_OPTIONS).decode()
    except (orjson.JSONEncodeError, TypeError):
        pass
    try:
        text = _dumps(record)
    except (TypeError, ValueError, RecursionError):
        # bytes, ExtType, EventTime, NaN or a non-str key that json refuses,
        # or nesting deeper than the encoder's recursion allows.
        return _dumps(_plain(record))
    if is_utf8_text(text):
        return text
    return _dumps(_plain(record))


def oversized_record(texts: Sequence[str], max_bytes: int) -> int | None:
    """The UTF-8 size of the first of ``texts`` over ``max_bytes``, or None when none is.

    A character takes 1 to 4 bytes: texts of at most ``max_bytes // 4``
    characters (nearly all) are settled by their length, in C; only longer
    ones are encoded. A stored record is at most
    :data:`~appliance.defaults.RECORD_MAX_BYTES` of JSON (docs/limits.md).
    """
    if not texts or max(map(len, texts)) <= max_bytes // 4:
        return None
    for text in texts:
        if len(text) > max_bytes // 4:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            if size > max_bytes:
                return size
    return None
