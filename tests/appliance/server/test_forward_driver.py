"""The forward driver over trio memory streams, with an autojump clock.

The writer here is a stand-in that resolves tickets when the test says so:
these tests are about the driver's ordering, deadlines and closes. The real
writer against a real table is tested in tests/appliance/lake and, with the
driver, in tests/appliance/test_service.py.
"""

from __future__ import annotations

import msgpack
import pytest
import trio
import trio.testing

from appliance.config import ForwardListenerConfig
from appliance.server.forward_driver import forward_driver
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from tests.appliance.server.support import (
    StandInWriter,
    handler_factory,
    seconds_until_closed,
    serving,
)

INFO = ConnectionInfo(listener="test", peer="192.0.2.1:5000", tls=True)


def request(chunk: str | None, n: int = 2, tag: str = "app") -> bytes:
    entries = b"".join(msgpack.packb([1700000000 + i, {"i": i}]) for i in range(n))
    option = {"chunk": chunk} if chunk else {}
    return msgpack.packb([tag, entries, option])


def ack(chunk: str) -> bytes:
    return msgpack.packb({"ack": chunk})


async def receive_within(stream: trio.abc.ReceiveStream, seconds: float) -> bytes | None:
    """The first piece that arrives within ``seconds``, or None."""
    with trio.move_on_after(seconds):
        return await stream.receive_some(65536)
    return None


handler_for = handler_factory(forward_driver, ForwardListenerConfig)


@pytest.mark.trio
async def test_ack_is_sent_only_after_commit(autojump_clock: trio.testing.MockClock) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("c1"))
        assert await receive_within(client, 60) is None
        assert len(writer.blocks) == 1
        assert writer.blocks[0].batch_id == "c1"
        writer.commit(0)
        assert await receive_within(client, 1) == ack("c1")
        await client.aclose()


@pytest.mark.trio
async def test_acks_go_out_in_request_order(autojump_clock: trio.testing.MockClock) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("first") + request("second"))
        await trio.sleep(1)
        writer.commit(1)
        assert await receive_within(client, 10) is None
        writer.commit(0)
        received = b""
        while len(received) < len(ack("first") + ack("second")):
            data = await receive_within(client, 1)
            assert data
            received += data
        assert received == ack("first") + ack("second")
        await client.aclose()


@pytest.mark.trio
async def test_request_without_chunk_is_committed_but_not_acked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(msgpack.packb(None) + request(None) + request("c2"))
        await trio.sleep(1)
        assert [b.batch_id for b in writer.blocks] == [None, "c2"]
        writer.commit(0)
        writer.commit(1)
        assert await receive_within(client, 1) == ack("c2")
        await client.aclose()


@pytest.mark.trio
async def test_idle_connection_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    handler = handler_for(StandInWriter(), idle_timeout_seconds=30)
    assert await seconds_until_closed(handler, INFO) == pytest.approx(30)


@pytest.mark.trio
async def test_protocol_error_closes_after_acking_what_came_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("good") + msgpack.packb({"not": "an array"}))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack("good")
    # The handler returned: the connection is over for this peer only.
    assert len(writer.blocks) == 1


@pytest.mark.trio
async def test_stop_reading_still_acks_in_flight_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    lifecycle = Lifecycle()
    async with serving(handler_for(writer, lifecycle), INFO) as client:
        await client.send_all(request("inflight"))
        await trio.sleep(1)
        lifecycle.stop_reading()
        await lifecycle.wait_no_readers()
        # Sent after the stop: not read, never submitted.
        await client.send_all(request("late"))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack("inflight")
    assert [b.batch_id for b in writer.blocks] == ["inflight"]


@pytest.mark.trio
async def test_full_ack_queue_stops_reading(autojump_clock: trio.testing.MockClock) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer, max_pending_acks=2), INFO) as client:
        for i in range(6):
            await client.send_all(request(f"c{i}"))
        await trio.sleep(5)
        # One being waited on by the acker, two queued, one blocked in send.
        assert len(writer.blocks) == 4
        for i in range(4):
            writer.commit(i)
        await trio.sleep(1)
        assert len(writer.blocks) == 6
        for i in range(4, 6):
            writer.commit(i)
        await client.aclose()


@pytest.mark.trio
async def test_rows_carry_tag_time_source_and_peer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("c", n=3, tag="web.access"))
        await trio.sleep(1)
        await client.aclose()
        writer.commit(0)
    (block,) = writer.blocks
    assert block.tag == "web.access"
    assert block.peer == "192.0.2.1:5000"
    assert block.source == "anonymous"
    assert list(block.times_ns) == [(1700000000 + i) * 10**9 for i in range(3)]
    assert list(block.records) == ['{"i":0}', '{"i":1}', '{"i":2}']
