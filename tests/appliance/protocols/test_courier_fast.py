"""Log Courier's one-loop event reader against the event-by-event path (``_event``).

The codec reads a payload's common events (UTF-8 JSON objects) in one loop
(``CourierServerConnection._split_events``) and each other event by
``_event``; with ``fast = False`` every event takes ``_event``, the path the
loop replaced. Both must give the same payloads (records, tags, hosts,
times, counts, memory) and the same refusals, whatever the bytes and cuts.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.timefmt import rfc3339_ns
from appliance.protocols.courier import CourierLimits, CourierServerConnection, PayloadReceived
from appliance.protocols.errors import ProtocolViolation
from tests.appliance.protocols.support import json_events

_STAMPS = st.sampled_from(
    [
        "2026-11-22T10:00:07.123Z",
        "2026-11-22T10:00:07Z",
        "2026-11-22T10:00:07.123456789Z",
        "2026-02-30T10:00:07.5Z",
        "2262-04-11T23:47:16.854775808Z",
        "0001-01-01T00:00:00Z",
        "2026-11-22T10:00:07+02:00",
        "2026-11-22T10:00:0²Z",
        "2026-11-22T10:00:07.123Z" + " " * 50,
        "",
    ]
)
_NAMES = st.sampled_from(["nginx", "", "x" * 300, "é", "web-01", "\ud800"])
_EVENT = json_events(["@timestamp", "type", "host", "beat", "message", "fields"], _STAMPS, _NAMES)
#: Events' bytes: mostly JSON objects, sometimes not JSON, not UTF-8, or not an object.
_EVENT_BYTES = st.one_of(
    _EVENT.map(lambda e: json.dumps(e, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    _EVENT.map(lambda e: json.dumps(e).encode()),
    st.sampled_from(
        [
            b"[1]",
            b'"x"',
            b"{",
            b"",
            b'{"a":1e400}',
            b'{"a":NaN}',
            b'{"a":"\\ud800"}',
            b"\xff{}",
            b"{} ",
            b"{}\t\r\n",
            b"{} x",
            b" {}",
            b"\xef\xbb\xbf{}",
            b'{"a":1}{"b":2}',
            b'{"a":18446744073709551616}',
            b"[" * 3000 + b"]" * 3000,
            b'{"a":' * 3000 + b"1" + b"}" * 3000,
        ]
    ),
)


def _message(events: list[bytes], nonce: bytes, kind: str) -> bytes:
    body = zlib.compress(b"".join(struct.pack(">I", len(e)) + e for e in events))
    if kind == "EVNT":
        return b"EVNT\xff\xff\xff\xff" + nonce + body
    return b"JDAT" + struct.pack(">I", len(nonce) + len(body)) + nonce + body


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    return b"".join(
        _message(
            draw(st.lists(_EVENT_BYTES, min_size=0, max_size=12)),
            draw(st.binary(min_size=16, max_size=16)),
            draw(st.sampled_from(["JDAT", "EVNT"])),
        )
        for _ in range(draw(st.integers(1, 3)))
    )


def _outcome(data: bytes, cuts: list[int], limits: CourierLimits, fast: bool) -> list[Any]:
    codec = CourierServerConnection(limits)
    codec.fast = fast
    events: list[Any] = []
    last = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if codec.state.value == "closed":
            break
        events += codec.receive_data(data[last:cut])
        last = max(last, cut)
    return [
        (e.reason,)
        if isinstance(e, ProtocolViolation)
        else (e, e.memory_bytes, e.content_digest)
        if isinstance(e, PayloadReceived)
        else e
        for e in events
    ]


_LIMITS = st.sampled_from(
    [
        CourierLimits(),
        CourierLimits(max_event_bytes=300, max_events=5, max_payload_memory_bytes=2_000),
        CourierLimits(max_decompressed_bytes=1_000),
    ]
)


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(0, 10_000), max_size=3), _LIMITS)
def test_fast_and_event_by_event_agree(data: bytes, cuts: list[int], limits: Any) -> None:
    assert _outcome(data, cuts, limits, fast=True) == _outcome(data, cuts, limits, fast=False)


def test_the_common_payload_is_read_by_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_event(*args: object) -> None:
        raise AssertionError("the event-by-event path ran")

    monkeypatch.setattr(CourierServerConnection, "_event", no_event)
    event = {
        "@timestamp": "2026-11-22T10:00:07.123Z",
        "type": "nginx",
        "host": {"name": "web-01"},
        "message": "hello",
    }
    nonce = os.urandom(16)
    (received,) = CourierServerConnection().receive_data(
        _message([json.dumps(event).encode()] * 20, nonce, "JDAT")
    )
    assert isinstance(received, PayloadReceived)
    assert received.types == ["nginx"] * 20
    assert received.hosts == ["web-01"] * 20
    assert received.times_ns == [rfc3339_ns("2026-11-22T10:00:07.123Z")] * 20
    assert received.records == [json.dumps(event, separators=(",", ":"))] * 20


def test_events_that_are_not_objects_keep_their_places() -> None:
    stamp = "2026-11-22T10:00:07Z"
    events = [
        json.dumps({"@timestamp": stamp, "n": 1}).encode(),
        b"not json",
        json.dumps({"@timestamp": stamp, "n": 2}).encode(),
    ]
    (received,) = CourierServerConnection().receive_data(_message(events, os.urandom(16), "JDAT"))
    assert isinstance(received, PayloadReceived)
    assert [json.loads(text) for text in received.records] == [
        {"@timestamp": stamp, "n": 1},
        {"message": "not json"},
        {"@timestamp": stamp, "n": 2},
    ]
    assert received.times_ns == [rfc3339_ns(stamp), None, rfc3339_ns(stamp)]
    assert received.not_json == 1
