"""The answering loop's guarantees, with a fake transport and a fake session.

Every protocol runs on :class:`~appliance.server.connection.Connection`, so
the guarantees it gives are tested here once, with no codec: acks in order
and only after the commit, no ack for a refused block, nothing sent after a
cancellation, the deadlines, backpressure, lanes, keepalives and where
decoding runs. The per-protocol tests (``sessions/``, the WebSocket and
Logjam listeners) keep what only their protocol does.

The fake session reads commands, one per unit (``"b:a"`` is a batch named
``a`` acked ``ack a``; see :class:`Commands`); the fake transport takes its
units from a memory channel and collects what is sent. The clock is trio's
autojump clock, except where a worker thread decodes (the autojump clock
skips ahead while a thread runs): those use the real clock.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from appliance import defaults
from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.logs import get_logger
from appliance.metrics import Metrics
from appliance.server.connection import (
    Action,
    Arrival,
    Await,
    Cause,
    Close,
    Connection,
    DriverSettings,
    Ending,
    PeerGone,
    Reply,
    Submit,
)
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.pending import ENTRY_BYTES
from appliance.server.transports.stream import ByteStreamSession, StreamHandler
from tests.appliance.server.support import StandInWriter, receive_within, serving

pytestmark = pytest.mark.trio

INFO = ConnectionInfo(listener="fake", address="192.0.2.9", port=4000, tls=False)


def block(name: str, *, storable: bool = True, rows: int = 1) -> RowBlock:
    """A block named ``name``; the writer refuses one that is not ``storable`` at submit."""
    return RowBlock(
        protocol="fake", source="anonymous", peer=INFO.peer, received_at_ns=1, batch_id=name,
        tag="fake" if storable else "a\udcffb", host=None, times_ns=[None] * rows,
        records=['{"a":1}'] * rows,
    )  # fmt: skip


class Commands:
    """A fake session: each unit is one command.

    * ``b:NAME`` a batch, acked ``ack NAME`` (``b:NAME@LANE`` in lane LANE);
    * ``m:NAME*ROWS`` a batch of ROWS rows, acked ``ack NAME``;
    * ``q:NAME`` a batch with no ack (committed, nothing sent);
    * ``k:NAME`` a batch acked ``ack NAME`` with the keepalive ``wait NAME``;
    * ``s:NAME`` a batch refused at submit (no refusal answer: the connection closes);
    * ``a:NAME`` a batch whose refusal is answered ``refused NAME: reason``;
    * ``n:NAME`` a batch with no ack whose refusal is answered (takes no slot);
    * ``r:NAME`` a reply ``reply NAME`` (``r:NAME@LANE``);
    * ``w:NAME`` an Await that yields a reply ``awaited NAME``;
    * ``x:REASON`` a Close with the reply ``bye``;
    * ``p:N`` part of a request: N bytes held until the next command;
    * ``h:`` the handshake completes.
    """

    def __init__(self) -> None:
        self.held = 0
        self.handshake = True
        self.greet: str | None = None
        self.threads: list[int] = []
        self.refusals: list[str] = []

    def greeting(self) -> str | None:
        return self.greet

    def handshake_done(self) -> bool:
        return self.handshake

    def buffered_bytes(self) -> int:
        return self.held

    def decode_bytes(self, unit: str) -> int:
        return len(unit) + self.held

    def receive(self, unit: str, arrival: Arrival) -> list[Action[str]]:
        self.threads.append(threading.get_ident())
        kind, _, rest = unit.partition(":")
        name, _, lane_text = rest.partition("@")
        lane = lane_text or None
        self.held = int(name) if kind == "p" else 0
        if kind == "b":
            return [Submit(block(name), ack=f"ack {name}", label=name, lane=lane)]
        if kind == "m":
            name, _, rows = name.partition("*")
            return [Submit(block(name, rows=int(rows)), ack=f"ack {name}", label=name)]
        if kind == "q":
            return [Submit(block(name), label=name)]
        if kind == "k":
            return [Submit(block(name), ack=f"ack {name}", label=name, keepalive=f"wait {name}")]
        if kind == "s":
            return [Submit(block(name, storable=False), ack=f"ack {name}", label=name)]
        if kind in ("a", "n"):
            storable = not name.startswith("bad")
            return [
                Submit(block(name, storable=storable), ack=f"ack {name}" if kind == "a" else None,
                       label=name, refused=self._refusal(name))
            ]  # fmt: skip
        if kind == "r":
            return [Reply(f"reply {name}", lane=lane)]
        if kind == "w":
            return [Await(self._awaited(name))]
        if kind == "x":
            return [Close(name, "bye")]
        if kind == "h":
            self.handshake = True
        return []

    def _refusal(self, name: str) -> Callable[[BlockRefused], str]:
        def refused(exc: BlockRefused) -> str:
            self.refusals.append(name)
            return f"refused {name}: {exc.reason}"

        return refused

    def _awaited(self, name: str) -> Callable[[], Any]:
        async def run() -> list[Action[str]]:
            await trio.sleep(1)  # a credential look-up
            return [Reply(f"awaited {name}")]

        return run


class FakeTransport:
    """Units from a memory channel; answers into :attr:`sent` (or into a stall)."""

    def __init__(self) -> None:
        self.units, self._units = trio.open_memory_channel[str](math.inf)
        self.sent: list[str] = []
        self.arrived = trio.Event()
        #: Sends block for ever (a peer that does not read) / fail (a peer that is gone).
        self.stalled = False
        self.gone = False

    async def receive(self) -> str:
        try:
            return await self._units.receive()
        except trio.EndOfChannel:
            raise PeerGone("peer closed") from None

    async def send(self, answer: str) -> None:
        if self.gone:
            raise PeerGone("the peer is gone")
        if self.stalled:
            with trio.move_on_after(30):
                await trio.sleep_forever()
            raise PeerGone("peer does not read")
        self.sent.append(answer)
        self.arrived.set()
        self.arrived = trio.Event()

    async def feed(self, *units: str) -> None:
        for unit in units:
            await self.units.send(unit)

    async def answers(self, count: int, seconds: float = 60) -> list[str]:
        """The first ``count`` answers, waiting at most ``seconds`` for them."""
        with trio.move_on_after(seconds):
            while len(self.sent) < count:
                await self.arrived.wait()
        return list(self.sent)


@dataclass
class Served:
    transport: FakeTransport
    session: Commands
    writer: StandInWriter
    lifecycle: Lifecycle
    connection: Connection[str, str]
    endings: list[Ending] = field(default_factory=list)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def ended(self) -> Ending | None:
        return self.endings[0] if self.endings else None


@asynccontextmanager
async def serving_fake(
    session: Commands | None = None,
    writer: StandInWriter | None = None,
    *,
    info: ConnectionInfo = INFO,
    **settings: Any,
) -> AsyncIterator[Served]:
    """A connection of the loop running until the block ends (then it is cancelled)."""
    base: dict[str, Any] = {"idle_timeout_seconds": 300.0, "max_pending_acks": 8,
                            "read_size_bytes": 65536}  # fmt: skip
    base.update(settings)
    transport, lifecycle = FakeTransport(), Lifecycle()
    session = session or Commands()
    writer = writer or StandInWriter()
    connection: Connection[str, str] = Connection(
        transport, session, writer, DriverSettings(**base), lifecycle=lifecycle,
        log=get_logger("test"), info=info, decode_threads=trio.CapacityLimiter(1),
    )  # fmt: skip
    served = Served(transport, session, writer, lifecycle, connection)

    async def run() -> None:
        with served.scope:
            served.endings.append(await connection.run())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield served
        nursery.cancel_scope.cancel()


# -- order and durability ----------------------------------------------------------------


async def test_an_ack_leaves_only_after_its_commit(autojump_clock: trio.testing.MockClock) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one")
        await served.writer.wait_blocks(1)
        assert await served.transport.answers(1, seconds=600) == []
        served.writer.commit(0)
        assert await served.transport.answers(1) == ["ack one"]


async def test_acks_leave_in_request_order_whatever_order_the_commits_come_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one", "r:two", "b:three", "q:four", "b:five")
        await served.writer.wait_blocks(4)
        served.writer.commit(3)
        served.writer.commit(2)
        served.writer.commit(1)
        # Everything waits behind the first batch, the reply too.
        assert await served.transport.answers(1, seconds=60) == []
        served.writer.commit(0)
        assert await served.transport.answers(4) == ["ack one", "reply two", "ack three",
                                                     "ack five"]  # fmt: skip


async def test_a_block_refused_at_submit_closes_with_nothing_after_it(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one", "s:bad", "b:after")
        await served.writer.wait_blocks(1)
        served.writer.commit(0)
        await served.transport.answers(2, seconds=60)
        ended = served.ended
    assert served.transport.sent == ["ack one"]
    assert [b.batch_id for b in served.writer.blocks] == ["one"]  # "after" was never read
    assert ended == Ending(Cause.REFUSED, "batch cannot be stored: tag is not valid UTF-8")
    assert "block.refused" in caplog.text


async def test_a_block_refused_at_commit_gets_no_ack_and_nothing_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one", "b:two", "b:three")
        await served.writer.wait_blocks(3)
        served.writer.commit(2)
        served.writer.refuse(1, "cannot be stored")
        served.writer.commit(0)
        await served.transport.answers(3, seconds=60)
        ended = served.ended
    assert served.transport.sent == ["ack one"]
    assert ended == Ending(Cause.REFUSED, "batch cannot be stored: cannot be stored")


async def test_a_refusal_with_an_answer_takes_the_acks_place_and_the_connection_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        # Refused at submit ("bad..." is not storable), and at commit.
        await served.transport.feed("a:one", "a:bad-submit", "a:at-commit", "a:four")
        await served.writer.wait_blocks(3)
        served.writer.refuse(1, "no room")
        served.writer.commit(0)
        served.writer.commit(2)
        assert await served.transport.answers(4) == [
            "ack one",
            "refused bad-submit: tag is not valid UTF-8",
            "refused at-commit: no room",
            "ack four",
        ]
        assert served.ended is None
        assert served.connection.tally.refused == 1
        assert served.connection.tally.refused_at_commit == 1


async def test_a_cancelled_connection_sends_nothing_more(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with serving_fake() as served:
        await served.transport.feed("b:one", "b:two", "r:three")
        await served.writer.wait_blocks(2)
        served.writer.commit(0)
        assert await served.transport.answers(1) == ["ack one"]
        served.scope.cancel()  # the service stops the connection's task
        await trio.sleep(1)
        served.writer.commit(1)  # committed after all: the peer is not told
        await trio.sleep(1)
    assert served.transport.sent == ["ack one"]
    assert served.ended is None
    assert caplog.text.count("reply.withheld") == 2  # the ack and the reply behind it


async def test_a_commit_that_lands_as_the_connection_is_cancelled_is_not_acked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one")
        await served.writer.wait_blocks(1)
        await trio.sleep(1)  # the answerer waits for the commit
        served.writer.commit(0)  # wakes it ...
        served.scope.cancel()  # ... in the same step as the cancel
        await trio.sleep(1)
    assert served.transport.sent == []


# -- ending -----------------------------------------------------------------------------------


async def test_a_close_is_answered_after_what_came_before_and_ends_reading(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one", "x:that was wrong", "b:never")
        await served.writer.wait_blocks(1)
        served.writer.commit(0)
        assert await served.transport.answers(2) == ["ack one", "bye"]
        await trio.sleep(1)
        assert served.ended == Ending(Cause.VIOLATION, "protocol error: that was wrong")
    assert len(served.writer.blocks) == 1
    assert "protocol.error" in caplog.text


async def test_what_was_read_is_still_answered_after_the_peer_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:one")
        await served.transport.units.aclose()
        await served.writer.wait_blocks(1)
        await trio.sleep(10)
        assert served.ended is None  # the answer still waits for its commit
        served.writer.commit(0)
        assert await served.transport.answers(1) == ["ack one"]
        await trio.sleep(1)
        assert served.ended == Ending(Cause.PEER_CLOSED, "peer closed")


async def test_shutdown_stops_reading_and_still_answers_what_was_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:inflight")
        await served.writer.wait_blocks(1)
        served.lifecycle.stop_reading()
        await served.lifecycle.wait_no_readers()
        await served.transport.feed("b:late")  # after the stop: never read
        await trio.sleep(1)
        served.writer.commit(0)
        assert await served.transport.answers(1) == ["ack inflight"]
        await trio.sleep(1)
        assert served.ended == Ending(Cause.SHUTDOWN, "shutdown")
    assert [b.batch_id for b in served.writer.blocks] == ["inflight"]


async def test_a_sink_that_takes_no_more_blocks_is_a_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class ClosedWriter(StandInWriter):
        async def submit(self, block: RowBlock) -> Any:
            raise trio.ClosedResourceError

    async with serving_fake(writer=ClosedWriter()) as served:
        await served.transport.feed("b:one")
        await trio.sleep(1)
        assert served.ended == Ending(Cause.SHUTDOWN, "shutdown")
    assert served.transport.sent == []


async def test_a_peer_that_does_not_read_ends_the_connection(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with serving_fake() as served:
        served.transport.stalled = True
        await served.transport.feed("b:one", "b:two")
        await served.writer.wait_blocks(2)
        served.writer.commit(0)
        served.writer.commit(1)
        await trio.sleep(60)
        assert served.ended == Ending(Cause.UNANSWERED, "peer does not read")
    assert served.transport.sent == []
    assert "connection.unanswered" in caplog.text


# -- deadlines -----------------------------------------------------------------------------


async def test_an_idle_connection_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    async with serving_fake(idle_timeout_seconds=30.0) as served:
        start = trio.current_time()
        await served.transport.feed("r:hello")
        await trio.sleep(29)
        assert served.ended is None
        await trio.sleep(2)
        assert served.ended == Ending(Cause.IDLE, "idle for 30.0s")
        assert trio.current_time() - start < 32


async def test_a_request_trickled_a_byte_at_a_time_is_closed_at_the_request_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The idle deadline restarts with every unit; the request deadline does not."""
    async with serving_fake(idle_timeout_seconds=30.0, request_timeout_seconds=60.0) as served:
        start = trio.current_time()
        for held in range(1, 100):  # 1,000 s of trickling, were it allowed
            if served.ended:
                break
            await served.transport.feed(f"p:{held}")
            await trio.sleep(10)  # well inside the idle deadline
        assert served.ended == Ending(Cause.REQUEST_TIMEOUT, "request not finished within 60.0s")
        assert trio.current_time() - start <= 60 + 10


async def test_requests_that_finish_restart_the_request_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake(idle_timeout_seconds=30.0, request_timeout_seconds=60.0) as served:
        for i in range(10):  # 10 requests of 40 s each: 400 s in all, each within its deadline
            await served.transport.feed("p:3")
            await trio.sleep(20)
            await served.transport.feed("p:6")
            await trio.sleep(20)
            await served.transport.feed(f"b:{i}")
            await served.writer.wait_blocks(i + 1)
            served.writer.commit(i)
            assert (await served.transport.answers(i + 1))[-1] == f"ack {i}"
        assert served.ended is None


async def test_a_pipelining_client_whose_every_unit_ends_mid_request_is_not_cut_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A unit that completes a request restarts the deadline even when bytes are held."""

    class Pipelined(Commands):
        def receive(self, unit: str, arrival: Arrival) -> list[Action[str]]:
            actions = super().receive(unit, arrival)
            self.held = 5  # every unit ends with the start of the next request
            return actions

    async with serving_fake(Pipelined(), idle_timeout_seconds=50.0,
                            request_timeout_seconds=60.0) as served:  # fmt: skip
        for i in range(8):  # 40 s apart: 320 s, each unit completing one request
            await served.transport.feed(f"b:{i}")
            await served.writer.wait_blocks(i + 1)
            served.writer.commit(i)
            await trio.sleep(40)
        assert served.ended is None
        assert len(await served.transport.answers(8)) == 8


async def test_an_unfinished_handshake_is_closed_at_its_deadline(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    session = Commands()
    session.handshake = False
    async with serving_fake(session, handshake_timeout_seconds=10.0) as served:
        for _ in range(5):
            await served.transport.feed("r:chatter")  # answered, but no handshake
            await trio.sleep(3)
        assert served.ended == Ending(Cause.HANDSHAKE_TIMEOUT, "no handshake within 10.0s")
    assert "handshake.timeout" in caplog.text


async def test_a_finished_handshake_lifts_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = Commands()
    session.handshake = False
    async with serving_fake(session, handshake_timeout_seconds=10.0) as served:
        await served.transport.feed("h:")
        await trio.sleep(100)
        assert served.ended is None


# -- backpressure, lanes, keepalives, greeting ------------------------------------------------


async def test_max_pending_answers_stop_the_reader(autojump_clock: trio.testing.MockClock) -> None:
    async with serving_fake(max_pending_acks=2) as served:
        await served.transport.feed(*(f"b:{i}" for i in range(6)))
        await trio.sleep(5)
        # Two answers wait: the third request is not taken before one has left.
        assert len(served.writer.blocks) == 2
        served.writer.commit(0)
        await trio.sleep(1)
        assert len(served.writer.blocks) == 3
        for i in range(1, 3):
            served.writer.commit(i)
        await trio.sleep(1)
        assert len(served.writer.blocks) == 5
        for i in range(3, 5):
            served.writer.commit(i)
        await served.writer.wait_blocks(6)
        served.writer.commit(5)
        assert await served.transport.answers(6) == [f"ack {i}" for i in range(6)]


async def test_pending_bytes_stop_the_reader(autojump_clock: trio.testing.MockClock) -> None:
    """The budget is bytes: two 100-row blocks fit, the third waits for an ack."""
    charge = block("x", rows=100).nbytes + ENTRY_BYTES
    async with serving_fake(max_pending_bytes=2 * charge, max_pending_acks=100) as served:
        await served.transport.feed(*(f"m:{i}*100" for i in range(4)))
        await trio.sleep(5)
        assert len(served.writer.blocks) == 2
        served.writer.commit(0)
        await trio.sleep(1)
        assert len(served.writer.blocks) == 3
        for i in range(1, 3):
            served.writer.commit(i)
        await served.writer.wait_blocks(4)
        served.writer.commit(3)
        assert await served.transport.answers(4) == [f"ack {i}" for i in range(4)]


async def test_a_block_larger_than_the_byte_budget_is_taken_when_nothing_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An oversized request must not stall for ever; it just waits to be alone."""
    async with serving_fake(max_pending_bytes=1) as served:
        await served.transport.feed("m:big*1000", "m:next*1000")
        await trio.sleep(5)
        assert [b.batch_id for b in served.writer.blocks] == ["big"]
        served.writer.commit(0)
        await served.writer.wait_blocks(2)
        served.writer.commit(1)
        assert await served.transport.answers(2) == ["ack big", "ack next"]


async def test_thousands_of_small_requests_are_all_taken_while_they_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Message mode: one event per request, thousands in flight (docs/decisions.md, 35).

    With the shipped bounds every one is read and submitted before any commit,
    so a client's acks all come back with the next commit or two.
    """
    count = 2500
    shipped = {
        "max_pending_bytes": defaults.LISTENER_MAX_PENDING_BYTES,
        "max_pending_acks": defaults.LISTENER_MAX_PENDING_ACKS,
    }
    async with serving_fake(**shipped) as served:
        await served.transport.feed(*(f"b:{i}" for i in range(count)))
        with trio.fail_after(60):
            await served.writer.wait_blocks(count)
        assert served.transport.sent == []  # nothing acked before its commit
        for i in range(count):
            served.writer.commit(i)
        assert await served.transport.answers(count) == [f"ack {i}" for i in range(count)]


async def test_a_batch_nothing_waits_for_takes_no_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake(max_pending_acks=1) as served:
        await served.transport.feed("b:first", "n:a", "n:b", "n:c")
        await trio.sleep(5)
        assert [b.batch_id for b in served.writer.blocks] == ["first", "a", "b", "c"]


async def test_a_lane_waiting_for_its_commit_holds_up_no_other_lane(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("b:slow@p1", "r:ping@p2", "b:quick@p2", "r:after@p1")
        await served.writer.wait_blocks(2)
        served.writer.commit(1)
        assert await served.transport.answers(2) == ["reply ping", "ack quick"]
        served.writer.commit(0)
        assert await served.transport.answers(4) == ["reply ping", "ack quick", "ack slow",
                                                     "reply after"]  # fmt: skip


async def test_keepalives_go_out_while_the_first_waiting_batch_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake(keepalive_seconds=5.0) as served:
        await served.transport.feed("k:one", "k:two")
        await served.writer.wait_blocks(2)
        served.writer.commit(1)  # the second is committed, the first is not
        await trio.sleep(16)
        # Every 5 s, for the batch at the head of the line only.
        assert served.transport.sent == ["wait one"] * 3
        served.writer.commit(0)
        assert (await served.transport.answers(5))[3:] == ["ack one", "ack two"]


async def test_the_greeting_goes_first(autojump_clock: trio.testing.MockClock) -> None:
    session = Commands()
    session.greet = "hello"
    async with serving_fake(session) as served:
        await served.transport.feed("r:one")
        assert await served.transport.answers(2) == ["hello", "reply one"]


async def test_an_await_is_finished_before_anything_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving_fake() as served:
        await served.transport.feed("w:check", "b:after")
        await trio.sleep(0.5)
        assert served.writer.blocks == []  # the look-up is still running
        await served.writer.wait_blocks(1)
        served.writer.commit(0)
        assert await served.transport.answers(2) == ["awaited check", "ack after"]


async def test_acks_and_their_latency_are_counted(autojump_clock: trio.testing.MockClock) -> None:
    metrics = Metrics(process=False).listener("fake", "fake")
    info = ConnectionInfo("fake", "192.0.2.9", 4000, tls=False, metrics=metrics)
    async with serving_fake(info=info) as served:
        await served.transport.feed("b:one", "r:two")
        await served.writer.wait_blocks(1)
        await trio.sleep(2)
        served.writer.commit(0)
        await served.transport.answers(2)
        tally = served.connection.tally
    assert (tally.batches, tally.events, tally.acks) == (1, 1, 1)
    counted = (metrics.requests, metrics.events, metrics.acks)
    assert [c.value for c in counted] == [1, 1, 1]  # type: ignore[attr-defined]
    assert metrics.ack_latency.sum >= 2  # type: ignore[attr-defined]


# -- where decoding runs (real clock: a worker thread runs under it) ---------------------------


async def test_large_units_are_decoded_in_a_worker_thread() -> None:
    async with serving_fake(inline_decode_max_bytes=64) as served:
        await served.transport.feed("b:small", "b:" + "L" * 100)
        await served.writer.wait_blocks(2)
        loop_thread = threading.get_ident()
        assert served.session.threads[0] == loop_thread
        assert served.session.threads[1] != loop_thread


@pytest.mark.parametrize("held", [0, 70])
async def test_the_bytes_held_count_towards_the_thread_decision(held: int) -> None:
    session = Commands()
    session.held = held
    async with serving_fake(session, inline_decode_max_bytes=64) as served:
        await served.transport.feed("b:tail")
        await served.writer.wait_blocks(1)
    assert (session.threads[0] != threading.get_ident()) == (held > 0)


# -- the byte-stream handler over a memory stream ------------------------------------------


class LineSession(ByteStreamSession):
    """One row per ``\\n``-terminated line, acked ``ok <line>``."""

    def __init__(self) -> None:
        self.buffer = b""

    def buffered_bytes(self) -> int:
        return len(self.buffer)

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        self.buffer += bytes(data)
        actions: list[Action[bytes]] = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            actions.append(Submit(block(line.decode()), b"ok " + line + b"\n", line.decode()))
        return actions


async def test_the_stream_handler_serves_a_session_over_a_stream(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    writer = StandInWriter()
    settings = DriverSettings(idle_timeout_seconds=30.0, max_pending_acks=8,
                              read_size_bytes=4)  # fmt: skip
    handler = StreamHandler(lambda _info: LineSession(), settings, writer, Lifecycle(),
                            get_logger("test"))  # fmt: skip
    async with serving(handler, INFO) as client:
        await client.send_all(b"first\nsec")
        await client.send_all(b"ond\n")
        await writer.wait_blocks(2)
        writer.commit(0)
        writer.commit(1)
        assert await receive_within(client, 1) == b"ok first\nok second\n"
        await client.send_eof()
        await trio.sleep(1)
    closed = [r for r in caplog.records if r.getMessage() == "connection.closed"]
    assert [getattr(r, "fields", {}).get("reason") for r in closed] == ["peer closed"]
