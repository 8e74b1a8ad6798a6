"""Hostile Fluentd forward clients against the running service, next to a good one.

What the codec documents (appliance/protocols/forward/connection.py, docs/forward.md) and
this module holds it to:

* refused (the connection is closed, a reason is logged, nothing is acked or
  stored): a tag that is not valid UTF-8 or is over ``MAX_TAG_BYTES``, a chunk
  id that is empty, too long or (JSON form) a lone surrogate, a request over
  ``max_request_bytes`` or whose entries inflate past
  ``max_decompressed_bytes``, an entries stream that cannot be read (corrupt,
  or gzip without ``compressed``), anything but a PING before the PONG (and
  no more than a PING's worth of bytes), a request that does not finish
  within ``request_timeout_seconds``;
* dropped per event (the chunk is acked, its other events are stored): an
  entry whose time is outside int64 nanoseconds or not a time at all.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES
from tests.hostile.case import Case, expect_connection_refused, hostile_case
from tests.hostile.clients import (
    forward_login,
    peer_name,
    read_until,
    send_ignoring_close,
    sha512_hex,
    tls_connect,
)
from tests.hostile.limits import (
    FORWARD_MAX_DECOMPRESSED_BYTES,
    FORWARD_MAX_REQUEST_BYTES,
    MAX_CONNECTIONS_PER_ADDRESS,
    next_address,
)
from tests.hostile.service import HostileService, record, rows_from

# -- msgpack by hand (a str that is not UTF-8 cannot be packed from Python) ---------


def pack(value: Any) -> bytes:
    """``msgpack.packb``, typed."""
    data: bytes = msgpack.packb(value)
    return data


def mp_str(raw: bytes) -> bytes:
    """A msgpack str holding exactly ``raw``."""
    n = len(raw)
    if n < 32:
        return bytes([0xA0 | n]) + raw
    if n < 256:
        return b"\xd9" + bytes([n]) + raw
    if n < 65536:
        return b"\xda" + struct.pack(">H", n) + raw
    return b"\xdb" + struct.pack(">I", n) + raw


def event_time(ns: int | None = None) -> msgpack.ExtType:
    ns = time.time_ns() if ns is None else ns
    return msgpack.ExtType(0, struct.pack(">II", ns // 10**9, ns % 10**9))


def entries(records: list[Any], when: Any = None) -> bytes:
    """A PackedForward entries stream of ``[time, record]``."""
    stamp = event_time() if when is None else when
    return b"".join(pack([stamp, r]) for r in records)


def packed(tag: bytes, stream: bytes, option: dict[str, Any]) -> bytes:
    """``[tag, entries(bin), option]`` with the tag's bytes as given."""
    return b"\x93" + mp_str(tag) + pack(stream) + pack(option)


def chunk_id() -> str:
    return f"hostile-{os.urandom(6).hex()}"


def acks(data: bytes) -> list[Any]:
    """Every msgpack (or JSON) answer in ``data``."""
    if data[:1] == b"{":
        return [json.loads(line) for line in data.decode().replace("}{", "}\n{").splitlines()]
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    try:
        return list(unpacker)
    except ValueError:
        return ["<unreadable answer>"]


def connect(case: Case, listener: str = "forward") -> tuple[ssl.SSLSocket, str]:
    sock = tls_connect(case.service, listener, case.address)
    return sock, peer_name(sock)


def refused(case: Case, data: bytes, listener: str = "forward", what: str = "") -> list[Any]:
    """Send ``data`` on a new connection: closed with a logged reason, nothing acked or stored."""
    sock, peer = connect(case, listener)
    if listener == "forward_secure":
        forward_login(sock, case.service.creds.shared_key)
    send_ignoring_close(sock, data)
    received = case.expect_closed_with_reason(sock, peer, what=what)
    answers = acks(received)
    assert not [a for a in answers if isinstance(a, dict) and "ack" in a], (what, answers)
    case.expect_no_rows = True
    return answers


def acked(case: Case, data: bytes, chunk: Any) -> None:
    """Send ``data``; it must be acked with ``chunk``."""
    sock, _ = connect(case)
    try:
        sock.sendall(data)
        received, closed = read_until(sock, lambda got: bool(acks(got)))
        assert acks(received) == [{"ack": chunk}], (received, closed)
    finally:
        sock.close()


# -- strings -------------------------------------------------------------------------

BAD_TAGS = {
    "a\\xffb": b"a\xffb",
    "lone continuation": b"\x80",
    "truncated two-byte": b"\xc3\x28",
    "encoded surrogate": b"\xed\xa0\x80",
    "overlong slash": b"\xc0\xaf",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
    "one byte over the limit": b"t" * (MAX_TAG_BYTES + 1),
    "1 MB": b"t" * 1_000_000,
}


def bad_tag_request(tag: bytes, mode: str) -> bytes:
    option: dict[str, Any] = {"chunk": chunk_id()}
    records = [{"hostile": "tag", "i": i} for i in range(3000 if len(tag) > 1024 else 2)]
    if mode == "message":
        return b"\x94" + mp_str(tag) + pack([event_time(), records[0], option])[1:]
    if mode == "forward":
        arr = pack([[event_time(), r] for r in records])
        return b"\x93" + mp_str(tag) + arr + pack(option)
    if mode == "packed":
        return packed(tag, entries(records), option)
    option["compressed"] = "gzip"
    return packed(tag, gzip.compress(entries(records)), option)


@pytest.mark.parametrize("mode", ["message", "forward", "packed", "compressed"])
def test_tag_that_is_not_storable_text_is_refused(service: HostileService, mode: str) -> None:
    """Each of BAD_TAGS on its own connection, with a few thousand events when it is long."""
    with hostile_case(service, "forward") as case:
        for name, tag in BAD_TAGS.items():
            refused(case, bad_tag_request(tag, mode), what=name)


def test_tag_of_exactly_max_tag_bytes_is_stored(service: HostileService) -> None:
    tag = "t" * MAX_TAG_BYTES
    chunk = chunk_id()
    with hostile_case(service, "forward") as case:
        acked(case, pack([tag, entries([{"ok": 1}]), {"chunk": chunk}]), chunk)
    assert [r["tag"] for r in case.hostile_rows()] == [tag]


JSON_BAD = {
    "tag lone high surrogate": '["\\ud800", 1700000000, {"a": 1}, {"chunk": "c-%s"}]',
    "tag lone low surrogate": '["\\udfff", 1700000000, {"a": 1}, {"chunk": "c-%s"}]',
    "tag reversed pair": '["\\udc00\\ud800", 1700000000, {"a": 1}, {"chunk": "c-%s"}]',
    "chunk lone surrogate": '["json.tag", 1700000000, {"a": 1}, {"chunk": "\\ud800-%s"}]',
    "tag 1 MB": '["' + "t" * 1_000_000 + '", 1700000000, {"a": 1}, {"chunk": "c-%s"}]',
    "chunk 1 MB": '["json.tag", 1700000000, {"a": 1}, {"chunk": "' + "c" * 1_000_000 + '%s"}]',
    "chunk empty": '["json.tag", 1700000000, {"a": 1}, {"chunk": ""}]',
}


def test_json_form_with_unstorable_text_is_refused(service: HostileService) -> None:
    with hostile_case(service, "forward") as case:
        for name, template in JSON_BAD.items():
            text = template % os.urandom(4).hex() if "%s" in template else template
            refused(case, text.encode(), what=name)


def test_json_form_record_with_a_lone_surrogate_is_stored_as_valid_text(
    service: HostileService,
) -> None:
    chunk = f"c-{os.urandom(4).hex()}"
    text = '["json.tag", 1700000000, {"msg": "a\\ud800b"}, {"chunk": "' + chunk + '"}]'
    with hostile_case(service, "forward") as case:
        sock, _ = connect(case)
        sock.sendall(text.encode())
        received, _ = read_until(sock, lambda got: b"}" in got)
        sock.close()
    rows = case.hostile_rows()
    # Either stored (the record's text is valid UTF-8 by construction) or refused.
    if b'"ack"' in received:
        assert json.loads(received) == {"ack": chunk}
        assert len(rows) == 1
        row_record = record(rows[0])
        assert row_record["msg"] != "a\ud800b"
        rows[0]["record"].encode("utf-8")  # strict: no lone surrogate
    else:
        assert rows == []


BAD_CHUNKS = {
    "empty str": "",
    "empty bin": b"",
    "one byte over": "c" * (MAX_BATCH_ID_BYTES + 1),
    "1 MB str": "c" * 1_000_000,
    "1 MB bin": b"\xff" * 1_000_000,
    "binary too long for hex": b"\xff" * ((MAX_BATCH_ID_BYTES - 4) // 2 + 1),
    "a number": 12345,
    "a map": {"a": 1},
}


def test_chunk_id_that_cannot_be_a_batch_id_is_refused(service: HostileService) -> None:
    records = [{"hostile": "chunk", "i": i} for i in range(3000)]
    with hostile_case(service, "forward") as case:
        for name, chunk in BAD_CHUNKS.items():
            data = pack(["chunk.tag", entries(records), {"chunk": chunk}])
            refused(case, data, what=name)


def test_binary_chunk_id_is_acked_byte_exact_and_stored_as_hex(service: HostileService) -> None:
    chunk = b"\xff\x00" + os.urandom(14)
    with hostile_case(service, "forward") as case:
        sock, _ = connect(case)
        sock.sendall(pack(["bin.chunk", entries([{"b": 1}]), {"chunk": chunk}]))
        received, _ = read_until(sock, lambda got: bool(acks(got)))
        sock.close()
        unpacker = msgpack.Unpacker(raw=True)
        unpacker.feed(received)
        assert list(unpacker) == [{b"ack": chunk}]
    (row,) = case.hostile_rows()
    assert row["batch_id"] == "hex:" + chunk.hex()


# -- times ---------------------------------------------------------------------------

BAD_TIMES = {
    "int 2**62 s": 2**62,
    "int -2**62 s": -(2**62),
    "int 2**63 - 1 s": 2**63 - 1,
    "float 1e300": 1e300,
    "float nan": float("nan"),
    "float inf": float("inf"),
    "float -inf": float("-inf"),
    "uint64 max": 2**64 - 1,
    "string with superscript": "2024-01-01T00:00:0\u00b2Z",
    "string Go zero time": "0001-01-01T00:00:00Z",
    "EventTime nanoseconds over 1e9": msgpack.ExtType(0, struct.pack(">II", 1, 10**9)),
    "EventTime of 12 bytes": msgpack.ExtType(0, b"\x00" * 12),
    "other ext": msgpack.ExtType(5, b"\x00" * 8),
    "a map": {"t": 1},
    "Fluent Bit form with a bad time": [2**62, {}],
}


def test_events_with_an_unusable_time_are_dropped_and_the_rest_stored(
    service: HostileService,
) -> None:
    """One request: every time of BAD_TIMES, each between two good entries."""
    chunk = chunk_id()
    stream = entries([{"kept": 0}])
    for i, when in enumerate(BAD_TIMES.values(), start=1):
        stream += pack([when, {"dropped": i}]) + entries([{"kept": i}])
    with hostile_case(service, "forward") as case:
        acked(case, pack(["time.tag", stream, {"chunk": chunk}]), chunk)
        line = case.service.wait_log(case.mark, lambda f: f.get("event") == "events.dropped")
        assert line is not None
    kept = sorted(record(r).get("kept") for r in case.hostile_rows())
    assert kept == list(range(len(BAD_TIMES) + 1))


# -- the PackedForward fast path (appliance/protocols/forward/fast.py) ----------------


def test_records_the_fast_path_declines_are_stored_by_the_convention(
    service: HostileService,
) -> None:
    """A chunk with ``size`` whose records hold what msgspec and orjson would read otherwise.

    msgspec turns a msgpack timestamp into a datetime, and orjson would
    write it as an ISO string; the stored records must follow the record
    convention (docs/table.md#records-as-json) as without the fast path.
    """
    chunk = chunk_id()
    timestamp = msgpack.Timestamp(1, 5)
    odd = [
        {"plain": "first"},
        {"t": timestamp},
        {"b": b"\xff"},
        {1: "int key"},
        {"x": msgpack.ExtType(5, b"ab")},
        {"plain": "last"},
    ]
    stream = b"".join(msgpack.packb([event_time(), r], datetime=False) for r in odd)
    with hostile_case(service, "forward") as case:
        acked(case, pack(["fast.tag", stream, {"chunk": chunk, "size": len(odd)}]), chunk)
    stored = [record(r) for r in case.hostile_rows()]
    stamp = base64.b64encode(timestamp.to_bytes()).decode()
    for expected in [
        {"plain": "first"},
        {"t": {"$ext": -1, "$binary": stamp}},
        {"b": {"$binary": "/w=="}},
        {"1": "int key"},
        {"x": {"$ext": 5, "$binary": "YWI="}},
        {"plain": "last"},
    ]:
        assert expected in stored, (expected, stored)
    assert len(stored) == len(odd)


@pytest.mark.parametrize("lie", [-1, 1, 1000])
def test_a_size_that_lies_stores_every_entry(service: HostileService, lie: int) -> None:
    """``size`` is only a hint: a wrong one makes the general path read the stream."""
    chunk = chunk_id()
    stream = entries([{"n": i} for i in range(5)])
    with hostile_case(service, "forward") as case:
        acked(case, pack(["size.tag", stream, {"chunk": chunk, "size": 5 + lie}]), chunk)
    assert sorted(record(r)["n"] for r in case.hostile_rows()) == list(range(5))


# -- sizes and bombs ------------------------------------------------------------------


def test_request_over_max_request_bytes_is_refused(service: HostileService) -> None:
    header = b"\x93" + mp_str(b"big") + b"\xc6" + struct.pack(">I", FORWARD_MAX_REQUEST_BYTES)
    with hostile_case(service, "forward") as case:
        refused(case, header + b"\x00" * 65536)


def test_gzip_over_max_decompressed_bytes_is_refused(service: HostileService) -> None:
    stream = entries([{"pad": "x" * 1000}] * (FORWARD_MAX_DECOMPRESSED_BYTES // 1000 + 64))
    data = pack(["bomb", gzip.compress(stream, 9), {"chunk": chunk_id(), "compressed": "gzip"}])
    with hostile_case(service, "forward") as case:
        refused(case, data)


def test_many_empty_gzip_members_cost_no_more_than_their_bytes(service: HostileService) -> None:
    """1.5 MiB of empty gzip members (about 75,000): linear work, nothing stored."""
    member = gzip.compress(b"")
    body = member * (3 * FORWARD_MAX_REQUEST_BYTES // 4 // len(member))
    chunk = chunk_id()
    data = pack(["members", body, {"chunk": chunk, "compressed": "gzip"}])
    with hostile_case(service, "forward") as case:
        sock, peer = connect(case)
        sock.sendall(data)
        received, closed = read_until(sock, lambda got: bool(acks(got)))
        sock.close()
        if not closed:  # an empty but readable stream may be acked (no events)
            assert acks(received) == [{"ack": chunk}]
        else:
            assert case.log_for(peer, {"protocol.error"}) is not None
        case.expect_no_rows = True


def test_members_with_entries_between_empty_ones_are_all_read(service: HostileService) -> None:
    member = gzip.compress(b"")
    chunk = chunk_id()
    body = member * 1000 + gzip.compress(entries([{"m": 1}])) + member * 1000
    body += gzip.compress(entries([{"m": 2}]))
    data = pack(["members", body, {"chunk": chunk, "compressed": "gzip"}])
    with hostile_case(service, "forward") as case:
        acked(case, data, chunk)
    assert sorted(record(r)["m"] for r in case.hostile_rows()) == [1, 2]


def test_gzip_of_millions_of_empty_maps_stores_nothing(service: HostileService) -> None:
    """A few KB of gzip inflating to 2 million empty maps (not ``[time, record]`` entries)."""
    body = gzip.compress(b"\x80" * (FORWARD_MAX_DECOMPRESSED_BYTES - 4096), 9)
    assert len(body) < 8192
    chunk = chunk_id()
    data = pack(["maps", body, {"chunk": chunk, "compressed": "gzip"}])
    with hostile_case(service, "forward") as case:
        sock, peer = connect(case)
        sock.sendall(data)
        received, closed = read_until(sock, lambda got: bool(acks(got)))
        sock.close()
        if not closed:  # every entry dropped and counted, or refused: never stored
            assert acks(received) == [{"ack": chunk}]
        else:
            assert case.log_for(peer, {"protocol.error"}) is not None
        case.expect_no_rows = True


def test_record_of_a_million_empty_maps_is_stored_once(service: HostileService) -> None:
    chunk = chunk_id()
    # {"a": [{}, {}, ...]}: a valid record, 1 MB of msgpack.
    record_bytes = b"\x81\xa1a\xdd" + struct.pack(">I", 1_000_000) + b"\x80" * 1_000_000
    data = b"\x94" + mp_str(b"maps") + pack(event_time()) + record_bytes
    data += pack({"chunk": chunk})
    with hostile_case(service, "forward") as case:
        acked(case, data, chunk)
    rows = case.hostile_rows()
    assert len(rows) == 1
    assert len(record(rows[0])["a"]) == 1_000_000


def test_deeply_nested_arrays_are_refused(service: HostileService) -> None:
    depth = 100_000
    record_bytes = b"\x81\xa1a" + b"\x91" * depth + b"\xc0"
    data = b"\x94" + mp_str(b"deep") + pack(event_time()) + record_bytes
    data += pack({"chunk": chunk_id()})
    with hostile_case(service, "forward") as case:
        refused(case, data)


def test_deeply_nested_json_is_refused(service: HostileService) -> None:
    depth = 100_000
    text = '["deep", 1700000000, {"a": ' + "[" * depth + "]" * depth + '}, {"chunk": "d"}]'
    with hostile_case(service, "forward") as case:
        refused(case, text.encode())


UNREADABLE: dict[str, Callable[[], bytes]] = {
    "gzip without compressed": lambda: pack(
        ["t", gzip.compress(entries([{"a": 1}] * 100)), {"chunk": chunk_id()}]
    ),
    "corrupt byte midway": lambda: pack(
        ["t", corrupt(entries([{"a": i} for i in range(100)])), {"chunk": chunk_id()}]
    ),
    "ends inside an entry": lambda: pack(
        ["t", entries([{"a": 1}] * 10)[:-3], {"chunk": chunk_id()}]
    ),
    "corrupt gzip": lambda: pack(
        [
            "t",
            corrupt(gzip.compress(entries([{"a": 1}] * 100))),
            {"chunk": chunk_id(), "compressed": "gzip"},
        ]
    ),
    "truncated gzip": lambda: pack(
        [
            "t",
            gzip.compress(entries([{"a": 1}] * 100))[:-10],
            {"chunk": chunk_id(), "compressed": "gzip"},
        ]
    ),
    "unsupported compression": lambda: pack(
        ["t", entries([{"a": 1}]), {"chunk": chunk_id(), "compressed": "lz4"}]
    ),
}


def corrupt(data: bytes) -> bytes:
    broken = bytearray(data)
    broken[len(broken) // 2] = 0xC1  # never used in msgpack; not the gzip byte either
    return bytes(broken)


def test_unreadable_entries_are_refused_not_acked(service: HostileService) -> None:
    with hostile_case(service, "forward") as case:
        for name, make in UNREADABLE.items():
            refused(case, make(), what=name)


# -- the handshake -------------------------------------------------------------------------


def ping(creds_key: str, nonce: bytes, hostname: bytes = b"evil") -> bytes:
    salt = os.urandom(16).hex().encode()
    digest = sha512_hex(salt, hostname, nonce, creds_key.encode())
    return (
        b"\x96"
        + pack("PING")
        + mp_str(hostname)
        + pack(salt)
        + (pack(digest) + pack("") + pack(""))
    )


def read_helo(sock: ssl.SSLSocket) -> bytes:
    received, _ = read_until(sock, lambda got: bool(acks(got)))
    helo = acks(received)[0]
    assert helo[0] == "HELO"
    return bytes(helo[1]["nonce"])


def test_ping_followed_by_more_than_max_request_bytes_is_refused(
    service: HostileService,
) -> None:
    junk = pack(["t", b"\x00" * (FORWARD_MAX_REQUEST_BYTES + 1024), {"chunk": "x"}])
    with hostile_case(service, "forward_secure") as case:
        for key in (case.service.creds.shared_key, "wrong"):
            sock, peer = connect(case, "forward_secure")
            nonce = read_helo(sock)
            send_ignoring_close(sock, ping(key, nonce) + junk)
            received = case.expect_closed_with_reason(sock, peer)
            answers = acks(received)
            assert not [a for a in answers if isinstance(a, dict)], answers
        case.expect_no_rows = True


BEFORE_PONG: dict[str, Callable[[bytes], bytes]] = {
    "a request instead of a PING": lambda nonce: pack(["t", 1, {"a": 1}]),
    "a PING with a 1 MB hostname": lambda nonce: ping("k", nonce, b"h" * 1_000_000),
    "a PING whose hostname is not UTF-8": lambda nonce: ping("k", nonce, b"a\xffb"),
    "16 MiB of nil": lambda nonce: b"\xc0" * (16 * 1024 * 1024),
    "a JSON request": lambda nonce: b'["t", 1, {"a": 1}]',
}


def test_anything_but_a_small_ping_before_the_pong_is_refused(service: HostileService) -> None:
    with hostile_case(service, "forward_secure") as case:
        for name, make in BEFORE_PONG.items():
            sock, peer = connect(case, "forward_secure")
            nonce = read_helo(sock)
            send_ignoring_close(sock, make(nonce))
            received = case.expect_closed_with_reason(sock, peer)
            pongs = [a for a in acks(received) if isinstance(a, list) and a[:1] == ["PONG"]]
            assert all(p[1] is False for p in pongs), (name, pongs)
        case.expect_no_rows = True


def test_after_login_an_invalid_tag_is_still_refused(service: HostileService) -> None:
    with hostile_case(service, "forward_secure") as case:
        refused(case, packed(b"a\xffb", entries([{"a": 1}]), {"chunk": chunk_id()}),
                "forward_secure")  # fmt: skip


# -- slow senders, many sockets, dedupe ---------------------------------------------------


def test_request_trickled_a_byte_at_a_time_is_cut_off(service: HostileService) -> None:
    data = pack(["slow", entries([{"slow": i} for i in range(200)]), {"chunk": "slow"}])
    with hostile_case(service, "forward") as case:
        sock, peer = connect(case)
        for byte in data:  # never finishes within request_timeout_seconds
            if not send_ignoring_close(sock, bytes([byte])):
                break
            received, closed = read_until(sock, lambda got: bool(got), 0.25)
            assert not acks(received) if received else True
            if closed:
                break
        assert case.log_for(peer, {"request.timeout"}) is not None, case.service.log_tail(case.mark)
        sock.close()
        case.expect_no_rows = True


def test_one_address_cannot_hold_more_than_its_connections(service: HostileService) -> None:
    with hostile_case(service, "forward") as case:
        held = [connect(case)[0] for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]
        for sock in held:  # through TLS, so counted; a heartbeat is answered by nothing
            sock.sendall(pack(None))
        for _ in range(3):
            expect_connection_refused(case)
        chunk = chunk_id()
        held[0].sendall(pack(["held", entries([{"h": 1}]), {"chunk": chunk}]))
        received, _ = read_until(held[0], lambda got: bool(acks(got)))
        assert acks(received) == [{"ack": chunk}]
        for sock in held:
            sock.close()


def test_same_chunk_id_from_another_client_is_not_dropped(service: HostileService) -> None:
    chunk = chunk_id()
    with hostile_case(service, "forward") as case:
        acked(case, pack(["dup", entries([{"who": 1}]), {"chunk": chunk}]), chunk)
        second = Case(case.service, "forward", next_address(), case.mark, case.good)
        acked(second, pack(["dup", entries([{"who": 2}]), {"chunk": chunk}]), chunk)
    rows = case.final_rows or []
    assert [record(r)["who"] for r in rows_from(rows, case.address)] == [1]
    assert [record(r)["who"] for r in rows_from(rows, second.address)] == [2]


#: One-event Message-mode requests a hostile client pipelines without reading an ack.
PIPELINED_REQUESTS = 20_000


def test_thousands_of_pipelined_requests_whose_acks_are_never_read(
    service: HostileService,
) -> None:
    """Message mode at its worst: 20,000 one-event requests at once, and no ack ever read.

    Pending work per connection is bounded by bytes and by count
    (``max_pending_bytes``, ``max_pending_acks``): past the bound the connection
    stops reading, and a peer that reads none of its acks is cut off by the
    send deadline. Whatever was stored is stored once; the good client and the
    memory bound hold (hostile_case).
    """
    requests = b"".join(
        pack(["pipelined", event_time(), {"i": i}, {"chunk": f"p-{i}"}])
        for i in range(PIPELINED_REQUESTS)
    )
    with hostile_case(service, "forward") as case:
        sock, _ = connect(case)
        sock.settimeout(5.0)  # the service may stop reading: it owes us nothing more
        # Timed out against backpressure, or closed: both are allowed.
        with contextlib.suppress(OSError, ssl.SSLError):
            sock.sendall(requests)
        time.sleep(1.0)  # let what was read commit
        sock.close()
    ids = [record(r)["i"] for r in case.hostile_rows()]
    assert len(ids) == len(set(ids)), "a pipelined request was stored twice"
