"""Per-event cost of the codec and record_json, and of the alternatives RESULTS.md suggests.

Runs on the same 1,000-entry PackedForward request that ``forward_bench``
sends, pinned to one core, best of 9 runs. Prints microseconds per event.
``orjson`` is measured only when it is importable (it is not a dependency)::

    .venv/bin/python -m bench.codec_micro
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from appliance.blocks.records import record_json, records_json
from appliance.protocols.forward import EventsReceived, EventTime, ForwardServerConnection
from bench import harness
from bench.forward_bench import TAG, Workload, chunk_id

_EVENT_TIME = struct.Struct(">II")


def best_us(fn: Callable[[], object], events: int, repeats: int = 9) -> float:
    """Microseconds per event: the fastest of ``repeats`` runs of >= 50 ms each.

    The fastest run is the one least disturbed by other processes.
    """

    def run() -> int:
        fn()
        return events

    return 1e6 / harness.best_rate(run, 0.05, repeats)


def unpack(stream: bytes, hook: Callable[[int, bytes], Any]) -> list[Any]:
    unpacker = msgpack.Unpacker(
        raw=False, unicode_errors="surrogateescape", strict_map_key=False, ext_hook=hook
    )
    unpacker.feed(stream)
    return list(unpacker)


def hook_event_time(code: int, data: bytes) -> Any:
    seconds, nanoseconds = _EVENT_TIME.unpack(data)
    return EventTime(seconds, nanoseconds)


def hook_ns(code: int, data: bytes) -> Any:
    seconds, nanoseconds = _EVENT_TIME.unpack(data)
    return seconds * 1_000_000_000 + nanoseconds


def inline_entries(stream: bytes) -> tuple[list[int], list[dict[Any, Any]]]:
    """A sketch of a fast path: one loop, no per-entry calls, int ns from the hook."""
    unpacker = msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        strict_map_key=False,
        ext_hook=hook_ns,
        max_buffer_size=len(stream),
    )
    unpacker.feed(stream)
    times: list[int] = []
    records: list[dict[Any, Any]] = []
    for entry in unpacker:
        if type(entry) is list and len(entry) == 2:
            when, record = entry
            if type(record) is dict and type(when) is int:
                times.append(when)
                records.append(record)
                continue
        # the general path (validation, drops) would take the rest
    return times, records


def main() -> int:
    with harness.pinned(sorted(os.sched_getaffinity(0))[0]):
        return measure()


def measure() -> int:
    workload = Workload.build(1000, 100)
    request = workload.request(chunk_id(1, 0, 0))
    entries = unpack(workload.entries, msgpack.ExtType)
    records = [entry[1] for entry in entries]
    n = len(records)
    codec = ForwardServerConnection()
    no_cycle_check = json.JSONEncoder(
        ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
    ).encode
    stream = workload.entries
    # The same request without its "size" option: the general path only.
    general_request = msgpack.packb(
        [TAG, workload.entries, {"chunk": chunk_id(1, 0, 0)}], use_bin_type=True
    )

    def general_with_texts() -> object:
        (event,) = codec.receive_data(general_request)
        assert isinstance(event, EventsReceived)
        assert event.texts is None
        return records_json(event.records)

    def fast_with_texts() -> object:
        (event,) = codec.receive_data(request)
        assert isinstance(event, EventsReceived)
        assert event.texts is not None
        return event.texts

    cases: list[tuple[str, Callable[[], object]]] = [
        ("codec + texts, fast path (size given; forward/fast.py)", fast_with_texts),
        ("codec + texts, general path (no size) + records_json", general_with_texts),
        ("  msgpack entries, default ExtType", lambda: unpack(stream, msgpack.ExtType)),
        ("  msgpack entries, ext_hook -> EventTime", lambda: unpack(stream, hook_event_time)),
        ("  msgpack entries, ext_hook -> int ns", lambda: unpack(stream, hook_ns)),
        ("  inline fast path sketch (decode + checks)", lambda: inline_entries(stream)),
        ("record_json (appliance.blocks.records)", lambda: [record_json(r) for r in records]),
        ("  json.JSONEncoder(check_circular=False)", lambda: [no_cycle_check(r) for r in records]),
    ]
    rows = [(name, best_us(fn, n)) for name, fn in cases]
    try:
        import orjson  # type: ignore[import-not-found]
    except ImportError:
        rows.append(("  orjson.dumps: not installed", float("nan")))
    else:
        same = all(orjson.dumps(r).decode() == record_json(r) for r in records)
        rows.append(
            (
                f"  orjson.dumps(r).decode() (same text: {same})",
                best_us(lambda: [orjson.dumps(r).decode() for r in records], n),
            )
        )
    print(f"per event, {n} entries of {workload.record_bytes:.0f}-byte records, best of 9:")
    for name, us in rows:
        print(f"{us:8.2f} us  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
