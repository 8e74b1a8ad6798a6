"""The forward codec's memory bounds: record limits while decoding, slices, and the decode gate.

What appliance/protocols/forward/connection.py ("Memory", "Records") and appliance/defaults.py
(the cost model) promise:

* a record far larger than any shipper sends is refused at its first excess:
  a container header over the limits at once, a record's values as they are
  counted, its bytes and its JSON once decoded;
* a stream over ``slice_bytes`` is decoded a slice at a time and gives the
  events and texts the whole stream would (hypothesis);
* before it builds anything for a request, the codec asks its gate with the
  request's worst-case cost (:func:`appliance.defaults.forward_request_cost`);
  a request put off is decoded by ``resume()`` with the same events, wherever
  the reads were split;
* the memory a decode takes stays within that cost for the shapes that cost
  most (tracemalloc).
"""

from __future__ import annotations

import gzip
import io
import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance import defaults
from appliance.blocks.records import records_json
from appliance.protocols.decode_gate import Admission, Admit
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation
from appliance.protocols.forward import (
    DecodeLimits,
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    request_kind,
)
from appliance.protocols.forward.fast import decodes_whole
from appliance.protocols.forward.handshake import Helo, Verdict
from tests.appliance.protocols.support import violation

NOW = 1_700_000_000
#: Small limits: slices of 64 bytes (always), records of at most 128 values and 256 bytes.
SMALL = DecodeLimits(
    max_record_values=128, max_record_bytes=256, slice_bytes=64, max_whole_bytes=64
)
MIB = 1024 * 1024


def event_time(seconds: int = NOW, nanoseconds: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def entries(records: list[Any], when: Any = None) -> bytes:
    stamp = event_time() if when is None else when
    return b"".join(pack([stamp, r]) for r in records)


def packed(stream: bytes, **option: Any) -> bytes:
    return pack(["t", stream, option])


def only(events: list[ForwardEvent]) -> ForwardEvent:
    assert len(events) == 1, events
    return events[0]


def received(
    data: bytes, decode: DecodeLimits | None = None, limits: ForwardLimits | None = None
) -> ForwardEvent:
    return only(ForwardServerConnection(limits, decode_limits=decode).receive_data(data))


# -- record limits ---------------------------------------------------------------------------


def nested_empty_maps(groups: int, per: int = 100) -> bytes:
    """``{"k": [[{}, ...] * groups]}`` as msgpack: no array longer than ``per``."""
    inner = b"\xdc" + struct.pack(">H", per) + b"\x80" * per
    return b"\x81\xa1k\xdd" + struct.pack(">I", groups) + inner * groups


def test_a_record_over_its_values_is_refused_at_its_first_excess() -> None:
    # 400 empty maps in arrays of 100: no header is over a limit, the count is.
    stream = b"\x92" + pack(event_time()) + nested_empty_maps(4)
    event = received(packed(entries([{"a": 1}] * 4) + stream), SMALL)
    violation([event], r"a record holds more than 128 values")


def test_the_count_stops_a_huge_record_long_before_its_end() -> None:
    """Sixty thousand arrays of a thousand empty maps (gzip: 120 KB), refused within two arrays."""
    record = nested_empty_maps(60_000, 1000)
    stream = b"\x92" + pack(event_time()) + record
    request = packed(gzip.compress(stream, compresslevel=9, mtime=0), compressed="gzip")
    tracemalloc.start()
    try:
        event = received(request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    violation([event], r"more than 1048576 values")
    # The decompressed stream (60 MB) is held; the objects, about a million
    # values, take some 100 MiB at most, not the 4 GiB of the whole record.
    assert peak < len(stream) + 160 * MIB


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (b"\x81\xa1k\xdd\x00\x00\x03\xe8" + b"\xc0" * 1000, "exceeds max_array_len"),
        (b"\xdf\x00\x00\x00\xc8" + b"".join(pack(f"k{i}") + b"\xc0" for i in range(200)), "map"),
        (b"\x81\xa1s\xda\x01\x2c" + b"x" * 300, "exceeds max_str_len"),
        (b"\x81\xa1b\xc5\x01\x2c" + b"x" * 300, "exceeds max_bin_len"),
    ],
)
def test_a_container_or_string_over_the_limits_is_refused_at_its_header(
    record: bytes, reason: str
) -> None:
    stream = entries([{"a": 1}] * 4) + b"\x92" + pack(event_time()) + record
    event = received(packed(stream), SMALL)
    assert violation([event], "record limits").reason.find(reason.split()[-1]) >= 0


def test_an_entry_over_the_record_bytes_is_refused() -> None:
    record = {f"k{i}": "v" * 20 for i in range(12)}  # 289 bytes, under 128 values
    event = received(packed(entries([{"a": 1}] * 4 + [record])), SMALL)
    violation([event], r"an entry of \d+ bytes is over the record limit of 256")


def test_a_record_whose_json_is_over_the_record_bytes_is_refused() -> None:
    event = received(packed(entries([{"a": 1}] * 4 + [{"c": "\x01" * 60}])), SMALL)
    violation([event], r"a record of \d+ bytes of JSON is over the limit of 256")


def test_texts_over_their_allowance_need_the_gates_grant() -> None:
    # Escapes of six characters a byte, in a str of four bytes a character:
    # about 24 bytes of text a byte, four times what a stream's cost reserves.
    record = {"c": "\x01" * 40 + "\U0001f600"}
    request = packed(entries([record] * 3))
    event = received(request, SMALL)  # a gate that lets everything through
    assert isinstance(event, EventsReceived)
    assert event.texts == records_json([record] * 3)
    gate = Gate()
    ForwardServerConnection(decode_limits=SMALL, gate=gate).receive_data(request)
    assert len(gate.costs) == 2  # the request, then more for its texts
    busy = Gate(refuse_over=gate.costs[0])
    events = ForwardServerConnection(decode_limits=SMALL, gate=busy).receive_data(request)
    violation(events, r"too large")
    later = Gate(later=2)
    events = ForwardServerConnection(decode_limits=SMALL, gate=later).receive_data(request)
    violation(events, r"decode budget busy: the records' JSON text needs \d+ bytes more")


def test_a_message_mode_request_counts_its_values() -> None:
    small = DecodeLimits(max_record_values=64, max_record_bytes=256, slice_bytes=32)
    ok = pack(["t", NOW, {"m": [{}] * 59}])  # the list's 59, the record's 2, the request's 3
    assert isinstance(received(ok, small), EventsReceived)
    over = pack(["t", NOW, {"m": [{}] * 60}])
    violation([received(over, small)], "request holds more than 64 values")


def test_a_forward_mode_request_counts_its_records_together() -> None:
    small = DecodeLimits(max_record_values=64, max_record_bytes=256, slice_bytes=32)
    over = pack(["t", [[NOW, {"m": [{}] * 10}]] * 6])
    violation([received(over, small)], "request holds more than 64 values")


def test_a_json_request_counts_its_objects_and_arrays() -> None:
    small = DecodeLimits(max_record_values=64, max_record_bytes=256, slice_bytes=32)
    ok = b'["t", 1700000000, {"m": [' + b",".join([b"{}"] * 60) + b"]}]"
    assert isinstance(received(ok, small), EventsReceived)
    over = b'["t", 1700000000, {"m": [' + b",".join([b"{}"] * 70) + b"]}]"
    violation([received(over, small)], "JSON request holds more than 64 objects and arrays")


def test_the_record_limits_cannot_be_reached_by_a_stream_decoded_whole() -> None:
    with pytest.raises(ValueError, match="at most max_record_values"):
        DecodeLimits(max_record_values=50, slice_bytes=64)
    with pytest.raises(ValueError, match="at most max_record_bytes"):
        DecodeLimits(max_record_values=1000, max_record_bytes=32, slice_bytes=64)


# -- slices --------------------------------------------------------------------------------------

_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=12),
        st.binary(max_size=6), st.floats(allow_nan=False),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)  # fmt: skip
_entries = st.lists(
    st.one_of(
        st.tuples(st.just(event_time()), st.dictionaries(st.text(max_size=5), _values, max_size=4)),
        st.tuples(
            st.integers(-5, 2**34), st.dictionaries(st.text(max_size=5), _values, max_size=3)
        ),
        st.tuples(st.just(event_time()), _values),  # dropped: not a map
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=_entries)
def test_a_stream_decoded_in_slices_gives_the_events_of_the_whole_stream(
    pairs: list[tuple[Any, Any]],
) -> None:
    stream = b"".join(pack([t, r]) for t, r in pairs)
    roomy = DecodeLimits(max_record_values=1 << 16, max_record_bytes=1 << 15, slice_bytes=1 << 14)
    tiny = DecodeLimits(
        max_record_values=1 << 16, max_record_bytes=1 << 15, slice_bytes=8, max_whole_bytes=8
    )
    whole = received(packed(stream, chunk="c"), roomy)
    sliced = received(packed(stream, chunk="c"), tiny)
    if isinstance(whole, ProtocolViolation) or len(stream) <= tiny.slice_bytes:
        assert sliced == whole
        return
    assert isinstance(whole, EventsReceived)
    assert isinstance(sliced, EventsReceived)
    assert whole.texts is None  # rendered by the rows layer
    assert sliced.records == []  # only their texts were kept
    assert sliced.texts == records_json(whole.records)
    assert (sliced.times_ns, sliced.dropped, sliced.chunk) == (
        whole.times_ns,
        whole.dropped,
        whole.chunk,
    )


def test_a_sliced_request_split_at_every_byte_gives_the_same_events() -> None:
    stream = entries([{"i": i, "s": "x" * (i % 7)} for i in range(12)])
    data = packed(stream, chunk="c1") + pack(["t", NOW, {"m": 1}]) + packed(stream, chunk="c2")
    expected = ForwardServerConnection(decode_limits=SMALL).receive_data(data)
    assert [type(e) for e in expected] == [EventsReceived] * 3
    for at in range(1, len(data)):
        codec = ForwardServerConnection(decode_limits=SMALL)
        events = codec.receive_data(data[:at]) + codec.receive_data(data[at:])
        assert events == expected, f"split at {at}"


# -- the gate ------------------------------------------------------------------------------------


class Gate:
    """A gate that records the costs it is asked, and puts off every ``later``-th request.

    A request put off goes when asked again (the answering loop has waited
    for room by then); ``refuse_over``: a cost over it is refused.
    """

    def __init__(self, later: int = 0, refuse_over: int | None = None) -> None:
        self.costs: list[int] = []
        self.later = later
        self.refuse_over = refuse_over
        self._put_off = False

    def __call__(self, cost: int) -> Admission:
        self.costs.append(cost)
        if self.refuse_over is not None and cost > self.refuse_over:
            return f"too large: {cost}"
        if self._put_off:
            self._put_off = False
            return Admit.GO
        if self.later and len(self.costs) % self.later == 0:
            self._put_off = True
            return Admit.LATER
        return Admit.GO


def drive(codec: ForwardServerConnection, reads: list[bytes]) -> list[ForwardEvent]:
    """Every read, resuming whatever the gate put off (as the answering loop does)."""
    events: list[ForwardEvent] = []
    for read in reads:
        events += codec.receive_data(read)
        while codec.deferred_cost and not (events and isinstance(events[-1], ProtocolViolation)):
            events += codec.resume()
        if events and isinstance(events[-1], ProtocolViolation):
            break
    return events


SAMPLE = (
    packed(entries([{"a": 1}, {"b": 2}]), chunk="one")
    + pack(None)
    + pack(["t", NOW, {"m": "x"}, {"chunk": "two"}])
    + packed(gzip.compress(entries([{"z": i} for i in range(5)]), mtime=0), compressed="gzip")
    + pack(["t", [[NOW, {"f": 1}], [NOW, {"f": 2}]], {"chunk": "three"}])
    + packed(entries([{"s": "y" * 40}] * 8), chunk="four")
)


@pytest.mark.parametrize("later", [2, 3])
def test_requests_put_off_give_the_same_events_wherever_the_reads_are_split(later: int) -> None:
    expected = ForwardServerConnection(decode_limits=SMALL).receive_data(SAMPLE)
    assert len(expected) == 6
    for at in range(1, len(SAMPLE)):
        codec = ForwardServerConnection(decode_limits=SMALL, gate=Gate(later))
        assert drive(codec, [SAMPLE[:at], SAMPLE[at:]]) == expected, f"split at {at}"


def test_a_json_request_put_off_is_decoded_by_resume() -> None:
    data = b'["t", 1, {"a": 1}, {"chunk": "j1"}]\n["t", 2, {"a": 2}, {"chunk": "j2"}]["t"'
    expected = ForwardServerConnection().receive_data(data)
    codec = ForwardServerConnection(gate=Gate(later=1))
    assert codec.receive_data(data) == []
    assert codec.deferred_cost > 0
    events = []
    while codec.deferred_cost:
        events += codec.resume()
    assert events == expected


def test_nothing_is_received_while_a_request_waits() -> None:
    codec = ForwardServerConnection(gate=Gate(later=1))
    assert codec.receive_data(packed(entries([{"a": 1}]), chunk="c")) == []
    with pytest.raises(LocalProtocolError, match="waits for resume"):
        codec.receive_data(b"\xc0")
    assert [type(e) for e in codec.resume()] == [EventsReceived]
    assert codec.deferred_cost == 0
    assert codec.receive_data(b"\xc0") == []  # a heartbeat, put off in its turn
    assert codec.deferred_cost > 0


def test_resume_without_a_request_waiting_is_a_bug() -> None:
    with pytest.raises(LocalProtocolError, match="resume"):
        ForwardServerConnection().resume()


def test_a_gate_refusal_refuses_the_request_before_it_is_decoded() -> None:
    gate = Gate(refuse_over=10_000)
    small = packed(entries([{"a": 1}]), chunk="ok")
    big = packed(gzip.compress(entries([{"a": 1}] * 100), mtime=0), compressed="gzip")
    events = ForwardServerConnection(gate=gate).receive_data(small + big)
    assert isinstance(events[0], EventsReceived)
    violation(events[1:], r"too large: \d+")


def cost(size: int, kind: str, limits: ForwardLimits | None = None) -> int:
    limits = limits or ForwardLimits()
    return defaults.forward_request_cost(
        size,
        kind,
        max_decompressed_bytes=limits.max_decompressed_bytes,
        max_events=limits.max_events_per_request,
    )


def test_the_gate_is_asked_each_requests_worst_case_by_its_kind() -> None:
    requests = [
        (packed(entries([{"a": 1}] * 3)), "packed"),
        (packed(gzip.compress(entries([{"a": 1}]), mtime=0), compressed="gzip"), "compressed"),
        (pack(["t", NOW, {"a": 1}]), "msgpack"),
        (pack(["t", [[NOW, {"a": 1}]]]), "msgpack"),
        (pack(None), "msgpack"),
    ]
    gate = Gate()
    ForwardServerConnection(gate=gate).receive_data(b"".join(data for data, _ in requests))
    assert gate.costs == [cost(len(data), kind) for data, kind in requests]
    json_gate = Gate()
    json_request = b'["t", 1, {"a": 1}]'
    ForwardServerConnection(gate=json_gate).receive_data(json_request)
    assert json_gate.costs == [cost(len(json_request), "json")]


def test_the_handshake_asks_the_gate_for_what_it_held_after_the_ping() -> None:
    helo = Helo(b"n" * 16, b"", keepalive=True)
    gate = Gate()
    codec = ForwardServerConnection(helo=helo, gate=gate)
    ping = pack(["PING", "client", "salt", "0" * 128, "", ""])
    held = packed(entries([{"a": 1}]), chunk="held")
    events = codec.receive_data(ping + held)
    assert len(events) == 1  # the PING
    assert len(gate.costs) == 1
    _, after = codec.finish_handshake(Verdict(True), "server")
    assert [type(e) for e in after] == [EventsReceived]
    assert gate.costs[1] == cost(len(held), "packed")


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (packed(b"\x92"), "packed"),
        (pack(["t", "not bin"]), "packed"),  # entries as str, as out_forward sends them
        (packed(gzip.compress(b"x")), "compressed"),
        (packed(b"\x28\xb5\x2f\xfd" + b"zstd"), "compressed"),
        (pack(["t" * 300, b"\x92"]), "packed"),  # a str16 tag
        (pack(["t", NOW, {}]), "msgpack"),
        (pack(["t", [[NOW, {}]]]), "msgpack"),
        (pack(None), "msgpack"),
        (pack({"not": "an array"}), "msgpack"),
        (pack([1, 2]), "msgpack"),
    ],
)
def test_request_kind(head: bytes, kind: str) -> None:
    assert request_kind(head, len(head)) == kind
    # A head cut before it tells: not known.
    assert request_kind(head[:1], len(head) + 10_000) == "unknown"


# -- the cost model holds ------------------------------------------------------------------------


def peak_of(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def costly_streams() -> dict[str, bytes]:
    """Entries streams of about 1 MiB, in the shapes that cost most per byte."""
    n = 1 << 20

    def fill(record: Any) -> bytes:
        one = pack([event_time(), record])
        return one * (n // len(one))

    return {
        "empty maps": fill({"m": [{}] * 60_000}),
        "one-entry map chains": fill({"c": [{"": {"": {"": None}}}] * 10_000}),
        "two-character strings": fill({"s": ["ab"] * 60_000}),
        "empty records": fill({}),
        "escapes": fill({"e": "\x01" * 1000}),
        "escapes in a str of four bytes a character": fill({"e": "\x01" * 1000 + "\U0001f600"}),
    }


@pytest.mark.parametrize("name", list(costly_streams()))
@pytest.mark.parametrize("with_size", [False, True])
def test_decoding_stays_within_the_reported_cost(name: str, with_size: bool) -> None:
    stream = costly_streams()[name]
    count = len(list(msgpack.Unpacker(io.BytesIO(stream))))
    request = packed(stream, size=count) if with_size else packed(stream)
    gate = Gate()
    codec = ForwardServerConnection(gate=gate)
    peak = peak_of(lambda: codec.receive_data(request))
    reported = sum(gate.costs)  # the request's, and more for texts over their allowance
    assert peak <= reported, (name, peak / MIB, reported / MIB)


def largest_whole_stream() -> int:
    """The largest entries stream the defaults decode in one pass (about 2.4 MiB)."""
    rules, events = DecodeLimits(), ForwardLimits().max_events_per_request
    low, high = rules.slice_bytes, rules.max_record_bytes
    while low < high:
        middle = (low + high + 1) // 2
        if decodes_whole(middle, rules, events):
            low = middle
        else:
            high = middle - 1
    return low


@pytest.mark.parametrize("with_size", [False, True])
def test_the_largest_stream_decoded_in_one_pass_stays_within_its_cost(with_size: bool) -> None:
    n = largest_whole_stream()
    assert 2 * MIB < n < 3 * MIB
    one = pack([event_time(), {"c": [{"": {"": {"": None}}}] * 10_000}])  # chains: the worst
    stream = one * (n // len(one))
    count = n // len(one)
    request = packed(stream, size=count) if with_size else packed(stream)
    gate = Gate()
    codec = ForwardServerConnection(gate=gate)
    events: list[ForwardEvent] = []
    peak = peak_of(lambda: events.extend(codec.receive_data(request)))
    (event,) = events
    assert isinstance(event, EventsReceived)
    assert event.records == []  # kept as text only, as from slices
    assert peak <= sum(gate.costs), (peak / MIB, sum(gate.costs) / MIB)
