"""Record -> JSON text, under the convention of appliance/blocks/records.py (docs/table.md)."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.records import MAX_DEPTH, record_json, records_json
from appliance.protocols.forward import EventTime, ForwardServerConnection

FAST = settings(max_examples=200, deadline=None)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def decoded_record(packed_record: bytes) -> dict[Any, Any]:
    """The record as the forward codec hands it over (msgpack str, bin, ext as it decodes them)."""
    codec = ForwardServerConnection()
    (event,) = codec.receive_data(b"\x93\xa1t\x01" + packed_record)
    assert event.records, event  # type: ignore[union-attr]
    record: dict[Any, Any] = event.records[0]  # type: ignore[union-attr]
    return record


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


# -- fast path -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"message": "hello", "level": 3, "ok": True, "none": None, "ratio": 0.5},
        {"nested": {"list": [1, "two", [3.25, None]], "map": {"a": {"b": {}}}}},
        {"unicode": "caf\u00e9 \u2603 \U0001f600", "quote": 'say "hi"\\', "ctl": "a\nb\tc\x00"},
        {"big": 2**64 - 1, "neg": -(2**63), "exp": 1e300, "tiny": -5e-324},
    ],
)
def test_fast_path_equals_compact_json_dumps(record: dict[str, Any]) -> None:
    text = record_json(record)
    assert text == compact(record)
    assert json.loads(text) == record


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)


@FAST
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_fast_path_property(record: dict[str, Any]) -> None:
    text = record_json(record)
    # Same value as the stdlib's compact text (orjson may spell floats differently).
    assert json.loads(text) == json.loads(compact(record)) == record


odd_values = st.one_of(
    json_values,
    st.binary(max_size=6),
    st.sampled_from(["\ud800", "caf\u00e9", "\udcff x"]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=2**64, max_value=2**70),
    st.builds(EventTime, st.integers(0, 2**32 - 1), st.integers(0, 10**9 - 1)),
)


@FAST
@given(st.lists(st.dictionaries(st.text(max_size=4), odd_values, max_size=3), max_size=6))
def test_a_block_of_records_is_rendered_as_each_record_alone(
    records: list[dict[str, Any]],
) -> None:
    """records_json (one pass over orjson, or each record on its own) is record_json's text."""
    assert records_json(records) == [record_json(r) for r in records]


# -- bytes and strings that are not text -------------------------------------------------


def test_bytes_that_are_utf8_become_text() -> None:
    record = {"b": b"caf\xc3\xa9", "e": b"", "list": [b"x", b"\xe2\x98\x83"]}
    assert record_json(record) == '{"b":"caf\u00e9","e":"","list":["x","\u2603"]}'


def test_bytes_that_are_not_utf8_become_base64() -> None:
    raw = b"\xff\x00\xfe binary"
    text = record_json({"b": raw, "nested": {"n": [b"\x80"]}})
    assert json.loads(text) == {
        "b": {"$binary": base64.b64encode(raw).decode()},
        "nested": {"n": [{"$binary": "gA=="}]},
    }
    assert text == '{"b":{"$binary":"/wD+IGJpbmFyeQ=="},"nested":{"n":[{"$binary":"gA=="}]}}'


def test_msgpack_str_that_is_not_utf8_is_treated_as_binary() -> None:
    raw = b"\xc3\x28 bad \xff"
    packed = b"\x82" + b"\xa1s" + bytes([0xA0 | len(raw)]) + raw + b"\xa2ok\xa3yes"
    record = decoded_record(packed)
    assert record["s"] == raw.decode("utf-8", "surrogateescape")  # what the codec hands over
    assert json.loads(record_json(record)) == {
        "s": {"$binary": base64.b64encode(raw).decode()},
        "ok": "yes",
    }


def test_str_with_surrogateescape_is_the_same_as_its_bytes() -> None:
    raw = b"\xed\xa0\x80\xff"
    assert record_json({"s": raw.decode("utf-8", "surrogateescape")}) == record_json({"s": raw})


def test_lone_surrogate_from_json_becomes_binary_not_an_exception() -> None:
    # A JSON-form request may carry "\ud800": that str has no UTF-8 encoding.
    (event,) = ForwardServerConnection().receive_data(b'["t", 1, {"a": "x\\ud800y", "\\udfff": 1}]')
    record = event.records[0]  # type: ignore[union-attr]
    text = record_json(record)
    text.encode("utf-8")
    assert json.loads(text) == {
        "a": {"$binary": base64.b64encode("x\ud800y".encode("utf-8", "surrogatepass")).decode()},
        "\\xed\\xbf\\xbf": 1,
    }


# -- keys ----------------------------------------------------------------------------------


def test_int_keys_become_strings() -> None:
    record = decoded_record(b"\x83\x01\xa1a\xff\xa1b\xcd\x01\x00\xa1c")
    assert record == {1: "a", -1: "b", 256: "c"}
    assert record_json(record) == '{"1":"a","-1":"b","256":"c"}'


def test_int_keys_on_the_slow_path_too() -> None:
    assert record_json({1: b"\xff", 2: float("nan")}) == '{"1":{"$binary":"/w=="},"2":null}'


def test_other_scalar_keys() -> None:
    assert record_json({True: 1, None: 2, 1.5: 3}) == '{"true":1,"null":2,"1.5":3}'
    assert record_json({True: b"\xff", None: b"x"}) == '{"true":{"$binary":"/w=="},"null":"x"}'
    assert record_json({float("nan"): 1}) == '{"null":1}'


def test_bytes_keys() -> None:
    assert record_json({b"key": 1, b"caf\xc3\xa9": 2}) == '{"key":1,"caf\u00e9":2}'
    # Not UTF-8: backslash escapes (as text, so JSON doubles the backslash).
    text = record_json({b"\xffk": 1})
    assert text == '{"\\\\xffk":1}'
    assert json.loads(text) == {"\\xffk": 1}


def test_str_key_that_was_not_utf8() -> None:
    key = b"k\xff".decode("utf-8", "surrogateescape")
    text = record_json({key: "v"})
    assert json.loads(text) == {"k\\xff": "v"}


# -- numbers, extensions, EventTime -----------------------------------------------------------


def test_nan_and_infinities_become_null() -> None:
    record = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "in": [math.nan, 1.5]}
    assert record_json(record) == '{"nan":null,"inf":null,"ninf":null,"in":[null,1.5]}'


def test_nan_from_msgpack() -> None:
    record = decoded_record(b"\x81\xa1f" + b"\xcb" + struct.pack(">d", math.nan))
    assert record_json(record) == '{"f":null}'


def test_ext_type_becomes_ext_and_base64() -> None:
    record = {"e": msgpack.ExtType(5, b"abc"), "l": [msgpack.ExtType(127, b"")]}
    assert json.loads(record_json(record)) == {
        "e": {"$ext": 5, "$binary": "YWJj"},
        "l": [{"$ext": 127, "$binary": ""}],
    }


def test_ext_type_from_msgpack() -> None:
    # fixext4 of type 7, and ext 0 that is not 8 bytes long (so not an EventTime)
    record = decoded_record(b"\x82\xa1x\xd6\x07abcd\xa1y\xd5\x00\x01\x02")
    assert record == {"x": msgpack.ExtType(7, b"abcd"), "y": msgpack.ExtType(0, b"\x01\x02")}
    assert record_json(record) == (
        '{"x":{"$ext":7,"$binary":"YWJjZA=="},"y":{"$ext":0,"$binary":"AQI="}}'
    )


def test_msgpack_timestamp_inside_a_record_is_an_ext() -> None:
    # ext -1 is decoded by msgpack itself (into a Timestamp), not by the codec's ext hook.
    payload = struct.pack(">I", 1_700_000_000)
    record = decoded_record(b"\x81\xa2ts\xd6\xff" + payload)
    assert record == {"ts": msgpack.Timestamp(1_700_000_000, 0)}
    assert json.loads(record_json(record)) == {
        "ts": {"$ext": -1, "$binary": base64.b64encode(payload).decode()}
    }


def test_event_time_inside_a_record_is_epoch_nanoseconds() -> None:
    assert record_json({"t": EventTime(1_700_000_000, 5)}) == '{"t":1700000000000000005}'
    record = decoded_record(b"\x81\xa2at\xd7\x00" + struct.pack(">II", 1_700_000_000, 123))
    assert record == {"at": EventTime(1_700_000_000, 123)}
    assert record_json(record) == '{"at":1700000000000000123}'


def test_mixed_record_keeps_plain_values_as_they_are() -> None:
    record = {"s": "text", "i": 7, "f": 2.5, "b": False, "n": None, "raw": b"\xff", "l": [1, "a"]}
    assert json.loads(record_json(record)) == {**record, "raw": {"$binary": "/w=="}}


# -- nesting -----------------------------------------------------------------------------------


def nest(levels: int, leaf: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"leaf": leaf}
    for _ in range(levels):
        record = {"a": [record]}
    return record


def test_nesting_within_the_limit_is_kept_on_the_slow_path() -> None:
    record = nest(MAX_DEPTH // 2 - 1, b"\xff")
    assert json.loads(record_json(record)) == nest(MAX_DEPTH // 2 - 1, {"$binary": "/w=="})


@pytest.mark.parametrize("leaf", ["text", b"\xff"])
def test_nesting_deeper_than_the_encoder_allows_does_not_raise(leaf: Any) -> None:
    record = nest(5000, leaf)
    text = record_json(record)
    parsed = json.loads(text)
    assert depth(parsed) <= MAX_DEPTH + 2
    assert '{"$truncated":"nesting"}' in text
    assert text.startswith('{"a":[{"a":[')


def test_deep_record_from_msgpack() -> None:
    packed = b"\x81\xa1a" * 1000 + b"\xc0"
    record = decoded_record(packed)
    assert '{"$truncated":"nesting"}' in record_json(record)


# -- always UTF-8 --------------------------------------------------------------------------------

any_text = st.text(alphabet=st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=8)
any_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | any_text
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
    | st.builds(msgpack.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999_999))
    | st.builds(EventTime, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999)),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(any_text | st.integers() | st.binary(max_size=4), children, max_size=4)
    ),
    max_leaves=10,
)


def no_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


@FAST
@given(st.dictionaries(any_text | st.integers() | st.binary(max_size=4), any_values, max_size=6))
def test_output_always_encodes_as_utf8(record: dict[Any, Any]) -> None:
    text = record_json(record)
    text.encode("utf-8")  # raises on a lone surrogate
    parsed = json.loads(text, parse_constant=no_constant)  # no NaN or Infinity
    assert isinstance(parsed, dict)
    assert len(parsed) <= len(record)


@FAST
@given(st.binary(max_size=32))
def test_bytes_round_trip_through_the_convention(raw: bytes) -> None:
    value = json.loads(record_json({"v": raw}))["v"]
    if isinstance(value, str):
        assert value.encode("utf-8") == raw
    else:
        assert base64.b64decode(value["$binary"]) == raw
        with pytest.raises(UnicodeDecodeError):
            raw.decode("utf-8")
