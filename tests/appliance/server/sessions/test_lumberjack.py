"""The Lumberjack session over trio memory streams, with an autojump clock.

The writer here is a stand-in that resolves tickets when the test says so:
these tests are about when acks and keepalives go out, in which order and
with which sequence, and about the rows a window becomes. The real writer and
real clients are in tests/interop/test_pylogbeat.py and
tests/interop/test_lumberjack_node.py.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES
from appliance.blocks.timefmt import MAX_TIME_NS
from appliance.config import LumberjackListenerConfig
from appliance.server.connection import Close, Submit
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.lumberjack import LumberjackSession, lumberjack_handler
from tests.appliance.server.support import (
    StandInWriter,
    arrival,
    handler_factory,
    receive_exactly,
    receive_within,
    serving,
)

INFO = ConnectionInfo(
    listener="beats", address="192.0.2.7", port=41000, tls=True, source="CN=shipper"
)


def per_row(values: str | Sequence[str | None] | None, rows: int) -> list[str | None]:
    """A block's tag or host column row by row: one shared value or one per row
    (appliance/blocks/block.py)."""
    if values is None or isinstance(values, str):
        return [values] * rows
    return list(values)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def window(count: int, v: int = 2) -> bytes:
    return f"{v}W".encode() + u32(count)


def j(seq: int, record: dict[str, Any]) -> bytes:
    payload = json.dumps(record).encode()
    return b"2J" + u32(seq) + u32(len(payload)) + payload


def d(seq: int, pairs: dict[str, str] | list[tuple[bytes, bytes]]) -> bytes:
    items = (
        [(k.encode(), v.encode()) for k, v in pairs.items()] if isinstance(pairs, dict) else pairs
    )
    body = b"".join(u32(len(k)) + k + u32(len(v)) + v for k, v in items)
    return b"1D" + u32(seq) + u32(len(items)) + body


def beats(first: int, n: int) -> bytes:
    """A v2 window numbered from ``first`` (pylogbeat numbers across windows)."""
    return window(n) + b"".join(j(seq, {"message": f"m{seq}"}) for seq in range(first, first + n))


def ack(seq: int, v: int = 2) -> bytes:
    return f"{v}A".encode() + u32(seq)


KEEPALIVE_V2 = ack(0)


handler_for = handler_factory(lumberjack_handler, LumberjackListenerConfig)


def stand_in_writer() -> StandInWriter:
    """Like the real writer, a block with no rows resolves at once."""
    return StandInWriter(resolve_empty=True)


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
        # Not trio.sleep: a read over the driver's inline limit is decoded in a
        # worker thread, which the autojump clock does not wait for.
        await writer.wait_blocks(1)
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
    assert per_row(block.tag, block.rows) == [
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
    assert per_row(block.tag, block.rows) == ["billing", "lumberjack"]


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
    assert per_row(block.host, block.rows) == [
        "web-01",
        "beats-5",
        "forwarder-1",
        "fallback",
        None,
        None,
    ]


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
    assert per_row(block.tag, block.rows) == ["nodelog"]
    assert per_row(block.host, block.rows) == ["lj-1"]
    assert list(block.times_ns) == [1795341607_123_000_000]
    assert json.loads(block.records[0])["line"] == "hi"


# -- strict strings, times, the highest sequence, buffered bytes ------------------


def fields_invalid(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "fields.invalid"]


@pytest.mark.trio
async def test_tag_or_host_too_long_falls_back_to_the_defaults_and_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    writer = stand_in_writer()
    stream = jwindow(
        {"type": "ok", "host": "web-01"},
        {"type": "t" * (MAX_TAG_BYTES + 1), "host": "web-02"},
        {"type": "ok", "host": {"name": "h" * (MAX_HOST_BYTES + 1)}},
    )
    async with serving(handler_for(writer, tag="beats-default"), INFO) as client:
        await client.send_all(stream)
        await writer.wait_blocks(1)
        writer.commit(0)
        # The window is stored and acked: the bad fields did not fail it.
        assert await receive_within(client, 1) == ack(3)
        await client.aclose()
    (block,) = writer.blocks
    assert per_row(block.tag, block.rows) == ["ok", "beats-default", "ok"]
    assert per_row(block.host, block.rows) == ["web-01", "web-02", None]
    assert json.loads(block.records[1])["type"] == "t" * (MAX_TAG_BYTES + 1)  # kept whole
    (logged,) = fields_invalid(caplog)
    assert (logged["tags"], logged["hosts"], logged["peer"]) == (1, 1, INFO.peer)


@pytest.mark.trio
async def test_hostile_timestamps_keep_the_event_with_the_receive_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Regression: these reached the writer and raised OverflowError there.
    times: list[Any] = [
        "2026-11-22T10:00:07.\u00b2Z",
        "\u0662\u0660\u0662\u0666-11-22T10:00:07Z",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59-14:00",
        "9999-12-31T23:59:59+14:00",
        1795341607,
        ["2026-11-22T10:00:07Z"],
        None,
        "2262-04-11T23:47:16.854775807Z",
    ]
    block = await rows_of(jwindow(*({"@timestamp": t, "n": i} for i, t in enumerate(times))))
    assert list(block.times_ns) == [None] * 8 + [MAX_TIME_NS]
    assert [json.loads(r)["n"] for r in block.records] == list(range(9))
    check_block(block)  # what the writer checks: storable


@pytest.mark.trio
async def test_d_values_that_are_not_utf8_are_stored_as_binary(
    autojump_clock: trio.testing.MockClock,
) -> None:
    block = await rows_of(
        window(1, v=1) + d(1, [(b"line", "café".encode("latin-1")), (b"type", b"\xff"),
                               (b"host", b"lj-1")])
    )  # fmt: skip
    assert json.loads(block.records[0]) == {
        "line": {"$binary": "Y2Fm6Q=="}, "type": {"$binary": "/w=="}, "host": "lj-1",
    }  # fmt: skip
    assert per_row(block.tag, block.rows) == [
        "lumberjack"
    ]  # a binary value is not a string: no tag
    assert per_row(block.host, block.rows) == ["lj-1"]


@pytest.mark.trio
async def test_ack_carries_the_highest_sequence_of_a_backwards_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        # Sequences 5, 9, 2: the ack is 9 (Logstash's highest), not 2 (the last).
        await client.send_all(window(3) + j(5, {}) + j(9, {}) + j(2, {}) + window(0))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack(9) + ack(9)
        await client.aclose()


@pytest.mark.trio
async def test_a_run_of_empty_windows_is_acked_once_per_window() -> None:
    # The real clock: a read this large is decoded in a worker thread, which an
    # autojump clock would not wait for.
    writer = stand_in_writer()
    async with serving(handler_for(writer, keepalive_seconds=600), INFO) as client:
        await client.send_all(window(0) * 1000)
        expected = ack(0) * 1000
        assert await receive_exactly(client, len(expected)) == expected
        await client.aclose()
    assert writer.blocks == []


def session(**config: Any) -> LumberjackSession:
    return LumberjackSession(LumberjackListenerConfig(**config), INFO)


def test_session_buffered_bytes_are_the_unfinished_frame() -> None:
    """The request deadline times a frame: a window's events may come as they happen."""
    lumberjack = session()
    assert lumberjack.buffered_bytes() == 0
    frame = j(1, {"message": "x"})
    assert lumberjack.receive(window(2) + frame + frame[:4], arrival(0)) == []
    assert lumberjack.buffered_bytes() == 4  # the first frame is complete, held in its window
    (action,) = lumberjack.receive(frame[4:], arrival(0))
    assert lumberjack.buffered_bytes() == 0
    assert isinstance(action, Submit)
    assert action.label == "seq 1"


def test_session_counts_invalid_fields() -> None:
    lumberjack = session()
    stream = jwindow({"type": "t" * (MAX_TAG_BYTES + 1)}, {"host": "h" * (MAX_HOST_BYTES + 1)})
    (action,) = lumberjack.receive(stream, arrival(0))
    assert (lumberjack.invalid_tags, lumberjack.invalid_hosts) == (1, 1)
    assert isinstance(action, Submit)
    assert per_row(action.block.tag, action.block.rows) == ["lumberjack", "lumberjack"]


def test_session_ack_keeps_no_window_alive() -> None:
    lumberjack = session()
    (action,) = lumberjack.receive(jwindow({"m": 1}, {"m": 2}), arrival(0))
    assert isinstance(action, Submit)
    ack_now = action.ack
    # The codec's method and two numbers (highest sequence, acks): not the window.
    assert isinstance(ack_now, partial)
    assert ack_now.args == (2, 1)
    assert ack_now() == ack(2)


RAW_STRINGS = st.binary(max_size=12) | st.text(max_size=6).map(str.encode)


@st.composite
def hostile_streams(draw: st.DrawFn) -> bytes:
    """Valid framing around hostile content: bytes that are not UTF-8, long and odd values."""
    version = draw(st.sampled_from([1, 2]))
    frames = b""
    count = draw(st.integers(1, 4))
    for seq in draw(st.lists(st.integers(0, 2**32 - 1), min_size=count, max_size=count)):
        if version == 1:
            pairs = draw(st.lists(st.tuples(
                st.sampled_from([b"type", b"host", b"@timestamp", b"line"]) | RAW_STRINGS,
                RAW_STRINGS | st.sampled_from([b"x" * 2000, "\u00b2".encode(),
                                               b"0001-01-01T00:00:00Z"]),
            ), max_size=4))  # fmt: skip
            frames += d(seq, pairs)
        else:
            value = st.text(max_size=8) | st.sampled_from(
                ["t" * 1100, "0001-01-01T00:00:00Z", "2026-11-22T10:00:07.\u00b2Z", "😀" * 300]
            ) | st.integers() | st.none()  # fmt: skip
            record = draw(st.dictionaries(
                st.sampled_from(["type", "host", "@timestamp", "message"]), value, max_size=4,
            ))  # fmt: skip
            if draw(st.booleans()):
                record = {"@metadata": {"beat": record.pop("type", None)}, "host": record}
            frames += j(seq, record)
    if draw(st.booleans()):
        payload = zlib.compress(frames)
        frames = f"{version}C".encode() + u32(len(payload)) + payload
    return window(count, version) + frames


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_streams(), st.integers(0, 10**6))
def test_every_block_a_session_makes_is_storable(stream: bytes, cut: int) -> None:
    """What a codec lets through must pass the writer's check (never crash it)."""
    lumberjack = session()
    cut = cut % (len(stream) + 1)
    actions = list(lumberjack.receive(stream[:cut], arrival(1)))
    if not any(isinstance(a, Close) for a in actions):
        actions += lumberjack.receive(stream[cut:], arrival(1))
    if any(isinstance(a, Close) for a in actions):
        return  # refused: the connection closes after the windows before
    (action,) = actions
    assert isinstance(action, Submit)
    check_block(action.block)
    assert callable(action.ack)
    action.ack()
