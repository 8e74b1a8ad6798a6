"""The Log Courier codec against hostile input.

Each class of hostile input found for Log Courier, and its relatives: HELO
bodies of every length, strings that cannot be stored (lone surrogates, bytes
that are not UTF-8, over-long values), times that are not times, payloads
built to make the codec hold far more memory than they decompress to, and the
``buffered_bytes`` count the driver's request deadline relies on. Every input
must give events or end in a ProtocolViolation, never an exception, whole or
split at any byte. Work is counted (calls, bytes), never timed.
"""

from __future__ import annotations

import json
import struct
import sys
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance import defaults
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES
from appliance.protocols.courier import (
    EVENT_OVERHEAD_BYTES,
    MAX_HELLO_BYTES,
    CourierEvent,
    CourierLimits,
    CourierServerConnection,
    CourierState,
    Hello,
    PayloadReceived,
    Ping,
    UnknownMessage,
)
from appliance.protocols.courier import connection as courier_module
from appliance.protocols.errors import LocalProtocolError
from tests.appliance.protocols.support import feed_reads, refused, violation

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NONCE = bytes(range(16))
PING = b"PING\x00\x00\x00\x00"


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def stream(*events: bytes) -> bytes:
    return b"".join(u32(len(e)) + e for e in events)


def jdat_of(*events: bytes, nonce: bytes = NONCE) -> bytes:
    body = nonce + zlib.compress(stream(*events))
    return b"JDAT" + u32(len(body)) + body


def evnt_of(*events: bytes, nonce: bytes = NONCE, level: int = 6) -> bytes:
    return b"EVNT\xff\xff\xff\xff" + nonce + zlib.compress(stream(*events), level)


def helo(body: bytes) -> bytes:
    return b"HELO" + u32(len(body)) + body


def big_limits(**kwargs: int) -> CourierLimits:
    """Limits that let a large test payload through unless a test narrows one."""
    base = {"max_payload_bytes": 64 * 1024 * 1024, "max_decompressed_bytes": 256 * 1024 * 1024}
    return CourierLimits(**(base | kwargs))


def outcome(codec: CourierServerConnection, *reads: bytes) -> list[CourierEvent] | str:
    """The events of ``reads``, or the reason of the violation they end in.

    Any exception fails the test (it propagates).
    """
    events = feed_reads(codec.receive_data, reads)
    if refused(events):
        assert codec.state is CourierState.CLOSED
        assert codec.buffered_bytes == 0
        return violation(events).reason
    return events


def one_payload(data: bytes, limits: CourierLimits | None = None) -> PayloadReceived:
    events = CourierServerConnection(limits).receive_data(data)
    (event,) = events
    assert isinstance(event, PayloadReceived)
    return event


# -- 1. HELO of every length (9..19 bytes raised struct.error) ----------------------------------


def expected_hello(body: bytes) -> Hello:
    """What a HELO body means, written out independently of the codec's structs.

    1..8 bytes: the compact layout of Ruby v2.7.0/v2.7.1 (one byte each of
    flags, major, minor, patch, then the client id). 0 or 9..32 bytes: the Go
    layout (flags[4], three u32, client[4]), zero-padded as the Go receiver
    pads (protocolhelo.go).
    """
    if 0 < len(body) <= 8:
        b = body + bytes(8 - len(body))
        return Hello(bytes([b[0], 0, 0, 0]), (b[1], b[2], b[3]), b[4:8])
    b = body + bytes(32 - len(body))
    version = (
        int.from_bytes(b[4:8], "big"),
        int.from_bytes(b[8:12], "big"),
        int.from_bytes(b[12:16], "big"),
    )
    return Hello(b[0:4], version, b[16:20])


@pytest.mark.parametrize("length", range(65))
def test_helo_of_every_length_is_an_answer_or_a_protocol_error(length: int) -> None:
    body = bytes(range(1, length + 1))  # no zero byte: every position is visible
    data = helo(body) + PING
    for at in range(len(data) + 1):
        got = outcome(CourierServerConnection(), data[:at], data[at:])
        if length <= MAX_HELLO_BYTES:
            assert got == [expected_hello(body), Ping()], f"split at {at}"
        else:
            assert got == f"HELO body of {length} bytes exceeds {MAX_HELLO_BYTES}"


@pytest.mark.parametrize("length", range(9, 20))
def test_helo_of_9_to_19_bytes_is_the_go_layout(length: int) -> None:
    # Regression: these lengths raised struct.error (the compact
    # layout unpacked a body longer than its 8 bytes).
    body = (b"\x01\x00\x00\x00" + u32(2) + u32(11) + u32(0) + b"LCOR")[:length]
    (hello,) = CourierServerConnection().receive_data(helo(body))
    assert isinstance(hello, Hello)
    assert hello.flags == b"\x01\x00\x00\x00"
    assert hello.version[0] == 2


def test_ruby_client_helo_layouts() -> None:
    # Ruby v2.7.0/2.7.1: pack('A4NCCCCA4'), 8 bytes; v2.7.2 on: pack('A4NNNNNA4'), 20 bytes.
    compact = bytes.fromhex("00 02 07 00") + b"RYLC"
    wide = bytes.fromhex("00000000 00000002 00000007 00000002") + b"RYLC"
    assert CourierServerConnection().receive_data(helo(compact)) == [
        Hello(bytes(4), (2, 7, 0), b"RYLC")
    ]
    (hello,) = CourierServerConnection().receive_data(helo(wide))
    assert hello == Hello(bytes(4), (2, 7, 2), b"RYLC")
    assert isinstance(hello, Hello)
    assert hello.client_name == "Ruby Log Courier v2.7.2"


@FAST
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=80), st.binary(max_size=40))
def test_fuzz_helo_bodies(body: bytes, at: int, tail: bytes) -> None:
    data = helo(body) + tail
    got = outcome(CourierServerConnection(), data[:at], data[at:])
    if isinstance(got, list) and got:
        assert got[0] == expected_hello(body)


def test_client_name_escapes_bytes_that_are_not_printable() -> None:
    hello = Hello(bytes(4), (1, 2, 3), b"A\n\xff\x1b")
    assert hello.client_name == "A\\x0a\\xff\\x1b v1.2.3"
    assert hello.client_name.isprintable()


# -- 2. strict strings: type, host, record text --------------------------------------------


def event(**fields: Any) -> bytes:
    """A JSON event as Go's encoding/json writes it: lone surrogates as \\u escapes."""
    return json.dumps(fields, ensure_ascii=True).encode()


def test_type_and_host_are_taken_when_valid() -> None:
    received = one_payload(
        jdat_of(
            event(type="nginx", host="web1", message="a"),
            event(type="caf\u00e9", host={"name": "ecs.example"}),
            event(message="none"),
        )
    )
    assert received.types == ["nginx", "caf\u00e9", None]
    assert received.hosts == ["web1", "ecs.example", None]
    assert (received.invalid_types, received.invalid_hosts) == (0, 0)


@pytest.mark.parametrize(
    ("fields", "types", "hosts"),
    [
        ({"type": "\ud800"}, (None, 1), (None, 0)),
        ({"type": "a\udfffb"}, (None, 1), (None, 0)),
        ({"host": "\ud83d"}, (None, 0), (None, 1)),
        ({"host": {"name": "x\udc80"}}, (None, 0), (None, 1)),
        ({"beat": {"hostname": "\ud800"}}, (None, 0), (None, 1)),
        ({"type": "\ud800", "host": "\udfff"}, (None, 1), (None, 1)),
        # A well-formed pair of surrogate escapes is one character: valid.
        ({"type": "\U0001f600", "host": "h"}, ("\U0001f600", 0), ("h", 0)),
    ],
    ids=["type", "type-inside", "host", "host-name", "beat-hostname", "both", "pair-is-valid"],
)
def test_a_lone_surrogate_never_reaches_a_column(
    fields: dict[str, Any], types: tuple[str | None, int], hosts: tuple[str | None, int]
) -> None:
    # Regression: a JSON "\ud800" in type/host reached the writer's
    # pa.array and ended the process. Now that field falls back and is counted.
    received = one_payload(evnt_of(event(message="m", **fields)))
    assert (received.types[0], received.invalid_types) == types
    assert (received.hosts[0], received.invalid_hosts) == hosts
    (text,) = received.records
    text.encode("utf-8")  # the record text is valid UTF-8 ...
    assert json.loads(text)["message"] == "m"  # ... and the event is kept


def test_a_lone_surrogate_in_the_record_is_kept_as_binary() -> None:
    (text,) = one_payload(jdat_of(event(type="\ud800", message="\udfff"))).records
    # The records convention: a lone surrogate has no UTF-8 form, so it is
    # kept as its surrogatepass bytes in {"$binary": base64}.
    assert json.loads(text) == {"type": {"$binary": "7aCA"}, "message": {"$binary": "7b+/"}}


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("t" * MAX_TAG_BYTES, True),
        ("t" * (MAX_TAG_BYTES + 1), False),
        ("\u00e9" * (MAX_TAG_BYTES // 2), True),  # 2 bytes each: exactly the limit
        ("\u00e9" * (MAX_TAG_BYTES // 2) + "t", False),
        ("\U0001f600" * (MAX_TAG_BYTES // 4 + 1), False),
    ],
)
def test_type_longer_than_max_tag_bytes_falls_back(value: str, kept: bool) -> None:
    received = one_payload(jdat_of(event(type=value)))
    assert received.types == [value if kept else None]
    assert received.invalid_types == (0 if kept else 1)
    assert json.loads(received.records[0]) == {"type": value}  # the record keeps it


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("h" * MAX_HOST_BYTES, True),
        ("h" * (MAX_HOST_BYTES + 1), False),
        ("\u4e2d" * (MAX_HOST_BYTES // 3), True),  # 3 bytes each: 255 bytes
        ("\u4e2d" * (MAX_HOST_BYTES // 3 + 1), False),
        ("h" * 1_000_000, False),  # most of max_event_bytes
    ],
)
def test_host_longer_than_max_host_bytes_becomes_null(value: str, kept: bool) -> None:
    received = one_payload(jdat_of(event(host={"name": value})))
    assert received.hosts == [value if kept else None]
    assert received.invalid_hosts == (0 if kept else 1)


def test_type_and_host_that_are_not_strings_are_absent_not_invalid() -> None:
    received = one_payload(
        jdat_of(event(type=7, host=["a"]), event(type="", host=""), event(type=None, host=True))
    )
    assert received.types == [None, None, None]
    assert received.hosts == [None, None, None]
    assert (received.invalid_types, received.invalid_hosts) == (0, 0)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type": "a\xffb"}',  # JSON whose bytes are not UTF-8
        b'{"host": "\xed\xa0\x80"}',  # a surrogate encoded in UTF-8 form: not UTF-8
        b"\xff\xfe plain",
        b"\xc0\x80",  # overlong NUL
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\x80",
    ],
)
def test_events_that_are_not_utf8_are_kept_as_binary_message(raw: bytes) -> None:
    received = one_payload(jdat_of(raw))
    assert received.not_json == 1
    assert received.types == [None]
    assert received.hosts == [None]
    (text,) = received.records
    text.encode("utf-8")
    assert set(json.loads(text)["message"]) == {"$binary"}


_SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"])
_ODD_TEXT = st.lists(st.one_of(_SURROGATES, st.characters(), st.text(max_size=4)), max_size=8).map(
    "".join
)


@FAST
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "type": _ODD_TEXT | st.integers(),
                "host": _ODD_TEXT | st.fixed_dictionaries({"name": _ODD_TEXT}),
                "message": _ODD_TEXT,
                "@timestamp": _ODD_TEXT,
            },
        ),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.binary(max_size=12), max_size=3),
)
def test_fuzz_every_kept_string_is_storable(
    events: list[dict[str, Any]], not_json: list[bytes]
) -> None:
    raws = [json.dumps(e, ensure_ascii=True).encode() for e in events] + not_json
    received = one_payload(evnt_of(*raws))
    assert received.count == len(raws)
    for text in received.records:
        text.encode("utf-8")
        assert isinstance(json.loads(text), dict)
    for value, limit in [(t, MAX_TAG_BYTES) for t in received.types] + [
        (h, MAX_HOST_BYTES) for h in received.hosts
    ]:
        assert value is None or (value and len(value.encode("utf-8")) <= limit)


# -- 3. times ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-05-06T07:08:09.12\u00b2Z",  # superscript two: str.isdigit() says yes
        "2024-05-06T07:08:09.\u0661\u0662\u0663Z",  # Arabic-Indic digits in the fraction
        "\u0662\u0660\u0662\u0664-05-06T07:08:09Z",  # ... and in the year
        "2024-05-06T07:08:09.\uff11Z",  # fullwidth one
        "0001-01-01T00:00:00Z",  # Go's zero time: outside int64 nanoseconds
        "9999-12-31T23:59:59.999999999Z",
        "1677-09-21T00:12:43.145224191Z",  # one nanosecond before int64 holds
        "2024-13-01T00:00:00Z",
        "",
    ],
    ids=[
        "superscript",
        "arabic-fraction",
        "arabic-year",
        "fullwidth",
        "go-zero",
        "year-9999",
        "below-int64",
        "month-13",
        "empty",
    ],
)
def test_timestamps_that_are_not_usable_keep_the_event_with_the_receive_time(stamp: str) -> None:
    # Regression: these raised in the writer (int() of '²',
    # OverflowError for year 1) and lost every batch of the commit group.
    received = one_payload(
        evnt_of(event(message="kept", **{"@timestamp": stamp}), event(message="next"))
    )
    assert received.times_ns == [None, None]
    assert json.loads(received.records[0]) == {"message": "kept", "@timestamp": stamp}


def test_usable_timestamps_keep_their_nanoseconds() -> None:
    received = one_payload(
        jdat_of(
            event(**{"@timestamp": "2024-05-06T07:08:09.123456789Z"}),
            event(**{"@timestamp": "1677-09-21T00:12:43.145224192Z"}),  # int64's first
            event(**{"@timestamp": 1714979289}),  # not text: no time
        )
    )
    assert received.times_ns == [1_714_979_289_123_456_789, -(2**63), None]


# -- 4. bounded memory and work -------------------------------------------------------------


@contextmanager
def counting(name: str) -> Iterator[list[int]]:
    """Count the calls of the courier codec's ``name`` (a function connection.py uses)."""
    calls = [0]
    original: Callable[..., Any] = getattr(courier_module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(courier_module, name, counted)
    try:
        yield calls
    finally:
        setattr(courier_module, name, original)


def test_events_become_record_texts_as_they_arrive() -> None:
    # Each event is turned into its record text once, when its last byte is
    # in: fed one byte at a time, half the payload has made half the texts.
    events = [event(i=i, message="x" * 40) for i in range(40)]
    compressed = zlib.compress(stream(*events), 0)  # stored: bytes arrive in order
    data = b"EVNT\xff\xff\xff\xff" + NONCE + compressed
    codec = CourierServerConnection()
    with counting("record_json") as calls:
        got: list[CourierEvent] = []
        half = len(data) // 2
        for i in range(half):
            got += codec.receive_data(data[i : i + 1])
        assert got == []
        assert 15 <= calls[0] <= 25  # about half the 40 events so far
        for i in range(half, len(data)):
            got += codec.receive_data(data[i : i + 1])
    assert calls[0] == 40  # never more than once per event, whatever the reads
    (received,) = got
    assert isinstance(received, PayloadReceived)
    assert [json.loads(t)["i"] for t in received.records] == list(range(40))


def test_typical_payload_holds_little_more_than_its_decompressed_bytes() -> None:
    events = [
        event(
            **{"@timestamp": f"2024-05-06T07:08:{i % 60:02}.{i:06}Z"},
            host="web1.example",
            type="nginx",
            path="/var/log/nginx/access.log",
            offset=i * 300,
            message=f'192.0.2.{i % 250} - - "GET /index.html?id={i} HTTP/1.1" 200 {i % 9000}',
        )
        for i in range(5000)
    ]
    raw = stream(*events)
    data = evnt_of(*events)
    codec = CourierServerConnection(big_limits())
    tracemalloc.start()
    try:
        (received,) = codec.receive_data(data)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(received, PayloadReceived)
    # The old codec kept every decoded dict: about 5x here (21x for worse shapes).
    assert held < 1.6 * len(raw)
    # The codec's own count covers what is really held.
    assert received.memory_bytes >= 0.9 * held
    # Shared strings: one "nginx" and one "web1.example" for all 5,000 rows.
    assert len({id(t) for t in received.types}) == 1
    assert len({id(h) for h in received.hosts}) == 1


@pytest.mark.parametrize(
    ("name", "events"),
    [
        # Each event becomes {"message":"\u0001..."}: six characters per byte,
        # four bytes per character once one character is outside the BMP.
        ("escapes-astral", [b"\x01" * 4000 + "\U0001f600".encode()] * 40),
        # 1E15 re-encodes as 1000000000000000.0.
        ("floats", [b'{"a":[' + b"1E15," * 2000 + b'1],"b":"\\ud83d\\ude00"}'] * 20),
        # Empty events: 4 bytes of decompressed stream each.
        ("empty", [b""] * 20_000),
    ],
)
def test_payload_memory_is_counted_and_bounded(name: str, events: list[bytes]) -> None:
    raw = stream(*events)
    data = evnt_of(*events)
    tracemalloc.start()
    try:
        received = one_payload(data, big_limits())
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # These shapes grow several times over when kept as text (the count is
    # there to cut them off) ...
    assert received.memory_bytes > 4 * len(raw)
    # ... and the count covers what is held.
    assert received.memory_bytes >= 0.9 * held
    # With the limit just under the count, the same payload is refused.
    tight = big_limits(max_payload_memory_bytes=received.memory_bytes - 1)
    reason = outcome(CourierServerConnection(tight), data)
    assert reason == (
        f"payload {NONCE.hex()} holds more than "
        f"max_payload_memory_bytes={received.memory_bytes - 1} as rows"
    )


def test_memory_limit_stops_the_payload_at_the_event_that_passes_it() -> None:
    per_event = sys.getsizeof('{"message":"xxxxxxxxxx"}') + EVENT_OVERHEAD_BYTES
    limits = big_limits(max_payload_memory_bytes=10 * per_event)
    assert one_payload(jdat_of(*[b"x" * 10] * 10), limits).memory_bytes == 10 * per_event
    with counting("record_json") as calls:
        reason = outcome(CourierServerConnection(limits), jdat_of(*[b"x" * 10] * 1000))
    assert isinstance(reason, str)
    assert "max_payload_memory_bytes" in reason
    assert calls[0] == 11  # the event that passed the limit was the last one made


def test_events_per_payload_are_bounded_and_so_is_the_work() -> None:
    # 250,001 empty events are 1 MB of zlib output in about 1 KB of zlib: the
    # count stops the payload at the first event over it.
    data = evnt_of(*[b""] * (defaults.COURIER_MAX_EVENTS + 1), level=9)
    assert len(data) < 4096
    with counting("record_json") as calls:
        reason = outcome(CourierServerConnection(), data)
    most = defaults.COURIER_MAX_EVENTS
    assert reason == f"payload {NONCE.hex()} carries more than max_events={most} events"
    assert calls[0] == defaults.COURIER_MAX_EVENTS


def test_default_memory_limit_is_twice_the_decompressed_cap() -> None:
    limits = CourierLimits()
    assert limits.max_payload_memory_bytes == defaults.COURIER_MAX_PAYLOAD_MEMORY_BYTES
    assert limits.max_decompressed_bytes * 2 == defaults.COURIER_MAX_PAYLOAD_MEMORY_BYTES
    with pytest.raises(ValueError, match="max_payload_memory_bytes"):
        CourierLimits(max_payload_memory_bytes=0)


def test_an_event_is_decoded_once_however_the_input_is_split() -> None:
    events = [event(i=i) for i in range(30)]
    data = jdat_of(*events) + evnt_of(*events)
    # The one-loop reader parses an object's text by the decoder's scanner,
    # the event-by-event path by the decoder: each event takes one of them once.
    for read in (1, 7, 64, len(data)):
        with counting("_json_decode") as decodes, counting("_json_scan") as scans:
            codec = CourierServerConnection()
            got: list[CourierEvent] = []
            for i in range(0, len(data), read):
                got += codec.receive_data(data[i : i + read])
        assert len(got) == 2
        assert decodes[0] + scans[0] == 60, f"reads of {read}"


def test_unknown_messages_still_get_their_answer_event() -> None:
    data = b"NEW1" + u32(5) + b"hello" + b"NEW2" + u32(0) + PING
    assert CourierServerConnection().receive_data(data) == [
        UnknownMessage(b"NEW1", 5),
        UnknownMessage(b"NEW2", 0),
        Ping(),
    ]


# -- 5. buffered_bytes ------------------------------------------------------------------------


def message_ends(data: bytes) -> set[int]:
    """Offsets of ``data`` (HELO, PING, JDAT, unknown messages) where a message ends."""
    ends = {0}
    at = 0
    while at < len(data):
        (length,) = struct.unpack(">I", data[at + 4 : at + 8])
        at += 8 + length
        ends.add(at)
    return ends


def test_buffered_bytes_is_zero_exactly_between_messages() -> None:
    data = (
        helo(bytes(4) + u32(2) + u32(10) + u32(0) + b"LCOR" + bytes(12))
        + jdat_of(event(a=1), event(b="x" * 300))
        + PING
        + b"WHAT" + u32(3) + b"abc"
        + jdat_of(b"not json")
    )  # fmt: skip
    ends = message_ends(data)
    codec = CourierServerConnection()
    for i in range(len(data) + 1):
        if i:
            codec.receive_data(data[i - 1 : i])
        if i in ends:
            assert codec.buffered_bytes == 0, f"at {i}"
        else:
            assert codec.buffered_bytes > 0, f"at {i}"


def test_buffered_bytes_counts_the_unfinished_message() -> None:
    codec = CourierServerConnection()
    assert codec.buffered_bytes == 0
    codec.receive_data(b"JDA")
    assert codec.buffered_bytes == 3  # a partial header
    body = NONCE + zlib.compress(stream(b"y" * 5000), 0)
    codec.receive_data(b"T" + u32(len(body)) + NONCE[:4])
    assert codec.buffered_bytes == 8 + 4  # header and part of the nonce
    codec.receive_data(body[4:3000])
    # Header, the body so far, and what it inflated to (held as a partial event).
    inflated = codec.buffered_bytes - 3000 - 8
    assert 2000 < inflated <= 3000
    codec.receive_data(body[3000:])
    assert codec.buffered_bytes == 0


def test_buffered_bytes_of_an_evnt_follows_its_decompressed_bytes() -> None:
    # An EVNT whose zlib stream is still open: the count grows with what it
    # inflates to (the rows it holds), not with the few compressed bytes.
    compressor = zlib.compressobj(9)
    head = b"EVNT\xff\xff\xff\xff" + NONCE
    part = compressor.compress(stream(*[b"{}"] * 50_000)) + compressor.flush(zlib.Z_SYNC_FLUSH)
    codec = CourierServerConnection()
    assert codec.receive_data(head + part) == []
    assert codec.buffered_bytes >= 50_000 * 6
    assert codec.buffered_bytes < 50_000 * 6 + len(head) + len(part) + 1


def test_buffered_bytes_of_a_skipped_message_counts_what_was_skipped() -> None:
    codec = CourierServerConnection()
    codec.receive_data(b"BIGM" + u32(1000) + bytes(10))
    assert codec.buffered_bytes == 18
    codec.receive_data(bytes(990))
    assert codec.buffered_bytes == 0


def test_buffered_bytes_is_zero_once_closed() -> None:
    codec = CourierServerConnection()
    violation(codec.receive_data(b"JDAT" + u32(100) + NONCE + b"\x00\x01bad"))
    assert codec.buffered_bytes == 0
    with pytest.raises(LocalProtocolError):
        codec.receive_data(PING)


# -- 6. the fuzz: any bytes after any prefix -------------------------------------------------------

_PREFIXES = st.sampled_from(
    [
        b"",
        helo(b"\x00" * 12),
        helo(b"\x01" * 19),
        b"HELO" + u32(17),
        b"EVNT\xff\xff\xff\xff" + NONCE,
        evnt_of(event(type="\ud800", host="\udfff", **{"@timestamp": "0001-01-01T00:00:00Z"})),
        jdat_of(b"\xff", event(**{"@timestamp": "2024-05-06T07:08:09.\u00b2Z"})),
    ]
)


@FAST
@given(_PREFIXES, st.binary(max_size=256), st.integers(min_value=1, max_value=40))
def test_fuzz_only_events_or_protocol_errors(prefix: bytes, tail: bytes, read: int) -> None:
    data = prefix + tail
    codec = CourierServerConnection(CourierLimits(max_payload_bytes=4096, max_event_bytes=512))
    reads = [data[i : i + read] for i in range(0, len(data), read)]
    got = outcome(codec, *reads)
    if isinstance(got, list):
        for item in got:
            if isinstance(item, PayloadReceived):
                for text in item.records:
                    text.encode("utf-8")
