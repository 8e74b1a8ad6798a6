"""The forward codec against hostile input: no input can take the appliance down.

Strict strings (tag, chunk), no ack for an entries stream that cannot be read,
bounded work and memory per byte, ``buffered_bytes``, and one regression test
per crash found (each also run through the event-to-row mapping and the Arrow
conversion, like the fuzz targets). The handshake's share (PING size, client
hostname) is in test_forward_handshake.py.
"""

from __future__ import annotations

import gzip
import json
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.blocks.checks import check_block
from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES
from appliance.lake.arrow import blocks_to_arrow
from appliance.protocols import forward
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation
from appliance.protocols.forward import (
    DECODE_MEMORY_FACTOR,
    MAX_BINARY_CHUNK_BYTES,
    Chunk,
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    Heartbeat,
    json_framer,
)
from appliance.rows.forward import forward_block
from appliance.server.listener import ConnectionInfo
from tests.appliance.protocols.support import feed_reads as feed_reads_until_violation
from tests.appliance.protocols.support import violation

T0 = 1_700_000_000
NS = 1_000_000_000
INFO = ConnectionInfo(listener="test", address="192.0.2.1", port=5000, tls=True)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def pack_raw_str(obj: Any) -> bytes:
    """msgpack where str values carrying surrogateescapes go out as their raw bytes."""
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogateescape")


def as_str(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def entries_stream(*entries: Any) -> bytes:
    return b"".join(pack(entry) for entry in entries)


def request(mode: str, tag: Any, option: dict[str, Any] | None = None, n: int = 2) -> bytes:
    """A request of ``mode`` whose tag and option are packed raw (not-UTF-8 str kept)."""
    entries = [[T0 + i, {"i": i}] for i in range(n)]
    stream = entries_stream(*entries)
    option = dict(option or {})
    if mode == "message":
        obj: list[Any] = [tag, T0, {"i": 0}]
    elif mode == "forward":
        obj = [tag, entries]
    elif mode == "packed":
        obj = [tag, stream]
    else:
        option["compressed"] = "gzip"
        obj = [tag, gzip.compress(stream)]
    obj.append(option)
    return pack_raw_str(obj)


MODES = ["message", "forward", "packed", "compressed"]


def closed_with_error(codec: ForwardServerConnection, data: bytes) -> ProtocolViolation:
    (error,) = codec.receive_data(data)
    assert isinstance(error, ProtocolViolation), error
    assert codec.state is ForwardState.CLOSED
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"\xc0")
    return error


def only(events: list[ForwardEvent]) -> EventsReceived:
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, EventsReceived)
    return event


def feed_reads(
    codec: ForwardServerConnection, reads: list[bytes], events: list[ForwardEvent] | None = None
) -> None:
    """Feed one read after the other, collecting what they return into ``events``
    (up to and with a violation)."""
    returned = feed_reads_until_violation(codec.receive_data, reads)
    if events is not None:
        events += returned


def splits(data: bytes, every: int = 1) -> Iterator[int]:
    yield from range(0, len(data) + 1, every)


def refused_wherever_split(data: bytes, every: int = 1, **kwargs: Any) -> str:
    """``data`` is refused (a violation ends its events) wherever the read is split."""
    reasons = set()
    for at in splits(data, every):
        codec = ForwardServerConnection(**kwargs)
        events: list[ForwardEvent] = []
        feed_reads(codec, [data[:at], data[at:]], events)
        assert codec.state is ForwardState.CLOSED, f"split at {at}"
        reasons.add(violation(events).reason)
    assert len(reasons) == 1, reasons
    return reasons.pop()


def storable(events: list[ForwardEvent]) -> None:
    """Every event maps to a block the writer accepts and Arrow converts."""
    blocks = [
        forward_block(e, source=INFO.source, peer=INFO.peer, received_at_ns=T0 * NS)
        for e in events
        if isinstance(e, EventsReceived)
    ]
    for block in blocks:
        check_block(block)
    if blocks:
        assert blocks_to_arrow(blocks).num_rows == sum(b.rows for b in blocks)


# -- strict strings: the tag -----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("raw", [b"a\xffb", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
def test_tag_that_is_not_utf8_is_refused(mode: str, raw: bytes) -> None:
    data = request(mode, as_str(raw), {"chunk": "c"})
    assert raw in data  # the precondition: the wire carries the invalid bytes
    reason = refused_wherever_split(data, every=3)
    assert "tag is not valid UTF-8" in reason


@pytest.mark.parametrize("mode", MODES)
def test_tag_at_the_limit_passes_and_one_byte_more_is_refused(mode: str) -> None:
    for tag in ("t" * MAX_TAG_BYTES, "\u00e9" * (MAX_TAG_BYTES // 2)):
        assert len(tag.encode()) == MAX_TAG_BYTES
        assert only(ForwardServerConnection().receive_data(request(mode, tag))).tag == tag
    for tag in ("t" * (MAX_TAG_BYTES + 1), "\u00e9" * (MAX_TAG_BYTES // 2) + "a"):
        error = closed_with_error(ForwardServerConnection(), request(mode, tag))
        assert "tag" in error.reason
        assert str(MAX_TAG_BYTES) in error.reason


@pytest.mark.parametrize("escape", ["\\ud800", "\\udc80", "\\udfff", "a\\udbffb"])
def test_json_tag_with_a_lone_surrogate_is_refused(escape: str) -> None:
    data = f'["{escape}", 1700000000, {{"a": 1}}]'.encode()
    assert "tag is not valid UTF-8" in refused_wherever_split(data)


def test_json_tag_with_an_escaped_surrogate_pair_is_text() -> None:
    data = b'["\\ud83d\\ude00.app", 1700000000, {"a": 1}]'
    assert only(ForwardServerConnection().receive_data(data)).tag == "\U0001f600.app"


# -- strict strings: the chunk --------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunk", ["", b""], ids=["str", "bin"])
def test_empty_chunk_is_refused(mode: str, chunk: str | bytes) -> None:
    error = closed_with_error(ForwardServerConnection(), request(mode, "t", {"chunk": chunk}))
    assert "chunk option is empty" in error.reason


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["str", "bin"])
def test_chunk_at_the_limit_passes_and_one_byte_more_is_refused(mode: str, kind: str) -> None:
    def chunk(n: int) -> str | bytes:
        return "c" * n if kind == "str" else b"c" * n

    codec = ForwardServerConnection()
    event = only(codec.receive_data(request(mode, "t", {"chunk": chunk(MAX_BATCH_ID_BYTES)})))
    assert event.chunk == Chunk(b"c" * MAX_BATCH_ID_BYTES, kind)  # type: ignore[arg-type]
    assert codec.ack_bytes(event.chunk).endswith(b"c" * MAX_BATCH_ID_BYTES)
    over = request(mode, "t", {"chunk": chunk(MAX_BATCH_ID_BYTES + 1)})
    error = closed_with_error(ForwardServerConnection(), over)
    assert f"over the limit of {MAX_BATCH_ID_BYTES}" in error.reason


@pytest.mark.parametrize("kind", ["str", "bin"])
def test_binary_chunk_is_stored_as_hex_within_the_limit(kind: str) -> None:
    raw = bytes(range(128, 128 + MAX_BINARY_CHUNK_BYTES))
    value: str | bytes = as_str(raw) if kind == "str" else raw
    codec = ForwardServerConnection()
    event = only(codec.receive_data(request("packed", "t", {"chunk": value})))
    assert event.chunk is not None
    text = event.chunk.text()
    assert text == "hex:" + raw.hex()
    assert len(text.encode()) <= MAX_BATCH_ID_BYTES
    # The ack still echoes the bytes exactly, with the msgpack type they came in.
    ack = codec.ack_bytes(event.chunk)
    assert msgpack.unpackb(ack, raw=True) == {b"ack": raw}
    assert ack[len(b"\x81\xa3ack")] == (0xD9 if kind == "str" else 0xC4)
    over = request("packed", "t", {"chunk": value + (b"\xff" if kind == "bin" else "\udcff")})
    error = closed_with_error(ForwardServerConnection(), over)
    assert f"{MAX_BINARY_CHUNK_BYTES} for a binary chunk" in error.reason


@FAST
@given(st.one_of(st.binary(min_size=1, max_size=MAX_BINARY_CHUNK_BYTES), st.text(min_size=1)))
def test_chunk_text_is_always_storable(value: bytes | str) -> None:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > MAX_BATCH_ID_BYTES:
        return
    codec = ForwardServerConnection()
    event = only(codec.receive_data(request("forward", "t", {"chunk": value})))
    assert event.chunk is not None
    text = event.chunk.text()
    assert len(text.encode("utf-8")) <= MAX_BATCH_ID_BYTES
    if isinstance(value, str):
        assert text == value  # text stays text
    assert codec.ack_bytes(event.chunk).endswith(raw)


@pytest.mark.parametrize("escape", ["\\ud800", "\\udc80", "x\\udfff"])
def test_json_chunk_with_a_lone_surrogate_is_refused(escape: str) -> None:
    data = f'["t", 1700000000, {{"a": 1}}, {{"chunk": "{escape}"}}]'.encode()
    assert "chunk is not valid UTF-8" in refused_wherever_split(data)


def test_json_chunk_that_is_text_is_acked_as_json_text() -> None:
    codec = ForwardServerConnection()
    event = only(codec.receive_data('["t", 1, {}, {"chunk": "\u00e7-\\u00e9"}]'.encode()))
    assert event.chunk == Chunk("\u00e7-\u00e9".encode(), "str")
    assert json.loads(codec.ack_bytes(event.chunk, json_form=True)) == {"ack": "\u00e7-\u00e9"}


def test_json_requests_are_strict_utf8() -> None:
    # json.loads(bytes) would guess UTF-16 from the zero bytes.
    data = '["t", 1, {}]'.encode("utf-16-le")
    assert data[0:1] == b"["
    closed_with_error(ForwardServerConnection(), data)


def test_refused_chunk_after_a_good_request_keeps_the_good_one() -> None:
    good = pack(["good", T0, {"a": 1}, {"chunk": "c1"}])
    bad = pack(["bad", T0, {"a": 1}, {"chunk": "x" * (MAX_BATCH_ID_BYTES + 1)}])
    codec = ForwardServerConnection()
    *events, error = codec.receive_data(good + bad)
    assert [only([e]).chunk for e in events] == [Chunk(b"c1")]
    violation([error], "chunk")


# -- never ack what is not stored ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "entries", "option"),
    [
        ("truncated", entries_stream([T0, {"a": 1}]) + pack([T0, {"a": 2}])[:-1], {}),
        ("corrupt", entries_stream([T0, {"a": 1}]) + b"\xc1" + pack([T0, {"b": 2}]), {}),
        ("gzip-unlabelled", gzip.compress(entries_stream([T0, {"a": 1}])), {}),
        ("gzip-as-text", gzip.compress(entries_stream([T0, {"a": 1}])), {"compressed": "text"}),
        (
            "gzip-truncated-entry",
            gzip.compress(entries_stream([T0, {"a": 1}]) + b"\x92"),
            {"compressed": "gzip"},
        ),
    ],
)
def test_unreadable_entries_are_refused_wherever_split(
    name: str, entries: bytes, option: dict[str, Any]
) -> None:
    data = pack(["t", entries, {**option, "chunk": "never-acked"}])
    refused_wherever_split(data)


def test_invalid_events_in_a_readable_stream_are_still_counted_drops() -> None:
    stream = entries_stream([T0, {"a": 1}], [T0, "not a map"], ["bad time", {"b": 1}], 7)
    event = only(ForwardServerConnection().receive_data(pack(["t", stream, {"chunk": "c"}])))
    assert event.records == [{"a": 1}]
    assert sum(event.dropped.values()) == 3
    assert event.chunk == Chunk(b"c")


# -- bounded work and memory ------------------------------------------------------------------


def test_many_gzip_members_in_one_request() -> None:
    empty = gzip.compress(b"", mtime=0)
    entries = empty * 20_000 + gzip.compress(entries_stream([T0, {"a": 1}])) + empty
    event = only(
        ForwardServerConnection().receive_data(pack(["g", entries, {"compressed": "gzip"}]))
    )
    assert event.records == [{"a": 1}]


def test_decode_options_bound_every_length_by_the_bytes() -> None:
    options = forward._decode_options(1000)
    assert options["max_str_len"] == options["max_bin_len"] == options["max_ext_len"] == 1000
    assert options["max_array_len"] == 1000
    assert options["max_map_len"] == 500
    # A header claiming more than the request holds is refused, not allocated for.
    with pytest.raises(ValueError, match="max_array_len"):
        msgpack.unpackb(b"\xdd\x00\x00\x03\xe9" + b"\xc0" * 1001, **options)


def test_a_partial_request_is_held_as_bytes_not_objects() -> None:
    # An array of a million empty maps that never ends. Decoding as bytes
    # arrived built a dict per byte (about 72 bytes of objects per byte).
    n = 1 << 20
    data = b"\x92\xa1t\xdd" + struct.pack(">I", n + 1) + b"\x80" * n
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=4 << 20))
    tracemalloc.start()
    try:
        for i in range(0, len(data), 65536):
            assert codec.receive_data(data[i : i + 65536]) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert codec.buffered_bytes == len(data)
    # Documented: at most about 4x (two buffers, each grows by doubling).
    assert held <= 4 * len(data)


@pytest.mark.parametrize("mode", ["forward", "packed"])
def test_decoding_stays_within_the_documented_memory_factor(mode: str) -> None:
    # The worst case found: chains of one-entry maps, a dict per two bytes.
    chain = b"\x81\xc0" * 100 + b"\xc0"
    entry = b"\x92" + pack(T0) + b"\x81\xa1c" + chain  # [T0, {"c": {nil: {nil: ...}}}]
    count = (512 * 1024) // len(entry)
    if mode == "forward":
        data = b"\x92\xa1t" + b"\xdd" + struct.pack(">I", count) + entry * count
    else:
        data = pack(["t", entry * count])
    codec = ForwardServerConnection()
    tracemalloc.start()
    try:
        event = only(codec.receive_data(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(event.times_ns) == count
    # A Forward mode request is decoded whole; a PackedForward stream of 512 KiB
    # a slice at a time (its records kept as text only: appliance/defaults.py).
    assert len(event.records) == (count if mode == "forward" else 0)
    assert peak <= DECODE_MEMORY_FACTOR * len(data)


class _CountingPattern:
    """Wraps a compiled pattern, counting the bytes each call looks at."""

    def __init__(self, pattern: Any, counter: list[int]) -> None:
        self._pattern = pattern
        self._counter = counter

    def search(self, buf: Any, pos: int) -> Any:
        found = self._pattern.search(buf, pos)
        self._counter[0] += (found.start() + 1 if found else len(buf)) - pos
        return found

    def match(self, buf: Any, pos: int) -> Any:
        found = self._pattern.match(buf, pos)
        self._counter[0] += found.end() + 1 - pos
        return found


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_json_framer_looks_at_each_byte_once(piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    examined = [0]
    for name in ("_JSON_STRUCTURE", "_JSON_STRING_STOP", "_JSON_WHITESPACE"):
        monkeypatch.setattr(
            json_framer, name, _CountingPattern(getattr(json_framer, name), examined)
        )
    value = json.dumps(["t", T0, {"s": 'x\\"y' * 2000, "a": [[], {}] * 2000}]).encode()
    data = (value + b"\n") * 3
    codec = ForwardServerConnection()
    events: list[ForwardEvent] = []
    reads = 0
    for i in range(0, len(data), piece):
        events += codec.receive_data(data[i : i + piece])
        reads += 1
    assert len(events) == 3
    # Each byte once, plus at most one byte of overlap per call; a rescan per
    # read would look at about reads * len(data) / 2 bytes.
    assert examined[0] <= 2 * len(data) + 2 * reads


def test_json_framer_never_holds_more_than_the_limit() -> None:
    limit = 10_000
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=limit))
    data = b'["t", 1, {"s": "' + b"x" * 50_000
    reads = [data[i : i + 3000] for i in range(0, len(data), 3000)]
    held = []
    for read in reads[:3]:
        codec.receive_data(read)
        held.append(codec.buffered_bytes)
    assert held == [3000, 6000, 9000]
    violation(codec.receive_data(reads[3]), "max_request_bytes")
    assert codec.buffered_bytes == 0


# -- buffered_bytes ------------------------------------------------------------------------------


def test_buffered_bytes_counts_the_unfinished_msgpack_request() -> None:
    one = pack(["t", T0, {"a": 1}, {"chunk": "c"}])
    codec = ForwardServerConnection()
    assert codec.buffered_bytes == 0
    for at in range(len(one)):
        codec.receive_data(one[at : at + 1])
        assert codec.buffered_bytes == (at + 1) % len(one)
    codec.receive_data(one * 2 + one[:5])
    assert codec.buffered_bytes == 5
    codec.receive_data(one[5:] + b"\xc0")
    assert codec.buffered_bytes == 0


def test_buffered_bytes_counts_the_unfinished_json_value() -> None:
    value = b'["t", 1700000000, {"a": "]"}]'
    codec = ForwardServerConnection()
    for at in range(len(value)):
        codec.receive_data(value[at : at + 1])
        assert codec.buffered_bytes == (at + 1) % len(value)
    codec.receive_data(b" \n ")
    assert codec.buffered_bytes == 0
    codec.receive_data(value[:4])
    assert codec.buffered_bytes == 4


def test_buffered_bytes_is_zero_once_closed() -> None:
    codec = ForwardServerConnection()
    codec.receive_data(pack(["t", T0, {"a": 1}])[:3])
    assert codec.buffered_bytes == 3
    closed_with_error(codec, b"\xc1")
    assert codec.buffered_bytes == 0


def test_large_request_buffers_are_dropped_afterwards() -> None:
    big = b"\xc0" + pack(["t", entries_stream([T0, {"p": "x" * 300_000}])])
    codec = ForwardServerConnection()
    events = codec.receive_data(big)
    assert len(events) == 2
    assert codec.buffered_bytes == 0
    assert codec._buffered_high == 0  # the unpackers were replaced
    assert only(codec.receive_data(pack(["t", T0, {"after": 1}]))).records == [{"after": 1}]


# -- regression tests: one per crash found ----------------------------------------------------

THOUSANDS = 3000
CRASHES: list[tuple[str, bytes, dict[str, Any]]] = [
    ("tag-not-utf8", pack_raw_str([as_str(b"a\xffb"), T0, {"a": 1}]), {}),
    (
        "tag-not-utf8-packed",
        pack_raw_str([as_str(b"a\xffb"), entries_stream([T0, {}]), {"chunk": "c"}]),
        {},
    ),
    ("json-tag-surrogate", b'["\\ud800", 1700000000, {"a": 1}]', {}),
    ("json-chunk-surrogate", b'["t", 1700000000, {"a": 1}, {"chunk": "\\ud800"}]', {}),
    (
        "tag-1mb",
        pack(["t" * 1_000_000, entries_stream(*[[T0, {"i": i}] for i in range(THOUSANDS)])]),
        {},
    ),
    (
        "chunk-1mb",
        pack(
            [
                "t",
                entries_stream(*[[T0, {"i": i}] for i in range(THOUSANDS)]),
                {"chunk": "c" * 1_000_000},
            ]
        ),
        {},
    ),
    ("chunk-1mb-bin", pack(["t", [[T0, {}]] * THOUSANDS, {"chunk": b"\x00" * 1_000_000}]), {}),
]


@pytest.mark.parametrize(("data", "kwargs"), [c[1:] for c in CRASHES], ids=[c[0] for c in CRASHES])
def test_crash_input_is_a_protocol_error(data: bytes, kwargs: dict[str, Any]) -> None:
    for at in (0, 1, len(data) // 2, len(data) - 1, len(data)):
        codec = ForwardServerConnection(**kwargs)
        events: list[ForwardEvent] = []
        feed_reads(codec, [data[:at], data[at:]], events)
        violation(events)
        storable(events)
        assert codec.state is ForwardState.CLOSED


# -- fuzz: strings of every kind through the codec and the row mapping ----------------------------

hostile_text = st.one_of(
    st.text(max_size=20),
    st.binary(max_size=20).map(as_str),  # str that may not be UTF-8
    st.sampled_from(["\udc80", "a\udcff", "t" * (MAX_TAG_BYTES + 1), ""]),
)
hostile_chunk = st.one_of(
    st.none(),
    hostile_text,
    st.binary(max_size=MAX_BATCH_ID_BYTES + 2),
    st.integers(min_value=0, max_value=MAX_BATCH_ID_BYTES + 2).map(lambda n: "c" * n),
)


@FAST
@given(
    st.lists(
        st.tuples(st.sampled_from(MODES), hostile_text, hostile_chunk), min_size=1, max_size=3
    ),
    st.data(),
)
def test_fuzz_hostile_strings_never_reach_a_block(
    requests: list[tuple[str, str, Any]], data: Any
) -> None:
    raw = b"".join(
        request(mode, tag, {"chunk": chunk} if chunk is not None else {})
        for mode, tag, chunk in requests
    )
    at = data.draw(st.integers(0, len(raw)))
    codec = ForwardServerConnection()
    events: list[ForwardEvent] = []
    feed_reads(codec, [raw[:at], raw[at:], b""], events)
    if events and isinstance(events[-1], ProtocolViolation):
        assert codec.state is ForwardState.CLOSED
        events.pop()
    for event in events:
        assert isinstance(event, EventsReceived | Heartbeat)
    storable(events)


@FAST
@given(
    st.binary(max_size=80), st.sampled_from([b'["', b'["t", 1, {"', b'["t", 1, {}, {"chunk": "'])
)
def test_fuzz_json_strings_never_reach_a_block(tail: bytes, head: bytes) -> None:
    codec = ForwardServerConnection()
    events: list[ForwardEvent] = []
    feed_reads(codec, [head + tail, b""], events)
    if events and isinstance(events[-1], ProtocolViolation):
        assert codec.state is ForwardState.CLOSED
    storable(events)
