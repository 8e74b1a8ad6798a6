"""msgpack decoding for the forward codec: bounded unpacker options, EventTime, event times.

Every unpacker the codec builds takes its options here (each length a header
may claim bounded by the bytes that must follow it, and by a record's
limits), turns ext type 0 into an :class:`~appliance.protocols.forward.events.EventTime`,
and counts the values it builds; an entry's time becomes epoch nanoseconds
here too (appliance/protocols/forward/connection.py, "Memory", "Records").
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

import msgpack

from appliance.blocks.timefmt import ns_in_range
from appliance.protocols.forward.events import _NS_PER_SECOND, DecodeLimits, EventTime

__all__ = ["DECODE_MEMORY_FACTOR"]

#: Bytes of Python objects that decoding one msgpack byte may build, at worst
#: (a chain of one-entry maps: a 224-byte dict per two bytes; measured).
DECODE_MEMORY_FACTOR: Final = 120
#: Seconds beyond which an epoch time no longer fits int64 nanoseconds (year 2262).
_MAX_TIME_SECONDS: Final = (2**63 - 1) // _NS_PER_SECOND
#: EventTime is msgpack ext type 0 carrying two big-endian u32 (spec: "EventTime Ext Format").
_EVENT_TIME_EXT_TYPE: Final = 0
_EVENT_TIME: Final = struct.Struct(">II")


class _InvalidEvent(Exception):
    """One event inside a valid request is unusable; it is dropped and counted."""


#: ``int.__new__``: builds an EventTime without a Python-level ``__new__`` frame,
#: about 0.2 µs an event less on the PackedForward hot path (bench/codec_micro.py).
_new_int: Final = int.__new__


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EVENT_TIME_EXT_TYPE and len(data) == _EVENT_TIME.size:
        seconds, nanoseconds = _EVENT_TIME.unpack(data)
        if nanoseconds < _NS_PER_SECOND:
            return _new_int(EventTime, seconds * _NS_PER_SECOND + nanoseconds)
    # Anything else stays an extension value; as an entry time it is invalid
    # ("EventTime nanoseconds out of range" included) and the event is dropped.
    return msgpack.ExtType(code, data)


def _decode_options(max_bytes: int) -> dict[str, Any]:
    """msgpack decoding options for at most ``max_bytes`` of input.

    Every length a header may claim is bounded by the bytes that must follow
    it: a str, bin or ext body by ``max_bytes``, an array by ``max_bytes``
    elements (each at least one byte), a map by ``max_bytes // 2`` pairs.
    raw=False with surrogateescape keeps str values that are not UTF-8
    (out_forward packs the binary entries stream as str, spec
    "PackedForward"): their original bytes come back with
    ``.encode("utf-8", "surrogateescape")``; column strings are then checked
    strictly. strict_map_key=False: records may have integer keys.
    """
    return {
        "raw": False,
        "unicode_errors": "surrogateescape",
        "strict_map_key": False,
        "ext_hook": _ext_hook,
        "max_str_len": max_bytes,
        "max_bin_len": max_bytes,
        "max_ext_len": max_bytes,
        "max_array_len": max_bytes,
        "max_map_len": max_bytes // 2,
    }


def _bounded_options(max_bytes: int, limits: DecodeLimits, max_elements: int) -> dict[str, Any]:
    """:func:`_decode_options`, with a record's limits on top: no str, bin or ext
    longer than ``max_record_bytes``, no array or map longer than ``max_elements``
    (a record's ``max_record_values``, or a request's entries), each refused at
    its header, before anything is built for it."""
    options = _decode_options(max_bytes)
    for key in ("max_str_len", "max_bin_len", "max_ext_len"):
        options[key] = min(options[key], limits.max_record_bytes)
    options["max_array_len"] = min(options["max_array_len"], max_elements)
    options["max_map_len"] = min(options["max_map_len"], max_elements)
    return options


class _TooManyValues(ValueError):
    """A record, or a Message or Forward mode request, holds more values than allowed."""


class _ValueCounter:
    """Counts the values msgpack builds, as its list and map hooks, up to a limit.

    msgpack calls a container's hook when the container is complete: it
    counts its elements then (a map's keys and values both), so the count
    is at most the msgpack values read, and a record of ``n`` bytes counts
    at most ``n``. Past ``limit`` the hook raises :class:`_TooManyValues`,
    which stops the decoder at once: a record far larger than any shipper
    sends is refused at its first excess, after at most one container's
    elements more (``max_array_len`` and ``max_map_len`` bound those too).
    """

    __slots__ = ("count", "limit", "what")

    def __init__(self, limit: int, what: str) -> None:
        self.count = 0
        self.limit = limit
        self.what = what

    def _over(self) -> _TooManyValues:
        return _TooManyValues(
            f"{self.what} holds more than {self.limit} values (the elements of its maps "
            "and arrays; RECORD_MAX_VALUES)"
        )

    def on_list(self, value: list[Any]) -> list[Any]:
        self.count += len(value)
        if self.count > self.limit:
            raise self._over()
        return value

    def on_map(self, value: dict[Any, Any]) -> dict[Any, Any]:
        self.count += 2 * len(value)
        if self.count > self.limit:
            raise self._over()
        return value


def _new_framer(max_bytes: int, options: dict[str, Any]) -> msgpack.Unpacker:
    """An unpacker used only with ``skip()``: it finds where a request ends
    without building any object, so nothing is built for a partial request."""
    return msgpack.Unpacker(max_buffer_size=max(max_bytes, 1), **options)


def _time_ns(value: Any) -> int | None:
    """Epoch nanoseconds of an event time, ``None`` for "use the receive time"."""
    kind = type(value)
    if kind is EventTime:
        return int(value)  # at most 2**32 seconds: always in int64 nanoseconds
    if kind is msgpack.ExtType and value.code == _EVENT_TIME_EXT_TYPE and len(value.data) == 8:
        raise _InvalidEvent("EventTime nanoseconds out of range")  # _ext_hook refused it
    if kind is int:
        if value == 0:
            return None
        ns = value * _NS_PER_SECOND
        if not ns_in_range(ns):
            raise _InvalidEvent("time out of range")
        return int(ns)
    if value is None:
        return None
    if kind is float:
        if not math.isfinite(value) or abs(value) > _MAX_TIME_SECONDS:
            raise _InvalidEvent("time out of range")
        if value == 0:
            return None
        seconds = math.floor(value)
        ns = int(seconds * _NS_PER_SECOND + round((value - seconds) * _NS_PER_SECOND))
        if not ns_in_range(ns):
            raise _InvalidEvent("time out of range")
        return ns
    if kind is list and len(value) == 2 and type(value[1]) is dict and type(value[0]) is not list:
        # Fluent Bit 2.1+ sends [[time, metadata], record]: the time is the
        # first element; the metadata map is not kept (docs/forward.md).
        return _time_ns(value[0])
    raise _InvalidEvent(f"time is not an integer or EventTime ({kind.__name__})")


def _count(dropped: dict[str, int], reason: str) -> None:
    dropped[reason] = dropped.get(reason, 0) + 1
