"""The Fluentd forward v1 server codec (sans-IO), edge case by edge case.

docs/forward.md lists what real peers send; each item has its own test here. Every
sample request is also fed split at every byte and one byte at a time, and
hypothesis round-trips generated requests and fuzzes the codec with garbage.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
import struct
import tracemalloc
import zlib
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.blocks.records import record_json, records_json
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation, RemoteProtocolError
from appliance.protocols.forward import (
    Chunk,
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    Heartbeat,
    gunzip_members,
    packed_request_min_bytes,
)
from tests.appliance.protocols import support

T0 = 1_700_000_000
NS = 1_000_000_000
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- building requests ---------------------------------------------------------


def pack(obj: Any) -> bytes:
    """msgpack as Fluentd clients send it: str as str, bytes as bin."""
    return msgpack.packb(obj, use_bin_type=True)


def pack_raw_str(obj: Any) -> bytes:
    """msgpack where str values carrying surrogateescapes go out as their raw bytes."""
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogateescape")


def as_str(data: bytes) -> str:
    """Bytes to pack as a msgpack *str* whatever they hold (out_forward's way)."""
    return data.decode("utf-8", "surrogateescape")


def fixext8(seconds: int, nanoseconds: int) -> bytes:
    """EventTime as fixext8, built by hand (spec "EventTime Ext Format")."""
    return b"\xd7\x00" + struct.pack(">II", seconds, nanoseconds)


def ext8(seconds: int, nanoseconds: int) -> bytes:
    """EventTime as ext8 with length 8, built by hand."""
    return b"\xc7\x08\x00" + struct.pack(">II", seconds, nanoseconds)


def event_time(seconds: int, nanoseconds: int) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def entries_stream(*entries: Any) -> bytes:
    """A MessagePackEventStream: the entries packed back to back."""
    return b"".join(pack(entry) for entry in entries)


def gzip_members(*parts: bytes) -> bytes:
    """Several complete gzip members, concatenated (spec "CompressedPackedForward")."""
    return b"".join(gzip.compress(part) for part in parts)


def received(
    tag: str,
    mode: str,
    times: list[int | None],
    records: list[dict[Any, Any]],
    chunk: Chunk | None = None,
    dropped: dict[str, int] | None = None,
    *,
    json_form: bool = False,
) -> EventsReceived:
    return EventsReceived(tag, mode, times, records, chunk, dropped or {}, json_form)  # type: ignore[arg-type]


# -- feeding ---------------------------------------------------------------------


def feed(data: bytes, **kwargs: Any) -> list[ForwardEvent]:
    return ForwardServerConnection(**kwargs).receive_data(data)


def feed_split(data: bytes, at: int, **kwargs: Any) -> list[ForwardEvent]:
    codec = ForwardServerConnection(**kwargs)
    return support.feed_reads(codec.receive_data, [data[:at], data[at:]])


def feed_bytewise(data: bytes, **kwargs: Any) -> list[ForwardEvent]:
    codec = ForwardServerConnection(**kwargs)
    return support.feed_reads(codec.receive_data, (data[i : i + 1] for i in range(len(data))))


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def feed_reads(
    codec: ForwardServerConnection, reads: list[bytes], events: list[ForwardEvent]
) -> None:
    """Feed one read after the other, collecting what they return into ``events``
    (up to and with a violation)."""
    events += support.feed_reads(codec.receive_data, reads)


def only(events: list[ForwardEvent]) -> EventsReceived:
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, EventsReceived)
    return event


def closed_with_error(codec: ForwardServerConnection, data: bytes) -> ProtocolViolation:
    """Feed ``data``, expect a violation alone, and check the codec is closed for good."""
    (error,) = codec.receive_data(data)
    assert isinstance(error, ProtocolViolation), error
    assert_closed(codec)
    return error


def assert_closed(codec: ForwardServerConnection) -> None:
    assert codec.state is ForwardState.CLOSED
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"\xc0")
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"")


# -- sample requests, one per mode, with the events each must give -----------------

PACKED_ENTRIES = entries_stream([T0, {"n": 1}], [event_time(T0, 5), {"n": 2}])
# out_forward's shape: the stream goes out as a msgpack str; EventTime makes it not UTF-8.
STR_ENTRIES = b"\x92" + fixext8(T0, 7) + pack({"log": "caf\u00e9"})
GZIP_ONE = gzip.compress(entries_stream([T0, {"z": 1}], [T0 + 1, {"z": 2}]))
GZIP_SEVERAL = gzip_members(
    entries_stream([T0, {"m": 1}]),
    entries_stream([T0 + 1, {"m": 2}], [T0 + 2, {"m": 3}]),
    entries_stream([T0 + 3, {"m": 4}]),
)

SAMPLES: list[tuple[str, bytes, list[ForwardEvent]]] = [
    (
        "message-int-time",
        pack(["app.access", T0, {"msg": "hello"}, {"chunk": "c-message"}]),
        [
            received(
                "app.access", "message", [T0 * NS], [{"msg": "hello"}], Chunk(b"c-message", "str")
            )
        ],
    ),
    (
        "message-fixext8",
        b"\x93" + pack("app") + fixext8(T0, 123_456_789) + pack({"a": 1}),
        [received("app", "message", [T0 * NS + 123_456_789], [{"a": 1}])],
    ),
    (
        "message-float-time",
        pack(["app", T0 + 0.25, {"f": True}]),
        [received("app", "message", [T0 * NS + 250_000_000], [{"f": True}])],
    ),
    (
        "forward-ext8",
        b"\x92"
        + pack("fwd")
        + b"\x92"
        + (b"\x92" + ext8(T0, 999_999_999) + pack({"k": "v"}))
        + pack([T0 + 1, {"k": "w"}]),
        [
            received(
                "fwd",
                "forward",
                [T0 * NS + 999_999_999, (T0 + 1) * NS],
                [{"k": "v"}, {"k": "w"}],
            )
        ],
    ),
    (
        "packed-bin",
        pack(["pk", PACKED_ENTRIES, {"chunk": b"\x00\x01bin-chunk", "size": 2}]),
        [
            received(
                "pk",
                "packed",
                [T0 * NS, T0 * NS + 5],
                [{"n": 1}, {"n": 2}],
                Chunk(b"\x00\x01bin-chunk", "bin"),
            )
        ],
    ),
    (
        "packed-str-not-utf8",
        pack_raw_str(["ps", as_str(STR_ENTRIES), {"chunk": "p8n9gmxTQVC8/nh2wlKKeQ=="}]),
        [
            received(
                "ps",
                "packed",
                [T0 * NS + 7],
                [{"log": "caf\u00e9"}],
                Chunk(b"p8n9gmxTQVC8/nh2wlKKeQ==", "str"),
            )
        ],
    ),
    (
        "compressed-one-member",
        pack(["gz", GZIP_ONE, {"compressed": "gzip", "chunk": "c-gz"}]),
        [
            received(
                "gz", "compressed", [T0 * NS, (T0 + 1) * NS], [{"z": 1}, {"z": 2}], Chunk(b"c-gz")
            )
        ],
    ),
    (
        "compressed-several-members",
        pack(["gz3", GZIP_SEVERAL, {"compressed": "gzip"}]),
        [
            received(
                "gz3",
                "compressed",
                [T0 * NS, (T0 + 1) * NS, (T0 + 2) * NS, (T0 + 3) * NS],
                [{"m": 1}, {"m": 2}, {"m": 3}, {"m": 4}],
            )
        ],
    ),
    (
        "compressed-text",
        pack(["tx", entries_stream([T0, {"t": 1}]), {"compressed": "text"}]),
        [received("tx", "packed", [T0 * NS], [{"t": 1}])],
    ),
    (
        "fluent-bit-metadata-time",
        pack(["fb", entries_stream([[event_time(T0, 9), {"otel": 1}], {"log": "x"}])]),
        [received("fb", "packed", [T0 * NS + 9], [{"log": "x"}])],
    ),
    ("heartbeat", b"\xc0", [Heartbeat()]),
    (
        "nil-and-zero-time",
        pack(["now", [[None, {"a": 1}], [0, {"a": 2}], [0.0, {"a": 3}]]]),
        [received("now", "forward", [None, None, None], [{"a": 1}, {"a": 2}, {"a": 3}])],
    ),
]
SAMPLE_IDS = [name for name, _, _ in SAMPLES]
ALL_BYTES = b"".join(data for _, data, _ in SAMPLES)
ALL_EVENTS = [event for _, _, events in SAMPLES for event in events]


@pytest.mark.parametrize(("data", "expected"), [s[1:] for s in SAMPLES], ids=SAMPLE_IDS)
def test_sample_in_one_read(data: bytes, expected: list[ForwardEvent]) -> None:
    assert feed(data) == expected


@pytest.mark.parametrize(("data", "expected"), [s[1:] for s in SAMPLES], ids=SAMPLE_IDS)
def test_sample_split_at_every_byte(data: bytes, expected: list[ForwardEvent]) -> None:
    for at in range(len(data) + 1):
        assert feed_split(data, at) == expected, f"split at {at}"
    assert feed_bytewise(data) == expected


def test_all_samples_in_one_read() -> None:
    assert feed(ALL_BYTES) == ALL_EVENTS


def test_all_samples_split_at_every_byte() -> None:
    for at in range(len(ALL_BYTES) + 1):
        assert feed_split(ALL_BYTES, at) == ALL_EVENTS, f"split at {at}"


def test_all_samples_one_byte_at_a_time() -> None:
    codec = ForwardServerConnection()
    events: list[ForwardEvent] = []
    for i in range(len(ALL_BYTES)):
        events += codec.receive_data(bytearray(ALL_BYTES[i : i + 1]))
    assert events == ALL_EVENTS
    assert codec.state is ForwardState.TRANSPORT_MSGPACK


def test_state_starts_idle_and_picks_the_transport_on_the_first_byte() -> None:
    codec = ForwardServerConnection()
    assert codec.state is ForwardState.IDLE
    assert codec.receive_data(b"") == []
    assert codec.state is ForwardState.IDLE
    assert codec.receive_data(b"\x93") == []
    assert codec.state is ForwardState.TRANSPORT_MSGPACK
    json_codec = ForwardServerConnection()
    assert json_codec.receive_data(b"[") == []
    assert json_codec.state is ForwardState.TRANSPORT_JSON


# -- the four carrier modes --------------------------------------------------------


def test_message_mode() -> None:
    event = only(feed(pack(["app.access", T0, {"message": "bar"}, {"option": "optional"}])))
    assert event == received("app.access", "message", [T0 * NS], [{"message": "bar"}])


def test_message_mode_with_nil_option() -> None:
    event = only(feed(pack(["app", T0, {"a": 1}, None])))
    assert event.records == [{"a": 1}]
    assert event.chunk is None


def test_forward_mode() -> None:
    entries = [[T0, {"message": "foo"}], [T0 + 1, {"message": "bar"}], [T0 + 2, {"x": [1, 2]}]]
    event = only(feed(pack(["tag.name", entries, {"chunk": "abc"}])))
    assert event.mode == "forward"
    assert event.tag == "tag.name"
    assert event.times_ns == [T0 * NS, (T0 + 1) * NS, (T0 + 2) * NS]
    assert event.records == [{"message": "foo"}, {"message": "bar"}, {"x": [1, 2]}]
    assert event.chunk == Chunk(b"abc", "str")
    assert event.dropped == {}


def test_forward_mode_with_no_entries() -> None:
    event = only(feed(pack(["empty", [], {"chunk": "c"}])))
    assert (event.mode, event.records, event.times_ns) == ("forward", [], [])
    assert event.chunk == Chunk(b"c")


def test_packed_forward_entries_as_bin() -> None:
    data = pack(["pk", PACKED_ENTRIES])
    assert data[4] == 0xC4  # bin8 right after the fixarray and the tag
    event = only(feed(data))
    assert event.mode == "packed"
    assert event.times_ns == [T0 * NS, T0 * NS + 5]
    assert event.records == [{"n": 1}, {"n": 2}]


def test_packed_forward_entries_as_str_with_binary_content() -> None:
    with pytest.raises(UnicodeDecodeError):
        STR_ENTRIES.decode("utf-8")  # the precondition: not UTF-8, as out_forward's streams
    data = pack_raw_str(["ps", as_str(STR_ENTRIES)])
    assert data[4] == 0xA0 | len(STR_ENTRIES)  # packed as a msgpack fixstr
    assert STR_ENTRIES in data
    event = only(feed(data))
    assert event.mode == "packed"
    assert event.times_ns == [T0 * NS + 7]
    assert event.records == [{"log": "caf\u00e9"}]


def test_packed_forward_entries_as_long_str() -> None:
    stream = entries_stream(*[[event_time(T0, i), {"i": i, "pad": "x" * 40}] for i in range(50)])
    data = pack_raw_str(["ps", as_str(stream)])
    assert data[4] == 0xDA  # str16
    event = only(feed(data))
    assert event.times_ns == [T0 * NS + i for i in range(50)]
    assert [r["i"] for r in event.records] == list(range(50))


def test_compressed_packed_forward_one_gzip_member() -> None:
    event = only(feed(pack(["gz", GZIP_ONE, {"compressed": "gzip"}])))
    assert event.mode == "compressed"
    assert event.records == [{"z": 1}, {"z": 2}]
    assert event.times_ns == [T0 * NS, (T0 + 1) * NS]


def test_compressed_packed_forward_several_gzip_members() -> None:
    # The precondition: one gunzip pass sees only the first member.
    assert zlib.decompress(GZIP_SEVERAL, wbits=31) == entries_stream([T0, {"m": 1}])
    event = only(feed(pack(["gz3", GZIP_SEVERAL, {"compressed": "gzip"}])))
    assert event.mode == "compressed"
    assert event.records == [{"m": 1}, {"m": 2}, {"m": 3}, {"m": 4}]
    assert event.dropped == {}


def test_compressed_entry_may_span_two_gzip_members() -> None:
    stream = entries_stream([T0, {"long": "y" * 100}], [T0 + 1, {"b": 2}])
    data = gzip_members(stream[:30], stream[30:70], stream[70:])
    event = only(feed(pack(["gz", data, {"compressed": "gzip"}])))
    assert event.records == [{"long": "y" * 100}, {"b": 2}]


def test_compressed_with_an_empty_member() -> None:
    data = gzip_members(b"", entries_stream([T0, {"a": 1}]), b"")
    event = only(feed(pack(["gz", data, {"compressed": "gzip"}])))
    assert event.records == [{"a": 1}]


@pytest.mark.parametrize("option", [{}, {"compressed": "text"}, {"compressed": None}, None])
def test_compressed_absent_or_text_means_uncompressed(option: dict[str, Any] | None) -> None:
    request: list[Any] = ["tx", entries_stream([T0, {"t": 1}])]
    if option is not None:
        request.append(option)
    event = only(feed(pack(request)))
    assert event == received("tx", "packed", [T0 * NS], [{"t": 1}])


@pytest.mark.parametrize("option", [{"compressed": "text"}, {}], ids=["text", "absent"])
def test_entries_that_are_gzip_without_compressed_gzip_close_the_connection(
    option: dict[str, Any],
) -> None:
    # "text" means exactly that: gzip bytes are then not events. They used to
    # be counted as dropped events and the chunk acked: the events were lost.
    codec = ForwardServerConnection()
    error = closed_with_error(codec, pack(["tx", GZIP_ONE, {**option, "chunk": "c"}]))
    assert "gzip" in error.reason


@pytest.mark.parametrize("compressed", ["lz4", "ZSTD", "GZIP", "", 1, b"gzip"])
def test_unknown_compression_closes_with_an_error(compressed: Any) -> None:
    codec = ForwardServerConnection()
    error = closed_with_error(codec, pack(["x", GZIP_ONE, {"compressed": compressed}]))
    assert "compression" in error.reason


def test_compressed_option_is_ignored_outside_packed_modes() -> None:
    event = only(feed(pack(["f", [[T0, {"a": 1}]], {"compressed": "zstd"}])))
    assert event.records == [{"a": 1}]


# -- times --------------------------------------------------------------------------


@pytest.mark.parametrize(("encode", "name"), [(fixext8, "fixext8"), (ext8, "ext8")])
def test_event_time_by_hand_in_every_position(encode: Any, name: str) -> None:
    time = encode(T0, 42)
    assert time[:2] == (b"\xd7\x00" if name == "fixext8" else b"\xc7\x08")
    record = pack({"k": name})
    message = b"\x93" + pack("m") + time + record
    forward = b"\x92" + pack("f") + b"\x91\x92" + time + record
    stream = b"\x92" + time + record
    packed = b"\x92" + pack("p") + b"\xc4" + bytes([len(stream)]) + stream
    for data, mode in [(message, "message"), (forward, "forward"), (packed, "packed")]:
        event = only(feed(data))
        assert event.mode == mode
        assert event.times_ns == [T0 * NS + 42]
        assert event.records == [{"k": name}]


def test_event_time_extremes() -> None:
    entries = [[event_time(0, 1), {}], [event_time(2**32 - 1, 999_999_999), {}]]
    event = only(feed(pack(["t", entries])))
    assert event.times_ns == [1, (2**32 - 1) * NS + 999_999_999]


def test_event_time_with_nanoseconds_out_of_range_is_dropped() -> None:
    entries = [[event_time(T0, NS), {"bad": 1}], [event_time(T0, NS - 1), {"ok": 1}]]
    event = only(feed(pack(["t", entries])))
    assert event.records == [{"ok": 1}]
    assert event.dropped == {"EventTime nanoseconds out of range": 1}


def test_ext_of_another_type_or_length_is_not_a_time() -> None:
    entries = [
        [msgpack.ExtType(1, struct.pack(">II", T0, 0)), {"a": 1}],
        [msgpack.ExtType(0, b"\x00" * 4), {"a": 2}],
        [T0, {"a": 3}],
    ]
    event = only(feed(pack(["t", entries])))
    assert event.records == [{"a": 3}]
    assert event.dropped == {"time is not an integer or EventTime (ExtType)": 2}


def test_integer_time() -> None:
    event = only(feed(pack(["t", [[T0, {}], [1, {}], [2**32, {}], [-1, {}]]])))
    assert event.times_ns == [T0 * NS, NS, 2**32 * NS, -NS]


def test_integer_time_beyond_int64_nanoseconds_is_dropped() -> None:
    event = only(feed(pack(["t", [[2**40, {"a": 1}], [2**64 - 1, {"a": 2}], [T0, {"a": 3}]]])))
    assert event.records == [{"a": 3}]
    assert event.dropped == {"time out of range": 2}


@pytest.mark.parametrize(
    ("time", "ns"),
    [
        (T0 + 0.5, T0 * NS + 500_000_000),
        (T0 + 0.125, T0 * NS + 125_000_000),
        (float(T0), T0 * NS),
        (-1.5, -1_500_000_000),
    ],
)
def test_float_time(time: float, ns: int) -> None:
    assert only(feed(pack(["t", time, {"a": 1}]))).times_ns == [ns]


@pytest.mark.parametrize("time", [math.nan, math.inf, -math.inf, 1e300])
def test_float_time_that_is_not_a_number_or_too_big_is_dropped(time: float) -> None:
    event = only(feed(pack(["t", [[time, {"a": 1}], [T0, {"a": 2}]]])))
    assert event.records == [{"a": 2}]
    assert event.dropped == {"time out of range": 1}


@pytest.mark.parametrize("time", [None, 0, 0.0, -0.0], ids=["nil", "int-0", "float-0", "minus-0"])
def test_nil_or_zero_time_means_receive_time(time: Any) -> None:
    assert only(feed(pack(["t", time, {"a": 1}]))).times_ns == [None]
    assert only(feed(pack(["t", [[time, {"a": 1}]]]))).times_ns == [None]
    assert only(feed(pack(["t", entries_stream([time, {"a": 1}])]))).times_ns == [None]


def test_entry_time_with_metadata_fluent_bit_form() -> None:
    entries = [
        [[event_time(T0, 1), {"trace_id": "abc"}], {"log": "a"}],
        [[T0 + 1, {}], {"log": "b"}],
        [[None, {}], {"log": "c"}],
    ]
    for data in (pack(["fb", entries]), pack(["fb", entries_stream(*entries)])):
        event = only(feed(data))
        assert event.times_ns == [T0 * NS + 1, (T0 + 1) * NS, None]
        assert event.records == [{"log": "a"}, {"log": "b"}, {"log": "c"}]
        assert event.dropped == {}


def test_entry_time_with_malformed_metadata_is_dropped() -> None:
    entries = [
        [[event_time(T0, 1)], {"log": "one element"}],
        [[event_time(T0, 1), "not a map"], {"log": "metadata not a map"}],
        [[[T0, {}], {}], {"log": "nested twice"}],
        [[T0, {}, 3], {"log": "three elements"}],
        [T0, {"log": "kept"}],
    ]
    event = only(feed(pack(["fb", entries])))
    assert event.records == [{"log": "kept"}]
    assert event.dropped == {"time is not an integer or EventTime (list)": 4}


@pytest.mark.parametrize("time", ["2024-01-01", b"\x00", True, {"s": 1}])
def test_time_of_a_wrong_type_is_dropped(time: Any) -> None:
    event = only(feed(pack(["t", [[time, {"a": 1}], [T0, {"a": 2}]]])))
    assert event.records == [{"a": 2}]
    assert event.dropped == {f"time is not an integer or EventTime ({type(time).__name__})": 1}


# -- the size option is only a hint ----------------------------------------------------


@pytest.mark.parametrize(
    "size",
    [None, 0, 1, 2, 10**6, len(PACKED_ENTRIES), "2", -5, [1]],
    ids=["absent", "zero", "smaller", "right", "bigger", "byte-length", "str", "negative", "array"],
)
def test_size_option_is_only_a_hint(size: Any) -> None:
    option: dict[str, Any] = {"chunk": "c"}
    if size is not None:
        option["size"] = size
    expected = received("pk", "packed", [T0 * NS, T0 * NS + 5], [{"n": 1}, {"n": 2}], Chunk(b"c"))
    assert only(feed(pack(["pk", PACKED_ENTRIES, option]))) == expected
    gz = gzip.compress(PACKED_ENTRIES)
    event = only(feed(pack(["pk", gz, {**option, "compressed": "gzip"}])))
    assert (event.records, event.times_ns) == (expected.records, expected.times_ns)


# -- chunk and ack ------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 24, 31, 32, 255, 256])
def test_ack_echoes_a_str_chunk_as_str(length: int) -> None:
    chunk_id = ("p8n9gmxTQVC8/nh2wlKKeQ==" * (length // 24 + 1))[:length]
    codec = ForwardServerConnection()
    event = only(codec.receive_data(pack(["t", T0, {"a": 1}, {"chunk": chunk_id}])))
    assert event.chunk == Chunk(chunk_id.encode(), "str")
    ack = codec.ack_bytes(event.chunk)
    assert ack == msgpack.packb({"ack": chunk_id})
    assert msgpack.unpackb(ack, raw=True) == {b"ack": chunk_id.encode()}


@pytest.mark.parametrize(
    "chunk_id",
    [b"\x00", bytes(range(16)), bytes(range(126)), b"u" * 255, b"u" * 256, bytes(range(120, 246))],
    ids=["one", "16", "126-binary", "255-text", "256-text", "126-high-binary"],
)
def test_ack_echoes_a_bin_chunk_as_bin(chunk_id: bytes) -> None:
    codec = ForwardServerConnection()
    event = only(codec.receive_data(pack(["t", [[T0, {"a": 1}]], {"chunk": chunk_id}])))
    assert event.chunk == Chunk(chunk_id, "bin")
    ack = codec.ack_bytes(event.chunk)
    assert ack == msgpack.packb({"ack": chunk_id}, use_bin_type=True)
    assert msgpack.unpackb(ack) == {"ack": chunk_id}


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00chunk", b"\xc3(" * 20, b"\xed\xa0\x80" + b"z" * 120])
def test_ack_echoes_a_str_chunk_that_is_not_utf8_byte_exact(raw: bytes) -> None:
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    data = pack_raw_str(["t", PACKED_ENTRIES, {"chunk": as_str(raw)}])
    assert raw in data
    codec = ForwardServerConnection()
    event = only(codec.receive_data(data))
    assert event.chunk == Chunk(raw, "str")
    ack = codec.ack_bytes(event.chunk)
    # Same bytes, same msgpack type (str), as the client sent them.
    assert ack == pack_raw_str({"ack": as_str(raw)})
    assert ack.endswith(raw)
    assert msgpack.unpackb(ack, raw=True) == {b"ack": raw}
    header = ack[len(b"\x81\xa3ack")]
    assert header in (0xA0 | len(raw), 0xD9, 0xDA)  # a str header, never bin
    # The batch_id column gets valid UTF-8: the hex of a chunk that is not.
    assert event.chunk.text() == "hex:" + raw.hex()


def test_ack_is_the_same_for_every_mode() -> None:
    chunk_id = "p8n9gmxTQVC8/nh2wlKKeQ=="
    requests = [
        ["t", T0, {"a": 1}, {"chunk": chunk_id}],
        ["t", [[T0, {"a": 1}]], {"chunk": chunk_id}],
        ["t", PACKED_ENTRIES, {"chunk": chunk_id}],
        ["t", GZIP_ONE, {"chunk": chunk_id, "compressed": "gzip"}],
    ]
    codec = ForwardServerConnection()
    events = codec.receive_data(b"".join(pack(r) for r in requests))
    assert len(events) == 4
    for event in events:
        assert isinstance(event, EventsReceived)
        assert event.chunk is not None
        assert codec.ack_bytes(event.chunk) == b"\x81\xa3ack\xb8" + chunk_id.encode()


def test_no_chunk_means_no_ack_token() -> None:
    for request in (["t", T0, {}], ["t", [[T0, {}]], {}], ["t", PACKED_ENTRIES, {"size": 2}]):
        assert only(feed(pack(request))).chunk is None


def test_json_form_ack_is_json() -> None:
    codec = ForwardServerConnection()
    event = only(codec.receive_data(b'["t", 1700000000, {"a": 1}, {"chunk": "p8n9gmxTQVC8"}]'))
    assert event.json is True
    assert event.chunk == Chunk(b"p8n9gmxTQVC8", "str")
    ack = codec.ack_bytes(event.chunk, json_form=event.json)
    assert json.loads(ack) == {"ack": "p8n9gmxTQVC8"}
    assert ack.startswith(b"{")


# -- heartbeat and several requests --------------------------------------------------------


def test_nil_is_a_heartbeat() -> None:
    assert feed(b"\xc0") == [Heartbeat()]
    assert feed(b"\xc0\xc0\xc0") == [Heartbeat(), Heartbeat(), Heartbeat()]


def test_heartbeats_between_requests() -> None:
    data = b"\xc0" + pack(["a", T0, {"i": 1}]) + b"\xc0" + pack(["b", T0, {"i": 2}]) + b"\xc0"
    events = feed(data)
    assert [type(e) for e in events] == [
        Heartbeat,
        EventsReceived,
        Heartbeat,
        EventsReceived,
        Heartbeat,
    ]
    assert [e.tag for e in events if isinstance(e, EventsReceived)] == ["a", "b"]
    assert feed_bytewise(data) == events


def test_several_requests_in_one_read_keep_their_order() -> None:
    data = b"".join(pack([f"tag{i}", T0 + i, {"i": i}, {"chunk": f"c{i}"}]) for i in range(20))
    events = feed(data)
    assert [only([e]).tag for e in events] == [f"tag{i}" for i in range(20)]
    assert [only([e]).chunk for e in events] == [Chunk(f"c{i}".encode()) for i in range(20)]
    assert [only([e]).times_ns for e in events] == [[(T0 + i) * NS] for i in range(20)]


# -- the JSON form ------------------------------------------------------------------------

JSON_REQUESTS = [
    b'["app.json", 1700000000, {"msg": "a]\\"[b", "n": [1, {"x": null}]}, {"chunk": "j1"}]',
    b'["app.json",[[1700000001,{"k":"v"}],[1700000002.5,{"k":"w"}]]]',
    b'["app.json", 0, {"empty time": true}]',
]
JSON_EVENTS: list[ForwardEvent] = [
    received(
        "app.json",
        "message",
        [T0 * NS],
        [{"msg": 'a]"[b', "n": [1, {"x": None}]}],
        Chunk(b"j1"),
        json_form=True,
    ),
    received(
        "app.json",
        "forward",
        [(T0 + 1) * NS, (T0 + 2) * NS + 500_000_000],
        [{"k": "v"}, {"k": "w"}],
        json_form=True,
    ),
    received("app.json", "message", [None], [{"empty time": True}], json_form=True),
]


def test_json_single_event_form() -> None:
    codec = ForwardServerConnection()
    assert codec.receive_data(JSON_REQUESTS[0]) == JSON_EVENTS[:1]
    assert codec.state is ForwardState.TRANSPORT_JSON


@pytest.mark.parametrize("separator", [b"", b" ", b"\n", b"\r\n", b" \t\n  "])
def test_json_requests_back_to_back(separator: bytes) -> None:
    data = separator.join(JSON_REQUESTS) + separator
    assert feed(data) == JSON_EVENTS
    for at in range(len(data) + 1):
        assert feed_split(data, at) == JSON_EVENTS, f"split at {at}"
    assert feed_bytewise(data) == JSON_EVENTS


def test_json_unicode_split_inside_a_character() -> None:
    data = '["t", 1, {"m": "caf\u00e9 \u2603 \U0001f600"}]'.encode()
    for at in range(len(data) + 1):
        assert only(feed_split(data, at)).records == [{"m": "caf\u00e9 \u2603 \U0001f600"}]


@pytest.mark.parametrize(
    "data",
    [
        b'{"tag": "t"}',
        b"[1, 2, {}]",
        b'["t"]',
        b"[]]",
        b'["t", 1, {},]',
        b'["t", "cGFja2Vk"]',
        b'["t", 1, {}, {"chunk": 5}]',
        b'["t", 1, {}, "option"]',
        b'["t", 1, {"a": "\xff"}]',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=[
        "object",
        "tag-not-string",
        "too-short",
        "unbalanced",
        "invalid-json",
        "packed-in-json",
        "chunk-not-string",
        "option-not-map",
        "not-utf8",
        "too-deep",
    ],
)
def test_json_request_errors(data: bytes) -> None:
    closed_with_error(ForwardServerConnection(), data)


@pytest.mark.parametrize("after", [b" 5", b'"s"', b"\n]", b"x"], ids=["number", "str", "]", "x"])
def test_json_garbage_after_a_request(after: bytes) -> None:
    data = JSON_REQUESTS[1] + after
    for at in range(len(data) + 1):
        codec = ForwardServerConnection()
        events: list[ForwardEvent] = []
        feed_reads(codec, [data[:at], data[at:]], events)
        # The request before the garbage is returned wherever the read was split.
        support.violation(events)
        assert events[:-1] == JSON_EVENTS[1:2], f"split at {at}"
        assert codec.state is ForwardState.CLOSED


def test_json_disabled_makes_bracket_a_msgpack_fixint() -> None:
    codec = ForwardServerConnection(allow_json=False)
    error = closed_with_error(codec, JSON_REQUESTS[0])
    assert "not an array" in error.reason
    assert feed(pack(["t", T0, {"a": 1}]), allow_json=False) != []


def test_json_first_byte_decides_for_the_whole_connection() -> None:
    codec = ForwardServerConnection()
    assert codec.receive_data(JSON_REQUESTS[1]) == JSON_EVENTS[1:2]
    closed_with_error(codec, pack(["t", T0, {"a": 1}]))


# -- invalid events inside a valid request -----------------------------------------------------


def test_invalid_entries_are_dropped_and_counted_by_reason() -> None:
    entries = [
        [T0, {"ok": 1}],
        [T0, "not a map"],
        [T0, [1, 2]],
        ["yesterday", {"bad": "time"}],
        [1.5, None],
        "not an entry",
        [T0],
        [],
        [T0 + 1, {"ok": 2}],
    ]
    event = only(feed(pack(["mix", entries, {"chunk": "keep-me"}])))
    assert event.records == [{"ok": 1}, {"ok": 2}]
    assert event.times_ns == [T0 * NS, (T0 + 1) * NS]
    assert event.chunk == Chunk(b"keep-me")
    assert event.dropped == {
        "record is not a map": 3,
        "time is not an integer or EventTime (str)": 1,
        "entry is not a [time, record] array": 3,
    }


def test_message_mode_invalid_record_is_dropped_and_chunk_kept() -> None:
    event = only(feed(pack(["m", T0, "not a map", {"chunk": "c"}])))
    assert event.records == []
    assert event.dropped == {"record is not a map": 1}
    assert event.chunk == Chunk(b"c")


# An entries stream that cannot be read whole closes the connection without an
# ack, as Fluentd and Fluent Bit do: these used to be counted as one dropped
# event while the chunk was acked, silently losing the rest of the chunk.


def test_packed_stream_with_a_truncated_tail_is_not_acked() -> None:
    stream = entries_stream([T0, {"a": 1}], [T0 + 1, {"a": 2}])
    tail = pack([T0 + 2, {"a": 3}])[:-2]
    for entries, option in [
        (stream + tail, {"chunk": "c"}),
        (gzip.compress(stream + tail), {"chunk": "c", "compressed": "gzip"}),
    ]:
        error = closed_with_error(ForwardServerConnection(), pack(["p", entries, option]))
        assert "ends inside an entry" in error.reason


def test_packed_stream_with_a_corrupt_byte_midway_is_not_acked() -> None:
    stream = entries_stream([T0, {"a": 1}]) + b"\xc1" + entries_stream([T0, {"lost": 1}])
    for entries, option in [
        (stream, {"chunk": "c"}),
        (gzip.compress(stream), {"chunk": "c", "compressed": "gzip"}),
    ]:
        error = closed_with_error(ForwardServerConnection(), pack(["p", entries, option]))
        assert "not valid msgpack" in error.reason


@pytest.mark.parametrize(
    "stream",
    [
        b"\x81\x91\x01\x02",  # a map whose key is an array: unhashable
        b"\x92\x01" + b"\x91" * 2000 + b"\x80",  # nested deeper than msgpack's stack
        entries_stream([T0, {"a": 1}]) + b"\xdb\xff\xff\xff\xff",  # a str longer than the stream
    ],
    ids=["unhashable-key", "too-deep", "claims-more-than-it-has"],
)
def test_packed_stream_msgpack_cannot_build_is_not_acked(stream: bytes) -> None:
    error = closed_with_error(ForwardServerConnection(), pack(["p", stream, {"chunk": "c"}]))
    assert "entries stream" in error.reason


def test_a_good_request_before_an_unreadable_stream_is_still_returned() -> None:
    good = pack(["good", T0, {"a": 1}, {"chunk": "c1"}])
    bad = pack(["bad", entries_stream([T0, {"a": 1}]) + b"\xc1", {"chunk": "c2"}])
    codec = ForwardServerConnection()
    *events, error = codec.receive_data(good + bad)
    assert [only([e]).chunk for e in events] == [Chunk(b"c1")]
    support.violation([error], "not valid msgpack")


def test_packed_stream_with_invalid_entries_between_valid_ones() -> None:
    stream = entries_stream([T0, {"a": 1}], 7, None, [T0, "s"], [b"t", {}], [T0 + 1, {"a": 2}])
    event = only(feed(pack(["p", stream])))
    assert event.records == [{"a": 1}, {"a": 2}]
    assert event.dropped == {
        "entry is not a [time, record] array": 2,
        "record is not a map": 1,
        "time is not an integer or EventTime (bytes)": 1,
    }


def test_packed_stream_that_is_empty() -> None:
    event = only(feed(pack(["p", b"", {"chunk": "c"}])))
    assert (event.records, event.dropped, event.chunk) == ([], {}, Chunk(b"c"))


# -- request-level errors ------------------------------------------------------------------------

REQUEST_ERRORS = [
    ("map", pack({"tag": "t", "time": T0})),
    ("int", pack(42)),
    ("str", pack("tag")),
    ("empty-array", pack([])),
    ("one-element", pack(["tag"])),
    ("message-without-record", pack(["tag", T0])),
    ("tag-int", pack([1, T0, {}])),
    ("tag-bin", pack([b"tag", T0, {}])),
    ("tag-nil", pack([None, [[T0, {}]]])),
    ("message-option-not-map", pack(["t", T0, {}, [1]])),
    ("forward-option-not-map", pack(["t", [[T0, {}]], "opt"])),
    ("packed-option-not-map", pack(["t", PACKED_ENTRIES, 3])),
    ("chunk-int", pack(["t", T0, {}, {"chunk": 5}])),
    ("chunk-array", pack(["t", [[T0, {}]], {"chunk": ["a"]}])),
    ("chunk-map", pack(["t", PACKED_ENTRIES, {"chunk": {"a": 1}}])),
    ("invalid-msgpack-c1", b"\xc1"),
    ("invalid-msgpack-inside", b"\x93\xa1t\xc1\x80"),
    ("unhashable-map-key", b"\x93\xa1t\x01\x81\x91\x01\x02"),
    ("invalid-gzip", pack(["t", b"this is not gzip", {"compressed": "gzip"}])),
    ("gzip-of-zlib", pack(["t", zlib.compress(PACKED_ENTRIES), {"compressed": "gzip"}])),
    ("truncated-gzip", pack(["t", GZIP_ONE[:-10], {"compressed": "gzip"}])),
    ("gzip-without-trailer", pack(["t", GZIP_ONE[:-8], {"compressed": "gzip"}])),
    ("gzip-header-only", pack(["t", GZIP_ONE[:10], {"compressed": "gzip"}])),
    ("gzip-empty", pack(["t", b"", {"compressed": "gzip"}])),
    ("gzip-then-garbage", pack(["t", GZIP_ONE + b"garbage!", {"compressed": "gzip"}])),
    ("unknown-compression", pack(["t", GZIP_ONE, {"compressed": "zstd"}])),
]


@pytest.mark.parametrize("data", [d for _, d in REQUEST_ERRORS], ids=[n for n, _ in REQUEST_ERRORS])
def test_request_level_error_closes(data: bytes) -> None:
    closed_with_error(ForwardServerConnection(), data)


@pytest.mark.parametrize("data", [d for _, d in REQUEST_ERRORS], ids=[n for n, _ in REQUEST_ERRORS])
def test_request_level_error_after_good_requests(data: bytes) -> None:
    good = pack(["good", T0, {"a": 1}, {"chunk": "c1"}]) + b"\xc0"
    codec = ForwardServerConnection()
    *events, error = codec.receive_data(good + data)
    # The requests that came complete are returned (they may still be acked) ...
    assert events == [received("good", "message", [T0 * NS], [{"a": 1}], Chunk(b"c1")), Heartbeat()]
    # ... before the violation, and the connection is closed.
    support.violation([error])
    assert_closed(codec)


def test_error_in_a_later_read_after_good_requests() -> None:
    codec = ForwardServerConnection()
    assert len(codec.receive_data(pack(["a", T0, {}]))) == 1
    closed_with_error(codec, b"\xc1")


def test_limits_must_be_positive() -> None:
    for name in ("max_request_bytes", "max_decompressed_bytes", "max_events_per_request"):
        with pytest.raises(ValueError, match=name):
            ForwardLimits(**{name: 0})


# -- limits -------------------------------------------------------------------------------------


def big_forward(n: int) -> bytes:
    return pack(["big", [[T0, {"i": i, "pad": "x" * 10}] for i in range(n)]])


@pytest.mark.parametrize("piece", [1, 7, 100, 10**6], ids=["bytewise", "7", "100", "one-read"])
def test_oversized_msgpack_request_fails(piece: int) -> None:
    data = big_forward(300)
    limit = len(data) - 1
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=limit))
    events: list[ForwardEvent] = []
    feed_reads(codec, pieces(data, piece), events)
    support.violation(events, "max_request_bytes")
    assert events[:-1] == []
    assert codec.state is ForwardState.CLOSED


@pytest.mark.parametrize("piece", [1, 7, 10**6], ids=["bytewise", "7", "one-read"])
def test_oversized_packed_request_fails(piece: int) -> None:
    data = pack(["p", b"\x00" * 5000])
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=4000))
    events: list[ForwardEvent] = []
    feed_reads(codec, pieces(data, piece), events)
    support.violation(events, "max_request_bytes")
    assert events[:-1] == []


def test_request_exactly_at_the_limit_passes_with_the_next_one_in_the_same_read() -> None:
    first = big_forward(100)
    second = big_forward(99)
    limit = len(first)
    assert len(second) < limit
    data = first + second
    for at in [len(first) + 1, len(first) + 5, len(first) + len(second) // 2]:
        codec = ForwardServerConnection(ForwardLimits(max_request_bytes=limit))
        events = codec.receive_data(data[:at]) + codec.receive_data(data[at:])
        assert [len(only([e]).records) for e in events] == [100, 99]
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=limit))
    assert [len(only([e]).records) for e in codec.receive_data(data)] == [100, 99]
    assert [len(only([e]).records) for e in feed_bytewise(data, limits=codec.limits)] == [100, 99]


def test_many_small_requests_never_add_up_to_the_limit() -> None:
    one = pack(["t", T0, {"a": 1}])
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=len(one)))
    events = codec.receive_data(one * 50)
    events += feed_bytewise(one * 50, limits=codec.limits)
    assert len(events) == 100


@pytest.mark.parametrize("piece", [1, 13, 10**6], ids=["bytewise", "13", "one-read"])
def test_oversized_json_request_fails(piece: int) -> None:
    data = json.dumps(["t", T0, {"m": "x" * 2000}]).encode()
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=len(data) - 1))
    events: list[ForwardEvent] = []
    feed_reads(codec, pieces(data, piece), events)
    support.violation(events, "max_request_bytes")
    assert events[:-1] == []


def test_json_request_exactly_at_the_limit_passes() -> None:
    first = json.dumps(["t", T0, {"m": "x" * 2000}]).encode()
    second = json.dumps(["t", T0, {"m": "y" * 1000}]).encode()
    data = first + b"\n" + second
    limits = ForwardLimits(max_request_bytes=len(first))
    events = feed(data, limits=limits)
    assert [only([e]).records[0]["m"][0] for e in events] == ["x", "y"]
    assert feed_bytewise(data, limits=limits) == events


def test_gunzip_members_stops_a_gzip_bomb_early() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1024 * 1024)
    bomb = b"".join(compressor.compress(zeros) for _ in range(50)) + compressor.flush()
    assert len(bomb) < 100_000  # 50 MiB of zeros in a few tens of kB
    limit = 1024 * 1024
    request = pack(["bomb", bomb, {"compressed": "gzip", "chunk": "c"}])
    codec = ForwardServerConnection(ForwardLimits(max_decompressed_bytes=limit))
    tracemalloc.start()
    try:
        support.violation(codec.receive_data(request), "max_decompressed_bytes")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * limit
    assert codec.state is ForwardState.CLOSED


def test_decompressed_size_exactly_at_the_limit_passes() -> None:
    stream = entries_stream(*[[T0, {"i": i}] for i in range(100)])
    data = gzip_members(stream[:300], stream[300:])
    limits = ForwardLimits(max_decompressed_bytes=len(stream))
    assert len(only(feed(pack(["g", data, {"compressed": "gzip"}]), limits=limits)).records) == 100
    over = ForwardLimits(max_decompressed_bytes=len(stream) - 1)
    support.violation(
        feed(pack(["g", data, {"compressed": "gzip"}]), limits=over), "max_decompressed_bytes"
    )


def test_decompressed_limit_counts_all_members() -> None:
    part = entries_stream([T0, {"pad": "z" * 100}])
    data = gzip_members(*[part] * 20)
    limits = ForwardLimits(max_decompressed_bytes=len(part) * 19)
    support.violation(
        feed(pack(["g", data, {"compressed": "gzip"}]), limits=limits), "max_decompressed_bytes"
    )


def test_gunzip_members_directly() -> None:
    assert gunzip_members(gzip_members(b"abc", b"", b"def"), 6) == b"abcdef"
    assert gunzip_members(gzip.compress(b"x" * 10_000), 10_000) == b"x" * 10_000
    with pytest.raises(RemoteProtocolError, match="max_decompressed_bytes"):
        gunzip_members(gzip.compress(b"x" * 10_000), 9_999)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        gunzip_members(gzip.compress(b"x" * 10_000)[:-1], 10**6)
    with pytest.raises(RemoteProtocolError, match="invalid"):
        gunzip_members(b"\x1f\x8b\x08\x00garbage-garbage", 10**6)


@pytest.mark.parametrize("mode", ["forward", "packed", "compressed"])
def test_max_events_per_request(mode: str) -> None:
    limit = 10

    def request(n: int) -> bytes:
        entries = [[T0 + i, {"i": i}] for i in range(n)]
        if mode == "forward":
            return pack(["e", entries])
        if mode == "packed":
            return pack(["e", entries_stream(*entries)])
        return pack(["e", gzip.compress(entries_stream(*entries)), {"compressed": "gzip"}])

    limits = ForwardLimits(max_events_per_request=limit)
    assert len(only(feed(request(limit), limits=limits)).records) == limit
    codec = ForwardServerConnection(limits)
    error = closed_with_error(codec, request(limit + 1))
    assert "max_events_per_request" in error.reason


@pytest.mark.parametrize("mode", ["forward", "packed"])
def test_max_events_per_request_counts_dropped_events(mode: str) -> None:
    entries: list[Any] = [[T0, "bad"]] * 6 + [[T0, {"ok": 1}]] * 5
    data = pack(["e", entries]) if mode == "forward" else pack(["e", entries_stream(*entries)])
    support.violation(
        feed(data, limits=ForwardLimits(max_events_per_request=10)), "max_events_per_request"
    )


# -- hypothesis: round trip and fuzz ------------------------------------------------------------

keys = st.text(max_size=8)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=8,
)
records = st.dictionaries(keys, values, max_size=4)
times = st.one_of(
    st.integers(min_value=1, max_value=2**32 - 1).map(lambda s: (s, s * NS)),
    st.tuples(
        st.integers(min_value=0, max_value=2**32 - 1),
        st.integers(min_value=0, max_value=NS - 1),
    ).map(lambda t: (event_time(*t), t[0] * NS + t[1])),
)
chunks = st.one_of(
    st.none(),
    st.text(min_size=1, max_size=40).map(lambda s: (s, Chunk(s.encode(), "str"))),
    st.binary(min_size=1, max_size=40).map(lambda b: (b, Chunk(b, "bin"))),
    st.binary(min_size=1, max_size=40).map(
        lambda b: (as_str(b), Chunk(b, "str"))  # a str chunk that may not be UTF-8
    ),
)
MODES = ["message", "forward", "packed-bin", "packed-str", "compressed"]


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, EventsReceived, bytes | None]:
    tag = draw(st.text(max_size=20))
    mode = draw(st.sampled_from(MODES))
    n = 1 if mode == "message" else draw(st.integers(min_value=0, max_value=5))
    events = draw(st.lists(st.tuples(times, records), min_size=n, max_size=n))
    chunk = draw(chunks)
    option: dict[str, Any] = {}
    if chunk is not None:
        option["chunk"] = chunk[0]
    if draw(st.booleans()):
        option["size"] = draw(st.integers(min_value=0, max_value=2**16))
    entries = [[t[0], r] for t, r in events]
    stream = b"".join(pack(e) for e in entries)
    if mode == "message":
        request: list[Any] = [tag, entries[0][0], entries[0][1]]
    elif mode == "forward":
        request = [tag, entries]
    elif mode == "packed-bin":
        request = [tag, stream]
    elif mode == "packed-str":
        request = [tag, as_str(stream)]
    else:
        option["compressed"] = "gzip"
        members = draw(st.integers(min_value=1, max_value=3))
        cut = len(stream) // members
        parts = [stream[i * cut : (i + 1) * cut] for i in range(members - 1)]
        parts.append(stream[(members - 1) * cut :])
        request = [tag, gzip_members(*parts)]
    if option or draw(st.booleans()):
        request.append(option)
    expected = received(
        tag,
        {"packed-bin": "packed", "packed-str": "packed"}.get(mode, mode),
        [t[1] for t, _ in events],
        [r for _, r in events],
        chunk[1] if chunk is not None else None,
    )
    ack = pack_raw_str({"ack": chunk[0]}) if chunk is not None else None
    return pack_raw_str(request), expected, ack


def rendered_checked(events: list[ForwardEvent]) -> list[ForwardEvent]:
    """``events`` with the fast path's texts checked against the records and set aside.

    A generated PackedForward request whose ``size`` option happens to equal its
    entry count takes the fast path, which renders the texts while decoding
    (docs/forward.md#the-fast-path); they must be exactly ``records_json`` of the
    records, and then the events compare like the general path's.
    """
    checked: list[ForwardEvent] = []
    for event in events:
        if isinstance(event, EventsReceived) and event.texts is not None:
            assert event.texts == records_json(event.records)
            event = replace(event, texts=None)
        checked.append(event)
    return checked


@FAST
@given(requests(), st.data())
def test_generated_requests_round_trip(
    request: tuple[bytes, EventsReceived, bytes | None], data: Any
) -> None:
    raw, expected, expected_ack = request
    at = data.draw(st.integers(min_value=0, max_value=len(raw)))
    codec = ForwardServerConnection()
    events = rendered_checked(codec.receive_data(raw[:at]) + codec.receive_data(raw[at:]))
    assert events == [expected]
    event = only(events)
    if expected_ack is None:
        assert event.chunk is None
    else:
        assert event.chunk is not None
        assert codec.ack_bytes(event.chunk) == expected_ack
    for record in event.records:
        json.loads(record_json(record).encode("utf-8"))


def test_a_size_equal_to_the_entry_count_renders_the_same_records() -> None:
    """The case hypothesis found: ``size`` 2 over two empty maps takes the fast path."""
    stream = pack([event_time(1, 0), {}]) + pack([event_time(2, 5), {}])
    events = ForwardServerConnection().receive_data(pack_raw_str(["t", stream, {"size": 2}]))
    event = only(events)
    assert event.texts == ["{}", "{}"]
    assert rendered_checked(events) == [received("t", "packed", [10**9, 2 * 10**9 + 5], [{}, {}])]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=2, max_size=4), st.data())
def test_generated_request_streams_split_anywhere(
    batch: list[tuple[bytes, EventsReceived, bytes | None]], data: Any
) -> None:
    raw = b"".join(r for r, _, _ in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=5)))
    codec = ForwardServerConnection()
    events: list[ForwardEvent] = []
    for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        events += codec.receive_data(raw[start:end])
    assert rendered_checked(events) == [e for _, e, _ in batch]


def check_fuzz(chunks_in: list[bytes], allow_json: bool) -> None:
    codec = ForwardServerConnection(
        ForwardLimits(
            max_request_bytes=4096, max_decompressed_bytes=4096, max_events_per_request=50
        ),
        allow_json=allow_json,
    )
    for piece in chunks_in:
        for event in codec.receive_data(piece):
            if isinstance(event, ProtocolViolation):
                assert_closed(codec)
                return
            assert isinstance(event, EventsReceived | Heartbeat)
            if isinstance(event, EventsReceived):
                assert len(event.times_ns) == len(event.records)
                assert all(type(r) is dict for r in event.records)
                for record in event.records:
                    json.loads(record_json(record).encode("utf-8"))
                if event.chunk is not None:
                    assert codec.ack_bytes(event.chunk).endswith(event.chunk.raw)
        assert codec.state is not ForwardState.CLOSED  # a close always ends in a violation


@FAST
@given(st.lists(st.binary(max_size=64), max_size=6), st.booleans())
def test_fuzz_arbitrary_bytes(chunks_in: list[bytes], allow_json: bool) -> None:
    check_fuzz(chunks_in, allow_json)


@FAST
@given(st.lists(st.binary(max_size=32), max_size=4), st.sampled_from([b"[", b"{", b'["t",']))
def test_fuzz_arbitrary_bytes_in_json_form(chunks_in: list[bytes], start: bytes) -> None:
    check_fuzz([start, *chunks_in], allow_json=True)


fuzz_values = st.recursive(
    leaves | st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=3) | st.integers(-3, 3) | st.binary(max_size=3), children
        )
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            fuzz_values,
            st.tuples(st.text(max_size=4), fuzz_values, fuzz_values).map(list),
            st.tuples(st.text(max_size=4), st.lists(st.lists(fuzz_values, max_size=3))).map(list),
            st.tuples(st.text(max_size=4), st.binary(max_size=40), fuzz_values).map(list),
        ),
        max_size=4,
    ),
    st.data(),
)
def test_fuzz_structured_requests(objs: list[Any], data: Any) -> None:
    raw = b"".join(pack(o) for o in objs)
    raw = data.draw(st.sampled_from([raw, raw[: len(raw) // 2] + raw[len(raw) // 2 + 1 :]]))
    at = data.draw(st.integers(0, len(raw)))
    check_fuzz([raw[:at], raw[at:]], allow_json=False)


def test_fluentd_chunk_id_is_base64_of_16_bytes() -> None:
    # The shape real out_forward sends: keep its text for the batch_id column.
    chunk_id = base64.b64encode(bytes(range(16))).decode()
    event = only(feed(pack(["t", T0, {}, {"chunk": chunk_id}])))
    assert event.chunk is not None
    assert event.chunk.text() == chunk_id


# -- the size a PackedForward request declares (ForwardServerConnection.bytes_short) ----------

requests_strategy = st.lists(
    st.one_of(
        # PackedForward: str or bin entries, with or without an option.
        st.tuples(
            st.text(min_size=1, max_size=40),
            st.binary(max_size=300) | st.text(max_size=300),
            st.none() | st.fixed_dictionaries({"chunk": st.text(min_size=1, max_size=8)}),
        ).map(lambda t: msgpack.packb([t[0], t[1]] if t[2] is None else list(t))),
        # Message and Forward modes: no size to read.
        st.builds(
            lambda tag, n: msgpack.packb([tag, n, {"m": "x"}]),
            st.text(max_size=5),
            st.integers(1, 2**31),
        ),
        st.builds(lambda tag: msgpack.packb([tag, [[1, {"m": 1}]]]), st.text(max_size=5)),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(requests_strategy, st.integers(1, 64))
def test_completes_nothing_is_never_wrong(requests: list[bytes], step: int) -> None:
    """A read it calls short never completes a request (so no decode is ever moved)."""
    codec = ForwardServerConnection()
    data = b"".join(requests)
    ends = list(itertools.accumulate(len(r) for r in requests))
    for start in range(0, len(data), step):
        if codec.state is ForwardState.CLOSED:
            break  # random entries need not be valid: the property holds up to there
        piece = data[start : start + step]
        short = codec.completes_nothing(piece)
        events = codec.receive_data(piece)
        if short:
            assert not any(start < end <= start + len(piece) for end in ends)
            assert events == []


def test_completes_nothing_reads_the_declared_entries_length() -> None:
    entries = b"\x00" * 70_000
    request = msgpack.packb(["app", entries, {"chunk": "c"}], use_bin_type=True)
    assert packed_request_min_bytes(request[:3]) == 0  # the entries' header is not in yet
    # The option map is at least one byte: everything but the option's other bytes.
    option = msgpack.packb({"chunk": "c"})
    assert packed_request_min_bytes(request) == len(request) - len(option) + 1
    codec = ForwardServerConnection()
    assert not codec.completes_nothing(request[:100])  # the first read picks the transport
    codec.receive_data(request[:100])
    assert codec.completes_nothing(request[100:50_000])
    codec.receive_data(request[100:50_000])
    assert not codec.completes_nothing(request[50_000:])
    (event,) = codec.receive_data(request[50_000:])
    assert isinstance(event, EventsReceived)
    # Nothing held: the head of the next request is the read's own start.
    assert codec.completes_nothing(request[:20_000])
    assert not codec.completes_nothing(b"\xc0")  # a heartbeat: nothing to tell
