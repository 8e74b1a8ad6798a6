"""Hostile Lumberjack (Beats) clients against the running service, next to a good one.

What the codec documents (appliance/protocols/lumberjack/connection.py) and this module holds it to:

* refused (connection closed, a logged reason, the window not acked): a ``J``
  frame that is not valid JSON text (invalid UTF-8, a lone surrogate escape,
  nesting past the parser's limit), ``W`` frames inside a ``C`` frame past
  :data:`MAX_WINDOWS_PER_C_FRAME`, ``C`` frames that cost more items than
  their bytes allow or nest deeper than :data:`MAX_COMPRESSION_DEPTH`, zlib
  output past ``max_decompressed_bytes``, a window over ``max_window_size``
  events or ``max_window_bytes`` bytes, a frame over ``max_frame_bytes``
  (refused from its header), a frame of the other version or of an unknown
  type, a request that does not finish within ``request_timeout_seconds``;
* kept with a fallback (acked, stored once): a tag or host field that is not
  storable text (over its length limit; in v1 ``D`` frames also bytes that
  are not UTF-8) falls back to the listener's tag / a null host; an
  ``@timestamp`` that is not ASCII RFC 3339 inside int64 nanoseconds becomes
  the receive time.
"""

from __future__ import annotations

import json
import ssl
import struct
import zlib
from typing import Any

from appliance import defaults
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES
from appliance.protocols.lumberjack import (
    MAX_COMPRESSION_DEPTH,
    MAX_WINDOWS_PER_C_FRAME,
)
from tests.hostile.case import Case, expect_connection_refused, hostile_case
from tests.hostile.clients import (
    c_frame,
    j_frame,
    peer_name,
    read_lumberjack_acks,
    read_until,
    send_ignoring_close,
    tls_connect,
    w_frame,
)
from tests.hostile.inputs import BAD_TIMESTAMPS, EXTREME_TIMESTAMPS
from tests.hostile.limits import (
    LUMBERJACK_MAX_DECOMPRESSED_BYTES,
    LUMBERJACK_MAX_FRAME_BYTES,
    LUMBERJACK_MAX_WINDOW_SIZE,
    LUMBERJACK_TAG,
    MAX_CONNECTIONS_PER_ADDRESS,
    TRICKLE_LISTENER,
    TRICKLE_REQUEST_TIMEOUT_SECONDS,
)
from tests.hostile.service import CLOSE_EVENTS, HostileService, has_receive_time, record

U32 = struct.Struct(">I")


def ack_sequences(data: bytes) -> list[int]:
    """The sequences of the complete ``A`` frames in ``data``."""
    buffer = bytearray(data[: len(data) // 6 * 6])
    try:
        return [sequence for _, sequence in read_lumberjack_acks(buffer)]
    except AssertionError:
        return [-1]  # not an ack: the test's assertion names it


def d_frame(sequence: int, pairs: dict[bytes, bytes]) -> bytes:
    """A v1 ``D`` frame: sequence, pair count, (length, key, length, value) per pair."""
    body = b"".join(U32.pack(len(k)) + k + U32.pack(len(v)) + v for k, v in pairs.items())
    return b"1D" + U32.pack(sequence) + U32.pack(len(pairs)) + body


def j(sequence: int, event: Any) -> bytes:
    return j_frame(sequence, json.dumps(event).encode())


def connect(case: Case) -> tuple[ssl.SSLSocket, str]:
    sock = tls_connect(case.service, "lumberjack", case.address)
    return sock, peer_name(sock)


def refused(case: Case, data: bytes, what: str = "") -> None:
    """Send ``data`` on a new connection: closed with a logged reason, nothing acked or stored."""
    sock, peer = connect(case)
    send_ignoring_close(sock, data)
    received = case.expect_closed_with_reason(sock, peer, what=what)
    assert [s for s in ack_sequences(received) if s != 0] == [], (what, received[:64])
    case.expect_no_rows = True


def acked(case: Case, data: bytes, sequence: int, version: int = 2) -> None:
    """Send ``data`` (one window); it must be acked with ``sequence``."""
    sock, _ = connect(case)
    try:
        sock.sendall(data)
        received, closed = read_until(sock, lambda got: sequence in ack_sequences(got))
        assert sequence in ack_sequences(received), (received, closed)
    finally:
        sock.close()


def window(events: list[Any]) -> bytes:
    """``2W n`` and a ``2C`` frame of ``n`` J frames, as Filebeat sends."""
    frames = b"".join(j(i + 1, e) for i, e in enumerate(events))
    return w_frame(len(events)) + c_frame(frames)


def by_case(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        number = int(record(row)["case"])
        assert number not in found, f"case {number} stored twice"
        found[number] = row
    return found


# -- times ---------------------------------------------------------------------------

NON_STRING_TIMES: list[Any] = [12345, None, [], {"a": 1}, 1.5e300, True]


def test_unusable_timestamps_are_stored_with_the_receive_time_v2(
    service: HostileService,
) -> None:
    values = [*BAD_TIMESTAMPS, *NON_STRING_TIMES]
    with hostile_case(service, "lumberjack") as case:
        acked(case, window([{"case": i, "@timestamp": v} for i, v in enumerate(values)]),
              len(values))  # fmt: skip
    rows = by_case(case.hostile_rows())
    assert sorted(rows) == list(range(len(values)))
    for i, value in enumerate(values):
        assert has_receive_time(rows[i]), (value, rows[i])
        assert record(rows[i])["@timestamp"] == value


def test_unusable_timestamps_are_stored_with_the_receive_time_v1(
    service: HostileService,
) -> None:
    values = [v for v in BAD_TIMESTAMPS if isinstance(v, str)]
    frames = b"".join(
        d_frame(i + 1, {b"case": str(i).encode(), b"@timestamp": v.encode()})
        for i, v in enumerate(values)
    )
    with hostile_case(service, "lumberjack") as case:
        acked(case, w_frame(len(values), 1) + frames, len(values), version=1)
    rows = by_case(case.hostile_rows())
    assert sorted(rows) == list(range(len(values)))
    for i, value in enumerate(values):
        assert has_receive_time(rows[i]), (value, rows[i])
        assert record(rows[i])["@timestamp"] == value


def test_the_int64_extremes_are_stored_exactly(service: HostileService) -> None:
    events = [{"case": i, "@timestamp": text} for i, (text, _) in enumerate(EXTREME_TIMESTAMPS)]
    with hostile_case(service, "lumberjack") as case:
        acked(case, window(events), len(events))
    rows = by_case(case.hostile_rows())
    for i, (text, ns) in enumerate(EXTREME_TIMESTAMPS):
        assert rows[i]["event_time_ns"] == ns, text


# -- strings ----------------------------------------------------------------------------


def test_too_long_tag_and_host_fall_back(service: HostileService) -> None:
    events = [
        {"case": 0, "@metadata": {"beat": "b" * 1_000_000}},
        {"case": 1, "@metadata": {"beat": "b" * (MAX_TAG_BYTES + 1)}},
        {"case": 2, "type": "t" * (MAX_TAG_BYTES + 1)},
        {"case": 3, "host": {"name": "h" * 1_000_000}},
        {"case": 4, "host": "h" * (MAX_HOST_BYTES + 1)},
        {"case": 5, "@metadata": {"beat": ""}, "host": {"name": ""}},
    ]
    with hostile_case(service, "lumberjack") as case:
        acked(case, window(events), len(events))
    rows = by_case(case.hostile_rows())
    assert [rows[i]["tag"] for i in range(6)] == [LUMBERJACK_TAG] * 6
    assert [rows[i]["host"] for i in range(6)] == [None] * 6


NOT_UTF8 = [b"a\xffb", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]


def test_v1_fields_that_are_not_utf8_fall_back_and_are_kept(service: HostileService) -> None:
    frames = b"".join(
        d_frame(i + 1, {b"case": str(i).encode(), b"type": raw, b"host": raw, b"line": raw,
                        raw: b"key-not-utf8"})
        for i, raw in enumerate(NOT_UTF8)
    )  # fmt: skip
    with hostile_case(service, "lumberjack") as case:
        acked(case, w_frame(len(NOT_UTF8), 1) + frames, len(NOT_UTF8), version=1)
    rows = by_case(case.hostile_rows())
    assert sorted(rows) == list(range(len(NOT_UTF8)))
    for i in range(len(NOT_UTF8)):
        assert rows[i]["tag"] == LUMBERJACK_TAG
        assert rows[i]["host"] is None
        assert "$binary" in json.dumps(record(rows[i])["line"])


BAD_J_PAYLOADS = {
    "invalid UTF-8 in a value": b'{"message":"a\xffb"}',
    "encoded surrogate": b'{"message":"\xed\xa0\x80"}',
    "lone surrogate escape": b'{"message":"\\ud800"}',
    "lone surrogate in the tag": b'{"@metadata":{"beat":"\\ud800"}}',
    "lone surrogate in the host": b'{"host":{"name":"\\udfff"}}',
    "lone surrogate in @timestamp": b'{"@timestamp":"2024-01-01T00:00:00\\ud800Z"}',
    "surrogate pair reversed": b'{"m":"\\udc00\\ud800"}',
    "nested past the parser's limit": b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not JSON": b"{nope",
    "truncated": b'{"message":"x',
}


def test_j_frame_that_is_not_json_text_is_refused(service: HostileService) -> None:
    with hostile_case(service, "lumberjack") as case:
        for name, payload in BAD_J_PAYLOADS.items():
            # Plain and inside a C frame, each on its own connection.
            refused(case, w_frame(1) + j_frame(1, payload), what=name)
            refused(case, w_frame(1) + c_frame(j_frame(1, payload)), what=name + " (in C)")


# -- bombs ----------------------------------------------------------------------------------


def test_empty_windows_inside_a_c_frame_are_refused(service: HostileService) -> None:
    """Once, 8.8 KB of ``W 0`` frames in a C frame made 1,000,000 windows."""
    bomb = c_frame(w_frame(0) * 1_000_000, level=9)
    assert len(bomb) < 16 * 1024
    with hostile_case(service, "lumberjack") as case:
        refused(case, bomb, what="1,000,000 W 0 in C")
        refused(case, c_frame(w_frame(0) * (MAX_WINDOWS_PER_C_FRAME + 1)), what="one too many")


def test_empty_nested_c_frames_are_refused(service: HostileService) -> None:
    """Once, 54 KB of empty nested C frames took 4.8 s."""
    empty_c = b"2C" + U32.pack(len(zlib.compress(b""))) + zlib.compress(b"")
    with hostile_case(service, "lumberjack") as case:
        refused(case, w_frame(1) + c_frame(empty_c * 100_000, level=9), what="siblings")
        nested = j(1, {"deep": 1})
        for _ in range(MAX_COMPRESSION_DEPTH + 2):
            nested = c_frame(nested)
        refused(case, w_frame(1) + nested, what="too deep")


def test_zlib_output_over_max_decompressed_bytes_is_refused(service: HostileService) -> None:
    frame = j(1, {"pad": "x" * (LUMBERJACK_MAX_DECOMPRESSED_BYTES + 1024)})
    with hostile_case(service, "lumberjack") as case:
        refused(case, w_frame(1) + c_frame(frame, level=9))


def test_incomplete_window_past_max_window_bytes_is_refused(service: HostileService) -> None:
    """Once, 100 KB of compressed frames held 200 MiB of an unfinished window."""
    per_frame = 64 * 1024
    frames_per_c = LUMBERJACK_MAX_DECOMPRESSED_BYTES // (per_frame + 64)
    sequence = 0
    data = bytearray(w_frame(LUMBERJACK_MAX_WINDOW_SIZE))
    while (
        sequence * per_frame < defaults.LUMBERJACK_MAX_WINDOW_BYTES + 4 * per_frame * frames_per_c
    ):
        frames = b""
        for _ in range(frames_per_c):
            sequence += 1
            frames += j(sequence, {"pad": "y" * per_frame})
        data += c_frame(frames, level=9)
    assert sequence < LUMBERJACK_MAX_WINDOW_SIZE
    with hostile_case(service, "lumberjack") as case:
        refused(case, bytes(data))


def test_frames_over_the_limits_are_refused_from_their_header(service: HostileService) -> None:
    cases = {
        "window over max_window_size": w_frame(LUMBERJACK_MAX_WINDOW_SIZE + 1),
        "window of 2**32 - 1": w_frame(2**32 - 1),
        "J frame over max_frame_bytes": w_frame(1)
        + b"2J" + U32.pack(1) + U32.pack(LUMBERJACK_MAX_FRAME_BYTES + 1) + b"{" * 1024,
        "C frame over max_frame_bytes": w_frame(1)
        + b"2C" + U32.pack(LUMBERJACK_MAX_FRAME_BYTES + 1) + b"\x78" * 1024,
        "D frame of 2**32 - 1 pairs": w_frame(1, 1) + b"1D" + U32.pack(1) + U32.pack(2**32 - 1)
        + b"\x00" * 1024,
        "D pair key over max_frame_bytes": w_frame(1, 1) + b"1D" + U32.pack(1) + U32.pack(1)
        + U32.pack(LUMBERJACK_MAX_FRAME_BYTES + 1) + b"k" * 1024,
    }  # fmt: skip
    with hostile_case(service, "lumberjack") as case:
        for name, data in cases.items():
            refused(case, data, what=name)


def test_protocol_violations_are_refused(service: HostileService) -> None:
    cases = {
        "unknown frame type": b"2X" + b"\x00" * 32,
        "unknown version": b"3W" + U32.pack(1),
        "v1 frame on a v2 connection": w_frame(1) + d_frame(1, {b"a": b"b"}),
        "J frame outside a window": j(1, {"a": 1}),
        "an ack from the client": b"2A" + U32.pack(1),
        "C frame cut short inside": w_frame(2) + c_frame(j(1, {"a": 1}) + j(2, {"b": 2})[:-3]),
        "corrupt zlib": w_frame(1) + b"2C" + U32.pack(16) + b"\x78\x9c" + b"\xff" * 14,
    }
    with hostile_case(service, "lumberjack") as case:
        for name, data in cases.items():
            refused(case, data, what=name)


# -- slow senders -------------------------------------------------------------------------


def test_large_v1_d_frame_trickled_is_read_once(service: HostileService) -> None:
    """Once, a v1 D frame was parsed again from its first pair on every read.

    About 9,000 TLS records of 64 bytes, each one read: on a busy machine the
    service takes longer to read them than the suite's 2 s request deadline
    (it closed the connection with ``request.timeout`` before the ack), so
    this frame goes to :data:`TRICKLE_LISTENER`, whose deadline is the
    default 60 s. What this test checks is the frame read whole through TLS
    by the real service, acked and stored once. Re-parsing from the first pair
    on every read (about 10^8 pair reads here) is caught by count, not by
    time, in tests/appliance/protocols/test_lumberjack_limits.py.
    """
    pairs = {f"key-{i:05d}".encode(): f"value {i}".encode() for i in range(20_000)}
    pairs[b"case"] = b"0"
    frame = d_frame(1, pairs)
    assert len(frame) < LUMBERJACK_MAX_FRAME_BYTES
    with hostile_case(service, "lumberjack") as case:
        sock = tls_connect(case.service, TRICKLE_LISTENER, case.address)
        peer = peer_name(sock)
        sock.sendall(w_frame(1, 1))
        for start in range(0, len(frame), 64):  # one TLS record (one read) per 64 bytes
            sock.sendall(frame[start : start + 64])
        received, closed = read_until(
            sock, lambda got: 1 in ack_sequences(got), TRICKLE_REQUEST_TIMEOUT_SECONDS
        )
        sock.close()
        assert ack_sequences(received) == [1], (received, closed, case.log_for(peer, CLOSE_EVENTS))
    (row,) = case.hostile_rows()
    assert len(record(row)) == 20_001


def test_request_trickled_a_byte_at_a_time_is_cut_off(service: HostileService) -> None:
    data = w_frame(2) + j(1, {"slow": 1}) + j(2, {"slow": 2, "pad": "z" * 200})
    with hostile_case(service, "lumberjack") as case:
        sock, peer = connect(case)
        for byte in data:  # never finishes within request_timeout_seconds
            if not send_ignoring_close(sock, bytes([byte])):
                break
            received, closed = read_until(sock, lambda got: bool(got), 0.25)
            assert [s for s in ack_sequences(received) if s != 0] == []
            if closed:
                break
        assert case.log_for(peer, {"request.timeout"}) is not None, case.service.log_tail(case.mark)
        sock.close()
        case.expect_no_rows = True


def test_one_address_cannot_hold_more_than_its_connections(service: HostileService) -> None:
    with hostile_case(service, "lumberjack") as case:
        held = [connect(case)[0] for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]
        for sock in held:  # an empty window each: served, so through TLS
            sock.sendall(w_frame(0))
            assert read_until(sock, lambda got: len(got) >= 6)[0] == b"2A" + U32.pack(0)
        for _ in range(3):
            expect_connection_refused(case)
        held[0].sendall(window([{"case": 0, "held": True}]))
        assert 1 in ack_sequences(read_until(held[0], lambda got: 1 in ack_sequences(got))[0])
        for sock in held:
            sock.close()
    assert len(case.hostile_rows()) == 1
