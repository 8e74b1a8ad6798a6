"""The WebSocket listener's sans-IO messages: parsing, answers, handshake helpers, rate."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.lake.rows import RowBlock
from appliance.protocols.websocket_messages import (
    MessageError,
    MessageLimits,
    MessageRate,
    TailFilter,
    ack_json,
    bearer_token,
    dropped_json,
    error_json,
    origin_allowed,
    parse_ingest,
    parse_target,
    tail_events_json,
)

LIMITS = MessageLimits(max_message_bytes=10_000, max_events_per_message=3)


def doc(**overrides: object) -> str:
    base: dict[str, object] = {
        "id": "m1",
        "tag": "web.app",
        "events": [{"time": 1.5, "record": {"a": 1}}, {"record": {"b": "x"}}],
    }
    base.update(overrides)
    return json.dumps(base)


def test_valid_message() -> None:
    message = parse_ingest(doc(), LIMITS)
    assert message.id == "m1"
    assert message.batch_id == "m1"
    assert message.tag == "web.app"
    assert message.times_ns == (1_500_000_000, None)
    assert message.records == ('{"a":1}', '{"b":"x"}')
    block = message.block(source="token:t", peer="1.2.3.4:5", received_at_ns=7)
    assert (block.protocol, block.batch_id, block.rows, block.host) == ("websocket", "m1", 2, None)


def test_integer_id_rfc3339_time_and_bytes_input() -> None:
    text = doc(id=42, events=[{"time": "2025-01-31T12:00:00.123456789Z", "record": {}}])
    message = parse_ingest(text.encode(), LIMITS)
    assert message.id == 42
    assert message.batch_id == "42"
    assert message.times_ns == (1_738_324_800_123_456_789,)


def test_empty_events_are_valid() -> None:
    assert parse_ingest(doc(events=[]), LIMITS).records == ()


@pytest.mark.parametrize(
    ("text", "reason", "message_id"),
    [
        ("{", "invalid JSON", None),
        ("[]", "a message must be a JSON object", None),
        (doc(id=None), "id: must be", None),
        (doc(id=True), "id: must be", None),
        (doc(id=""), "id: must be", None),
        (doc(id="x" * 257), "id: must be", None),
        (doc(tag=""), "tag: must be", "m1"),
        (doc(tag=5), "tag: must be", "m1"),
        (doc(events={}), "events: must be a list", "m1"),
        (doc(events=[{"record": {}}] * 4), "events: 4 events, more than 3", "m1"),
        (doc(events=[1]), "events[0]: must be an object", "m1"),
        (doc(events=[{"record": []}]), "events[0].record: must be an object", "m1"),
        (doc(events=[{"record": {}, "time": "yesterday"}]), "events[0].time: not an RFC", "m1"),
        (doc(events=[{"record": {}, "time": True}]), "events[0].time: must be", "m1"),
        (doc(events=[{"record": {}, "time": 1e300}]), "events[0].time: out of range", "m1"),
    ],
)
def test_refusals_name_the_reason(text: str, reason: str, message_id: object) -> None:
    with pytest.raises(MessageError) as caught:
        parse_ingest(text, LIMITS)
    assert caught.value.reason.startswith(reason)
    assert caught.value.message_id == message_id
    assert orjson.loads(caught.value.reply) == {"error": caught.value.reason, "id": message_id}


def test_oversized_message() -> None:
    with pytest.raises(MessageError, match="larger than 10000 bytes"):
        parse_ingest(doc(tag="x" * 10_000), LIMITS)


@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_input_parses_or_is_refused(data: str | bytes) -> None:
    reason = ""
    try:
        message = parse_ingest(data, LIMITS)
    except MessageError as exc:
        reason = exc.reason
    else:
        assert len(message.records) == len(message.times_ns)
        return
    assert reason


def test_answers() -> None:
    assert json.loads(ack_json("a")) == {"ack": "a"}
    assert json.loads(ack_json(3)) == {"ack": 3}
    assert json.loads(error_json("bad", None)) == {"error": "bad", "id": None}
    assert json.loads(dropped_json(5)) == {"dropped": 5}


def test_bearer_token() -> None:
    assert bearer_token([(b"Authorization", b"Bearer apt_x")]) == "apt_x"
    assert bearer_token([(b"authorization", b"bearer  apt_y ")]) == "apt_y"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer ")]) is None
    assert bearer_token([]) is None


def test_origin() -> None:
    assert origin_allowed(None, [])
    assert not origin_allowed("https://a.example", [])
    assert origin_allowed("https://A.example/", ["https://a.example"])
    assert not origin_allowed("https://b.example", ["https://a.example"])
    assert origin_allowed("https://b.example", ["*"])


def test_target_and_filter() -> None:
    path, tail = parse_target("/tail?tag=web.&protocol=forward")
    assert path == "/tail"
    assert tail == TailFilter("web.", "forward")
    assert parse_target("/ingest") == ("/ingest", TailFilter("", None))
    with pytest.raises(MessageError):
        parse_target("/tail?tag=" + "x" * 2000)


def block(tag: str | list[str], protocol: str = "forward") -> RowBlock:
    n = 1 if isinstance(tag, str) else len(tag)
    return RowBlock(protocol, "src", "peer", 1_000_000_000, "b", tag, None,
                    [None] * n, ['{"k":1}'] * n, 10)  # fmt: skip


def test_filter_rows() -> None:
    assert TailFilter("web.").rows(block("web.app")) == [0]
    assert TailFilter("web.").rows(block("db")) == []
    assert TailFilter("web.").rows(block(["db", "web.a", "web.b"])) == [1, 2]
    assert TailFilter("", "websocket").rows(block("web.app")) == []


def test_tail_event_json() -> None:
    (text,) = tail_events_json(block(["a", "web.x"]), [1])
    document = json.loads(text)
    assert document["tag"] == "web.x"
    assert document["record"] == {"k": 1}
    assert document["time"] == "1970-01-01T00:00:01.000000000Z"
    assert document["time_ns"] == 1_000_000_000


def test_rate_is_a_token_bucket() -> None:
    rate = MessageRate(2, now=0.0)
    assert [rate.allow(0.0) for _ in range(3)] == [True, True, False]
    assert rate.allow(0.5)
    assert not rate.allow(0.5)
    assert rate.allow(10.0)
