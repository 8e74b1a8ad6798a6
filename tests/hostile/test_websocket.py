"""Hostile WebSocket senders (``/ingest``, real TLS) against the running service.

What the codec and the session document (appliance/protocols/websocket_messages.py,
appliance/server/sessions/websocket.py) and this module holds them to:

* a message that breaks a rule is refused whole: the answer is
  ``{"error": reason, "id": id}``, a ``websocket.message_refused`` line is
  logged, nothing of it is stored, and the connection carries on (answers
  are per message). There are no per-event fallbacks: an ``id``/``tag``
  that is not storable text, a ``time`` that is not ASCII RFC 3339 or a
  finite number inside int64 nanoseconds, JSON that is not valid text (a
  lone surrogate escape), too many events or containers, all refuse it;
* a frame that breaks the WebSocket protocol (a text frame that is not
  UTF-8) or a message over ``max_message_bytes`` closes the connection
  (1007, 1009) with a logged close;
* an upgrade that does not finish within ``tls_handshake_timeout_seconds``,
  or a message that does not arrive within ``idle_timeout_seconds``, ends
  the connection with a logged reason.
"""

from __future__ import annotations

import json
import time
from typing import Any

from wsproto.events import CloseConnection

from appliance import defaults
from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES
from tests.hostile.case import Case, expect_connection_refused, hostile_case
from tests.hostile.clients import (
    WsClient,
    peer_name,
    read_until_closed,
    send_ignoring_close,
    tls_connect,
    ws_frame,
)
from tests.hostile.inputs import BAD_TIMESTAMPS, EXTREME_TIMESTAMPS
from tests.hostile.limits import (
    MAX_CONNECTIONS_PER_ADDRESS,
    WEBSOCKET_IDLE_TIMEOUT_SECONDS,
    WEBSOCKET_MAX_MESSAGE_BYTES,
)
from tests.hostile.service import HostileService, record

OPCODE_CONTINUATION, OPCODE_TEXT, OPCODE_BINARY = 0, 1, 2


def message(msg_id: Any, events: list[dict[str, Any]], tag: Any = "hostile.ws") -> str:
    return json.dumps({"id": msg_id, "tag": tag, "events": events})


def expect_errors(case: Case, texts: dict[str, str]) -> None:
    """Send each text on one connection: each gets an error answer and a log line."""
    client = WsClient(case.service, case.address)
    try:
        for name, text in texts.items():
            client.send_text(text)
            answer = client.receive_json()
            assert set(answer) <= {"error", "id"}, (name, answer)
            assert answer.get("error"), (name, answer)
    finally:
        client.close()
    lines = [
        f
        for f in case.service.log_lines(case.mark)
        if f.get("event") == "websocket.message_refused" and f.get("peer") == client.peer
    ]
    assert len(lines) == len(texts), (len(lines), len(texts))
    assert all(f.get("reason") for f in lines)
    case.expect_no_rows = True


def test_ids_and_tags_that_are_not_storable_text_are_refused(service: HostileService) -> None:
    event = '"events": [{"record": {"a": 1}}]}'
    texts = {
        "id lone surrogate": '{"id": "\\ud800", "tag": "t", ' + event,
        "id reversed pair": '{"id": "\\udc00\\ud800", "tag": "t", ' + event,
        "tag lone surrogate": '{"id": "a", "tag": "\\udfff", ' + event,
        "tag 1 MB": message("b", [{"record": {}}], "t" * 1_000_000),
        "tag one over": message("c", [{"record": {}}], "t" * (MAX_TAG_BYTES + 1)),
        "tag empty": message("d", [{"record": {}}], ""),
        "tag a number": message("e", [{"record": {}}], 12),
        "id 1 MB": message("i" * 1_000_000, [{"record": {}}]),
        "id one over": message("i" * (MAX_BATCH_ID_BYTES + 1), [{"record": {}}]),
        "id empty": message("", [{"record": {}}]),
        "id control character": message("a\u0000b", [{"record": {}}]),
        "id 2**63": message(2**63, [{"record": {}}]),
        "id a float": message(1.5, [{"record": {}}]),
        "id missing": json.dumps({"tag": "t", "events": [{"record": {}}]}),
        "record lone surrogate": '{"id": "f", "tag": "t", '
        + '"events": [{"record": {"m": "\\ud800"}}]}',
        "record key lone surrogate": '{"id": "g", "tag": "t", '
        + '"events": [{"record": {"\\ud800": 1}}]}',
        "record not an object": message("h", [{"record": [1, 2]}]),
    }  # fmt: skip
    with hostile_case(service, "websocket") as case:
        expect_errors(case, texts)


def test_unusable_times_are_refused(service: HostileService) -> None:
    values: list[Any] = [*BAD_TIMESTAMPS, 1e300, -1e300, 2**63, -(2**63) - 1, 1e19, True, [], {}]
    texts = {
        repr(v)[:40] + f" #{i}": message(f"t{i}", [{"time": v, "record": {}}])
        for i, v in enumerate(values)
    }
    texts["NaN"] = '{"id": "nan", "tag": "t", "events": [{"time": NaN, "record": {}}]}'
    texts["Infinity"] = '{"id": "inf", "tag": "t", "events": [{"time": Infinity, "record": {}}]}'
    with hostile_case(service, "websocket") as case:
        expect_errors(case, texts)


def test_the_int64_extremes_are_stored_exactly(service: HostileService) -> None:
    events = [
        {"time": text, "record": {"case": i}} for i, (text, _) in enumerate(EXTREME_TIMESTAMPS)
    ]
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        client.send_text(message("extremes", events))
        assert client.receive_json() == {"ack": "extremes"}
        client.close()
    rows = {record(r)["case"]: r for r in case.hostile_rows()}
    for i, (text, ns) in enumerate(EXTREME_TIMESTAMPS):
        assert rows[i]["event_time_ns"] == ns, text


def test_too_many_events_or_containers_are_refused(service: HostileService) -> None:
    containers = defaults.WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE + 10
    texts = {
        "events one over": message(
            "e", [{"record": {}}] * (defaults.WEBSOCKET_MAX_EVENTS_PER_MESSAGE + 1)
        ),
        "containers": message("c", [{"record": {"a": [[]] * containers}}]),
        "nested past the parser": '{"id": "n", "tag": "t", "events": [{"record": {"a": '
        + "[" * 100_000
        + "]" * 100_000
        + "}}]}",
    }
    with hostile_case(service, "websocket") as case:
        expect_errors(case, texts)


def test_a_flood_of_messages_is_rate_limited_not_stalled(service: HostileService) -> None:
    """More than max_messages_per_second (100): the excess is refused, every one answered."""
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        for i in range(300):
            client.send_text(message(f"flood-{i}", [{"record": {"i": i}}]))
        answers = [client.receive_json() for _ in range(300)]
        client.close()
        acked = {a["ack"] for a in answers if "ack" in a}
        refused = [a for a in answers if "error" in a]
        assert refused, "no message over the rate was refused"
        assert len(acked) + len(refused) == 300
    stored = sorted(f"flood-{record(r)['i']}" for r in case.hostile_rows())
    assert stored == sorted(acked)


def closed_with_a_logged_code(case: Case, client: WsClient, codes: set[int]) -> None:
    """The service closes with one of ``codes`` and logs it.

    The client may see 1006 instead: the service closes the socket with the
    hostile bytes still unread, and the kernel's reset can overtake its close frame.
    """
    answer = client.receive()
    assert isinstance(answer, CloseConnection), answer
    assert answer.code in codes | {1006}, answer
    client.close()
    line = case.service.wait_log(
        case.mark,
        lambda f: (
            f.get("event") in {"websocket.closed", "websocket.aborted"}
            and f.get("peer") == client.peer
        ),
    )
    assert line is not None, case.service.log_tail(case.mark)
    assert int(line.get("code", 0)) in codes, line


def test_text_frame_that_is_not_utf8_closes_the_connection(service: HostileService) -> None:
    payloads = [b"a\xffb", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
                b'{"id": "x", "tag": "\xff", "events": []}']  # fmt: skip
    with hostile_case(service, "websocket") as case:
        for payload in payloads:
            client = WsClient(case.service, case.address)
            client.send_raw(ws_frame(OPCODE_TEXT, payload))
            closed_with_a_logged_code(case, client, {1007})
        case.expect_no_rows = True


def test_binary_message_is_refused_or_closes(service: HostileService) -> None:
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        client.send_raw(ws_frame(OPCODE_BINARY, b'{"id": "b", "tag": "\xff", "events": []}'))
        answer = client.receive()
        if isinstance(answer, CloseConnection):
            assert answer.code != 1000
        else:
            assert "error" in json.loads(answer), answer
        client.close()
        case.expect_no_rows = True


def test_message_over_max_message_bytes_closes_the_connection(service: HostileService) -> None:
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        big = message("big", [{"record": {"pad": "x" * WEBSOCKET_MAX_MESSAGE_BYTES}}])
        send_ignoring_close(client.sock, ws_frame(OPCODE_TEXT, big.encode()))
        closed_with_a_logged_code(case, client, {1009})
        case.expect_no_rows = True


def test_message_in_fifty_thousand_fragments_is_read_once(service: HostileService) -> None:
    text = message("fragments", [{"record": {"pad": "f" * 50_000}}]).encode()
    frames = [ws_frame(OPCODE_TEXT, text[:1], fin=False)]
    frames += [ws_frame(OPCODE_CONTINUATION, text[i : i + 1], fin=False)
               for i in range(1, len(text) - 1)]  # fmt: skip
    frames.append(ws_frame(OPCODE_CONTINUATION, text[-1:]))
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        client.send_raw(b"".join(frames))
        answer = client.receive()
        client.close()
        if isinstance(answer, CloseConnection):  # a fragment limit is a valid answer too
            assert answer.code != 1000
            case.expect_no_rows = True
        else:
            assert json.loads(answer) == {"ack": "fragments"}
    if not case.expect_no_rows:
        assert len(case.hostile_rows()) == 1


def test_upgrade_trickled_a_byte_at_a_time_is_cut_off(service: HostileService) -> None:
    request = (
        b"GET /ingest HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + b"X-Pad: " + b"p" * 400 + b"\r\n\r\n"
    )
    with hostile_case(service, "websocket") as case:
        sock = tls_connect(case.service, "websocket", case.address)
        peer = peer_name(sock)
        for byte in request:
            if not send_ignoring_close(sock, bytes([byte])):
                break
            time.sleep(0.02)
        received, closed = read_until_closed(sock, 30)
        sock.close()
        assert closed
        assert not received.startswith(b"HTTP/1.1 101"), received[:80]
        line = case.service.wait_log(
            case.mark,
            lambda f: f.get("event") == "websocket.handshake_failed" and f.get("peer") == peer,
        )
        assert line is not None, case.service.log_tail(case.mark)
        case.expect_no_rows = True


def test_message_trickled_a_byte_at_a_time_is_cut_off(service: HostileService) -> None:
    """A message must arrive whole within idle_timeout_seconds (5 s for this listener)."""
    frame = ws_frame(OPCODE_TEXT, message("slow", [{"record": {"pad": "s" * 400}}]).encode())
    with hostile_case(service, "websocket") as case:
        client = WsClient(case.service, case.address)
        deadline = time.monotonic() + 6 * WEBSOCKET_IDLE_TIMEOUT_SECONDS  # a liveness bound
        for byte in frame:
            if not send_ignoring_close(client.sock, bytes([byte])) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        line = case.service.wait_log(
            case.mark,
            lambda f: f.get("event") == "websocket.closed" and f.get("peer") == client.peer,
        )
        client.close()
        assert line is not None, case.service.log_tail(case.mark)
        assert line.get("reason"), line
        case.expect_no_rows = True


def test_one_address_cannot_hold_more_than_its_connections(service: HostileService) -> None:
    with hostile_case(service, "websocket") as case:
        held = [WsClient(case.service, case.address) for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]
        for _ in range(3):
            expect_connection_refused(case)
        held[0].send_text(message("held", [{"record": {"held": 1}}]))
        assert held[0].receive_json() == {"ack": "held"}
        for client in held:
            client.close()
    assert len(case.hostile_rows()) == 1
