"""The Log Courier driver over trio memory streams, with an autojump clock.

The writer here is a stand-in that resolves tickets when the test says so:
these tests are about the driver's ordering, keepalives and closes. The real
writer against a real table, with TLS, is tested in
tests/interop/test_courier_client.py.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.blocks.checks import check_block
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES
from appliance.config import CourierListenerConfig
from appliance.lake.arrow import blocks_to_arrow
from appliance.server.connection import Close, Reply, Submit
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.courier import CourierSession, courier_handler
from tests.appliance.server.support import (
    StandInWriter,
    arrival,
    handler_factory,
    receive_exactly,
    receive_within,
    serving,
)

INFO = ConnectionInfo(
    listener="test", address="192.0.2.7", port=41000, tls=True, source="CN=shipper"
)

HELO = b"HELO\x00\x00\x00\x20" + bytes(4) + struct.pack(">III", 2, 10, 0) + b"LCOR" + bytes(12)
PING = b"PING\x00\x00\x00\x00"
PONG = b"PONG\x00\x00\x00\x00"


def nonce(n: int) -> bytes:
    return bytes([n]) * 16


def events_stream(*events: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(e)) + e for e in events)


def jdat(n: int, *events: bytes) -> bytes:
    body = nonce(n) + zlib.compress(events_stream(*events))
    return b"JDAT" + struct.pack(">I", len(body)) + body


def evnt(n: int, *events: bytes) -> bytes:
    return b"EVNT\xff\xff\xff\xff" + nonce(n) + zlib.compress(events_stream(*events))


def ackn(n: int, count: int) -> bytes:
    return b"ACKN\x00\x00\x00\x14" + nonce(n) + struct.pack(">I", count)


def messages(data: bytes) -> list[bytes]:
    """Split server output into whole messages (all server messages carry a length)."""
    out = []
    while data:
        (length,) = struct.unpack(">I", data[4:8])
        out.append(data[: 8 + length])
        data = data[8 + length :]
    return out


handler_for = handler_factory(courier_handler, CourierListenerConfig)


@pytest.mark.trio
async def test_helo_is_answered_with_vers_advertising_evnt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(HELO)
        vers = await receive_exactly(client, 40)
        assert vers[:8] == b"VERS\x00\x00\x00\x20"
        assert vers[8] & 0x01  # supports EVNT
        assert vers[24:28] == b"APPL"
        await client.aclose()


@pytest.mark.trio
async def test_partial_ackns_go_out_every_keepalive_period_while_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer, keepalive_seconds=5.0), INFO) as client:
        await client.send_all(evnt(9, b'{"x":1}', b'{"x":2}'))
        start = trio.current_time()
        stamps = []
        for _ in range(4):
            assert await receive_exactly(client, 28) == ackn(9, 0)
            stamps.append(trio.current_time() - start)
        # Every 5 s of the mock clock (docs/courier.md: at least every 5 s).
        assert stamps == pytest.approx([5.0, 10.0, 15.0, 20.0])
        writer.commit(0)
        assert await receive_exactly(client, 28) == ackn(9, 2)
        # After the final ACKN, no more keepalives for it.
        assert await receive_within(client, 30) == b""
        await client.aclose()


@pytest.mark.trio
async def test_keepalive_period_is_the_listener_setting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer, keepalive_seconds=2.0), INFO) as client:
        await client.send_all(jdat(4, b"{}"))
        waited = await receive_within(client, 9)
        assert messages(waited) == [ackn(4, 0)] * 4  # at 2, 4, 6 and 8 s
        writer.commit(0)
        assert await receive_exactly(client, 28) == ackn(4, 1)
        await client.aclose()


@pytest.mark.trio
async def test_ping_and_unknown_messages_are_answered_in_order_with_acks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer, keepalive_seconds=50.0), INFO) as client:
        await client.send_all(PING)
        assert await receive_exactly(client, 8) == PONG
        await client.send_all(jdat(5, b"{}") + PING + b"NEWT\x00\x00\x00\x02hi")
        await trio.sleep(1)
        writer.commit(0)
        sent = await receive_exactly(client, 28 + 8 + 8)
        assert messages(sent) == [ackn(5, 1), PONG, b"????\x00\x00\x00\x00"]
        await client.aclose()


@pytest.mark.trio
async def test_legacy_client_without_helo_is_served(autojump_clock: trio.testing.MockClock) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(jdat(6, b'{"old":true}'))
        await trio.sleep(1)
        writer.commit(0)
        # No VERS: the client never said HELO. Just the ACKN.
        assert await receive_exactly(client, 28) == ackn(6, 1)
        await client.aclose()


@pytest.mark.trio
async def test_bad_zlib_closes_the_connection_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    bad = b"JDAT" + struct.pack(">I", 16 + 500) + nonce(7) + b"\x00\x01not zlib"
    start = trio.current_time()
    async with serving(handler_for(writer), INFO) as client:
        # The declared body never arrives in full: the handler must not wait for it.
        await client.send_all(HELO + bad)
    # The handler returned (the listener then closes the socket) at once.
    assert trio.current_time() - start < 1
    assert writer.blocks == []
    sent = await receive_within(client, 1)
    assert [m[:4] for m in messages(sent)] == [b"VERS"]


@pytest.mark.trio
async def test_payload_before_bad_zlib_is_still_acked_then_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    bad = b"EVNT\xff\xff\xff\xff" + nonce(8) + b"\xff\xfe"
    async with serving(handler_for(writer, keepalive_seconds=50.0), INFO) as client:
        await client.send_all(jdat(2, b"{}") + bad + jdat(3, b"{}"))
        await trio.sleep(1)
        assert len(writer.blocks) == 1  # the bad one and what follows are not taken
        writer.commit(0)
        assert await receive_exactly(client, 28) == ackn(2, 1)
    # The handler returned once the ACKN was out.
    assert len(writer.blocks) == 1


@pytest.mark.trio
async def test_rows_carry_type_host_time_source_peer_and_nonce(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    events = [
        b'{"@timestamp":"2024-05-06T07:08:09.123456789Z","host":"web1","type":"nginx",'
        b'"message":"GET /"}',
        b'{"@timestamp":"2024-05-06T09:08:09+02:00","host":{"name":"ecs"},"type":7}',
        b"not json at all",
        b"\xff\xfe raw",  # not JSON and not UTF-8 either
    ]
    async with serving(handler_for(writer, tag="shipped"), INFO) as client:
        await client.send_all(HELO + evnt(3, *events))
        await trio.sleep(1)
        await client.aclose()
        writer.commit(0)
    (block,) = writer.blocks
    assert block.protocol == "courier"
    assert str(block.batch_id).split(":")[0] == nonce(3).hex()
    assert block.source == "CN=shipper"
    assert block.peer == "192.0.2.7:41000"
    assert list(block.tag) == ["nginx", "shipped", "shipped", "shipped"]
    assert list(block.host) == ["web1", "ecs", None, None]  # type: ignore[arg-type]  # ECS host.name
    t = 1_714_979_289
    assert list(block.times_ns) == [t * 10**9 + 123_456_789, t * 10**9, None, None]
    assert block.records[0] == (
        '{"@timestamp":"2024-05-06T07:08:09.123456789Z","host":"web1","type":"nginx",'
        '"message":"GET /"}'
    )
    assert block.records[2] == '{"message":"not json at all"}'
    assert block.records[3] == '{"message":{"$binary":"//4gcmF3"}}'


@pytest.mark.trio
async def test_empty_payload_is_acked_with_count_zero(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(jdat(1))
        await trio.sleep(1)
        (block,) = writer.blocks
        assert block.rows == 0
        writer.commit(0)
        assert await receive_exactly(client, 28) == ackn(1, 0)
        await client.aclose()


# -- hostile input, end to end through the session -----------------------------------------


def submits(actions: list[object]) -> list[Submit]:
    return [a for a in actions if isinstance(a, Submit)]


@pytest.mark.trio
@pytest.mark.parametrize("length", range(9, 20))
async def test_helo_of_9_to_19_bytes_is_answered(
    autojump_clock: trio.testing.MockClock, length: int
) -> None:
    # Regression: these HELO lengths raised struct.error, which
    # escaped the connection task. Now they are a HELO like any other.
    writer = StandInWriter()
    body = (bytes(4) + struct.pack(">III", 2, 11, 0) + b"LCOR")[:length]
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(b"HELO" + struct.pack(">I", length) + body + PING)
        answer = await receive_exactly(client, 40 + 8)
        assert [m[:4] for m in messages(answer)] == [b"VERS", b"PONG"]
        await client.aclose()


@pytest.mark.trio
async def test_hostile_strings_and_times_are_stored_with_fallbacks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Regression: a lone surrogate in type/host, a '²' or Go's zero
    # time in @timestamp, raw bytes that are not UTF-8: each used to reach
    # the writer and end the process. Now the block is storable: the tag falls
    # back to the listener's, the host to null, the time to the receive time.
    writer = StandInWriter()
    events = [
        json.dumps({"type": "\ud800", "host": "\udfff", "message": "surrogates"}).encode(),
        json.dumps(
            {"type": "t" * (MAX_TAG_BYTES + 1), "host": "h" * (MAX_HOST_BYTES + 1)}
        ).encode(),
        b'{"@timestamp":"2024-05-06T07:08:09.12\xc2\xb2Z","type":"ok","host":"web1"}',
        b'{"@timestamp":"0001-01-01T00:00:00Z"}',
        b"\xff\xfe not json, not utf-8",
    ]
    async with serving(handler_for(writer, tag="shipped"), INFO) as client:
        await client.send_all(HELO + evnt(5, *events))
        await trio.sleep(1)
        writer.commit(0)
        await client.aclose()
    (block,) = writer.blocks
    assert list(block.tag) == ["shipped", "shipped", "ok", "shipped", "shipped"]
    assert list(block.host) == [None, None, "web1", None, None]  # type: ignore[arg-type]
    assert list(block.times_ns) == [None] * 5
    check_block(block)  # what the writer checks before a block joins a commit group
    table = blocks_to_arrow([block])  # and the conversion that used to raise
    assert table.num_rows == 5
    assert json.loads(block.records[0])["message"] == "surrogates"
    assert json.loads(block.records[4]) == {
        "message": {"$binary": "//4gbm90IGpzb24sIG5vdCB1dGYtOA=="}
    }


def test_rows_share_one_tag_and_host_when_no_event_names_them() -> None:
    session = CourierSession(CourierListenerConfig(tag="plain"), INFO)
    (submit,) = submits(session.receive(jdat(1, b'{"a":1}', b"text"), arrival()))
    assert submit.block.tag == "plain"
    assert submit.block.host is None
    assert submit.block.rows == 2
    check_block(submit.block)


def test_batch_id_is_the_nonce_in_hex_and_a_digest_of_the_payload() -> None:
    """A restarted old Go client repeats nonces: the same nonce with other events is new."""
    session = CourierSession(CourierListenerConfig(), INFO)
    (submit,) = submits(session.receive(jdat(0xAB, b"{}"), arrival()))
    nonce_hex, _, digest = str(submit.block.batch_id).partition(":")
    assert nonce_hex == "ab" * 16
    assert len(digest) == 16
    assert submit.label == "ab" * 16
    # A true resend (same nonce, same events) has the same batch id.
    (again,) = submits(CourierSession(CourierListenerConfig(), INFO).receive(
        jdat(0xAB, b"{}"), arrival()))  # fmt: skip
    assert again.block.batch_id == submit.block.batch_id
    # The same nonce with other events is another batch.
    (other,) = submits(CourierSession(CourierListenerConfig(), INFO).receive(
        jdat(0xAB, b'{"message":"new run"}'), arrival()))  # fmt: skip
    assert other.block.batch_id != submit.block.batch_id


def test_session_buffered_bytes_follows_the_codec() -> None:
    # Plain calls, no trio: receive() may run in a worker thread.
    session = CourierSession(CourierListenerConfig(), INFO)
    assert session.buffered_bytes() == 0
    data = HELO + jdat(2, b'{"a":1}') + PING
    actions: list[object] = []
    for i in range(len(data)):
        actions += session.receive(data[i : i + 1], arrival())
        done = i + 1 in (len(HELO), len(HELO) + len(jdat(2, b'{"a":1}')), len(data))
        assert (session.buffered_bytes() == 0) == done, f"after byte {i}"
    assert [type(a) for a in actions] == [Reply, Submit, Reply]


def test_a_bad_helo_ends_the_session_with_a_close() -> None:
    session = CourierSession(CourierListenerConfig(), INFO)
    (close,) = session.receive(b"HELO" + struct.pack(">I", 33) + bytes(33), arrival())
    assert isinstance(close, Close)
    assert "exceeds 32" in close.reason
    assert session.buffered_bytes() == 0


_ODD_TEXT = st.lists(
    st.one_of(
        st.sampled_from(["\ud800", "\udfff", "\u00b2", "\u0663", "0001-01-01T00:00:00Z"]),
        st.characters(),
        st.text(max_size=4),
    ),
    max_size=6,
).map("".join)
_ODD_EVENT = st.fixed_dictionaries(
    {},
    optional={
        "type": _ODD_TEXT,
        "host": _ODD_TEXT | st.fixed_dictionaries({"name": _ODD_TEXT}),
        "@timestamp": _ODD_TEXT
        | st.sampled_from(["2024-05-06T07:08:09.1\u00b2Z", "9999-12-31T23:59:59Z"]),
        "message": _ODD_TEXT,
    },
).map(lambda e: json.dumps(e).encode())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ODD_EVENT | st.binary(max_size=16), max_size=10), st.integers(1, 64))
def test_fuzz_session_blocks_are_always_storable(events: list[bytes], read: int) -> None:
    # Codec, event-to-row mapping and the Arrow conversion, on odd events:
    # nothing but storable blocks (or a Close) comes out.
    session = CourierSession(CourierListenerConfig(), INFO)
    data = HELO + evnt(1, *events) + jdat(2, *events)
    actions: list[object] = []
    for i in range(0, len(data), read):
        actions += session.receive(data[i : i + read], arrival())
    blocks = [s.block for s in submits(actions)]
    assert [b.rows for b in blocks] == [len(events)] * 2
    for block in blocks:
        check_block(block)
    assert blocks_to_arrow(blocks).num_rows == 2 * len(events)
