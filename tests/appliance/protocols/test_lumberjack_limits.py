"""The Lumberjack codec against hostile input: bounded work per byte, strict strings, times, acks.

Work is measured by the codec's own counters (length fields read, zlib
streams started, bytes inflated), objects by counting windows and acks, and
memory with tracemalloc: never by wall-clock time. Each hostile input found has
a regression test here that asserts a ``ProtocolViolation`` or clean
handling, and hypothesis checks that hostile frame streams give nothing else.
"""

from __future__ import annotations

import gc
import json
import struct
import tracemalloc
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance import defaults
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES, check_text, is_utf8_text
from appliance.blocks.timefmt import MAX_TIME_NS, MIN_TIME_NS
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.lumberjack import (
    C_FRAME_BASE_ITEMS,
    C_FRAME_ITEMS_PER_BYTE,
    EVENT_OVERHEAD_BYTES,
    MAX_COMPRESSION_DEPTH,
    MAX_WINDOWS_PER_C_FRAME,
    NESTED_C_FRAME_ITEMS,
    WINDOW_MEMORY_FACTOR,
    LumberjackEvent,
    LumberjackLimits,
    LumberjackServerConnection,
    LumberjackState,
    Window,
)
from tests.appliance.protocols.support import feed_reads, violation

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def w(count: int, v: int = 2) -> bytes:
    return f"{v}W".encode() + u32(count)


def j(seq: int, record: Any) -> bytes:
    payload = record if isinstance(record, bytes) else json.dumps(record).encode()
    return b"2J" + u32(seq) + u32(len(payload)) + payload


def d(seq: int, pairs: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(u32(len(k)) + k + u32(len(val)) + val for k, val in pairs)
    return b"1D" + u32(seq) + u32(len(pairs)) + body


def c(frames: bytes, v: int = 2, level: int = 9) -> bytes:
    payload = zlib.compress(frames, level)
    return f"{v}C".encode() + u32(len(payload)) + payload


def ack(seq: int, v: int = 2) -> bytes:
    return f"{v}A".encode() + u32(seq)


def conn(**limits: int) -> LumberjackServerConnection:
    return LumberjackServerConnection(LumberjackLimits(**limits) if limits else None)


def feed_all(connection: LumberjackServerConnection, *chunks: bytes) -> list[LumberjackEvent]:
    """Feed ``chunks``: the windows, and the violation that ends them, if any."""
    return feed_reads(connection.receive_data, chunks)


def budget(compressed: int) -> int:
    return C_FRAME_BASE_ITEMS + C_FRAME_ITEMS_PER_BYTE * compressed


# -- W 0 frames: one object however many, and at most MAX_WINDOWS_PER_C_FRAME in a C ---


def test_w0_frames_inside_a_c_frame_are_capped() -> None:
    # Once, 8.8 KB of C frames holding W 0 frames made 1,000,000 windows.
    one = c(w(0) * 100_000)
    stream = one * 10
    connection = conn()
    *windows, error = connection.receive_data(stream)
    # The W 0 frames before the violation are one object taking their acks.
    assert len(windows) == 1
    assert windows[0].acks == MAX_WINDOWS_PER_C_FRAME
    assert connection.ack_bytes(windows[0]) == ack(0) * MAX_WINDOWS_PER_C_FRAME
    violation([error], f"more than {MAX_WINDOWS_PER_C_FRAME} windows")
    assert connection.fields_read <= MAX_WINDOWS_PER_C_FRAME + 2
    assert connection.streams_inflated == 1


def test_windows_in_a_c_frame_count_nested_ones_too() -> None:
    half = MAX_WINDOWS_PER_C_FRAME // 2
    stream = c(w(0) * half + c(w(0) * (half + 1)))
    connection = conn()
    violation(feed_all(connection, stream), "windows")
    assert connection.streams_inflated == 2


def test_c_frame_with_exactly_the_allowed_windows_is_accepted() -> None:
    stream = c((w(1) + j(1, {})) * (MAX_WINDOWS_PER_C_FRAME - 1) + w(0))
    windows = feed_all(conn(), stream)
    assert sum(win.acks for win in windows) == MAX_WINDOWS_PER_C_FRAME


def test_a_run_of_plain_w0_frames_is_one_window_object() -> None:
    connection = conn()
    windows = connection.receive_data(w(0) * 40_000)
    assert [(win.sequences, win.acks) for win in windows] == [([], 40_000)]
    assert connection.ack_bytes(windows[0]) == ack(0) * 40_000
    assert connection.fields_read == 40_000


def test_w0_runs_keep_their_place_between_windows() -> None:
    connection = conn()
    stream = w(0) * 2 + w(1) + j(7, {}) + w(0) * 3 + w(1) + j(9, {}) + w(0)
    windows = connection.receive_data(stream)
    assert [(win.sequences, win.acks) for win in windows] == [
        ([], 2), ([7], 1), ([], 3), ([9], 1), ([], 1),
    ]  # fmt: skip
    acks = b"".join(connection.ack_bytes(win) for win in windows)
    assert acks == ack(0) * 2 + ack(7) * 4 + ack(9) * 2


def test_w0_frames_before_a_violation_are_returned_and_acked() -> None:
    connection = conn()
    *windows, error = connection.receive_data(w(0) * 3 + b"2X" + u32(0))
    assert [win.acks for win in windows] == [3]
    violation([error], "unknown frame type")


# -- the item budget of a C frame -------------------------------------------------


def test_empty_nested_c_frames_are_bounded_by_the_outer_frames_budget() -> None:
    # Once, 54 KB of empty nested C frames took 4.8 s.
    empty = c(b"")
    stream = w(1) + c(c(c(empty * 200) * 200) * 200)
    connection = conn()
    violation(feed_all(connection, stream), "frames and pairs")
    compressed = len(stream) - 6 - 6
    assert connection.streams_inflated <= budget(compressed) // NESTED_C_FRAME_ITEMS + 2


def test_repeated_empty_frames_in_a_c_frame_stop_at_the_budget() -> None:
    # 100,000 identical J frames compress to a few hundred bytes: an attacker's
    # ratio, refused after the budget, not after 100,000 events.
    stream = w(100_000) + c(j(1, b"{}") * 100_000)
    connection = conn()
    violation(feed_all(connection, stream), "frames and pairs")
    assert connection.fields_read <= 2 * budget(len(stream)) + 4


def test_d_pairs_count_against_the_budget_before_they_are_scanned() -> None:
    frame = d(1, [(b"", b"")] * 1_000_000)  # 8 MB of empty pairs, about 8 KB compressed
    connection = conn()
    violation(feed_all(connection, w(1, 1) + c(frame, v=1)), "frames and pairs")
    assert connection.fields_read == 4  # the C length, W size, D sequence and pair count


@pytest.mark.parametrize("level", [1, 6, 9])
def test_real_clients_windows_fit_the_budget(level: int) -> None:
    """Numbered frames compress to about 2 bytes each at best (the docstring's bench)."""
    tiny = [j(i, b"{}") for i in range(1, 2049)]
    messages = [j(i, {"message": f"m{i}"}) for i in range(1, 2049)]
    pairs = [d(i, [(b"line", b"x"), (b"host", b"web-01")]) for i in range(1, 2049)]
    for version, frames in ((2, tiny), (2, messages), (1, pairs)):
        stream = w(len(frames), version) + c(b"".join(frames), version, level)
        (window,) = feed_all(conn(), stream)
        assert len(window.texts) == 2048


def test_nested_c_frames_share_the_decompressed_limit() -> None:
    # Each inner C frame holds a window of 1 MiB; with a limit per level, 100
    # of them would inflate 100 MiB.
    limit = 4 * 1024 * 1024
    inner = c(w(1) + j(1, b'{"a":"' + b"x" * (1024 * 1024) + b'"}'))
    connection = conn(max_decompressed_bytes=limit)
    violation(feed_all(connection, c(inner * 100)), "max_decompressed_bytes")
    assert connection.bytes_inflated <= limit + 1


def test_depth_limit_still_holds() -> None:
    frames = j(1, {})
    for _ in range(MAX_COMPRESSION_DEPTH + 1):
        frames = c(frames)
    violation(feed_all(conn(), w(1) + frames), "nested deeper")


# -- D frames arriving in pieces: linear, not quadratic ---------------------------


def big_d_frame(pairs: int) -> bytes:
    return d(1, [(f"k{i}".encode(), b"v") for i in range(pairs)])


@pytest.mark.parametrize("piece", [1, 7, 64])
def test_d_frame_in_pieces_is_scanned_once(piece: int) -> None:
    # Once, the frame was parsed again from its first pair on every read.
    pairs = 3000 if piece > 1 else 800
    stream = w(1, 1) + big_d_frame(pairs)
    connection = conn()
    windows: list[Window] = []
    calls = 0
    for i in range(0, len(stream), piece):
        windows += connection.receive_data(stream[i : i + piece])
        calls += 1
    (window,) = windows
    assert window.records == [{f"k{i}": "v" for i in range(pairs)}]
    # Two length fields per pair, plus at most the header and the pair cut
    # short (four fields) again per read: linear, where re-parsing from the
    # first pair would read about pairs * calls fields.
    assert connection.fields_read <= 2 * pairs + 4 * calls + 2


def test_d_frame_split_in_three_anywhere() -> None:
    stream = w(1, 1) + d(3, [(b"a", b"1"), (b"", b""), (b"bc", b"\xff"), (b"host", b"h")])
    expected = [{"a": "1", "": "", "bc": {"$binary": "/w=="}, "host": "h"}]
    for i in range(len(stream) + 1):
        for k in range(i, len(stream) + 1):
            (window,) = feed_all(conn(), stream[:i], stream[i:k], stream[k:])
            assert window.records == expected, (i, k)
            assert window.hosts == ["h"]


# -- the byte limit of a window ---------------------------------------------------


def test_incomplete_window_is_refused_at_max_window_bytes() -> None:
    # Once, 100 KB of compressed frames held 200 MiB in an unfinished window.
    limit = 1024 * 1024
    connection = conn(max_window_bytes=limit)
    one = c(j(1, {"pad": "x" * 300_000}))  # about 300 KB of JSON in under 1 KB
    connection.receive_data(w(100))
    held = [0]
    refused: ProtocolViolation | None = None
    for _ in range(10):
        events = connection.receive_data(one)
        if events and isinstance(events[-1], ProtocolViolation):
            refused = events[-1]
            break
        held.append(connection.buffered_bytes)
    assert refused is not None
    assert f"max_window_bytes={limit}" in refused.reason
    assert len(held) == 4  # three frames of about 300 KB fit in 1 MiB
    assert max(held) <= limit
    assert connection.buffered_bytes == 0  # released on the error


def test_data_frame_past_the_window_limit_is_refused_from_its_header() -> None:
    limit = 1000
    for header in (b"2J" + u32(1) + u32(2000), b"1D" + u32(1) + u32(1) + u32(2000)):
        version = header[0] - ord("0")
        connection = conn(max_window_bytes=limit)
        connection.receive_data(w(1, version))
        violation(connection.receive_data(header), f"max_window_bytes={limit}")


def test_window_bytes_count_every_frame_of_the_window() -> None:
    frame = j(1, {"k": "v" * 80})
    limit = 3 * len(frame)
    (window,) = feed_all(conn(max_window_bytes=limit), w(3) + frame * 3)
    assert window.nbytes == limit
    violation(feed_all(conn(max_window_bytes=limit - 1), w(3) + frame * 3), "max_window_bytes")


def test_d_frames_without_pairs_count_against_the_window_too() -> None:
    (window,) = feed_all(conn(max_window_bytes=30), w(3, 1) + d(1, []) * 3)
    assert window.nbytes == 30
    violation(feed_all(conn(max_window_bytes=29), w(3, 1) + d(1, []) * 3), "max_window_bytes=29")


def test_default_window_byte_limit() -> None:
    assert (
        LumberjackLimits().max_window_bytes
        == defaults.LUMBERJACK_MAX_WINDOW_BYTES
        == 64 * 1024 * 1024
    )
    with pytest.raises(ValueError, match="max_window_bytes"):
        LumberjackLimits(max_window_bytes=0)


MEMORY_SHAPES: dict[str, tuple[int, list[bytes]]] = {
    "empty D frames (10 bytes)": (1, [d(i, []) for i in range(5000)]),
    "empty J objects": (2, [j(i, b"{}") for i in range(5000)]),
    "unique tiny J objects": (2, [j(i, {"a": i}) for i in range(5000)]),
    "unique tag and host": (
        2, [j(i, {"type": f"t{i}", "host": f"h{i}", "@timestamp": "2026-11-22T10:00:07Z"})
            for i in range(5000)],
    ),
    "one astral character in ASCII, tag and host too": (
        2, [j(i, json.dumps({"type": f"{i}" + "a" * 900 + "😀", "host": f"{i}" + "b" * 200 + "😀",
                             "m": "😀"}, ensure_ascii=False).encode()) for i in range(300)],
    ),
    "unique D type and host": (
        1, [d(i, [(b"type", b"t%d" % i), (b"host", b"h%d" % i)]) for i in range(5000)],
    ),
    "typical Beats events": (
        2, [j(i, {"@timestamp": "2026-11-22T10:00:07.123Z", "@metadata": {"beat": "filebeat"},
                  "message": f"GET /index.html 200 {i}", "host": {"name": "web-01"}})
            for i in range(2000)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", MEMORY_SHAPES)
def test_unfinished_window_memory_is_bounded_by_its_bytes(name: str) -> None:
    version, frames = MEMORY_SHAPES[name]
    stream = w(len(frames) + 1, version) + b"".join(frames)  # one event short: unfinished
    connection = conn()
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(0, len(stream), 65536):
            connection.receive_data(stream[i : i + 65536])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    window_bytes = connection.buffered_bytes
    assert window_bytes == len(stream) - 6
    assert held <= WINDOW_MEMORY_FACTOR * window_bytes + EVENT_OVERHEAD_BYTES * len(frames)


# -- buffered_bytes ---------------------------------------------------------------


def test_buffered_bytes_counts_the_unfinished_frame_and_window() -> None:
    frame = j(1, {"m": "x"})
    stream = w(2) + frame + frame + w(0)
    for i in range(len(stream) + 1):
        connection = conn()
        connection.receive_data(stream[:i])
        if i < 6:
            expected = i  # the W frame cut short
        elif i < 6 + 2 * len(frame):
            expected = i - 6  # the window's frames, whole or in part
        else:
            done = i - 6 - 2 * len(frame)  # the window is complete
            expected = done if done < 6 else 0  # then a W 0 cut short, then whole
        assert connection.buffered_bytes == expected, i


def test_buffered_bytes_is_zero_between_windows_and_after_an_error() -> None:
    connection = conn()
    connection.receive_data(w(1) + j(1, {}) + w(1, 2)[:3])
    assert connection.buffered_bytes == 3
    connection.receive_data(w(1)[3:])
    assert connection.buffered_bytes == 0
    connection.receive_data(j(2, {})[:5])
    assert connection.buffered_bytes == 5
    violation(connection.receive_data(b"9" * 20))
    assert connection.buffered_bytes == 0


def test_v1_standing_window_holds_its_events_until_complete() -> None:
    connection = conn()
    frame = d(1, [(b"line", b"x")])
    connection.receive_data(w(2, 1) + frame + frame + frame)
    assert connection.buffered_bytes == len(frame)
    assert connection.state is LumberjackState.IN_WINDOW


# -- strict strings: tag and host from the record ---------------------------------


def one_window(stream: bytes, **kw: Any) -> Window:
    windows = feed_all(LumberjackServerConnection(**kw), stream)
    assert len(windows) == 1
    return windows[0]


def test_tag_and_host_at_their_limits_are_kept_and_past_them_counted() -> None:
    records = [
        {"type": "t" * MAX_TAG_BYTES, "host": "h" * MAX_HOST_BYTES},
        {"type": "t" * (MAX_TAG_BYTES + 1), "host": "h" * (MAX_HOST_BYTES + 1)},
        # 342 characters of 3 bytes: under the limit in characters, over in bytes.
        {"@metadata": {"beat": "€" * 342}, "type": "later", "host": {"name": "é" * 128}},
        {"@metadata": {"beat": "€" * 341}, "host": {"name": "é" * 127}},
    ]
    stream = w(4) + b"".join(j(i, r) for i, r in enumerate(records, 1))
    window = one_window(stream)
    assert window.tags == ["t" * MAX_TAG_BYTES, None, None, "€" * 341]
    assert window.hosts == ["h" * MAX_HOST_BYTES, None, None, "é" * 127]
    assert (window.invalid_tags, window.invalid_hosts) == (2, 2)
    # The records themselves are kept whole.
    assert window.records == records


def test_tag_fields_are_the_connections_own() -> None:
    stream = w(2) + j(1, {"fields": {"app": "billing"}, "type": "log"}) + j(2, {"type": "log"})
    window = one_window(stream, tag_fields=["fields.app"])
    assert window.tags == ["billing", None]


def test_a_lone_surrogate_escape_in_json_is_a_protocol_error() -> None:
    # Once, a lone surrogate reached Arrow and ended the process.
    for payload in (b'{"type": "\\ud800"}', b'{"host": {"name": "a\\udfffb"}}', b'{"\\ud800": 1}'):
        violation(feed_all(conn(), w(1) + j(1, payload)), "not valid JSON")


def test_d_values_that_are_not_utf8_are_binary_and_never_tag_or_host() -> None:
    pairs = [
        (b"type", b"sys\xfflog"),
        (b"host", b"\xed\xa0\x80"),  # a UTF-8-encoded surrogate: not UTF-8
        (b"@timestamp", b"2026-11-22T10:00:07\xffZ"),
        (b"\xffkey", b"ok"),
        (b"line", "caf\u00e9".encode("latin-1")),
    ]
    window = one_window(w(1, 1) + d(5, pairs))
    assert window.tags == [None]
    assert window.hosts == [None]
    assert window.times_ns == [None]
    (text,) = window.texts
    assert is_utf8_text(text)
    assert json.loads(text) == {
        "type": {"$binary": "c3lz/2xvZw=="},
        "host": {"$binary": "7aCA"},
        "@timestamp": {"$binary": "MjAyNi0xMS0yMlQxMDowMDowN/9a"},
        "\\xffkey": "ok",
        "line": {"$binary": "Y2Fm6Q=="},
    }


def test_d_pairs_give_tag_host_and_time() -> None:
    pairs = [(b"type", b"nodelog"), (b"host", b"lj-1"), (b"@timestamp", b"2026-11-22T10:00:07Z")]
    window = one_window(w(1, 1) + d(1, pairs))
    assert (window.tags, window.hosts, window.times_ns) == (
        ["nodelog"], ["lj-1"], [1795341607 * 10**9],
    )  # fmt: skip


def test_repeated_tag_and_host_strings_are_shared() -> None:
    record = {"@metadata": {"beat": "filebeat"}, "host": {"name": "web-01"}}
    window = one_window(w(3) + j(1, record) + j(2, record) + j(3, record))
    assert window.tags[0] is window.tags[1] is window.tags[2]
    assert window.hosts[0] is window.hosts[2]


# -- times ------------------------------------------------------------------------

TIMES: dict[str, tuple[Any, int | None]] = {
    "superscript two in the fraction": ("2026-11-22T10:00:07.\u00b2Z", None),
    "superscript after a digit": ("2026-11-22T10:00:07.1\u00b2Z", None),
    "Arabic-Indic year": ("\u0662\u0660\u0662\u0666-11-22T10:00:07Z", None),
    "Arabic-Indic fraction digit": ("2026-11-22T10:00:07.1\u0663Z", None),
    "fullwidth digit": ("2026-11-22T10:00:0\uff17Z", None),
    "Go zero time": ("0001-01-01T00:00:00Z", None),
    "year 1 with an offset": ("0001-01-01T00:00:00+14:00", None),
    "year 9999 minus 14 h": ("9999-12-31T23:59:59-14:00", None),
    "year 9999 plus 14 h": ("9999-12-31T23:59:59+14:00", None),
    "year 9999 UTC": ("9999-12-31T23:59:59.999999999Z", None),
    "last int64 instant": ("2262-04-11T23:47:16.854775807Z", MAX_TIME_NS),
    "one past it": ("2262-04-11T23:47:16.854775808Z", None),
    "first int64 instant": ("1677-09-21T00:12:43.145224192Z", MIN_TIME_NS),
    "one before it": ("1677-09-21T00:12:43.145224191Z", None),
    "epoch seconds as a number": (1795341607, None),
    "a float": (1795341607.5, None),
    "a list": (["2026-11-22T10:00:07Z"], None),
    "an object": ({"$date": "2026-11-22T10:00:07Z"}, None),
    "null": (None, None),
    "true": (True, None),
    "a huge integer": (10**30, None),
    "a normal time": ("2026-11-22T10:00:07.5Z", 1795341607_500_000_000),
}


@pytest.mark.parametrize("name", TIMES)
def test_timestamp_is_kept_only_when_int64_ns_holds_it(name: str) -> None:
    value, expected = TIMES[name]
    record = {"@timestamp": value, "message": "kept"}
    window = one_window(w(1) + j(1, record))
    assert window.times_ns == [expected]
    assert [json.loads(text) for text in window.texts] == [record]


def test_timestamps_in_d_frames_follow_the_same_rule() -> None:
    values = [t for t, _ in TIMES.values() if isinstance(t, str)]
    stream = w(len(values), 1) + b"".join(
        d(i, [(b"@timestamp", t.encode())]) for i, t in enumerate(values)
    )
    window = one_window(stream)
    assert window.times_ns == [e for t, e in TIMES.values() if isinstance(t, str)]


# -- acks: the highest sequence of the window -------------------------------------


@pytest.mark.parametrize(
    ("sequences", "highest"),
    [
        ([1, 2, 3], 3),
        ([5, 3, 9, 1], 9),  # backwards: still the highest, not the last (1)
        ([2**32 - 2, 2**32 - 1, 0, 1], 2**32 - 1),  # wraps: the highest before the wrap
        ([7], 7),
        ([0, 0], 0),
    ],
)
@pytest.mark.parametrize("version", [1, 2])
def test_ack_carries_the_highest_sequence(sequences: list[int], highest: int, version: int) -> None:
    frames = b"".join(d(s, [(b"n", b"1")]) if version == 1 else j(s, {}) for s in sequences)
    connection = conn()
    (window, empty) = feed_all(connection, w(len(sequences), version) + frames + w(0, version))
    assert window.highest_sequence == highest
    assert window.last_sequence == sequences[-1]
    assert connection.ack_bytes(window) == ack(highest, version)
    # An empty window after it, and v1's keepalive, repeat the highest.
    assert connection.ack_bytes(empty) == ack(highest, version)
    if version == 1:
        assert connection.keepalive_bytes() == ack(highest, 1)


def test_ack_bytes_for_keeps_only_two_numbers() -> None:
    connection = conn()
    connection.receive_data(w(1))
    assert connection.ack_bytes_for(None, 3) == ack(0) * 3
    assert connection.ack_bytes_for(12) == ack(12)
    assert connection.ack_bytes_for(None, 2) == ack(12) * 2


# -- hostile streams: a ProtocolViolation or clean windows, nothing else ----------

SMALL = {"max_window_size": 50, "max_frame_bytes": 4096, "max_decompressed_bytes": 65536,
         "max_window_bytes": 8192}  # fmt: skip


HOSTILE_JSON = [
    b"{}",
    b'{"type":"\\ud800"}',
    b"[]",
    b'{"@timestamp":"0001-01-01T00:00:00Z"}',
    b'{"@timestamp":"2026-11-22T10:00:07.\xc2\xb2Z"}',
    b"{",
    b'{"a":"\xff"}',
    json.dumps({"type": "t" * 1100}).encode(),
]


@st.composite
def hostile_frames(draw: st.DrawFn, depth: int = 0) -> bytes:
    version = draw(st.sampled_from([b"1", b"2"]))
    kind = draw(
        st.sampled_from([b"W", b"D", b"J", b"C", b"A", b"X"] if depth < 3 else [b"W", b"J"])
    )
    if kind == b"W":
        return version + kind + u32(draw(st.sampled_from([0, 1, 2, 3, 2**32 - 1])))
    seq = u32(draw(st.sampled_from([0, 1, 2**31, 2**32 - 1])))
    if kind == b"D":
        pairs = draw(st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)), max_size=4))
        count = draw(st.sampled_from([len(pairs), len(pairs) + 1, 2**32 - 1]))
        body = b"".join(u32(len(k)) + k + u32(len(v)) + v for k, v in pairs)
        return version + kind + seq + u32(count) + body
    if kind == b"J":
        payload = draw(st.sampled_from(HOSTILE_JSON))
        length = draw(st.sampled_from([len(payload), len(payload) + 3, 2**32 - 1]))
        return version + kind + seq + u32(length) + payload
    if kind == b"C":
        inner = b"".join(draw(st.lists(hostile_frames(depth + 1), max_size=4)))
        payload = zlib.compress(inner * draw(st.sampled_from([1, 2, 50])))
        if draw(st.booleans()):
            payload = payload[: draw(st.integers(0, len(payload)))]
        return version + kind + u32(len(payload)) + payload
    return version + kind + seq


@FAST
@given(st.lists(hostile_frames(), max_size=8), st.data())
def test_hostile_frame_streams_give_only_windows_or_a_violation(
    frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=3), label="cuts"))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    connection = conn(**SMALL)
    windows = feed_all(connection, *pieces)
    if windows and isinstance(windows[-1], ProtocolViolation):
        assert connection.state is LumberjackState.CLOSED
        assert connection.buffered_bytes == 0
        return
    for window in windows:
        assert isinstance(window, Window)
        assert len(window.texts) == len(window.sequences) == len(window.tags)
        assert all(is_utf8_text(text) for text in window.texts)
        for tag in window.tags:
            assert tag is None or check_text(tag, "tag", MAX_TAG_BYTES)
        for host in window.hosts:
            assert host is None or check_text(host, "host", MAX_HOST_BYTES)
        assert all(t is None or MIN_TIME_NS <= t <= MAX_TIME_NS for t in window.times_ns)
        connection.ack_bytes(window)
    # Work stays linear in what was sent (every field read is at least 4 bytes
    # of input, or of output inflated within the C frame budgets).
    inflated = connection.bytes_inflated
    assert connection.fields_read <= (len(stream) + inflated) // 4 + 2 * len(pieces) + 2


# -- a J frame is one record (docs/limits.md, "bytes of one record", "values in one record") --


def test_a_j_frame_over_the_record_bytes_is_refused_from_its_length_field() -> None:
    # Only the header is sent: the frame is refused before its bytes are waited for.
    header = b"2J" + u32(1) + u32(defaults.RECORD_MAX_BYTES + 1)
    codec = LumberjackServerConnection(LumberjackLimits(max_frame_bytes=64 << 20))
    violation(codec.receive_data(w(1) + header), r"over the record limit of 16777216")


def test_a_j_frame_of_more_objects_and_arrays_than_a_record_may_hold_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(defaults, "RECORD_MAX_VALUES", 1000)
    within = {"a": [[] for _ in range(990)]}
    over = {"a": [[] for _ in range(1000)]}
    windows = LumberjackServerConnection().receive_data(w(1) + j(1, within))
    assert [type(e) for e in windows] == [Window]
    events = LumberjackServerConnection().receive_data(w(1) + j(1, over))
    violation(events, r"J frame 1 holds more than 1000 JSON objects and arrays")
