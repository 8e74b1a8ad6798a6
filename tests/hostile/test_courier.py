"""Hostile Log Courier clients against the running service, next to a good one.

What the codec documents (appliance/protocols/courier/connection.py) and this module holds it to:

* refused (connection closed, a logged reason, no ACKN): HELO bodies over 32
  bytes, payloads over the byte, decompressed-byte or event limits, bodies
  shorter than a nonce, zlib data that is not one valid stream, requests
  that do not finish within ``request_timeout_seconds``;
* kept with a fallback (acked, stored once): a ``type``/``host`` that is not
  storable text (a lone surrogate ``"\\ud800"``, over the length limit)
  falls back to the listener's tag / a null host; an ``@timestamp`` that is
  not ASCII RFC 3339 inside int64 nanoseconds becomes the receive time;
  an event that is not JSON (invalid UTF-8 included) is kept as
  ``{"message": ...}``.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from typing import Any

import pytest

from appliance.blocks.text import MAX_TAG_BYTES
from tests.courier_client import (
    HEADER,
    U32,
    CourierClient,
    CourierClientError,
    Pending,
    encode,
    event_stream,
    helo,
)
from tests.hostile.case import Case, expect_connection_refused, hostile_case
from tests.hostile.clients import (
    peer_name,
    read_available,
    read_until,
    send_ignoring_close,
    tls_connect,
)
from tests.hostile.inputs import BAD_TIMESTAMPS, EXTREME_TIMESTAMPS
from tests.hostile.limits import (
    COURIER_MAX_DECOMPRESSED_BYTES,
    COURIER_MAX_EVENTS,
    COURIER_MAX_PAYLOAD_BYTES,
    COURIER_TAG,
    MAX_CONNECTIONS_PER_ADDRESS,
    next_address,
)
from tests.hostile.service import CLOSE_EVENTS, HostileService, has_receive_time, record, rows_from


def parse_messages(data: bytes) -> list[tuple[bytes, bytes]]:
    """The whole server messages in ``data``."""
    messages = []
    while len(data) >= HEADER.size:
        kind, length = HEADER.unpack_from(data)
        if len(data) < HEADER.size + length:
            break
        messages.append((kind, data[HEADER.size : HEADER.size + length]))
        data = data[HEADER.size + length :]
    return messages


def acks(data: bytes) -> list[tuple[bytes, int]]:
    """(nonce, count) of every ACKN in ``data``."""
    return [
        (body[:16], U32.unpack(body[16:20])[0])
        for kind, body in parse_messages(data)
        if kind == b"ACKN"
    ]


def hostile_client(case: Case) -> CourierClient:
    """A CourierClient from the case's own address, after HELO/VERS."""
    service = case.service
    client = CourierClient(
        "127.0.0.1", service.port("courier"), ca_file=service.ca_file, network_timeout=30
    )
    client.sock = tls_connect(service, "courier", case.address)
    client.sock.sendall(helo(b"EVIL"))
    kind, _ = client.read_message()
    assert kind == b"VERS"
    return client


def jdat_raw(nonce: bytes, compressed: bytes) -> bytes:
    return encode(b"JDAT", nonce + compressed)


def refused(case: Case, client: CourierClient, data: bytes, nonce: bytes | None = None) -> None:
    """Send ``data``; the service must close with a logged reason, acking nothing of ``nonce``."""
    assert client.sock is not None
    peer = peer_name(client.sock)
    send_ignoring_close(client.sock, data)
    received = case.expect_closed_with_reason(client.sock, peer)
    if nonce is not None:
        assert [count for n, count in acks(received) if n == nonce and count > 0] == []
    case.expect_no_rows = True


def publish(case: Case, events: list[bytes]) -> None:
    """Publish ``events`` from the hostile address; it must be acked."""
    client = hostile_client(case)
    try:
        client.publish(events)
    finally:
        client.close()


def stored(case: Case, count: int) -> list[dict[str, Any]]:
    """The rows from the case's address, once it ended; there must be ``count``."""
    rows = case.hostile_rows()
    assert len(rows) == count, rows
    return rows


# -- HELO --------------------------------------------------------------------------


def test_helo_of_every_length_0_to_40(service: HostileService) -> None:
    with hostile_case(service, "courier") as case:
        for length in range(41):
            sock = tls_connect(service, "courier", case.address)
            peer = peer_name(sock)
            sock.sendall(HEADER.pack(b"HELO", length) + b"\xff" * length)
            if length <= 32:
                # Read whole (0, 9..32: Go layout; 1..8: the Ruby compact layout).
                sock.sendall(encode(b"PING"))
                received, closed = read_until(sock, lambda got: b"PONG" in got, 10)
                kinds = [kind for kind, _ in parse_messages(received)]
                assert kinds == [b"VERS", b"PONG"], (length, kinds, closed)
                sock.close()
            else:
                case.expect_closed_with_reason(sock, peer)
            # The next connection from this address only once the service let this one go.
            assert case.log_for(peer, {"connection.closed"}) is not None
        case.expect_no_rows = True


# -- times ---------------------------------------------------------------------------


def by_case(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Rows by their record's ``case`` number; each case exactly once."""
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        number = record(row)["case"]
        assert number not in found, f"case {number} stored twice"
        found[number] = row
    return found


def test_unusable_timestamps_are_stored_with_the_receive_time(service: HostileService) -> None:
    """Every value of BAD_TIMESTAMPS (and a few non-strings), one event each, one payload."""
    values = [*BAD_TIMESTAMPS, 12345, None, [], {"a": 1}, 1.5e300]
    events = [json.dumps({"case": i, "@timestamp": v}).encode() for i, v in enumerate(values)]
    with hostile_case(service, "courier") as case:
        publish(case, events)
    rows = by_case(stored(case, len(values)))
    for i, value in enumerate(values):
        assert has_receive_time(rows[i]), (value, rows[i])
        assert record(rows[i])["@timestamp"] == value


def test_the_int64_extremes_are_stored_exactly(service: HostileService) -> None:
    events = [
        json.dumps({"case": i, "@timestamp": text}).encode()
        for i, (text, _) in enumerate(EXTREME_TIMESTAMPS)
    ]
    with hostile_case(service, "courier") as case:
        publish(case, events)
    rows = by_case(stored(case, len(events)))
    for i, (text, ns) in enumerate(EXTREME_TIMESTAMPS):
        assert rows[i]["event_time_ns"] == ns, text


# -- strings ----------------------------------------------------------------------------

#: JSON texts of strings a column cannot hold.
BAD_STRINGS = [
    '"\\ud800"',  # lone high surrogate
    '"\\udfff"',  # lone low surrogate
    '"a\\ud800b"',
    '"\\udc00\\ud800"',  # a pair in the wrong order
    json.dumps("x" * 1_000_000),
    json.dumps("x" * (MAX_TAG_BYTES + 1)),
]


def test_unstorable_type_falls_back_to_the_listener_tag(service: HostileService) -> None:
    events = [
        f'{{"case":{i},"type":{value},"message":"m"}}'.encode()
        for i, value in enumerate(BAD_STRINGS)
    ]
    with hostile_case(service, "courier") as case:
        publish(case, events)
    rows = by_case(stored(case, len(events)))
    for i in range(len(BAD_STRINGS)):
        assert rows[i]["tag"] == COURIER_TAG, BAD_STRINGS[i][:40]
        assert record(rows[i])["message"] == "m"


HOST_TEMPLATES = ['{"case":%d,"host":%s}', '{"case":%d,"host":{"name":%s}}',
                  '{"case":%d,"beat":{"hostname":%s}}']  # fmt: skip


def test_unstorable_host_becomes_null(service: HostileService) -> None:
    cases = [(t, v) for t in HOST_TEMPLATES for v in BAD_STRINGS]
    events = [(t % (i, v)).encode() for i, (t, v) in enumerate(cases)]
    with hostile_case(service, "courier") as case:
        publish(case, events)
    rows = by_case(stored(case, len(events)))
    for i, (template, value) in enumerate(cases):
        assert rows[i]["host"] is None, (template, value[:40])


NOT_JSON = [b"\xff\xfe\xfd", b'{"type":"a\xffb","message":"x"}', b'{"message":"\xed\xa0\x80"}',
            b"\xc0\xaf", b'{"message":"\xf4\x90\x80\x80"}', b"", b"\x00" * 100]  # fmt: skip


def test_events_that_are_not_json_text_are_kept_as_message(service: HostileService) -> None:
    with hostile_case(service, "courier") as case:
        for raw in NOT_JSON:  # one payload each: the rows cannot carry a case number
            publish(case, [raw])
    rows = stored(case, len(NOT_JSON))
    assert all(row["tag"] == COURIER_TAG for row in rows)
    assert all("message" in record(row) for row in rows)


# -- sizes and bombs ---------------------------------------------------------------------


def test_zlib_bomb_over_max_decompressed_bytes_is_refused(service: HostileService) -> None:
    events = [b"0" * 1024] * (COURIER_MAX_DECOMPRESSED_BYTES // 1024 + 16)
    nonce = os.urandom(16)
    with hostile_case(service, "courier") as case:
        compressed = zlib.compress(event_stream(events), 9)
        refused(case, hostile_client(case), jdat_raw(nonce, compressed), nonce)


@pytest.mark.parametrize("kind", [b"JDAT", b"EVNT"])
def test_a_million_empty_events_are_refused(service: HostileService, kind: bytes) -> None:
    nonce = os.urandom(16)
    compressed = zlib.compress(U32.pack(0) * 1_000_000, 9)
    assert COURIER_MAX_EVENTS < 1_000_000
    if kind == b"JDAT":
        message = jdat_raw(nonce, compressed)
    else:
        message = HEADER.pack(b"EVNT", 0xFFFFFFFF) + nonce + compressed
    with hostile_case(service, "courier") as case:
        refused(case, hostile_client(case), message, nonce)


def test_many_concatenated_zlib_streams_cost_no_more_than_their_bytes(
    service: HostileService,
) -> None:
    """A JDAT of one zlib stream and 50,000 empty ones after it: read once, linear.

    The Go receiver reads one zlib stream per payload; what follows it in the
    body may be ignored (the payload is acked with its one event) or refused.
    """
    nonce = os.urandom(16)
    streams = zlib.compress(event_stream([b'{"message":"m"}']), 9) + zlib.compress(b"") * 50_000
    with hostile_case(service, "courier") as case:
        client = hostile_client(case)
        assert client.sock is not None
        peer = peer_name(client.sock)
        client.pending[nonce] = Pending(nonce, 1, time.monotonic())
        client.send_raw(jdat_raw(nonce, streams))
        try:
            client.wait_acked([nonce])
            acked = True
        except CourierClientError:
            acked = False
            assert case.log_for(peer, CLOSE_EVENTS) is not None
        client.close()
    assert len(case.hostile_rows()) == (1 if acked else 0)


def test_payload_over_max_payload_bytes_is_refused_from_its_header(
    service: HostileService,
) -> None:
    with hostile_case(service, "courier") as case:
        header = HEADER.pack(b"JDAT", COURIER_MAX_PAYLOAD_BYTES + 1)
        refused(case, hostile_client(case), header + b"\x00" * 64)


@pytest.mark.parametrize("length", [0, 1, 15])
def test_jdat_shorter_than_a_nonce_is_refused(service: HostileService, length: int) -> None:
    with hostile_case(service, "courier") as case:
        refused(case, hostile_client(case), encode(b"JDAT", b"\x01" * length))


def test_corrupt_zlib_is_refused(service: HostileService) -> None:
    nonce = os.urandom(16)
    compressed = bytearray(zlib.compress(event_stream([b'{"a":1}'] * 100)))
    compressed[len(compressed) // 2] ^= 0xFF
    with hostile_case(service, "courier") as case:
        refused(case, hostile_client(case), jdat_raw(nonce, bytes(compressed)), nonce)


def test_event_over_max_event_bytes_is_refused(service: HostileService) -> None:
    nonce = os.urandom(16)
    # An event length prefix claiming 3 MiB (max_event_bytes is 2 MiB).
    compressed = zlib.compress(U32.pack(3 * 1024 * 1024) + b"{" * 1000)
    with hostile_case(service, "courier") as case:
        refused(case, hostile_client(case), jdat_raw(nonce, compressed), nonce)


def test_second_helo_is_refused(service: HostileService) -> None:
    with hostile_case(service, "courier") as case:
        refused(case, hostile_client(case), helo())


# -- slow senders and many sockets ------------------------------------------------------


def test_request_trickled_a_byte_at_a_time_is_cut_off(service: HostileService) -> None:
    nonce = os.urandom(16)
    message = jdat_raw(nonce, zlib.compress(event_stream([b'{"message":"slow"}'] * 50)))
    with hostile_case(service, "courier") as case:
        client = hostile_client(case)
        assert client.sock is not None
        peer = peer_name(client.sock)
        for byte in message:  # never finishes within request_timeout_seconds
            if not send_ignoring_close(client.sock, bytes([byte])):
                break
            received, closed = read_available(client.sock, 0.25)
            assert not acks(received)
            if closed:
                break
        line = case.log_for(peer, {"request.timeout"})
        assert line is not None, case.service.log_tail(case.mark)
        client.sock.close()
        case.expect_no_rows = True


def test_one_address_cannot_hold_more_than_its_connections(service: HostileService) -> None:
    with hostile_case(service, "courier") as case:
        held = [tls_connect(service, "courier", case.address)
                for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]  # fmt: skip
        for sock in held:  # open, and through TLS: each holds a slot
            sock.sendall(helo(b"HOLD"))
            assert read_until(sock, lambda got: len(got) >= 8)[0][:4] == b"VERS"
        for _ in range(3):
            expect_connection_refused(case)
        for sock in held:  # the held connections are not harmed
            sock.sendall(encode(b"PING"))
            assert read_until(sock, lambda got: len(got) >= 8)[0] == encode(b"PONG")
            sock.close()


# -- dedupe -------------------------------------------------------------------------------


def test_same_nonce_from_another_client_is_not_dropped(service: HostileService) -> None:
    nonce = os.urandom(16)
    with hostile_case(service, "courier") as case:
        first = hostile_client(case)
        first.publish([{"message": "first client"}], nonce=nonce)
        first.close()
        second_address = next_address()
        client = CourierClient(
            "127.0.0.1", service.port("courier"), ca_file=service.ca_file, network_timeout=30
        )
        client.sock = tls_connect(service, "courier", second_address)
        client.sock.sendall(helo())
        assert client.read_message()[0] == b"VERS"
        client.publish([{"message": "second client"}], nonce=nonce)
        client.close()
    rows = case.final_rows or []
    messages = [record(r)["message"] for r in rows_from(rows, case.address)]
    messages += [record(r)["message"] for r in rows_from(rows, second_address)]
    assert messages == ["first client", "second client"]
