"""The PackedForward fast path: a whole entries stream decoded in one msgspec call, or None.

What real shippers send in PackedForward mode is one shape: ``size``
entries, each ``[EventTime, map]`` with text keys and JSON-like values
(Fluentd's out_forward and npm ``@fluent-org/logger`` always put ``size``
in the options; Fluent Bit whenever it sends options, which acks need;
docs/forward.md, "The fast path"). For that shape this module does in C
what the general path (:meth:`ForwardServerConnection._decode_entries
<appliance.protocols.forward.ForwardServerConnection>`) does with one Python
call per entry:

1. one :mod:`msgspec` decode of the stream behind an array header of
   ``size`` elements, typed ``[[Raw, dict], ...]``: an entry count other
   than ``size``, an entry that is not a two-element array with a map, a
   str that is not valid UTF-8, an extension value (the hook refuses it),
   or nesting past the decoder's recursion limit fails the decode;
2. the EventTimes of all entries in one :mod:`struct` unpack: all must be
   ext type 0 with 8 bytes and nanoseconds under 10**9;
3. the records' JSON text in one pass
   (:func:`~appliance.rows.records.plain_records_json`): text keys, no
   bytes, no datetimes (msgspec's reading of the msgpack timestamp
   extension), no integer beyond 64 bits.

Any miss returns None and the general path reads the stream from the
start, as it would have anyway: so the events, the records, their texts and
every drop and violation are the general path's own. For the shape above
the two give equal ``(times, records)`` and the texts equal
:func:`~appliance.rows.records.records_json` of them (a differential
hypothesis test, tests/appliance/protocols/test_forward_fast.py, and the
``forward_fast`` fuzz target). Measured on 1,000-event chunks of 100-byte
records: 0.63 µs an event against 1.30 µs (bench/codec_micro.py).

Memory and work: msgspec bounds every length a header claims by the bytes
left (a claimed length past the end is "truncated" before anything is
built) and builds the same objects as the general path; on top come one
copy of the stream (behind its header), a tuple and a ``Raw`` per entry,
the joined EventTimes and their integers: about 13 bytes per stream byte
at worst (12-byte entries), and 42% more peak memory than
the general path measured on a 39 MiB stream of 200,000 entries. They are
freed before the general path runs, so the peaks do not add up. A miss
costs up to the whole fast path's work (a record's bytes found at the end:
about 1.65 times the general path's CPU for that request, measured), so
a connection whose request missed after a decode does not try again for
:data:`~appliance.protocols.forward.FAST_PATH_PAUSE_REQUESTS` requests
(a client whose records hold bytes would otherwise pay twice on every
chunk).
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Final

import msgspec

from appliance.rows.records import plain_records_json

__all__ = ["FAST_PREFIX", "fast_entries", "fast_path_size"]

#: How every entry of the fast path starts: a 2-element array (0x92), then
#: fixext 8 (0xd7) of ext type 0: an EventTime (spec "EventTime Ext Format").
FAST_PREFIX: Final = b"\x92\xd7\x00"
_NS_PER_SECOND: Final = 1_000_000_000
#: An EventTime's msgpack bytes: fixext 8 header, type 0, seconds, nanoseconds.
_EVENT_TIME_BYTES: Final = 10
#: The smallest entry: array header, an EventTime, an empty map.
_MIN_ENTRY_BYTES: Final = 1 + _EVENT_TIME_BYTES + 1
#: Entry counts whose unpacking format is kept for reuse (a shipper's chunks
#: are usually of a few sizes); each kept format costs about 64 bytes an
#: entry, so larger counts build theirs for the call only (at most 16 x
#: 0.5 MiB kept).
_CACHED_FORMAT_ENTRIES: Final = 8192


class _NotPlain(Exception):
    """An extension value inside an entry: the general path renders it."""


def _refuse_extension(code: int, data: memoryview) -> Any:
    raise _NotPlain(code)


#: Entries as (the time's raw msgpack bytes, the record); thread-safe, reused.
_DECODER: Final = msgspec.msgpack.Decoder(
    list[tuple[msgspec.Raw, dict[Any, Any]]], ext_hook=_refuse_extension
)


def _event_times(count: int) -> struct.Struct:
    """``count`` EventTimes side by side: skip the 2 header bytes, two big-endian u32."""
    return struct.Struct(">" + "2xII" * count)


_cached_event_times: Final = functools.lru_cache(maxsize=16)(_event_times)


def _array_header(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big")  # array 32 (msgpack spec "array format")


def _times_ns(raws: list[msgspec.Raw]) -> list[int | None] | None:
    """Epoch nanoseconds of raw EventTimes, or None unless every one is a valid EventTime."""
    count = len(raws)
    joined = b"".join(raws)
    if (
        len(joined) != count * _EVENT_TIME_BYTES
        or joined[0::_EVENT_TIME_BYTES] != b"\xd7" * count
        or joined[1::_EVENT_TIME_BYTES] != b"\x00" * count
    ):
        return None
    layout = _cached_event_times if count <= _CACHED_FORMAT_ENTRIES else _event_times
    values = layout(count).unpack(joined)
    nanoseconds = values[1::2]
    if max(nanoseconds) >= _NS_PER_SECOND:
        return None  # the general path drops such an event and counts it
    return [s * _NS_PER_SECOND + n for s, n in zip(values[0::2], nanoseconds, strict=True)]


def fast_path_size(stream: bytes, size: object, max_events: int) -> int | None:
    """The entry count :func:`fast_entries` would read ``stream`` as, or None if it may not.

    A cheap look at the request's ``size`` option and the stream's first bytes.

    Args:
        stream: the whole (decompressed) entries stream of a PackedForward request.
        size: the request's ``size`` option, as sent (anything but a
            positive int means no fast path).
        max_events: the connection's ``max_events_per_request``.
    """
    if (
        type(size) is int
        and 0 < size <= max_events
        and size * _MIN_ENTRY_BYTES <= len(stream)
        and stream.startswith(FAST_PREFIX)
    ):
        return size
    return None


def fast_entries(
    stream: bytes, size: int
) -> tuple[list[int | None], list[dict[Any, Any]], list[str]] | None:
    """Times (epoch ns), records and their JSON texts of a plain entries stream; else None.

    ``size``: what :func:`fast_path_size` gave; None is a miss (the
    stream is not of the plain shape), which cost a decode.
    """
    try:
        entries = _DECODER.decode(_array_header(size) + stream)
    except (msgspec.DecodeError, ValueError, RecursionError, _NotPlain):
        # DecodeError covers ValidationError (the shape, an unhashable key)
        # and truncation; UnicodeDecodeError (a str that is not UTF-8) is a
        # ValueError.
        return None
    times = _times_ns([entry[0] for entry in entries])
    if times is None:
        return None
    records = [entry[1] for entry in entries]
    texts = plain_records_json(records)
    if texts is None:
        return None
    return times, records, texts
