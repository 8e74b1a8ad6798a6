"""Fuzz target: the PackedForward fast path against the general path (a differential).

Run: ``python fuzz/fuzz_forward_fast.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz), and
:func:`check_stream` is what the hypothesis tests call.

The input is fuzz/harness.py's layout; the payload is an entries stream. The
cut points are not used as reads: ``cut_a`` is the request's ``size``
option (``0xffff``: the number of msgpack values the stream holds, so the
fast path is reached whenever the stream is plain). The same stream goes to
two codecs in one PackedForward request each, one with ``size`` (where
:mod:`appliance.protocols.forward_fast` may take it) and one without (the
general path only). The run fails unless both give the same outcome: the
same events (times, records, drops, chunk) or the same violation; and when
the fast path rendered the texts, they must equal ``records_json`` of the
records and the general path must have dropped nothing. Flag ``0x01``
gzips the stream (CompressedPackedForward). ``SMALL_LIMITS``: 8 events.
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

    from appliance.protocols.errors import ProtocolViolation
    from appliance.protocols.forward import (
        EventsReceived,
        ForwardLimits,
        ForwardServerConnection,
    )
    from appliance.rows.records import records_json
    from fuzz.harness import SMALL_LIMITS, FuzzInput, fuzz_main

GZIP: Final = 0x01
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


def _outcome(limits: ForwardLimits, request: bytes) -> EventsReceived | str:
    events = ForwardServerConnection(limits).receive_data(request)
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
    stream: bytes, size: int | None, *, compressed: bool = False, small: bool = False
) -> bool:
    """Fail unless the fast and general paths agree on ``stream``; whether the fast one took it."""
    limits = _SMALL if small else _DEFAULT
    payload = gzip.compress(stream, mtime=0) if compressed else stream
    fast = _outcome(limits, _request(payload, size, compressed))
    general = _outcome(limits, _request(payload, None, compressed))
    if isinstance(general, str) or isinstance(fast, str):
        assert fast == general, (fast, general)
        return False
    assert general.texts is None
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
    return check_stream(stream, size, compressed=given.has(GZIP), small=given.has(SMALL_LIMITS))


def run_one(data: bytes) -> None:
    """Run one fuzz input (see the module docstring)."""
    took_fast_path(data)


if __name__ == "__main__":
    fuzz_main(run_one)
