"""The shared stream driver: deadlines, refused blocks and where decoding runs.

A tiny line protocol stands in for a real codec: each ``\\n``-terminated line
is one batch of one row, acked with ``ok <line>``; a line ``bad`` yields a
block the writer refuses (a tag that is not UTF-8). The real protocols are
tested through their own sessions in the other files of this folder.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing

from appliance.lake.rows import RowBlock
from appliance.logs import get_logger
from appliance.server.connection import Action, Arrival, DriverSettings, Submit
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.transports.stream import ByteStreamSession, StreamHandler
from tests.appliance.server.support import StandInWriter, receive_within, serving

pytestmark = pytest.mark.trio

INFO = ConnectionInfo(listener="lines", address="192.0.2.9", port=4000, tls=False)


class LineSession(ByteStreamSession):
    """One row per line; records the thread each ``receive`` ran in."""

    def __init__(self) -> None:
        self.buffer = b""
        self.threads: list[int] = []

    def buffered_bytes(self) -> int:
        return len(self.buffer)

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        self.threads.append(threading.get_ident())
        self.buffer += bytes(data)
        actions: list[Action] = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            tag = "a\udcffb" if line == b"bad" else "lines"
            block = RowBlock(
                protocol="lines", source="anonymous", peer=INFO.peer,
                received_at_ns=arrival.time_ns, batch_id=None, tag=tag, host=None,
                times_ns=[None], records=['{"line":1}'], nbytes=10,
            )  # fmt: skip
            actions.append(Submit(block, b"ok " + line + b"\n", line.decode("latin-1")))
        return actions


def driver(writer: StandInWriter, session: LineSession, **settings: Any) -> StreamHandler:
    base = {"idle_timeout_seconds": 300.0, "max_pending_acks": 8, "read_size_bytes": 65536}
    base.update(settings)
    return StreamHandler(
        lambda _info: session, DriverSettings(**base), writer,  # type: ignore[arg-type]
        Lifecycle(), get_logger("test"),
    )  # fmt: skip


async def test_a_request_trickled_byte_by_byte_is_closed_at_the_request_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The idle deadline restarts on every byte; the request deadline does not."""
    writer = StandInWriter()
    handler = driver(writer, LineSession(), idle_timeout_seconds=30.0, request_timeout_seconds=60.0)
    client, server = trio.testing.memory_stream_pair()
    ended: list[float] = []

    async def serve() -> None:
        await handler(server, INFO)
        ended.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        for _ in range(100):  # 1,000 s of trickling, were it allowed
            if ended:
                break
            await client.send_all(b"x")
            await trio.sleep(10)  # well inside the idle deadline
        nursery.cancel_scope.cancel()
    assert ended, "a request trickled for 1,000 s was never cut off"
    assert ended[0] - start <= 60 + 10
    assert writer.blocks == []


async def test_requests_that_finish_reset_the_request_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter(resolve_empty=True)
    handler = driver(writer, LineSession(), idle_timeout_seconds=30.0, request_timeout_seconds=60.0)
    async with serving(handler, INFO) as client:
        for i in range(10):  # 10 requests of 40 s each: 400 s in all, each within its deadline
            await client.send_all(b"abc")
            await trio.sleep(20)
            await client.send_all(b"def")
            await trio.sleep(20)
            await client.send_all(b"\n")
            await writer.wait_blocks(i + 1)
            writer.commit(i)
            assert await receive_within(client, 1) == b"ok abcdef\n"
        await client.send_all(b"")
        await client.aclose()


async def test_a_refused_block_closes_its_connection_without_an_ack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    session = LineSession()
    async with serving(driver(writer, session), INFO) as client:
        await client.send_all(b"good\nbad\nafter\n")
        await writer.wait_blocks(1)
        writer.commit(0)
        received = await receive_within(client, 30)
    # The good batch before it is acked; nothing of the refused one or after it.
    assert received == b"ok good\n"
    assert [b.tag for b in writer.blocks] == ["lines"]


async def test_a_ticket_the_writer_refuses_gets_no_ack_and_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(driver(writer, LineSession()), INFO) as client:
        await client.send_all(b"one\ntwo\nthree\n")
        await writer.wait_blocks(3)
        writer.commit(0)
        writer.refuse(1)
        writer.commit(2)
        received = await receive_within(client, 30)
    assert received == b"ok one\n"


async def test_large_reads_are_decoded_in_a_worker_thread() -> None:
    writer = StandInWriter(resolve_empty=True)
    session = LineSession()
    async with serving(driver(writer, session, inline_decode_max_bytes=64), INFO) as client:
        await client.send_all(b"small\n")
        await writer.wait_blocks(1)
        await client.send_all(b"L" * 100 + b"\n")
        await writer.wait_blocks(2)
        writer.commit(0)
        writer.commit(1)
        await client.aclose()
    loop_thread = threading.get_ident()
    assert session.threads[0] == loop_thread
    assert session.threads[1] != loop_thread


@pytest.mark.parametrize("held", [0, 70])
async def test_the_bytes_held_count_towards_the_thread_decision(held: int) -> None:
    writer = StandInWriter(resolve_empty=True)
    session = LineSession()
    session.buffer = b"h" * held
    async with serving(driver(writer, session, inline_decode_max_bytes=64), INFO) as client:
        await client.send_all(b"tail\n")
        await writer.wait_blocks(1)
        writer.commit(0)
        await client.aclose()
    assert (session.threads[0] != threading.get_ident()) == (held > 0)


async def test_a_busy_pipelining_client_that_ends_every_read_mid_request_is_not_cut_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Progress restarts the request deadline even when bytes are always held."""
    writer = StandInWriter()
    handler = driver(writer, LineSession(), idle_timeout_seconds=50.0, request_timeout_seconds=60.0)
    with trio.fail_after(1000):
        received = await _pipeline(writer, handler)
    assert received.count(b"ok r") == 8


async def _pipeline(writer: StandInWriter, handler: StreamHandler) -> bytes:
    async with serving(handler, INFO) as client:
        await client.send_all(b"r0-start")
        for i in range(1, 8):  # each read finishes one request and starts the next: 280 s
            await trio.sleep(40)
            await client.send_all(f"\nr{i}-start".encode())
            await writer.wait_blocks(i)
            writer.commit(i - 1)
        await client.send_all(b"\n")
        await writer.wait_blocks(8)
        writer.commit(7)
        received = await receive_within(client, 5)
        await client.aclose()
    return received
