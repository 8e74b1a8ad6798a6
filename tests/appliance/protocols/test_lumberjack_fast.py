"""Lumberjack's inline J-frame loop (``_json_frames``) against the frame-by-frame path
(``_frame`` -> ``_data_json`` -> ``_event``): the same windows, events and violations."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.timefmt import rfc3339_ns
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.lumberjack import LumberjackLimits, LumberjackServerConnection, Window
from tests.appliance.protocols.support import json_events

_STAMPS = st.sampled_from(
    [
        "2026-11-22T10:00:07.123Z",
        "2026-11-22T10:00:07Z",
        "2026-02-30T10:00:07.5Z",
        "2262-04-11T23:47:16.854775808Z",
        "2026-11-22T10:00:07+02:00",
        "2026-11-22T10:00:0²Z",
        "",
    ]
)
_NAMES = st.sampled_from(["filebeat", "", "x" * 300, "é", "web-01"])
_EVENT = json_events(
    ["@timestamp", "@metadata", "type", "host", "beat", "message"], _STAMPS, _NAMES
)
#: Frames' JSON: mostly objects, sometimes invalid JSON or not an object.
_PAYLOAD = st.one_of(
    _EVENT.map(lambda e: json.dumps(e, ensure_ascii=False).encode()),
    _EVENT.map(lambda e: json.dumps(e).encode()),
    st.sampled_from([b"[1]", b'"x"', b"{", b'{"a":1e400}', b'{"a":"\\ud800"}', b"\xff{}", b"{} "]),
)


def _frames(payloads: list[bytes], first: int) -> bytes:
    return b"".join(
        b"2J" + struct.pack(">II", seq, len(p)) + p for seq, p in enumerate(payloads, first)
    )


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        payloads = draw(st.lists(_PAYLOAD, min_size=1, max_size=12))
        window = b"2W" + struct.pack(
            ">I", draw(st.sampled_from([len(payloads), len(payloads) + 1]))
        )
        frames = _frames(payloads, draw(st.integers(0, 2**32 - 20)))
        if draw(st.booleans()):
            compressed = zlib.compress(frames)
            frames = b"2C" + struct.pack(">I", len(compressed)) + compressed
        out += window + frames
    return out


def _outcome(data: bytes, cuts: list[int], limits: LumberjackLimits) -> list[Any]:
    codec = LumberjackServerConnection(limits)
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
        else (
            e.sequences,
            e.texts,
            e.tags,
            e.hosts,
            e.times_ns,
            e.acks,
            e.nbytes,
            e.invalid_tags,
            e.invalid_hosts,
        )
        for e in events
        if isinstance(e, ProtocolViolation | Window)
    ]


_LIMITS = st.sampled_from(
    [LumberjackLimits(), LumberjackLimits(max_window_bytes=400, max_frame_bytes=200)]
)


@settings(max_examples=500, deadline=None)
@given(streams(), st.lists(st.integers(0, 10_000), max_size=3), _LIMITS)
def test_fast_and_frame_by_frame_agree(data: bytes, cuts: list[int], limits: Any) -> None:
    fast = _outcome(data, cuts, limits)
    with pytest.MonkeyPatch.context() as patch:
        # Every J frame then goes through _frame and _data_json, one by one.
        patch.setattr(
            LumberjackServerConnection, "_json_frames", lambda self, view, offset, *rest: offset
        )
        slow = _outcome(data, cuts, limits)
    assert fast == slow


def test_a_beats_window_is_read_by_the_inline_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_event(*args: object) -> None:
        raise AssertionError("the frame-by-frame path ran")

    monkeypatch.setattr(LumberjackServerConnection, "_event", no_event)
    events = [
        {"@timestamp": "2026-11-22T10:00:07.123Z", "@metadata": {"beat": "filebeat"},
         "host": {"name": "web-01"}, "message": "hello"}
        for _ in range(10)
    ]  # fmt: skip
    data = b"2W" + struct.pack(">I", 10) + _frames([json.dumps(e).encode() for e in events], 1)
    (window,) = LumberjackServerConnection().receive_data(data)
    assert isinstance(window, Window)
    assert window.tags == ["filebeat"] * 10
    assert window.hosts == ["web-01"] * 10
    assert window.times_ns == [rfc3339_ns("2026-11-22T10:00:07.123Z")] * 10


@settings(max_examples=200, deadline=None)
@given(
    streams(),
    st.sampled_from(
        [("a.b.c",), ("type", "@metadata.beat"), ("x.y", "a.b.c"), ("host.name", "message")]
    ),
)
def test_deeper_tag_fields_agree_too(data: bytes, tag_fields: tuple[str, ...]) -> None:
    def outcome() -> list[Any]:
        codec = LumberjackServerConnection(tag_fields=tag_fields)
        return [
            e.reason if isinstance(e, ProtocolViolation) else (e.texts, e.tags, e.hosts)
            for e in codec.receive_data(data)
        ]

    fast = outcome()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            LumberjackServerConnection, "_json_frames", lambda self, view, offset, *rest: offset
        )
        assert outcome() == fast
