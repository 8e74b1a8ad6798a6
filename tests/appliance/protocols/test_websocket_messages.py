"""The WebSocket listener's sans-IO messages: parsing, answers, handshake helpers, rate."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance import defaults
from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES
from appliance.protocols import websocket_messages
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
)
from appliance.rows.websocket import ingest_block

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
        (doc(events=[{"record": {}, "time": 1e300}]), "events[0].time: not finite", "m1"),
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
                    [None] * n, ['{"k":1}'] * n)  # fmt: skip


def test_filter_rows() -> None:
    assert TailFilter("web.").rows(block("web.app")) == [0]
    assert TailFilter("web.").rows(block("db")) == []
    assert TailFilter("web.").rows(block(["db", "web.a", "web.b"])) == [1, 2]
    assert TailFilter("", "websocket").rows(block("web.app")) == []


def test_rate_is_a_token_bucket() -> None:
    rate = MessageRate(2, now=0.0)
    assert [rate.allow(0.0) for _ in range(3)] == [True, True, False]
    assert rate.allow(0.5)
    assert not rate.allow(0.5)
    assert rate.allow(10.0)


# -- times: ASCII RFC 3339 or finite numbers, always within int64 nanoseconds -------------


def one_event(time: object, **message: object) -> str:
    return doc(events=[{"time": time, "record": {}}], **message)


def refused(text: str | bytes, limits: MessageLimits = LIMITS) -> MessageError:
    with pytest.raises(MessageError) as caught:
        parse_ingest(text, limits)
    # Every refusal is the per-message error answer, whatever broke.
    assert orjson.loads(caught.value.reply)["error"] == caught.value.reason
    return caught.value


@pytest.fixture
def stdlib_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse with the stdlib, which yields lone surrogates, NaN and infinities.

    orjson refuses all three, so this proves the checks after the parser hold
    on their own.
    """
    monkeypatch.setattr(websocket_messages, "_json_loads", json.loads)


@pytest.mark.parametrize(
    "time",
    [
        "2025-01-31T12:00:00.12\u00b2Z",  # superscript two: str.isdigit() says yes
        "\u0662\u0660\u0662\u0665-01-31T12:00:00Z",  # Arabic-Indic 2025
        "2025-01-31T12:00:\u0661\u0662Z",
        "2025-01-31T12:00:00.\uff11Z",  # fullwidth digit one
        "0001-01-01T00:00:00Z",  # Go's zero time: before 1677
        "9999-12-31T23:59:59Z",  # after 2262
        "1677-09-21T00:12:43.145224191Z",  # one nanosecond before the int64 minimum
        "2262-04-11T23:47:16.854775808Z",  # one nanosecond after the int64 maximum
        "",
        "2" * 1_000,
    ],
)
def test_time_text_outside_ascii_or_int64_is_refused(time: str) -> None:
    error = refused(one_event(time))
    assert error.reason.startswith("events[0].time: not an RFC 3339 timestamp")
    assert error.message_id == "m1"


def test_time_text_at_the_int64_edges_is_kept() -> None:
    low = parse_ingest(one_event("1677-09-21T00:12:43.145224192Z"), LIMITS)
    high = parse_ingest(one_event("2262-04-11T23:47:16.854775807Z"), LIMITS)
    assert low.times_ns == (-(2**63),)
    assert high.times_ns == (2**63 - 1,)


@pytest.mark.parametrize(
    "time",
    [
        9_223_372_037,  # seconds: the first whole second past 2262-04-11
        -9_223_372_037,
        10**12,
        2**64 - 1,  # the largest integer orjson yields
        10**30,  # orjson yields a float for it
        9_223_372_037.0,
        -9_223_372_037.0,
        1.7976931348623157e308,
    ],
)
def test_numeric_time_outside_int64_ns_is_refused(time: float) -> None:
    error = refused(one_event(time))
    assert error.reason.startswith("events[0].time: not finite epoch seconds")
    assert error.message_id == "m1"


@pytest.mark.parametrize(
    ("time", "ns"),
    [
        (9_223_372_036, 9_223_372_036_000_000_000),
        (-9_223_372_036, -9_223_372_036_000_000_000),
        (9_223_372_036.5, 9_223_372_036_500_000_000),
        (-0.5, -500_000_000),
        (0, 0),
        (1_732_270_000.25, 1_732_270_000_250_000_000),
    ],
)
def test_numeric_time_inside_int64_ns_is_kept(time: float, ns: int) -> None:
    assert parse_ingest(one_event(time), LIMITS).times_ns == (ns,)


@pytest.mark.usefixtures("stdlib_json")
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400])
def test_nan_infinity_and_huge_integers_are_refused(literal: str) -> None:
    text = '{"id": "m1", "tag": "t", "events": [{"record": {}, "time": TIME}]}'
    error = refused(text.replace("TIME", literal))
    assert error.reason.startswith("events[0].time: not finite epoch seconds")


def test_orjson_refuses_nan_and_overflowing_numbers_as_invalid_json() -> None:
    for literal in ("NaN", "Infinity", "1e400"):
        text = '{"id": "m1", "tag": "t", "events": [{"record": {}, "time": TIME}]}'
        assert refused(text.replace("TIME", literal)).reason.startswith("invalid JSON")


@given(st.floats(min_value=-9.2e9, max_value=9.2e9))
def test_float_seconds_keep_the_float_s_nanoseconds(seconds: float) -> None:
    # The exact instant the binary float names, to the nearest nanosecond
    # (round(seconds * 1e9) misses by up to a few hundred ns at today's epoch).
    exact = round(Fraction(seconds) * 1_000_000_000)
    (ns,) = parse_ingest(one_event(seconds), LIMITS).times_ns
    assert ns is not None
    assert abs(ns - exact) <= 1


def test_float_seconds_today_are_not_rounded_to_the_product() -> None:
    seconds = 1_732_270_000.123456
    assert round(seconds * 1_000_000_000) != round(Fraction(seconds) * 1_000_000_000)
    (ns,) = parse_ingest(one_event(seconds), LIMITS).times_ns
    assert ns == round(Fraction(seconds) * 1_000_000_000)


# -- strict strings: tag and id are valid UTF-8 within their byte limits ------------------


def test_tag_limit_is_in_utf8_bytes() -> None:
    assert parse_ingest(doc(tag="t" * MAX_TAG_BYTES), LIMITS).tag == "t" * MAX_TAG_BYTES
    two_byte = "\u00e9" * (MAX_TAG_BYTES // 2 + 1)  # fewer characters than the limit
    error = refused(doc(tag=two_byte))
    assert error.reason == f"tag is {MAX_TAG_BYTES + 2} bytes, over the limit of {MAX_TAG_BYTES}"
    assert error.message_id == "m1"


def test_id_limit_is_in_utf8_bytes() -> None:
    longest = "i" * MAX_BATCH_ID_BYTES
    assert parse_ingest(doc(id=longest), LIMITS).batch_id == longest
    error = refused(doc(id="\u00e9" * (MAX_BATCH_ID_BYTES // 2 + 1)))
    assert error.reason.startswith("id: must be")
    assert error.message_id is None


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64 - 1, 1.5])
def test_integer_ids_are_int64(value: object) -> None:
    assert refused(doc(id=value)).reason.startswith("id: must be")


def test_int64_ids_are_taken() -> None:
    assert parse_ingest(doc(id=2**63 - 1), LIMITS).batch_id == str(2**63 - 1)
    assert parse_ingest(doc(id=-(2**63)), LIMITS).batch_id == str(-(2**63))


@pytest.mark.parametrize("field", ["id", "tag"])
def test_lone_surrogate_escapes_are_invalid_json(field: str) -> None:
    text = doc(**{field: "a\ud800b"})  # json.dumps writes the escape "\ud800"
    assert "\\ud800" in text
    error = refused(text)
    assert error.reason.startswith("invalid JSON")
    assert refused(text.encode()).reason.startswith("invalid JSON")


def test_bytes_that_are_not_utf8_are_invalid_json() -> None:
    text = doc(tag="a#b").encode().replace(b"#", b"\xff")  # no UTF-8 sequence holds \xff
    assert refused(text).reason.startswith("invalid JSON")


@pytest.mark.usefixtures("stdlib_json")
def test_lone_surrogates_are_refused_after_any_parser() -> None:
    tag = refused(doc(tag="a\ud800b"))
    assert (tag.reason, tag.message_id) == ("tag is not valid UTF-8", "m1")
    assert refused(doc(id="a\udc80")).reason.startswith("id: must be")
    # In a record it is not the message's fault to refuse: record_json keeps
    # it as $binary, and the block is one the writer stores.
    message = parse_ingest(doc(events=[{"record": {"k": "a\ud800"}}]), LIMITS)
    (record,) = message.records
    assert set(orjson.loads(record)["k"]) == {"$binary"}
    check_block(ingest_block(message, source="token:t", peer="1.2.3.4:5", received_at_ns=1))


@pytest.mark.usefixtures("stdlib_json")
@given(
    st.dictionaries(st.sampled_from(["id", "tag"]), st.text(alphabet=st.characters(), max_size=300))
)
def test_any_accepted_id_and_tag_can_be_stored(fields: dict[str, str]) -> None:
    try:
        message = parse_ingest(doc(**fields), LIMITS)
    except MessageError:
        return
    check_block(ingest_block(message, source="token:t", peer="1.2.3.4:5", received_at_ns=1))


# -- bounded work and memory per message ---------------------------------------------------


def test_limits_must_be_positive() -> None:
    for name in ("max_message_bytes", "max_events_per_message", "max_containers_per_message"):
        with pytest.raises(ValueError, match=name):
            MessageLimits(**{name: 0})


def test_containers_over_the_limit_are_refused_before_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never(data: object) -> object:
        raise AssertionError("parsed a message over the container limit")

    monkeypatch.setattr(websocket_messages, "_json_loads", never)
    limits = MessageLimits(max_containers_per_message=4)
    # One '[' in a string counts too: the count is an upper bound.
    text = doc(tag="[", events=[{"record": {}}])
    assert text.count("{") + text.count("[") == 5
    for data in (text, text.encode()):
        error = refused(data, limits)
        assert error.reason.startswith("more than 4 JSON objects and arrays")
        assert error.message_id is None


def test_containers_at_the_limit_are_parsed() -> None:
    limits = MessageLimits(max_containers_per_message=4)
    assert parse_ingest(doc(events=[{"record": {}}]), limits).records == ("{}",)


def test_the_default_limits_admit_the_most_events_with_nested_records() -> None:
    record = {"a": {"b": [1, {"c": [2]}]}, "d": [{}, {}]}  # itself and 7 nested
    event = {"record": record}
    text = json.dumps(
        {"id": 1, "tag": "t", "events": [event] * defaults.WEBSOCKET_MAX_EVENTS_PER_MESSAGE}
    )
    assert len(text) <= defaults.WEBSOCKET_MAX_MESSAGE_BYTES
    message = parse_ingest(text, MessageLimits())
    assert len(message.records) == defaults.WEBSOCKET_MAX_EVENTS_PER_MESSAGE


def _fill(unit: str, containers: int = 0) -> str:
    """A message of about the default maximum size whose record is one list.

    The list holds ``containers`` empty lists, then as many ``unit`` items as fit.
    """
    head, tail = '{"id":"x","tag":"t","events":[{"record":{"a":[', "]}}]}"
    lists = "[]," * containers
    count = (defaults.WEBSOCKET_MAX_MESSAGE_BYTES - len(head) - len(lists) - len(tail)) // len(unit)
    return head + lists + (unit * count)[:-1] + tail


#: What parsing a message may hold at its peak, per byte of the message
#: (module docstring, "Work and memory per message").
PARSE_PEAK_FACTOR = 30
#: What the records' JSON text may hold after parsing, per byte of the message.
RECORDS_FACTOR = 4


@pytest.mark.parametrize(
    "make",
    [
        lambda: _fill('"a",'),  # one-character strings: the costliest scalar
        lambda: _fill("1e0,"),  # floats
        lambda: _fill("999,"),  # integers outside the small-int cache
        # As many containers as the cap admits (the message's own four, too).
        lambda: _fill('"a",', defaults.WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE - 5),
    ],
    ids=["strings", "floats", "ints", "containers-at-the-cap"],
)
def test_parse_memory_is_a_bounded_factor_of_the_message(
    make: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make().encode()
    assert len(data) <= defaults.WEBSOCKET_MAX_MESSAGE_BYTES
    peaks: list[int] = []

    def measured(raw: Any) -> Any:
        tracemalloc.start()
        try:
            return orjson.loads(raw)
        finally:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    monkeypatch.setattr(websocket_messages, "_json_loads", measured)
    message = parse_ingest(data, MessageLimits())
    assert peaks[0] <= PARSE_PEAK_FACTOR * len(data)
    assert sum(map(len, message.records)) <= RECORDS_FACTOR * len(data)


def test_containers_past_the_cap_would_exceed_the_factor() -> None:
    # Why the cap exists: a message of nothing but empty lists costs more than
    # PARSE_PEAK_FACTOR per byte; the default cap refuses it.
    data = _fill("[],").encode()
    tracemalloc.start()
    try:
        orjson.loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak > PARSE_PEAK_FACTOR * len(data)
    assert refused(data, MessageLimits()).reason.startswith("more than 100000 JSON objects")


def test_float_expansion_of_records_stays_within_the_factor() -> None:
    data = _fill("1e15,").encode()  # written back as 1000000000000000.0
    message = parse_ingest(data, MessageLimits())
    assert 3 * len(data) < sum(map(len, message.records)) <= RECORDS_FACTOR * len(data)
