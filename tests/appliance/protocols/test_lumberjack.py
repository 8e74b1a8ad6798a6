"""The Lumberjack v1/v2 server codec (sans-IO), edge case by edge case.

docs/lumberjack.md lists what real peers need; each item has its own test here. Every
sample stream is also fed split at every byte and one byte at a time, and
hypothesis round-trips generated windows and fuzzes the codec with garbage.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocols.errors import LocalProtocolError, ProtocolViolation
from appliance.protocols.lumberjack import (
    MAX_COMPRESSION_DEPTH,
    LumberjackEvent,
    LumberjackLimits,
    LumberjackServerConnection,
    LumberjackState,
    Window,
)
from tests.appliance.protocols.support import feed_reads, violation

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- building frames -----------------------------------------------------------


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def w(count: int, v: int = 2) -> bytes:
    """A window frame."""
    return f"{v}W".encode() + u32(count)


def j(seq: int, record: Any, v: int = 2) -> bytes:
    """A JSON data frame; ``record`` given as bytes goes out as is."""
    payload = record if isinstance(record, bytes) else json.dumps(record).encode()
    return f"{v}J".encode() + u32(seq) + u32(len(payload)) + payload


def d(seq: int, pairs: dict[str, str] | list[tuple[bytes, bytes]], v: int = 1) -> bytes:
    """A v1 data frame of key/value pairs."""
    items = (
        [(k.encode(), val.encode()) for k, val in pairs.items()]
        if isinstance(pairs, dict)
        else pairs
    )
    body = b"".join(u32(len(k)) + k + u32(len(val)) + val for k, val in items)
    return f"{v}D".encode() + u32(seq) + u32(len(items)) + body


def c_raw(payload: bytes, v: int = 2) -> bytes:
    """A compressed frame around ``payload`` exactly as given."""
    return f"{v}C".encode() + u32(len(payload)) + payload


def c(frames: bytes, v: int = 2) -> bytes:
    """A compressed frame holding ``frames``."""
    return c_raw(zlib.compress(frames), v)


def ack(seq: int, v: int = 2) -> bytes:
    return f"{v}A".encode() + u32(seq)


def conn(**limits: int) -> LumberjackServerConnection:
    return LumberjackServerConnection(LumberjackLimits(**limits) if limits else None)


def feed(
    *chunks: bytes, connection: LumberjackServerConnection | None = None
) -> list[LumberjackEvent]:
    """Feed ``chunks`` one call each; all windows they complete, in order (and a violation)."""
    connection = connection or conn()
    return feed_reads(connection.receive_data, chunks)


def shape(windows: list[Window]) -> list[tuple[int, list[int], list[dict[str, Any]]]]:
    """One entry per window as the client sees it (a run of ``W 0`` is one object, n acks)."""
    return [(win.version, win.sequences, win.records) for win in windows for _ in range(win.acks)]


def rec(i: int) -> dict[str, Any]:
    return {"@timestamp": f"2026-11-22T10:00:0{i % 10}Z", "message": f"line {i} ü", "seq": i}


def pairs(i: int) -> dict[str, str]:
    return {"line": f"line {i} ü", "host": "web-01", "seq": str(i)}


# -- samples, each fed whole, split at every byte, and byte by byte ------------

SAMPLES: dict[str, tuple[bytes, list[tuple[int, list[int], list[dict[str, Any]]]]]] = {
    "v2 plain window": (
        w(3) + j(1, rec(1)) + j(2, rec(2)) + j(3, rec(3)),
        [(2, [1, 2, 3], [rec(1), rec(2), rec(3)])],
    ),
    "v2 one C frame (lumberjack-client)": (
        w(2) + c(j(1, rec(1)) + j(2, rec(2))),
        [(2, [1, 2], [rec(1), rec(2)])],
    ),
    "v2 window over several C frames and a plain one": (
        w(4) + c(j(5, rec(5)) + j(6, rec(6))) + c(j(7, rec(7))) + j(8, rec(8)),
        [(2, [5, 6, 7, 8], [rec(5), rec(6), rec(7), rec(8)])],
    ),
    "v2 nested C": (
        w(3) + c(c(j(1, rec(1))) + j(2, rec(2)) + c(c(j(3, rec(3))))),
        [(2, [1, 2, 3], [rec(1), rec(2), rec(3)])],
    ),
    "v2 C holding windows whole": (
        c(w(2) + j(1, rec(1)) + j(2, rec(2)) + w(1)) + j(3, rec(3)),
        [(2, [1, 2], [rec(1), rec(2)]), (2, [3], [rec(3)])],
    ),
    "v2 pipelined windows with W 0": (
        w(1) + j(10, rec(10)) + w(0) + w(2) + j(11, rec(11)) + j(12, rec(12)),
        [(2, [10], [rec(10)]), (2, [], []), (2, [11, 12], [rec(11), rec(12)])],
    ),
    "v1 D frames (lumberjack-protocol)": (
        w(2, 1) + d(1, pairs(1)) + d(2, pairs(2)),
        [(1, [1, 2], [pairs(1), pairs(2)])],
    ),
    "v1 compressed D frames": (
        w(2, 1) + c(d(1, pairs(1)) + d(2, pairs(2)), 1),
        [(1, [1, 2], [pairs(1), pairs(2)])],
    ),
    "v2 a run of W 0 (one object, one ack each)": (
        w(0) + w(0) + w(0) + w(1) + j(1, rec(1)) + w(0) + w(0),
        [(2, [], [])] * 3 + [(2, [1], [rec(1)])] + [(2, [], [])] * 2,
    ),
    "v1 D frame of many pairs, empty ones included (resumable scan)": (
        w(1, 1) + d(4, [(b"", b""), (b"k", b""), (b"", b"v"), (b"long" * 9, b"x" * 40),
                        ("ключ".encode(), b"\xff\xfe")]),
        [(1, [4], [{"": "v", "k": "", "long" * 9: "x" * 40, "ключ": {"$binary": "//4="}}])],
    ),
    "v1 window size stands until the next W": (
        w(2, 1) + d(1, pairs(1)) + d(2, pairs(2)) + d(3, pairs(3)) + d(4, pairs(4))
        + w(1, 1) + d(5, pairs(5)),
        [
            (1, [1, 2], [pairs(1), pairs(2)]),
            (1, [3, 4], [pairs(3), pairs(4)]),
            (1, [5], [pairs(5)]),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_whole(name: str) -> None:
    data, expected = SAMPLES[name]
    assert shape(feed(data)) == expected


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_split_at_every_byte(name: str) -> None:
    data, expected = SAMPLES[name]
    for i in range(len(data) + 1):
        assert shape(feed(data[:i], data[i:])) == expected, f"split at {i}"


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_fed_one_byte_at_a_time(name: str) -> None:
    data, expected = SAMPLES[name]
    assert shape(feed(*(data[i : i + 1] for i in range(len(data))))) == expected


# -- acks ----------------------------------------------------------------------


def test_ack_carries_the_highest_sequence_not_the_count() -> None:
    # pylogbeat numbers across windows: its second window is 3, 4, 5 and it
    # waits for "A 5", not "A 3".
    connection = conn()
    (first,) = feed(w(2) + j(1, rec(1)) + j(2, rec(2)), connection=connection)
    assert connection.ack_bytes(first) == ack(2)
    (second,) = feed(w(3) + j(3, rec(3)) + j(4, rec(4)) + j(5, rec(5)), connection=connection)
    assert second.last_sequence == 5
    assert connection.ack_bytes(second) == ack(5)


def test_ack_of_a_client_that_restarts_numbering_each_window() -> None:
    # npm lumberjack-client numbers every window from 1.
    connection = conn()
    windows = feed(
        w(1) + c(j(1, rec(0))) + w(3) + c(j(1, rec(1)) + j(2, rec(2)) + j(3, rec(3))),
        connection=connection,
    )
    assert [connection.ack_bytes(win) for win in windows] == [ack(1), ack(3)]


def test_pipelined_windows_come_out_in_order_and_are_acked_in_order() -> None:
    connection = conn()
    stream = b"".join(w(2) + j(2 * k, rec(k)) + j(2 * k + 1, rec(k)) for k in range(5))
    windows = connection.receive_data(stream)
    assert [win.sequences for win in windows] == [[2 * k, 2 * k + 1] for k in range(5)]
    assert [connection.ack_bytes(win) for win in windows] == [ack(2 * k + 1) for k in range(5)]


@pytest.mark.parametrize(
    ("version", "stream"),
    [(1, w(1, 1) + d(9, pairs(9))), (2, w(1) + j(9, rec(9)))],
)
def test_acks_answer_in_the_connections_version(version: int, stream: bytes) -> None:
    connection = conn()
    (window,) = feed(stream, connection=connection)
    assert window.version == version
    assert connection.ack_bytes(window) == f"{version}A".encode() + u32(9)


def test_v2_keepalive_is_2A_with_sequence_zero() -> None:
    connection = conn()
    (window,) = feed(w(1) + j(41, rec(1)), connection=connection)
    assert connection.keepalive_bytes() == b"2A\x00\x00\x00\x00"
    connection.ack_bytes(window)
    feed(w(1), connection=connection)
    assert connection.keepalive_bytes() == b"2A\x00\x00\x00\x00"


def test_v1_keepalive_is_1A_with_the_last_acked_sequence() -> None:
    connection = conn()
    (first, second) = feed(w(2, 1) + d(1, pairs(1)) + d(2, pairs(2)) + d(3, pairs(3))
                           + d(4, pairs(4)), connection=connection)  # fmt: skip
    assert connection.keepalive_bytes() == ack(0, 1)  # nothing acked yet
    connection.ack_bytes(first)
    assert connection.keepalive_bytes() == ack(2, 1)
    connection.ack_bytes(second)
    assert connection.keepalive_bytes() == ack(4, 1)


@pytest.mark.parametrize("version", [1, 2])
def test_empty_window_yields_an_empty_window_acking_the_last_sequence(version: int) -> None:
    connection = conn()
    (empty,) = feed(w(0, version), connection=connection)
    assert empty == Window(version)
    assert empty.last_sequence is None
    assert connection.ack_bytes(empty) == ack(0, version)
    data = d(7, pairs(7), version) if version == 1 else j(7, rec(7))
    (full, empty_again) = feed(w(1, version) + data + w(0, version), connection=connection)
    assert connection.ack_bytes(full) == ack(7, version)
    assert connection.ack_bytes(empty_again) == ack(7, version)
    assert connection.state is LumberjackState.AWAITING_WINDOW


# -- compressed frames ---------------------------------------------------------


def test_window_spans_several_compressed_frames() -> None:
    connection = conn()
    assert feed(w(3) + c(j(1, rec(1))), connection=connection) == []
    assert connection.state is LumberjackState.IN_WINDOW
    assert feed(c(j(2, rec(2))), connection=connection) == []
    (window,) = feed(c(j(3, rec(3))), connection=connection)
    assert window.sequences == [1, 2, 3]


def nested(frames: bytes, depth: int) -> bytes:
    for _ in range(depth):
        frames = c(frames)
    return frames


def test_compressed_frames_nest_up_to_the_maximum_depth() -> None:
    (window,) = feed(w(1) + nested(j(1, rec(1)), MAX_COMPRESSION_DEPTH))
    assert window.records == [rec(1)]


def test_compressed_frame_holding_several_windows_and_an_empty_one() -> None:
    windows = feed(c(w(1) + j(1, rec(1)) + w(0) + w(1) + j(2, rec(2))))
    assert [win.sequences for win in windows] == [[1], [], [2]]


# -- D frames (v1) -------------------------------------------------------------


def test_d_frame_with_several_pairs() -> None:
    frame = d(
        3,
        [
            (b"line", "héllo wörld".encode()),
            (b"host", b"web-01"),
            (b"empty", b""),
            ("ключ".encode(), "значение".encode()),
            (b"bad", b"\xff\xfe ok"),
        ],
    )
    (window,) = feed(w(1, 1) + frame)
    assert window.records == [
        # A value that is not UTF-8 is kept whole as {"$binary": base64}
        # (the appliance.blocks.records convention), no longer replaced by U+FFFD.
        {"line": "héllo wörld", "host": "web-01", "empty": "", "ключ": "значение",
         "bad": {"$binary": "//4gb2s="}},
    ]  # fmt: skip


def test_d_frame_with_no_pairs_is_an_empty_record() -> None:
    (window,) = feed(w(1, 1) + d(1, {}))
    assert window.records == [{}]


# -- violations ----------------------------------------------------------------

BOMB = zlib.compress(b"\x00" * (64 * 1024 * 1024), 9)  # about 64 KiB
SMALL_BOMB = zlib.compress(b"\x00" * 500_000, 9)  # about 500 bytes
SMALL = {"max_window_size": 10, "max_frame_bytes": 1024, "max_decompressed_bytes": 4096}

VIOLATIONS: dict[str, tuple[bytes, str]] = {
    "unknown frame type": (w(1) + b"2X" + u32(1), "unknown frame type"),
    "unknown version byte": (b"3W" + u32(1), "unknown protocol version"),
    "D frame on a v2 connection": (w(1) + d(1, pairs(1), v=2), "unknown frame type"),
    "J frame on a v1 connection": (w(1, 1) + j(1, rec(1), v=1), "unknown frame type"),
    "v1 frame on a v2 connection": (w(1) + d(1, pairs(1)), "v1 frame on a v2 connection"),
    "v2 frame on a v1 connection": (w(1, 1) + j(1, rec(1)), "v2 frame on a v1 connection"),
    "version mix inside a C frame": (w(1) + c(d(1, pairs(1))), "v1 frame on a v2"),
    "J before any W": (j(1, rec(1)), "outside a window"),
    "D before any W": (d(1, pairs(1)), "outside a window"),
    "v2 data after a complete window without W": (
        w(1) + j(1, rec(1)) + j(2, rec(2)), "outside a window",
    ),
    "v1 data after W 0": (w(0, 1) + d(1, pairs(1)), "outside a window"),
    "W inside an incomplete window": (w(2) + j(1, rec(1)) + w(1), "before the last one"),
    "invalid zlib": (w(1) + c_raw(b"this is not zlib"), "not valid zlib"),
    "truncated zlib stream": (w(1) + c_raw(zlib.compress(j(1, rec(1)))[:-6]), "truncated"),
    "frame cut short inside a C frame": (w(1) + c(j(1, rec(1))[:-3]), "cut short"),
    "header cut short inside a C frame": (w(1) + c(b"2"), "cut short"),
    "invalid JSON": (w(1) + j(1, b'{"a": '), "not valid JSON"),
    "JSON that is not UTF-8": (w(1) + j(1, b'{"a": "\xff"}'), "not valid JSON"),
    "JSON array": (w(1) + j(1, [1, 2]), "not a JSON object"),
    "JSON string": (w(1) + j(1, "text"), "not a JSON object"),
    "JSON null": (w(1) + j(1, None), "not a JSON object"),
    "window over max_window_size": (w(11), "max_window_size=10"),
    "J frame over max_frame_bytes": (w(1) + b"2J" + u32(1) + u32(1025), "max_frame_bytes=1024"),
    "C frame over max_frame_bytes": (w(1) + b"2C" + u32(1025), "max_frame_bytes=1024"),
    "D key over max_frame_bytes": (
        w(1, 1) + b"1D" + u32(1) + u32(1) + u32(2000), "max_frame_bytes=1024",
    ),
    "D frame over max_frame_bytes in total": (
        w(1, 1) + d(1, [(f"k{i}".encode(), b"v" * 100) for i in range(20)]),
        "max_frame_bytes=1024",
    ),
    "incomplete frame buffered past max_frame_bytes": (
        # Each length is within the limit; the frame is not complete, and
        # already longer than the limit: refused before the rest arrives.
        w(1, 1) + b"1D" + u32(1) + u32(1) + u32(1000) + b"k" * 1000 + u32(1000) + b"v" * 100,
        "frame exceeds max_frame_bytes=1024",
    ),
    "decompressed past max_decompressed_bytes": (
        w(1) + c(j(1, {"pad": "x" * 5000})), "max_decompressed_bytes=4096",
    ),
    "zlib bomb": (w(1) + c_raw(SMALL_BOMB), "max_decompressed_bytes=4096"),
    "C frames nested too deep": (
        w(1) + nested(j(1, rec(1)), MAX_COMPRESSION_DEPTH + 1), "nested deeper",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", VIOLATIONS)
def test_violation_ends_the_events_and_closes(name: str) -> None:
    data, reason = VIOLATIONS[name]
    connection = conn(**SMALL)
    assert reason in violation(feed(data, connection=connection)).reason
    assert connection.state is LumberjackState.CLOSED
    with pytest.raises(LocalProtocolError):
        connection.receive_data(b"")


@pytest.mark.parametrize("name", VIOLATIONS)
def test_violation_split_across_two_reads_still_ends_the_events(name: str) -> None:
    data, reason = VIOLATIONS[name]
    for i in range(0, len(data) + 1, max(1, len(data) // 97)):
        connection = conn(**SMALL)
        assert reason in violation(feed(data[:i], data[i:], connection=connection)).reason, (
            f"split at {i}"
        )


def test_windows_before_a_violation_are_returned_before_it() -> None:
    connection = conn()
    good = w(1) + j(1, rec(1)) + w(1) + c(j(2, rec(2)))
    *windows, error = connection.receive_data(good + b"2X\x00\x00")
    assert [win.sequences for win in windows] == [[1], [2]]
    # Acks of the good windows can still be built and sent.
    assert [connection.ack_bytes(win) for win in windows] == [ack(1), ack(2)]
    violation([error], "unknown frame type")
    assert connection.state is LumberjackState.CLOSED
    with pytest.raises(LocalProtocolError):
        connection.receive_data(b"more bytes are never looked at")


def test_violation_inside_a_compressed_frame_after_complete_windows() -> None:
    connection = conn()
    # The state is checked at a data frame's header, so the bad JSON
    # sits in a window of its own (without its W the error would be "outside a window").
    *windows, error = connection.receive_data(c(w(1) + j(1, rec(1)) + w(1) + j(2, b"[not json")))
    assert [win.sequences for win in windows] == [[1]]
    violation([error], "not valid JSON")


def test_json_nested_deeper_than_the_parser_recurses_is_a_protocol_error() -> None:
    # json.loads raises RecursionError here, not ValueError.
    violation(conn().receive_data(w(1) + j(1, b"[" * 100_000)), "not valid JSON")


def test_zlib_bomb_is_stopped_with_bounded_memory() -> None:
    limit = 1024 * 1024
    connection = conn(max_decompressed_bytes=limit)
    stream = w(1) + c_raw(BOMB)  # 64 MiB of zeros in about 64 KiB
    tracemalloc.start()
    try:
        violation(connection.receive_data(stream), "max_decompressed_bytes")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * limit


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_window_size"):
        LumberjackLimits(max_window_size=0)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        LumberjackLimits(max_frame_bytes=0)


def test_exact_limits_are_accepted() -> None:
    record = {"pad": "x" * 100}
    payload = json.dumps(record).encode()
    frames = j(1, payload) + j(2, payload)
    connection = conn(
        max_window_size=2, max_frame_bytes=len(payload), max_decompressed_bytes=len(frames)
    )
    (window,) = feed(w(2) + c_raw(zlib.compress(frames)), connection=connection)
    assert window.records == [record, record]


# -- hypothesis: round trip and fuzz -------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
JSON_RECORDS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4)
PAIR_RECORDS = st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=4)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int, list[tuple[list[int], list[dict[str, Any]]]]]:
    """A connection's bytes: windows numbered across windows, compressed or not."""
    version = draw(st.sampled_from([1, 2]))
    frame: Callable[[int, dict[str, Any]], bytes] = (
        (lambda seq, r: d(seq, r)) if version == 1 else (lambda seq, r: j(seq, r))
    )
    sequence = draw(st.integers(0, 2**32 - 100))
    expected = []
    data = b""
    for records in draw(st.lists(st.lists(JSON_RECORDS if version == 2 else PAIR_RECORDS,
                                          max_size=6), min_size=1, max_size=4)):  # fmt: skip
        sequences = list(range(sequence + 1, sequence + 1 + len(records)))
        sequence += len(records)
        frames = [frame(seq, r) for seq, r in zip(sequences, records, strict=True)]
        how = draw(st.sampled_from(["plain", "one C", "several C", "nested C"]))
        if how == "plain" or not frames:
            body = b"".join(frames)
        elif how == "one C":
            body = c(b"".join(frames), version)
        elif how == "several C":
            cuts = sorted(draw(st.lists(st.integers(0, len(frames)), max_size=3)))
            groups = [frames[a:b] for a, b in zip([0, *cuts], [*cuts, len(frames)], strict=True)]
            body = b"".join(c(b"".join(g), version) for g in groups)
        else:
            body = c(c(b"".join(frames), version), version)
        data += w(len(records), version) + body
        expected.append((sequences, records))
    return data, version, expected


@FAST
@given(streams(), st.data())
def test_generated_windows_round_trip_split_anywhere(
    stream: tuple[bytes, int, list[tuple[list[int], list[dict[str, Any]]]]], data: st.DataObject
) -> None:
    raw, version, expected = stream
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    connection = conn()
    windows = feed(raw[:cut], raw[cut:], connection=connection)
    # A run of W 0 comes out as one window taking one ack per W.
    assert [(s, r) for _, s, r in shape(windows)] == expected
    assert all(win.version == version for win in windows)
    last = 0
    acks = b""
    for sequences, _ in expected:
        last = sequences[-1] if sequences else last
        acks += ack(last, version)
    assert b"".join(connection.ack_bytes(win) for win in windows) == acks


def run_garbage(connection: LumberjackServerConnection, chunks: list[bytes]) -> None:
    for event in feed(*chunks, connection=connection):
        if isinstance(event, ProtocolViolation):
            assert connection.state is LumberjackState.CLOSED
            return
        assert len(event.sequences) == len(event.records)
        connection.ack_bytes(event)
    connection.keepalive_bytes()


@FAST
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_arbitrary_bytes_parse_or_end_in_a_violation(chunks: list[bytes]) -> None:
    run_garbage(conn(**SMALL), chunks)


@FAST
@given(
    st.sampled_from([w(3), w(3, 1), w(2) + j(1, rec(1)), w(1, 1) + b"1C", w(1) + b"2C" + u32(40)]),
    st.lists(st.binary(max_size=48), max_size=4),
    st.booleans(),
)
def test_garbage_after_a_valid_prefix_parses_or_ends_in_a_violation(
    prefix: bytes, chunks: list[bytes], compress: bool
) -> None:
    """Garbage deep inside frames: after a window, inside C payloads."""
    if compress:
        chunks = [zlib.compress(chunk) for chunk in chunks]
    run_garbage(conn(**SMALL), [prefix, *chunks])


# -- reads that cannot finish a frame (LumberjackServerConnection.completes_nothing) ----------


@FAST
@given(streams(), st.integers(1, 40))
def test_a_read_said_to_complete_nothing_completes_nothing(
    stream: tuple[bytes, int, list[tuple[list[int], list[dict[str, Any]]]]], step: int
) -> None:
    """The driver takes such reads without a worker thread: they must yield no window."""
    raw, _, expected = stream
    connection = conn()
    windows: list[Window] = []
    for start in range(0, len(raw), step):
        piece = raw[start : start + step]
        short = connection.completes_nothing(piece)
        events = connection.receive_data(piece)
        if short:
            assert events == []
        windows += [e for e in events if isinstance(e, Window)]
    # The hint changed nothing: every window came out.
    assert [(s, r) for _, s, r in shape(windows)] == expected


def test_the_hint_reads_c_and_j_lengths_and_a_d_frames_pairs_left() -> None:
    body = c(j(1, rec(1)) + j(2, {"pad": "x" * 5000}))
    connection = conn()
    connection.receive_data(w(2) + body[:100])
    assert connection.completes_nothing(body[100:-1])  # one byte short of the C frame
    assert not connection.completes_nothing(body[100:])
    assert len(connection.receive_data(body[100:])) == 1
    # Nothing held: the next frame's own header, at the start of the read.
    plain = j(3, {"pad": "y" * 300})
    connection.receive_data(w(1))
    assert connection.completes_nothing(plain[:200])
    assert not connection.completes_nothing(plain)
    assert not connection.completes_nothing(w(1))  # a W frame completes at once
    # A v1 D frame being scanned: each pair still to come takes 8 bytes or more.
    v1 = conn()
    frame = d(1, {f"k{i}": "v" for i in range(100)})
    v1.receive_data(w(1, 1) + frame[:300])
    assert v1.completes_nothing(frame[300:310])
    assert not v1.completes_nothing(frame[300:])
