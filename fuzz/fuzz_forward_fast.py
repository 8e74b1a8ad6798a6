"""Fuzz target: the PackedForward fast path against the general path (a differential).

Run: ``python fuzz/fuzz_forward_fast.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz), and
:func:`check_stream` is what the hypothesis tests call.

The input is fuzz/harness.py's layout; the payload is an entries stream. The
cut points are not used as reads: ``cut_a`` is the request's ``size``
option (``0xffff``: the number of msgpack values the stream holds, so the
fast path is reached whenever the stream is plain). The same stream goes to
two codecs in one PackedForward request each, one with ``size`` (where
:mod:`appliance.protocols.forward.fast` may take it) and one without (the
general path only). The run fails unless both give the same outcome: the
same events (times, records, drops, chunk) or the same violation; and when
the fast path rendered the texts, they must equal ``records_json`` of the
records and the general path must have dropped nothing. Flag ``0x01``
gzips the stream (CompressedPackedForward). ``SMALL_LIMITS``: 8 events.
Flag ``0x02`` gives both codecs tiny record limits (:data:`SLICED_LIMITS`):
streams over 64 bytes are decoded a slice at a time, both paths render the
texts, and records over 128 values or 256 bytes, or texts over their
allowance, are refused by the general path and must never be taken by the
fast one.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path
from typing import Any, Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    import msgpack

    from appliance.blocks.records import records_json
    from appliance.protocols.errors import ProtocolViolation
    from appliance.protocols.forward import (
        DecodeLimits,
        EventsReceived,
        ForwardLimits,
        ForwardServerConnection,
    )
    from appliance.protocols.forward.fast import fast_entries, fast_path_size
    from fuzz.harness import SMALL_LIMITS, FuzzInput, fuzz_main

GZIP: Final = 0x01
#: Flag: tiny record limits, so that slices and the record limits are reached.
SLICED: Final = 0x02
#: The record limits of :data:`SLICED`: every stream over 64 bytes is sliced.
SLICED_LIMITS: Final = DecodeLimits(
    max_record_values=128, max_record_bytes=256, slice_bytes=64, max_whole_bytes=64
)
#: The same limits, streams of 64 to 256 bytes decoded whole (as the defaults
#: decode streams of 256 KiB to about 2.4 MiB): their texts are checked instead.
WHOLE_LIMITS: Final = DecodeLimits(max_record_values=128, max_record_bytes=256, slice_bytes=64)
#: ``cut_a`` value that means "size: as many values as the stream holds".
COUNT_VALUES: Final = 0xFFFF
_DEFAULT: Final = ForwardLimits(max_decompressed_bytes=1024 * 1024)
_SMALL: Final = ForwardLimits(max_decompressed_bytes=4096, max_events_per_request=8)


def _request(stream: bytes, size: int | None, compressed: bool) -> bytes:
    option: dict[str, Any] = {"chunk": "fuzz-chunk"}
    if size is not None:
        option["size"] = size
    if compressed:
        option["compressed"] = "gzip"
    return msgpack.packb(["fuzz.tag", stream, option], use_bin_type=True)


def _outcome(
    limits: ForwardLimits, decode: DecodeLimits | None, request: bytes
) -> EventsReceived | str:
    events = ForwardServerConnection(limits, decode_limits=decode).receive_data(request)
    assert len(events) == 1, events
    event = events[0]
    if isinstance(event, ProtocolViolation):
        return event.reason
    assert isinstance(event, EventsReceived), event
    return event


def _values(stream: bytes) -> int:
    """How many msgpack values ``stream`` holds (0 when it is not a whole stream)."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(stream), 1), strict_map_key=False)
    unpacker.feed(stream)
    count = 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            return count
        except (ValueError, TypeError):
            return 0
        count += 1


def _packed(records: list[Any]) -> bytes:
    # surrogateescape: a str that was not UTF-8 packs back to its own bytes.
    packed: bytes = msgpack.packb(records, use_bin_type=True, unicode_errors="surrogateescape")
    return packed


def _same(a: EventsReceived, b: EventsReceived) -> bool:
    # packb compares the records byte for byte (NaN != NaN as objects).
    return (a.tag, a.mode, a.times_ns, a.chunk, a.dropped) == (
        b.tag,
        b.mode,
        b.times_ns,
        b.chunk,
        b.dropped,
    ) and _packed(a.records) == _packed(b.records)


def check_stream(
    stream: bytes,
    size: int | None,
    *,
    compressed: bool = False,
    small: bool = False,
    sliced: bool = False,
    whole: bool = False,
) -> bool:
    """Fail unless the fast and general paths agree on ``stream``; whether the fast one took it.

    ``sliced``: both codecs have :data:`SLICED_LIMITS`; ``whole``: :data:`WHOLE_LIMITS`.
    """
    limits = _SMALL if small else _DEFAULT
    decode = SLICED_LIMITS if sliced else WHOLE_LIMITS if whole else None
    payload = gzip.compress(stream, mtime=0) if compressed else stream
    fast = _outcome(limits, decode, _request(payload, size, compressed))
    general = _outcome(limits, decode, _request(payload, None, compressed))
    if isinstance(general, str) or isinstance(fast, str):
        assert fast == general, (fast, general)
        return False
    if general.texts is not None:
        # A stream over slice_bytes (sliced, or whole): both paths kept only the texts.
        assert general.records == fast.records == []
        assert _same(fast, general), (fast, general)
        assert fast.texts == general.texts, (fast.texts, general.texts)
        count = fast_path_size(stream, size, limits.max_events_per_request)
        took = (
            count is not None
            and fast_entries(stream, count, decode, max_events=limits.max_events_per_request)
            is not None
        )
        assert not (took and general.dropped)
        return took
    assert _same(fast, general), (fast, general)
    if fast.texts is None:
        return False
    assert not general.dropped
    assert fast.texts == records_json(general.records), (fast.texts, general.records)
    return True


def took_fast_path(data: bytes) -> bool:
    """Run one fuzz input (see the module docstring); whether the fast path took it."""
    given = FuzzInput.parse(data)
    stream = given.payload
    size = _values(stream) if given.cut_a == COUNT_VALUES else given.cut_a
    return check_stream(
        stream,
        size,
        compressed=given.has(GZIP),
        small=given.has(SMALL_LIMITS),
        sliced=given.has(SLICED),
    )


def run_one(data: bytes) -> None:
    """Run one fuzz input (see the module docstring)."""
    took_fast_path(data)


if __name__ == "__main__":
    fuzz_main(run_one)
