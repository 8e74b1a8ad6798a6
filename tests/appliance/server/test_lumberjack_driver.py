"""The Lumberjack session over trio memory streams, with an autojump clock.

The writer here is a stand-in that resolves tickets when the test says so:
these tests are about when acks and keepalives go out, in which order and
with which sequence, and about the rows a window becomes. The real writer and
real clients are in tests/interop/test_pylogbeat.py and
tests/interop/test_lumberjack_node.py.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
import trio
import trio.testing

from appliance.config import LumberjackListenerConfig
from appliance.lake.rows import RowBlock
from appliance.server.listener import ConnectionInfo
from appliance.server.lumberjack_driver import lumberjack_driver
from tests.appliance.server.support import (
    StandInWriter,
    handler_factory,
    receive_within,
    serving,
)

INFO = ConnectionInfo(listener="beats", peer="192.0.2.7:41000", tls=True, source="CN=shipper")


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def window(count: int, v: int = 2) -> bytes:
    return f"{v}W".encode() + u32(count)


def j(seq: int, record: dict[str, Any]) -> bytes:
    payload = json.dumps(record).encode()
    return b"2J" + u32(seq) + u32(len(payload)) + payload


def d(seq: int, pairs: dict[str, str]) -> bytes:
    body = b"".join(
        u32(len(k.encode())) + k.encode() + u32(len(v.encode())) + v.encode()
        for k, v in pairs.items()
    )
    return b"1D" + u32(seq) + u32(len(pairs)) + body


def beats(first: int, n: int) -> bytes:
    """A v2 window numbered from ``first`` (pylogbeat numbers across windows)."""
    return window(n) + b"".join(j(seq, {"message": f"m{seq}"}) for seq in range(first, first + n))


def ack(seq: int, v: int = 2) -> bytes:
    return f"{v}A".encode() + u32(seq)


KEEPALIVE_V2 = ack(0)


handler_for = handler_factory(lumberjack_driver, LumberjackListenerConfig)


def stand_in_writer() -> StandInWriter:
    """Like the real writer, a block with no rows resolves at once."""
    return StandInWriter(resolve_empty=True)


@pytest.mark.trio
async def test_ack_is_sent_only_after_commit(autojump_clock: trio.testing.MockClock) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        await client.send_all(beats(1, 3))
        assert await receive_within(client, 300) == b""
        assert [block.rows for block in writer.blocks] == [3]
        writer.commit(0)
        assert await receive_within(client, 1) == ack(3)
        await client.aclose()


@pytest.mark.trio
async def test_acks_go_out_in_window_order(autojump_clock: trio.testing.MockClock) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        # Three pipelined windows in one write, numbered across windows.
        await client.send_all(beats(1, 2) + beats(3, 3) + beats(6, 1))
        await trio.sleep(1)
        assert [block.rows for block in writer.blocks] == [2, 3, 1]
        writer.commit(2)
        writer.commit(1)
        assert await receive_within(client, 60) == b""
        writer.commit(0)
        assert await receive_within(client, 1) == ack(2) + ack(5) + ack(6)
        await client.aclose()


@pytest.mark.trio
async def test_keepalives_while_waiting_then_the_ack_carries_the_highest_sequence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=5), INFO) as client:
        await client.send_all(beats(1, 2))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack(2)
        await client.send_all(beats(3, 4))
        # Nothing is committed for 16 s: a keepalive every 5 s, none acks anything.
        assert await receive_within(client, 16) == KEEPALIVE_V2 * 3
        writer.commit(1)
        assert await receive_within(client, 1) == ack(6)
        await client.aclose()


@pytest.mark.trio
async def test_keepalive_waits_for_the_first_pending_window_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=5), INFO) as client:
        await client.send_all(beats(1, 1) + beats(2, 1))
        await trio.sleep(1)
        writer.commit(1)  # the second is committed, the first is not
        assert await receive_within(client, 11) == KEEPALIVE_V2 * 2
        writer.commit(0)
        assert await receive_within(client, 1) == ack(1) + ack(2)
        await client.aclose()


@pytest.mark.trio
async def test_v1_acks_and_keepalives_are_1A_with_the_last_acked_sequence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=5), INFO) as client:
        # npm lumberjack-protocol: one W for the connection, then D frames only.
        await client.send_all(window(2, v=1) + b"".join(d(i, {"n": str(i)}) for i in (1, 2, 3, 4)))
        await trio.sleep(1)
        assert [block.rows for block in writer.blocks] == [2, 2]
        assert await receive_within(client, 5) == ack(0, v=1)  # nothing acked yet
        writer.commit(0)
        assert await receive_within(client, 1) == ack(2, v=1)
        assert await receive_within(client, 5) == ack(2, v=1)  # keepalive: last acked
        writer.commit(1)
        assert await receive_within(client, 1) == ack(4, v=1)
        await client.aclose()


@pytest.mark.trio
async def test_empty_window_is_acked_at_once_with_the_last_sequence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        await client.send_all(window(0))
        assert await receive_within(client, 1) == ack(0)
        await client.send_all(beats(7, 2))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack(8)
        await client.send_all(window(0))
        assert await receive_within(client, 1) == ack(8)
        await client.aclose()
    assert [block.rows for block in writer.blocks] == [2]


@pytest.mark.trio
async def test_protocol_error_closes_after_acking_the_windows_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        await client.send_all(beats(1, 2) + b"2J" + u32(3) + u32(5) + b"{bad}")
        await trio.sleep(1)
        writer.commit(0)
        # The good window's ack, then the end of the stream: this peer is closed.
        assert await receive_within(client, 60) == ack(2)
    assert [block.rows for block in writer.blocks] == [2]


@pytest.mark.trio
async def test_protocol_error_alone_closes_without_an_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(b"2J" + u32(1) + u32(2) + b"{}")  # data before any W
        assert await receive_within(client, 60) == b""
    assert writer.blocks == []


# -- rows ------------------------------------------------------------------------


async def rows_of(stream: bytes, **settings: Any) -> RowBlock:
    writer = stand_in_writer()
    async with serving(handler_for(writer, **settings), INFO) as client:
        await client.send_all(stream)
        await trio.sleep(1)
        writer.commit(0)
        await client.aclose()
    (block,) = writer.blocks
    return block


def jwindow(*records: dict[str, Any]) -> bytes:
    return window(len(records)) + b"".join(j(i + 1, r) for i, r in enumerate(records))


@pytest.mark.trio
async def test_rows_carry_protocol_source_peer_and_no_batch_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(jwindow({"message": "a"}, {"message": "b"}))
    assert block.protocol == "lumberjack"
    assert block.source == "CN=shipper"
    assert block.peer == "192.0.2.7:41000"
    assert block.batch_id is None
    # J frames keep the client's JSON text as sent (json.dumps spacing here).
    assert list(block.records) == ['{"message": "a"}', '{"message": "b"}']


@pytest.mark.trio
async def test_tag_is_the_beat_then_type_then_the_listener_tag(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        jwindow(
            {"@metadata": {"beat": "filebeat"}, "type": "log"},
            {"type": "syslog"},
            {"message": "nothing names it"},
            {"@metadata": {"beat": ""}, "type": "empty beat"},
            {"@metadata": {"beat": {"name": "x"}}, "type": "beat not a string"},
            {"@metadata": "not an object", "type": 5},
        ),
        tag="beats-default",
    )
    assert list(block.tag) == [
        "filebeat", "syslog", "beats-default", "empty beat", "beat not a string", "beats-default",
    ]  # fmt: skip


@pytest.mark.trio
async def test_tag_fields_are_configurable_dotted_paths(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        jwindow({"fields": {"app": "billing"}, "type": "log"}, {"type": "log"}),
        tag_fields=["fields.app"],
    )
    assert list(block.tag) == ["billing", "lumberjack"]


@pytest.mark.trio
async def test_host_is_host_name_then_beat_hostname_then_a_host_string(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        jwindow(
            {"host": {"name": "web-01"}, "beat": {"hostname": "older"}},
            {"beat": {"hostname": "beats-5"}},
            {"host": "forwarder-1"},
            {"host": {"hostname": "no name key"}, "beat": {"hostname": "fallback"}},
            {"host": {"ip": ["10.0.0.1"]}},
            {"message": "no host at all"},
        )
    )
    assert list(block.host) == ["web-01", "beats-5", "forwarder-1", "fallback", None, None]


@pytest.mark.trio
async def test_timestamp_becomes_event_nanoseconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        jwindow(
            {"@timestamp": "2026-11-22T10:00:07.000007123Z"},
            {"@timestamp": "2026-11-22T10:00:07.5Z"},
            {"@timestamp": "2026-11-22T11:00:07+01:00"},
            {"@timestamp": "yesterday"},
            {"@timestamp": 1795341607},
            {"message": "no time"},
        )
    )
    base = 1795341607 * 10**9
    assert list(block.times_ns) == [base + 7123, base + 500_000_000, base, None, None, None]


@pytest.mark.trio
async def test_v1_pairs_map_type_host_and_timestamp(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        window(1, v=1)
        + d(1, {"line": "hi", "type": "nodelog", "host": "lj-1",
                "@timestamp": "2026-11-22T10:00:07.123Z"})
    )  # fmt: skip
    assert list(block.tag) == ["nodelog"]
    assert list(block.host) == ["lj-1"]
    assert list(block.times_ns) == [1795341607_123_000_000]
    assert json.loads(block.records[0])["line"] == "hi"
