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
   (:func:`~appliance.blocks.records.plain_records_json`): text keys, no
   bytes, no datetimes (msgspec's reading of the msgpack timestamp
   extension), no integer beyond 64 bits.

Any miss returns None and the general path reads the stream from the
start, as it would have anyway: so the events, the records, their texts and
every drop and violation are the general path's own. For the shape above
the two give equal ``(times, records)`` and the texts equal
:func:`~appliance.blocks.records.records_json` of them (a differential
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
freed before the general path runs, so the peaks do not add up. A stream
over ``slice_bytes`` is decoded as the general path decodes it, a slice at
a time (appliance/protocols/forward/connection.py, "Memory"): one msgspec call finds
where each entry ends (``Raw``, nothing built), then each slice is decoded
and rendered, and only its texts are kept (``records`` comes back empty).
Slices cost no more CPU than one call over the whole stream (they stay in
the CPU's cache); an entry that could break a record limit (over
``max_record_bytes``, or over ``max_record_values`` bytes), a text
over ``max_record_bytes`` or texts over their :class:`TextAllowance` make
it return None, and the general path, which counts, decides. A miss
costs up to the whole fast path's work (a record's bytes found at the end:
about 1.65 times the general path's CPU for that request, measured), so
a connection whose request missed after a decode does not try again for
:data:`~appliance.protocols.forward.FAST_PATH_PAUSE_REQUESTS` requests
(a client whose records hold bytes would otherwise pay twice on every
chunk).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

from appliance import defaults
from appliance.blocks.records import oversized_record, plain_records_json

__all__ = [
    "FAST_PREFIX",
    "RecordRules",
    "TextAllowance",
    "decodes_whole",
    "fast_entries",
    "fast_path_size",
    "oversized",
    "texts_within",
]

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


@dataclass(frozen=True, slots=True)
class _Defaults:
    """The default record limits (appliance/defaults.py), for callers that give none."""

    max_record_values: int = defaults.RECORD_MAX_VALUES
    max_record_bytes: int = defaults.RECORD_MAX_BYTES
    slice_bytes: int = defaults.FORWARD_SLICE_BYTES
    max_whole_bytes: int | None = None


_DEFAULT_RULES: Final = _Defaults()
#: Entries as their raw msgpack bytes, nothing built: where each entry starts
#: and ends, for a stream decoded a slice at a time.
_BOUNDS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])


class TextAllowance:
    """The memory a sliced stream's records may take as JSON text, spent slice by slice.

    ``FORWARD_TEXT_BYTES_PER_BYTE`` per stream byte (appliance/defaults.py),
    beyond each text's str header (which ``FORWARD_EVENT_BYTES`` counts per
    event): what the stream's decode cost reserved for them. Real records
    take 1 to 2 bytes a byte, or up to about 6 in a str of four bytes a
    character (one emoji makes it so); more (escapes of six characters for
    a byte, in such a str) is spent beyond the allowance, and the general
    path asks its gate for it (:meth:`ForwardServerConnection._render
    <appliance.protocols.forward.ForwardServerConnection>`); the fast path
    leaves such a stream to it.
    """

    __slots__ = ("left",)

    def __init__(self, stream_bytes: int) -> None:
        self.left = defaults.FORWARD_TEXT_BYTES_PER_BYTE * stream_bytes

    def spend(self, texts: Sequence[str]) -> int:
        """Take what ``texts`` occupy (``sys.getsizeof``); the bytes spent beyond the allowance."""
        self.left -= sum(map(sys.getsizeof, texts)) - _TEXT_HEADER_BYTES * len(texts)
        return max(0, -self.left)

    def add(self, nbytes: int) -> None:
        """``nbytes`` more were reserved for the texts."""
        self.left += nbytes


#: A text's str header, counted per event (FORWARD_EVENT_BYTES), not from the
#: allowance: CPython's largest (a str of four bytes a character), rounded up.
_TEXT_HEADER_BYTES: Final = 80


class RecordRules(Protocol):
    """The record limits the fast path keeps (``DecodeLimits`` of forward/events.py)."""

    @property
    def max_record_values(self) -> int: ...

    @property
    def max_record_bytes(self) -> int: ...

    @property
    def slice_bytes(self) -> int: ...

    @property
    def max_whole_bytes(self) -> int | None: ...


def decodes_whole(stream_bytes: int, rules: RecordRules, max_events: int) -> bool:
    """Whether an entries stream is decoded in one pass (else a slice at a time).

    Up to ``slice_bytes``; and beyond, as long as decoding it whole takes no
    more than its reported cost (``FORWARD_WHOLE_BYTES_PER_BYTE`` a byte
    within :func:`appliance.defaults.forward_stream_cost`: up to about 2.4 MiB
    with the defaults), no entry of it can be over ``max_record_bytes``, and
    it is within ``max_whole_bytes`` when that is given.
    """
    if stream_bytes <= rules.slice_bytes:
        return True
    if rules.max_whole_bytes is not None and stream_bytes > rules.max_whole_bytes:
        return False
    return stream_bytes <= rules.max_record_bytes and (
        defaults.FORWARD_WHOLE_BYTES_PER_BYTE * stream_bytes
        <= defaults.forward_stream_cost(stream_bytes, max_events)
    )


def texts_within(
    texts: Sequence[str], stream_bytes: int, max_record_values: int, max_record_bytes: int
) -> bool | str:
    """Whether the texts of a stream decoded whole keep the record limits.

    True; a ``str``: why not (a record's JSON over ``max_record_bytes``);
    False: not known, one text is long enough to hold more than
    ``max_record_values`` values (a value takes a character of JSON at
    least), which only counting them (a slice at a time) tells.
    """
    if not texts:
        return True
    longest = max(map(len, texts))
    if stream_bytes > max_record_values and longest > max_record_values:
        return False
    if longest > max_record_bytes // 4:
        return oversized(texts, max_record_bytes) or True
    return True


def oversized(texts: Sequence[str], max_record_bytes: int) -> str | None:
    """Why a slice's texts cannot be kept (a record's JSON too large), or None."""
    over = oversized_record(texts, max_record_bytes)
    if over is None:
        return None
    return (
        f"a record of {over} bytes of JSON is over the limit of {max_record_bytes} "
        "(RECORD_MAX_BYTES)"
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
    stream: bytes,
    size: int,
    rules: RecordRules | None = None,
    *,
    max_events: int = defaults.FORWARD_MAX_EVENTS_PER_REQUEST,
) -> tuple[list[int | None], list[dict[Any, Any]], list[str]] | None:
    """Times (epoch ns), records and their JSON texts of a plain entries stream; else None.

    ``size``: what :func:`fast_path_size` gave; None is a miss (the
    stream is not of the plain shape), which cost a decode. ``rules``: the
    record limits (None: the defaults).

    A stream over ``slice_bytes`` is decoded a slice at a time (as the
    general path does: appliance/protocols/forward/connection.py, "Memory"): the records
    come back empty, their texts whole; unless it is decoded whole
    (:func:`decodes_whole`), which the defaults allow up to about 2.4 MiB.
    It is taken only when the general path would take it too: every entry
    small enough that it cannot hold more than ``max_record_values`` values
    (one per byte at most) or be over ``max_record_bytes``, every text within
    ``max_record_bytes``, and all texts within their :class:`TextAllowance`;
    otherwise None, and the general path decides (and says why).
    """
    if rules is None:
        rules = _DEFAULT_RULES
    slice_bytes = rules.slice_bytes
    max_record_bytes = rules.max_record_bytes
    max_record_values = rules.max_record_values
    n = len(stream)
    if n <= slice_bytes:
        return _whole(stream, size)
    if decodes_whole(n, rules, max_events):
        # As the general path does (appliance/protocols/forward/connection.py, "Memory"):
        # one pass, as fast as ever; a text that could hold more values than
        # a record may, or is over the record bytes, leaves it to the general
        # path, which counts and says why.
        found = _whole(stream, size)
        if found is None:
            return None
        whole_times, _, whole_texts = found
        if texts_within(whole_texts, n, max_record_values, max_record_bytes) is not True:
            return None
        return whole_times, [], whole_texts  # as from slices: the texts only
    try:
        bounds = _BOUNDS.decode(_array_header(size) + stream)
    except (msgspec.DecodeError, ValueError, RecursionError):
        return None
    lengths = list(map(len, bounds))
    del bounds  # they hold a copy of the stream
    if max(lengths) > min(max_record_bytes, max_record_values):
        return None
    ends = list(itertools.accumulate(lengths))
    allowance = TextAllowance(len(stream))
    times: list[int | None] = []
    texts: list[str] = []
    first = start = 0
    while first < size:
        # The entries from ``first`` that fit in a slice (at least one).
        last = max(bisect.bisect_right(ends, start + slice_bytes, first), first + 1)
        end = ends[last - 1]
        found = _whole(stream[start:end], last - first)
        if found is None:
            return None
        slice_times, _, slice_texts = found
        if oversized(slice_texts, max_record_bytes) is not None or allowance.spend(slice_texts):
            return None  # the general path refuses it, or asks for the texts' memory
        times += slice_times
        texts += slice_texts
        first, start = last, end
    return times, [], texts


def _whole(
    stream: bytes, size: int
) -> tuple[list[int | None], list[dict[Any, Any]], list[str]] | None:
    """:func:`fast_entries` of a stream decoded in one call."""
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
