"""The Log Courier server codec (sans-IO), message by message and edge case by edge case.

Frames are written out byte for byte here (hex literals and ``struct`` by
hand), not built with the codec's own encoders, so the codec is checked
against the protocol and not against itself. Every sample is also fed split
at every byte and one byte at a time; hypothesis fuzzes the codec with
garbage (it must parse or end with a ProtocolViolation, nothing else) and
round-trips generated payloads cut at random places.
"""

from __future__ import annotations

import base64
import json
import struct
import tracemalloc
import zlib
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance import defaults
from appliance.protocols.courier import (
    CourierEvent,
    CourierLimits,
    CourierServerConnection,
    CourierState,
    Hello,
    PayloadReceived,
    Ping,
    UnknownMessage,
    Unsupported,
    encode_message,
)
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation
from tests.appliance.protocols.support import feed_reads, refused, violation

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NONCE = bytes(range(16))
NONCE_B = bytes(range(0xF0, 0x100))

# -- frames, byte for byte ----------------------------------------------------------

#: HELO as the Go client sends it (protocolhelo.go): flags 00000000, v2.10.0, LCOR.
HELO_GO = bytes.fromhex(
    "48454c4f 00000020"  # "HELO", length 32
    "00000000"  # flags
    "00000002 0000000a 00000000"  # major 2, minor 10, patch 0
    "4c434f52"  # "LCOR"
    "000000000000000000000000"  # reserved
)
#: HELO as the Ruby client v2.7.0 and v2.7.1 send it (client_tcp.rb):
#: 'A4NCCCCA4' = flags, 2, 7, 0, RYLC (the compact layout).
HELO_RUBY = bytes.fromhex("48454c4f 00000008 00 02 07 00 52594c43")
#: HELO as the Ruby client sends it since v2.7.2 (client_tcp.rb, 6e9d898):
#: 'A4NNNNNA4' = flags, 2, 7, 2, RYLC: the first 20 bytes of the Go layout.
HELO_RUBY_20 = bytes.fromhex("48454c4f 00000014 00000000 00000002 00000007 00000002 52594c43")
#: HELO of the first handshaking Go clients (messagehelo.go): no body.
HELO_EMPTY = b"HELO\x00\x00\x00\x00"
PING = b"PING\x00\x00\x00\x00"
CLIENT_UNKNOWN = b"????\x00\x00\x00\x00"

#: Two events, '{"a":1}' and 'not json', each with a u32 length, zlib level 3.
EVENTS_ZLIB = bytes.fromhex("785e63606060af564a54b232ac656060e0c8cb2f51c82acecf03002f8c0543")
#: A zlib stream of no events.
EMPTY_ZLIB = bytes.fromhex("785e030000000001")
#: The record texts of EVENTS_ZLIB: compact JSON; the event that is not JSON
#: is kept as {"message": <its text>}. (The codec now keeps each
#: event's JSON record text, not the decoded dict, so these are texts.)
EVENTS_RECORDS: list[str] = ['{"a":1}', '{"message":"not json"}']

#: JDAT: length = 16 (nonce) + 31 (zlib) = 47 = 0x2f.
JDAT = b"JDAT" + bytes.fromhex("0000002f") + NONCE + EVENTS_ZLIB
#: EVNT: length 0xFFFFFFFF, nonce, the same zlib stream; the message ends with it.
EVNT = b"EVNT" + bytes.fromhex("ffffffff") + NONCE_B + EVENTS_ZLIB


def test_sample_zlib_streams_hold_what_the_tests_say() -> None:
    assert zlib.decompress(EVENTS_ZLIB) == b'\x00\x00\x00\x07{"a":1}\x00\x00\x00\x08not json'
    assert zlib.decompress(EMPTY_ZLIB) == b""
    assert len(EVENTS_ZLIB) == 31


# -- building more frames by hand -----------------------------------------------------


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def stream(*events: bytes) -> bytes:
    """The uncompressed payload: each event with its u32 length."""
    return b"".join(u32(len(e)) + e for e in events)


def jdat(nonce: bytes, compressed: bytes) -> bytes:
    return b"JDAT" + u32(len(nonce) + len(compressed)) + nonce + compressed


def evnt(nonce: bytes, compressed: bytes) -> bytes:
    return b"EVNT\xff\xff\xff\xff" + nonce + compressed


def jdat_of(nonce: bytes, *events: bytes) -> bytes:
    return jdat(nonce, zlib.compress(stream(*events)))


def evnt_of(nonce: bytes, *events: bytes) -> bytes:
    return evnt(nonce, zlib.compress(stream(*events)))


def stored_zlib(data: bytes) -> bytes:
    """A zlib stream of one stored (uncompressed) block, by RFC 1950/1951 by hand."""
    assert len(data) < 65536
    block = b"\x01" + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data
    return b"\x78\x01" + block + u32(zlib.adler32(data))


# -- feeding ------------------------------------------------------------------------


def feed(data: bytes, **kwargs: Any) -> list[CourierEvent]:
    return CourierServerConnection(**kwargs).receive_data(data)


def feed_split(data: bytes, at: int, **kwargs: Any) -> list[CourierEvent]:
    codec = CourierServerConnection(**kwargs)
    return feed_reads(codec.receive_data, [data[:at], data[at:]])


def feed_bytewise(data: bytes, **kwargs: Any) -> list[CourierEvent]:
    codec = CourierServerConnection(**kwargs)
    return feed_reads(codec.receive_data, (data[i : i + 1] for i in range(len(data))))


def received_payload(
    nonce: bytes,
    kind: Literal["JDAT", "EVNT"],
    records: list[str],
    not_json: int = 0,
) -> PayloadReceived:
    """The payload event the codec gives for events with no type, host or time."""
    empty: list[Any] = [None] * len(records)
    return PayloadReceived(nonce, kind, records, empty, list(empty), list(empty), not_json)


def parsed(received: PayloadReceived) -> list[Any]:
    """The payload's record texts as JSON values (they are compact JSON objects)."""
    return [json.loads(text) for text in received.records]


def payload(events: list[CourierEvent]) -> PayloadReceived:
    (event,) = events
    assert isinstance(event, PayloadReceived)
    return event


def closed_with_error(codec: CourierServerConnection, data: bytes) -> ProtocolViolation:
    """Feed ``data``, expect a violation alone, and check the codec is closed for good."""
    (error,) = codec.receive_data(data)
    assert isinstance(error, ProtocolViolation), error
    assert_closed(codec)
    return error


def assert_closed(codec: CourierServerConnection) -> None:
    assert codec.state is CourierState.CLOSED
    with pytest.raises(LocalProtocolError):
        codec.receive_data(PING)
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"")


def fails(codec: CourierServerConnection, *reads: bytes) -> bool:
    """True when ``reads`` end in a violation (and the codec is closed)."""
    return refused(feed_reads(codec.receive_data, reads)) and codec.state is CourierState.CLOSED


def rejects(data: bytes, match: str, **kwargs: Any) -> ProtocolViolation:
    error = closed_with_error(CourierServerConnection(**kwargs), data)
    assert match in error.reason, error.reason
    return error


# -- samples: every client message, with the events it must give ------------------------

SAMPLES: list[tuple[str, bytes, list[CourierEvent]]] = [
    ("helo-go", HELO_GO, [Hello(b"\x00\x00\x00\x00", (2, 10, 0), b"LCOR")]),
    ("helo-ruby", HELO_RUBY, [Hello(b"\x00\x00\x00\x00", (2, 7, 0), b"RYLC")]),
    ("helo-ruby-20", HELO_RUBY_20, [Hello(b"\x00\x00\x00\x00", (2, 7, 2), b"RYLC")]),
    ("helo-empty", HELO_EMPTY, [Hello(bytes(4), (0, 0, 0), bytes(4))]),
    ("ping", PING, [Ping()]),
    ("client-unknown-reply", CLIENT_UNKNOWN, [Unsupported()]),
    ("jdat", JDAT, [received_payload(NONCE, "JDAT", EVENTS_RECORDS, not_json=1)]),
    ("evnt", EVNT, [received_payload(NONCE_B, "EVNT", EVENTS_RECORDS, not_json=1)]),
    ("jdat-empty", jdat(NONCE, EMPTY_ZLIB), [received_payload(NONCE, "JDAT", [])]),
    ("evnt-empty", evnt(NONCE, EMPTY_ZLIB), [received_payload(NONCE, "EVNT", [])]),
    (
        "jdat-stored-block",
        jdat(NONCE, stored_zlib(stream(b'{"x":"y"}'))),
        [received_payload(NONCE, "JDAT", ['{"x":"y"}'])],
    ),
    ("unknown-with-body", b"WHAT\x00\x00\x00\x03abc", [UnknownMessage(b"WHAT", 3)]),
    ("unknown-empty", b"NEWT\x00\x00\x00\x00", [UnknownMessage(b"NEWT", 0)]),
    (
        "session",
        HELO_GO + JDAT + EVNT + PING + b"WHAT\x00\x00\x00\x01!" + JDAT,
        [
            Hello(bytes(4), (2, 10, 0), b"LCOR"),
            received_payload(NONCE, "JDAT", EVENTS_RECORDS, not_json=1),
            received_payload(NONCE_B, "EVNT", EVENTS_RECORDS, not_json=1),
            Ping(),
            UnknownMessage(b"WHAT", 1),
            received_payload(NONCE, "JDAT", EVENTS_RECORDS, not_json=1),
        ],
    ),
]


@pytest.mark.parametrize(("name", "data", "expected"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_sample_parses_whole(name: str, data: bytes, expected: list[CourierEvent]) -> None:
    assert feed(data) == expected


@pytest.mark.parametrize(("name", "data", "expected"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_sample_parses_split_at_every_byte(
    name: str, data: bytes, expected: list[CourierEvent]
) -> None:
    for at in range(len(data) + 1):
        assert feed_split(data, at) == expected, f"split at {at}"
    assert feed_bytewise(data) == expected


@pytest.mark.parametrize(("name", "data", "expected"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_sample_followed_by_garbage_keeps_its_events(
    name: str, data: bytes, expected: list[CourierEvent]
) -> None:
    codec = CourierServerConnection()
    # Trailing garbage: a server-only message type, which no client may send.
    events = codec.receive_data(data + b"ACKN" + bytes(4))
    assert events[:-1] == expected
    violation(events)
    assert_closed(codec)


# -- answers, byte for byte -----------------------------------------------------------


def test_vers_is_the_go_layout_and_advertises_evnt() -> None:
    codec = CourierServerConnection(server_version=(1, 2, 3))
    assert codec.vers_bytes() == bytes.fromhex(
        "56455253 00000020"  # "VERS", length 32
        "01000000"  # flags: bit 0 of the first byte = supports EVNT
        "00000001 00000002 00000003"  # version 1.2.3
        "4150504c"  # "APPL"
        "000000000000000000000000"  # reserved
    )
    assert codec.supports_evnt


def test_vers_reports_the_appliance_version_by_default() -> None:
    from appliance import __version__

    major, minor, patch = (int(p) for p in __version__.split(".")[:3])
    vers = CourierServerConnection().vers_bytes()
    assert struct.unpack(">III", vers[12:24]) == (major, minor, patch)


def test_pong_and_unknown_reply_bytes() -> None:
    assert CourierServerConnection.pong_bytes() == b"PONG\x00\x00\x00\x00"
    assert CourierServerConnection.unknown_bytes() == b"????\x00\x00\x00\x00"


def test_ackn_echoes_the_nonce_exactly_with_the_event_count() -> None:
    codec = CourierServerConnection()
    received = payload(codec.receive_data(JDAT))
    assert codec.ack_bytes(received) == (
        b"ACKN" + bytes.fromhex("00000014") + NONCE + bytes.fromhex("00000002")
    )


def test_keepalive_ackn_acknowledges_nothing() -> None:
    codec = CourierServerConnection()
    received = payload(codec.receive_data(EVNT))
    assert codec.keepalive_bytes(received) == b"ACKN\x00\x00\x00\x14" + NONCE_B + bytes(4)


def test_ackn_of_a_nonce_that_is_not_16_bytes_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        CourierServerConnection.ackn_bytes(b"short", 1)
    with pytest.raises(LocalProtocolError):
        encode_message(b"TOOLONG")


def test_encode_message_frames_type_length_body() -> None:
    assert encode_message(b"ABCD", b"xyz") == b"ABCD\x00\x00\x00\x03xyz"


# -- handshake ------------------------------------------------------------------------


def test_helo_opens_the_connection_and_is_kept() -> None:
    codec = CourierServerConnection()
    assert codec.state is CourierState.IDLE
    (hello,) = codec.receive_data(HELO_GO)
    assert codec.state is CourierState.OPEN
    assert codec.hello == hello
    assert isinstance(hello, Hello)
    assert hello.client_name == "Log Courier v2.10.0"


def test_client_names() -> None:
    assert Hello(bytes(4), (2, 7, 0), b"RYLC").client_name == "Ruby Log Courier v2.7.0"
    assert Hello(bytes(4), (0, 0, 0), b"LCVR").client_name == "Log Carver"
    assert Hello(bytes(4), (1, 0, 0), bytes(4)).client_name == "Unknown v1.0.0"
    assert Hello(bytes(4), (0, 0, 0), b"ZZZZ").client_name == "ZZZZ"
    with pytest.raises(ValueError, match="4 bytes"):
        Hello(b"", (0, 0, 0), b"LCOR")


def test_short_helo_bodies_are_zero_padded() -> None:
    # Flags only (the first handshaking clients sent one flags byte in VERS).
    (hello,) = feed(b"HELO\x00\x00\x00\x01\x01")
    assert hello == Hello(b"\x01\x00\x00\x00", (0, 0, 0), bytes(4))
    # A Go-layout body cut after the client id (20 of 32 bytes).
    (hello,) = feed(b"HELO" + u32(20) + HELO_GO[8:28])
    assert hello == Hello(bytes(4), (2, 10, 0), b"LCOR")


def test_helo_over_32_bytes_is_rejected() -> None:
    rejects(b"HELO" + u32(33) + bytes(33), "exceeds 32")


def test_second_helo_is_rejected() -> None:
    codec = CourierServerConnection()
    codec.receive_data(HELO_GO)
    error = closed_with_error(codec, HELO_GO)
    assert "HELO after" in error.reason


def test_legacy_client_opening_with_jdat_is_served() -> None:
    codec = CourierServerConnection()
    assert payload(codec.receive_data(JDAT)).records == EVENTS_RECORDS
    assert codec.hello is None
    assert codec.state is CourierState.OPEN
    # ... and then HELO is no longer the first message: refused.
    closed_with_error(codec, HELO_GO)


def test_legacy_client_opening_with_ping_is_served() -> None:
    codec = CourierServerConnection()
    assert codec.receive_data(PING) == [Ping()]
    assert codec.state is CourierState.OPEN


def test_unknown_message_before_helo_leaves_the_handshake_possible() -> None:
    codec = CourierServerConnection()
    assert codec.receive_data(b"NEW1\x00\x00\x00\x02hi") == [UnknownMessage(b"NEW1", 2)]
    assert codec.state is CourierState.IDLE
    assert isinstance(codec.receive_data(HELO_GO)[0], Hello)


# -- PING, ????, server messages ------------------------------------------------------------


def test_ping_with_a_body_is_rejected() -> None:
    rejects(b"PING\x00\x00\x00\x01x", "empty body")


def test_client_unknown_reply_with_a_body_is_rejected() -> None:
    rejects(b"????\x00\x00\x00\x02xx", "empty body")


@pytest.mark.parametrize("kind", [b"VERS", b"PONG", b"ACKN"])
def test_server_messages_from_a_client_are_rejected(kind: bytes) -> None:
    rejects(kind + u32(0), "server message")


# -- unknown messages -------------------------------------------------------------------


def test_unknown_message_body_is_skipped_and_the_next_message_parsed() -> None:
    body = bytes(range(256)) * 40  # 10 KiB that would be garbage if parsed
    events = feed(b"BIGM" + u32(len(body)) + body + PING)
    assert events == [UnknownMessage(b"BIGM", len(body)), Ping()]


def test_unknown_message_body_is_not_buffered() -> None:
    codec = CourierServerConnection()
    body = bytes(4 * 1024 * 1024)
    tracemalloc.start()
    try:
        codec.receive_data(b"BIGM" + u32(len(body)))
        for i in range(0, len(body), 65536):
            codec.receive_data(body[i : i + 65536])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_unknown_message_over_the_payload_limit_is_rejected() -> None:
    rejects(b"BIGM" + u32(defaults.COURIER_MAX_PAYLOAD_BYTES + 1), "max_payload_bytes")


def test_unknown_streamed_message_is_rejected() -> None:
    rejects(b"EVN2\xff\xff\xff\xff" + NONCE, "its end cannot be found")


# -- JDAT -------------------------------------------------------------------------------


def test_jdat_events_in_order_with_their_json() -> None:
    events = [json.dumps({"i": i, "message": f"line {i}"}).encode() for i in range(50)]
    received = payload(feed(jdat_of(NONCE, *events)))
    assert parsed(received) == [{"i": i, "message": f"line {i}"} for i in range(50)]
    assert received.count == 50
    assert received.kind == "JDAT"
    assert received.nonce == NONCE
    assert received.nonce_hex == NONCE.hex()


def test_several_jdat_in_one_read_give_one_payload_each() -> None:
    data = jdat_of(NONCE, b'{"n":1}') + jdat_of(NONCE_B, b'{"n":2}', b'{"n":3}')
    first, second = feed(data)
    assert isinstance(first, PayloadReceived)
    assert isinstance(second, PayloadReceived)
    assert (first.nonce, first.records) == (NONCE, ['{"n":1}'])
    assert (second.nonce, second.records) == (NONCE_B, ['{"n":2}', '{"n":3}'])


def test_jdat_bytes_after_its_zlib_stream_are_skipped() -> None:
    # The Go receiver reads a JDAT body to its length but stops inflating at
    # the end of the zlib stream: what follows inside the length is ignored.
    data = jdat(NONCE, EVENTS_ZLIB + b"trailing") + PING
    for at in range(len(data) + 1):
        events = feed_split(data, at)
        assert events == [received_payload(NONCE, "JDAT", EVENTS_RECORDS, 1), Ping()]


def test_jdat_whose_zlib_stream_is_cut_short_is_rejected() -> None:
    rejects(jdat(NONCE, EVENTS_ZLIB[:-3]), "truncated")


def test_jdat_too_short_for_a_nonce_is_rejected() -> None:
    rejects(b"JDAT" + u32(16) + NONCE, "too short")


def test_jdat_over_the_payload_limit_is_rejected_from_its_header() -> None:
    # Refused on the header alone: nothing of the body is read or buffered.
    rejects(b"JDAT" + u32(defaults.COURIER_MAX_PAYLOAD_BYTES + 1), "max_payload_bytes")
    limits = CourierLimits(max_payload_bytes=40)
    rejects(JDAT[:8], "max_payload_bytes=40", limits=limits)
    assert payload(feed(jdat_of(NONCE), limits=limits)).count == 0


def test_jdat_with_the_streamed_length_is_rejected() -> None:
    rejects(b"JDAT\xff\xff\xff\xff", "max_payload_bytes")


# -- EVNT -------------------------------------------------------------------------------


def test_evnt_ends_where_its_zlib_stream_ends() -> None:
    # The next message starts right after the zlib trailer (adler32).
    data = EVNT + PING + JDAT + EVNT
    expected = [
        received_payload(NONCE_B, "EVNT", EVENTS_RECORDS, 1),
        Ping(),
        received_payload(NONCE, "JDAT", EVENTS_RECORDS, 1),
        received_payload(NONCE_B, "EVNT", EVENTS_RECORDS, 1),
    ]
    assert feed(data) == expected
    for at in range(len(data) + 1):
        assert feed_split(data, at) == expected, f"split at {at}"
    assert feed_bytewise(data) == expected


def test_evnt_with_a_finite_length_is_rejected() -> None:
    rejects(b"EVNT" + u32(47) + NONCE + EVENTS_ZLIB, "EVNT length must be 0xffffffff")


def test_evnt_whose_stream_runs_past_the_payload_limit_is_rejected() -> None:
    limits = CourierLimits(max_payload_bytes=16 + 20)
    # A stored block never ends within 20 bytes when it holds 100.
    data = evnt(NONCE, stored_zlib(stream(b"x" * 100)))
    rejects(data, "max_payload_bytes=36", limits=limits)
    # Split at every byte: still refused, never more than the limit taken in.
    for at in range(len(data) + 1):
        codec = CourierServerConnection(limits)
        assert fails(codec, data[:at], data[at:]), f"split at {at}"


def test_evnt_exactly_at_the_payload_limit_is_accepted() -> None:
    compressed = zlib.compress(stream(b'{"k":1}'))
    limits = CourierLimits(max_payload_bytes=16 + len(compressed))
    received, ping = feed(evnt(NONCE, compressed) + PING, limits=limits)
    assert received == received_payload(NONCE, "EVNT", ['{"k":1}'])
    assert ping == Ping()


# -- bad compression ---------------------------------------------------------------------


def test_payload_that_does_not_decompress_closes_at_once() -> None:
    # The error comes with the first bad bytes, before the declared length arrived.
    codec = CourierServerConnection()
    head = b"JDAT" + u32(16 + 1000) + NONCE
    error = closed_with_error(codec, head + b"\x00\x01garbage")
    assert "does not decompress" in error.reason


@pytest.mark.parametrize(
    ("name", "compressed"),
    [
        ("gzip", bytes.fromhex("1f8b08000000000000ff")),
        ("raw-deflate", zlib.compress(b"x")[2:]),
        ("bad-adler32", EVENTS_ZLIB[:-1] + bytes([EVENTS_ZLIB[-1] ^ 1])),
        ("preset-dictionary", bytes.fromhex("78bb") + u32(1) + b"\x03\x00"),
    ],
)
def test_compression_that_is_not_plain_zlib_is_rejected(name: str, compressed: bytes) -> None:
    rejects(jdat(NONCE, compressed + bytes(8)), "does not decompress")
    rejects(evnt(NONCE, compressed + bytes(8)), "does not decompress")


def test_valid_payload_before_bad_one_is_returned_then_the_error() -> None:
    codec = CourierServerConnection()
    events = codec.receive_data(JDAT + jdat(NONCE_B, b"\x00\x00not zlib at all"))
    assert events[:-1] == [received_payload(NONCE, "JDAT", EVENTS_RECORDS, 1)]
    violation(events, "does not decompress")
    assert_closed(codec)


# -- events inside a payload ---------------------------------------------------------------


def b64(raw: bytes) -> dict[str, str]:
    return {"$binary": base64.b64encode(raw).decode("ascii")}


# The expected records are JSON values now (the codec keeps record texts, issue
# 13); bytes that are not UTF-8 are {"$binary": ...} under the records
# convention, which the session used to apply later.
@pytest.mark.parametrize(
    ("raw", "record"),
    [
        (b"plain text line", {"message": "plain text line"}),
        (b"", {"message": ""}),
        (b"[1, 2]", {"message": "[1, 2]"}),
        (b'"just a string"', {"message": '"just a string"'}),
        (b"42", {"message": "42"}),
        (b'{"a": 1', {"message": '{"a": 1'}),
        (b'{"bad utf8": "\xff"}', {"message": b64(b'{"bad utf8": "\xff"}')}),
        (b'{"ok": "caf\xc3\xa9"}', {"ok": "caf\u00e9"}),
        # Events are UTF-8 (Go's encoding/json); other encodings are not sniffed.
        ('{"a": 1}'.encode("utf-16"), {"message": b64('{"a": 1}'.encode("utf-16"))}),
        (b'\xef\xbb\xbf{"bom": 1}', {"message": '\ufeff{"bom": 1}'}),
    ],
    ids=["text", "empty", "array", "string", "number", "cut", "bad-utf8", "utf8", "utf16", "bom"],
)
def test_event_that_is_not_a_json_object_is_kept_as_message(
    raw: bytes, record: dict[str, Any]
) -> None:
    received = payload(feed(jdat_of(NONCE, b'{"n":0}', raw)))
    assert parsed(received) == [{"n": 0}, record]
    assert received.not_json == (0 if "ok" in record else 1)
    assert received.count == 2
    for text in received.records:
        text.encode("utf-8")  # every record text is valid UTF-8


def test_event_nested_deeper_than_the_interpreter_allows_is_kept_as_message() -> None:
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    received = payload(feed(jdat_of(NONCE, deep)))
    assert parsed(received) == [{"message": deep.decode()}]


def test_event_over_the_event_limit_is_rejected_from_its_length_prefix() -> None:
    limits = CourierLimits(max_event_bytes=100)
    assert payload(feed(jdat_of(NONCE, b"x" * 100), limits=limits)).count == 1
    # Only the length prefix of the oversized event is in the stream.
    oversized = jdat(NONCE, zlib.compress(u32(101)))
    rejects(oversized, "max_event_bytes=100", limits=limits)


def test_payload_over_the_decompressed_limit_is_rejected_without_inflating_it_all() -> None:
    limits = CourierLimits(max_decompressed_bytes=1024 * 1024)
    # 8 MiB of events, each well under max_event_bytes, in under 32 KiB of zlib.
    # (The events were once NUL bytes; the codec now keeps each event's
    # record text at once, where a NUL is the six characters \u0000, so the
    # bomb is made of "x" to measure decompression alone. The growth of
    # escapes is bounded by max_payload_memory_bytes: test_courier_hardening.)
    bomb = zlib.compress(stream(*[b"x" * 1020] * 8192), 9)
    assert len(bomb) < 32 * 1024
    tracemalloc.start()
    try:
        rejects(jdat(NONCE, bomb), "max_decompressed_bytes=1048576", limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024


def test_payload_exactly_at_the_decompressed_limit_is_accepted() -> None:
    data = stream(b'{"a":1}', b'{"b":2}')
    limits = CourierLimits(max_decompressed_bytes=len(data))
    assert payload(feed(jdat(NONCE, zlib.compress(data)), limits=limits)).count == 2
    tight = CourierLimits(max_decompressed_bytes=len(data) - 1)
    rejects(jdat(NONCE, zlib.compress(data)), "max_decompressed_bytes", limits=tight)


def test_payload_over_the_event_count_limit_is_rejected() -> None:
    limits = CourierLimits(max_events=3)
    assert payload(feed(jdat_of(NONCE, b"{}", b"{}", b"{}"), limits=limits)).count == 3
    rejects(jdat_of(NONCE, b"{}", b"{}", b"{}", b"{}"), "max_events=3", limits=limits)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("half-length-prefix", stream(b'{"a":1}') + b"\x00\x00"),
        ("half-event", stream(b'{"a":1}') + u32(10) + b"12345"),
    ],
)
def test_payload_that_ends_inside_an_event_is_rejected(name: str, data: bytes) -> None:
    rejects(jdat(NONCE, zlib.compress(data)), "ends inside an event")
    rejects(evnt(NONCE, zlib.compress(data)), "ends inside an event")


def test_event_split_across_deflate_blocks_and_reads() -> None:
    # A full-flush splits the stream into blocks that end mid-event.
    body = stream(*(json.dumps({"i": i, "pad": "p" * i}).encode() for i in range(200)))
    compressor = zlib.compressobj()
    parts = [compressor.compress(body[i : i + 7]) + compressor.flush(zlib.Z_FULL_FLUSH)
             for i in range(0, len(body), 7)]  # fmt: skip
    compressed = b"".join(parts) + compressor.flush()
    data = evnt(NONCE, compressed) + PING
    codec = CourierServerConnection()
    events: list[CourierEvent] = []
    for i in range(0, len(data), 13):
        events += codec.receive_data(data[i : i + 13])
    first, ping = events
    assert isinstance(first, PayloadReceived)
    assert [r["i"] for r in parsed(first)] == list(range(200))
    assert ping == Ping()


# -- events and limits validate themselves -----------------------------------------------------


def test_payload_event_validates_its_nonce() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        PayloadReceived(b"short", "JDAT", [], [], [], [])
    with pytest.raises(ValueError, match="differ in length"):
        PayloadReceived(NONCE, "JDAT", ["{}"], [], [], [])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_payload_bytes": 16},
        {"max_decompressed_bytes": 0},
        {"max_event_bytes": 0},
        {"max_events": 0},
    ],
)
def test_limits_must_be_positive(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="max_"):
        CourierLimits(**kwargs)


def test_closed_connection_refuses_input_as_a_local_error() -> None:
    codec = CourierServerConnection()
    closed_with_error(codec, b"ACKN" + u32(0))


# -- fuzzing --------------------------------------------------------------------------------


@FAST
@given(st.binary(max_size=512))
def test_fuzz_garbage_parses_or_ends_in_a_violation(data: bytes) -> None:
    codec = CourierServerConnection(CourierLimits(max_payload_bytes=4096))
    if refused(feed_reads(codec.receive_data, [data, b""])):
        assert codec.state is CourierState.CLOSED


_PREFIXES = st.sampled_from(
    [b"", HELO_GO, HELO_GO + b"JDAT", b"EVNT\xff\xff\xff\xff" + NONCE, JDAT[:30], EVNT[:35]]
)


@FAST
@given(_PREFIXES, st.binary(max_size=512), st.integers(min_value=1, max_value=64))
def test_fuzz_after_a_valid_prefix_parses_or_ends_in_a_violation(
    prefix: bytes, tail: bytes, read: int
) -> None:
    codec = CourierServerConnection(CourierLimits(max_payload_bytes=4096, max_event_bytes=256))
    data = prefix + tail
    reads = (data[i : i + read] for i in range(0, len(data), read))
    if refused(feed_reads(codec.receive_data, reads)):
        assert codec.state is CourierState.CLOSED


@FAST
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=400))
def test_fuzz_random_bytes_inside_a_zlib_stream(body: bytes, flip: int) -> None:
    compressed = bytearray(zlib.compress(stream(body, b'{"a":1}')))
    compressed[flip % len(compressed)] ^= 0x5A
    codec = CourierServerConnection()
    if refused(codec.receive_data(evnt(NONCE, bytes(compressed)) + PING)):
        assert codec.state is CourierState.CLOSED


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@FAST
@given(
    st.lists(st.dictionaries(st.text(max_size=10), _JSON_VALUES, max_size=5), max_size=20),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
    st.integers(min_value=0, max_value=9),
)
def test_generated_payloads_round_trip_at_any_cut(
    records: list[dict[str, Any]], streamed: bool, cuts: list[int], level: int
) -> None:
    raw = [json.dumps(r).encode() for r in records]
    compressed = zlib.compress(stream(*raw), level)
    message = evnt(NONCE, compressed) if streamed else jdat(NONCE, compressed)
    data = HELO_GO + message + PING
    points = sorted({min(c, len(data)) for c in cuts})
    codec = CourierServerConnection()
    events: list[CourierEvent] = []
    start = 0
    for point in [*points, len(data)]:
        events += codec.receive_data(data[start:point])
        start = point
    hello, received, ping = events
    assert isinstance(hello, Hello)
    assert ping == Ping()
    assert isinstance(received, PayloadReceived)
    assert parsed(received) == records
    assert received.kind == ("EVNT" if streamed else "JDAT")
