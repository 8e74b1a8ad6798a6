"""The PackedForward fast path (appliance/protocols/forward/fast.py) against the general path.

Every test goes through :func:`fuzz.fuzz_forward_fast.check_stream`: the
same stream in a request with ``size`` and in one without must give the
same events or the same violation, and texts the fast path rendered must
equal ``records_json`` of the records. The tests also show which shapes the
fast path takes (so it is not a path nothing reaches) and which it leaves
to the general path.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.blocks.records import plain_records_json, records_json
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.forward import (
    FAST_PATH_PAUSE_REQUESTS,
    EventsReceived,
    ForwardServerConnection,
)
from appliance.protocols.forward.fast import fast_entries, fast_path_size
from appliance.rows.forward import forward_block
from fuzz.fuzz_forward_fast import COUNT_VALUES, SLICED_LIMITS, check_stream, run_one

NOW = 1_700_000_000
#: An entry's array header and an EventTime at NOW: what a record's bytes follow.
FIRST_TIME = b"\x92\xd7\x00" + struct.pack(">II", NOW, 0)


def event_time(seconds: int = NOW, nanoseconds: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def entries(*pairs: tuple[Any, Any]) -> bytes:
    return b"".join(msgpack.packb([t, r], use_bin_type=True, datetime=False) for t, r in pairs)


def fast(stream: bytes, size: Any, max_events: int) -> Any:
    """What the codec's fast path gives: None where it does not apply or misses."""
    count = fast_path_size(stream, size, max_events)
    return None if count is None else fast_entries(stream, count)


def plain(n: int) -> bytes:
    return entries(*((event_time(NOW, i), {"seq": i, "msg": f"line {i}"}) for i in range(n)))


def test_a_plain_stream_takes_the_fast_path_and_matches() -> None:
    assert check_stream(plain(50), 50)
    assert check_stream(plain(50), 50, compressed=True)


def test_the_fast_path_gives_the_general_paths_events() -> None:
    stream = plain(3)
    found = fast(stream, 3, 100)
    assert found is not None
    times, records, texts = found
    assert times == [NOW * 10**9, NOW * 10**9 + 1, NOW * 10**9 + 2]
    assert records == [{"seq": i, "msg": f"line {i}"} for i in range(3)]
    assert texts == records_json(records)


@pytest.mark.parametrize(
    ("why", "stream", "size"),
    [
        ("no size option", plain(3), None),
        ("size is not the count", plain(3), 2),
        ("size past the count", plain(3), 4),
        ("size is a bool", plain(1), True),
        ("integer seconds", entries((NOW, {"a": 1})), 1),
        ("nanoseconds out of range", entries((event_time(NOW, 10**9), {"a": 1})), 1),
        ("record is not a map", entries((event_time(), [1])), 1),
        ("three elements", msgpack.packb([event_time(), {"a": 1}, 3]), 1),
        ("bytes value", entries((event_time(), {"a": b"\xff"})), 1),
        ("integer key", entries((event_time(), {1: "a"})), 1),
        ("msgpack timestamp value", entries((event_time(), {"t": msgpack.Timestamp(1, 2)})), 1),
        ("msgpack timestamp key", entries((event_time(), {msgpack.Timestamp(1, 2): 1})), 1),
        ("extension value", entries((event_time(), {"x": msgpack.ExtType(5, b"ab")})), 1),
        (
            "str not UTF-8",
            b"\x92\xd7\x00" + struct.pack(">II", NOW, 0) + b"\x81\xa1a\xa2\xff\xfe",
            1,
        ),
        ("array as a key", b"\x92\xd7\x00" + struct.pack(">II", NOW, 0) + b"\x81\x91\x01\x02", 1),
        ("map as a key", FIRST_TIME + b"\x81\x81\xa1a\x01\x01", 1),
        ("truncated", plain(2)[:-1], 2),
        ("trailing bytes", plain(2) + b"\xc0", 2),
    ],
)
def test_the_general_path_keeps_what_the_fast_path_does_not_take(
    why: str, stream: bytes, size: Any
) -> None:
    assert fast(stream, size, 100) is None, why
    assert not check_stream(stream, size if type(size) is int else None), why


def test_nan_and_infinities_take_the_fast_path_as_null() -> None:
    stream = entries((event_time(), {"n": math.nan, "i": math.inf}))
    assert check_stream(stream, 1)
    found = fast(stream, 1, 10)
    assert found is not None
    assert found[2] == ['{"n":null,"i":null}']


def test_deep_nesting_falls_back() -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = {"d": deep}
    stream = entries((event_time(), deep))
    assert fast(stream, 1, 10) is None
    assert not check_stream(stream, 1)


def test_max_events_per_request_still_holds() -> None:
    stream = plain(9)
    assert fast(stream, 9, 8) is None
    assert not check_stream(stream, 9, small=True)  # the general path's violation


def test_rows_use_the_rendered_texts() -> None:
    request = msgpack.packb(["t", plain(2), {"size": 2, "chunk": "c1"}], use_bin_type=True)
    (event,) = ForwardServerConnection().receive_data(request)
    assert isinstance(event, EventsReceived)
    assert event.texts is not None
    block = forward_block(event, source="s", peer="127.0.0.1:1", received_at_ns=NOW * 10**9)
    assert block.records is event.texts


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
)
_keys = st.one_of(
    st.text(max_size=6), st.text(max_size=6), st.integers(-5, 5), st.binary(max_size=2)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=8,
)
_records = st.one_of(
    st.dictionaries(st.text(max_size=6), _values, max_size=4),
    st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=4),
    _values,
)
_times = st.one_of(
    st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 10**9 - 1)),
    st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    st.integers(-1, 2**40),
    st.none(),
    st.floats(),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(_times, _records), min_size=1, max_size=6),
    size_delta=st.sampled_from([0, 0, 0, -1, 1]),
    compressed=st.booleans(),
)
def test_fast_and_general_paths_agree(
    pairs: list[tuple[Any, Any]], size_delta: int, compressed: bool
) -> None:
    stream = entries(*pairs)
    check_stream(stream, len(pairs) + size_delta, compressed=compressed)


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(
            st.builds(event_time, st.integers(0, 2**32 - 1), st.integers(0, 10**9 - 1)),
            st.dictionaries(st.text(max_size=6), _values, max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_plain_records_take_the_fast_path(pairs: list[tuple[Any, Any]]) -> None:
    """Records of text keys and JSON values are taken (bytes and integer keys aside)."""
    took = check_stream(entries(*pairs), len(pairs))
    assert took == (plain_records_json([record for _, record in pairs]) is not None)


@given(
    seconds=st.integers(0, 2**32 - 1),
    nanoseconds=st.integers(0, 2**32 - 1),
    data=st.binary(max_size=200),
    flags=st.integers(0, 255),
)
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_never_split_the_paths(
    seconds: int, nanoseconds: int, data: bytes, flags: int
) -> None:
    """Any bytes after a whole first EventTime, ``size`` the stream's value count."""
    head = bytes([flags]) + COUNT_VALUES.to_bytes(2, "big") + b"\0\0"
    run_one(head + b"\x92\xd7\x00" + struct.pack(">II", seconds, nanoseconds) + data)


def test_a_connection_pauses_the_fast_path_after_a_miss() -> None:
    """A client whose records the fast path cannot take pays for one try per pause, not each."""
    connection = ForwardServerConnection()

    def send(stream: bytes, n: int) -> EventsReceived:
        request = msgpack.packb(["t", stream, {"size": n}], use_bin_type=True)
        (event,) = connection.receive_data(request)
        assert isinstance(event, EventsReceived)
        return event

    assert send(plain(2), 2).texts is not None
    miss = entries((event_time(), {"a": b"\xff"}))
    assert send(miss, 1).texts is None
    for _ in range(FAST_PATH_PAUSE_REQUESTS):
        assert send(plain(2), 2).texts is None  # the general path: the same events
    assert send(plain(2), 2).texts is not None
    # Requests the fast path declines at a glance (no decode) start no pause.
    assert send(entries((NOW, {"a": 1})), 1).texts is None  # integer time
    assert send(plain(2), 0).texts is None  # size 0
    assert send(plain(2), 2).texts is not None


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (b"\xc1", "entries stream is not valid msgpack: FormatError"),
        (b"\x91" * 5000, "entries stream is not valid msgpack: StackError"),
    ],
)
def test_an_unreadable_stream_names_why(stream: bytes, reason: str) -> None:
    """The general path's violation says which msgpack error (they carry no message)."""
    request = msgpack.packb(["t", stream, {"size": 1}], use_bin_type=True)
    (event,) = ForwardServerConnection().receive_data(request)
    assert isinstance(event, ProtocolViolation)
    assert event.reason == reason


# -- the record limits, on streams decoded a slice at a time (fuzz flag SLICED) ---------------


#: Nested arrays of ``n`` empty maps (``[[{}, ...], ...]``, 100 to an array): past the
#: per-container length, only the value count stops them.
def empty_maps(n: int) -> list[Any]:
    return [[{}] * 100 for _ in range(n // 100)]


def sliced_outcome(stream: bytes, size: int | None) -> EventsReceived | str:
    """The general path's (or, with ``size``, the fast path's) outcome under SLICED_LIMITS."""
    option: dict[str, Any] = {} if size is None else {"size": size}
    request = msgpack.packb(["t", stream, option], use_bin_type=True)
    (event,) = ForwardServerConnection(decode_limits=SLICED_LIMITS).receive_data(request)
    if isinstance(event, ProtocolViolation):
        return event.reason
    assert isinstance(event, EventsReceived)
    return event


def test_a_sliced_stream_takes_the_fast_path_with_the_general_paths_texts() -> None:
    stream = plain(40)
    assert len(stream) > SLICED_LIMITS.slice_bytes
    assert check_stream(stream, 40, sliced=True)
    event = sliced_outcome(stream, 40)
    assert isinstance(event, EventsReceived)
    assert event.records == []  # only the texts were kept
    assert event.texts == records_json([{"seq": i, "msg": f"line {i}"} for i in range(40)])


@pytest.mark.parametrize(
    ("why", "record", "reason"),
    [
        ("more values than a record may hold", {"m": empty_maps(200)}, "more than 128 values"),
        ("an array longer than a record may hold", {"a": [0] * 200}, "record limits"),
        ("a map longer than a record may hold", {str(i): 0 for i in range(150)}, "record limits"),
        ("a string longer than a record may be", {"s": "x" * 300}, "record limits"),
        ("an entry over the record bytes", {f"k{i}": "v" * 20 for i in range(12)}, "bytes"),
        (
            "JSON text over the record bytes",
            {"c": "\x01" * 60},  # 62 bytes of msgpack, 370 of JSON
            "bytes of JSON is over the limit of 256",
        ),
    ],
)
def test_the_fast_path_never_takes_a_record_the_general_path_refuses(
    why: str, record: dict[str, Any], reason: str
) -> None:
    stream = plain(8) + entries((event_time(), record)) + plain(8)
    size = 17
    general = sliced_outcome(stream, None)
    assert isinstance(general, str), why
    assert reason in general, (why, general)
    # With size, the fast path declines and the general path refuses alike.
    assert sliced_outcome(stream, size) == general
    assert not check_stream(stream, size, sliced=True)


def test_texts_over_their_allowance_are_left_to_the_general_path() -> None:
    # Escapes of six characters a byte in a str of four bytes a character: the
    # general path asks its gate for the memory (test_forward_limits.py).
    record = {"c": "\x01" * 40 + "\U0001f600"}
    stream = entries(*([(event_time(), record)] * 3))
    assert fast(stream, 3, 10) is not None  # decoded whole: its cost covers any text
    count = fast_path_size(stream, 3, 10)
    assert count is not None
    assert fast_entries(stream, count, SLICED_LIMITS) is None
    assert not check_stream(stream, 3, sliced=True)


def test_a_record_just_within_the_limits_is_stored() -> None:
    # The list's 124 elements, the record's 2, the entry's 2: 128 values of 128
    # (and 255 bytes of JSON of 256).
    within = entries((event_time(), {"m": [0] * 124}))
    over = entries((event_time(), {"m": [0] * 125}))
    assert isinstance(sliced_outcome(plain(8) + within, None), EventsReceived)
    assert "more than 128 values" in str(sliced_outcome(plain(8) + over, None))
    # Its 141 bytes could hold more than 128 values: the fast path leaves it to
    # the general one, which counts them.
    assert not check_stream(plain(8) + within, 9, sliced=True)
    assert check_stream(plain(9), 9, sliced=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(_times, _records), min_size=1, max_size=30),
    size_delta=st.sampled_from([0, 0, 0, -1, 1]),
    compressed=st.booleans(),
    whole=st.booleans(),
)
def test_fast_and_general_paths_agree_slice_by_slice(
    pairs: list[tuple[Any, Any]], size_delta: int, compressed: bool, whole: bool
) -> None:
    """SLICED_LIMITS (every stream over 64 bytes sliced) or WHOLE_LIMITS (up to 256 whole)."""
    check_stream(
        entries(*pairs), len(pairs) + size_delta, compressed=compressed,
        sliced=not whole, whole=whole,
    )  # fmt: skip


_bulky = st.recursive(
    st.one_of(st.none(), st.text(max_size=40), st.integers(-(2**63), 2**64 - 1)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=40), st.dictionaries(st.text(max_size=4), inner, max_size=40)
    ),
    max_leaves=150,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    records=st.lists(
        st.dictionaries(st.text(max_size=5), _bulky, max_size=4), min_size=1, max_size=12
    )
)
def test_records_near_the_limits_never_split_the_paths(records: list[dict[str, Any]]) -> None:
    """Records of up to hundreds of values, around SLICED_LIMITS' 128 values and 256 bytes."""
    pairs = [(event_time(NOW, i), r) for i, r in enumerate(records)]
    check_stream(entries(*pairs), len(pairs), sliced=True)
    check_stream(entries(*pairs), len(pairs), whole=True)
