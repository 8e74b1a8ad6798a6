"""The workers' least-connections accept gate and the sockets and counts they inherit.

The decision (:func:`may_accept`) is checked over arbitrary counts; the
driver (the listener's gated accept) on real loopback sockets under trio's
autojump clock, so the grace is virtual time and no test waits on the machine.
"""

from __future__ import annotations

import os
import socket

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from appliance.server.listener import ConnectionInfo, TcpService, _Backlog, _gated_accept
from appliance.server.spread import (
    ABSENT,
    ACCEPT_DEFER_SECONDS,
    AcceptGate,
    ConnectionCounts,
    InheritedSockets,
    WorkerShare,
    may_accept,
)

counts_of = st.lists(st.integers(min_value=-1, max_value=1000), min_size=1, max_size=16)


@given(counts_of, st.data())
def test_a_worker_may_accept_exactly_when_it_holds_the_fewest_of_the_live_workers(
    counts: list[int], data: st.DataObject
) -> None:
    me = data.draw(st.integers(min_value=0, max_value=len(counts) - 1))
    live = [count for count in counts if count >= 0]
    mine = max(counts[me], 0)
    assert may_accept(counts, me) == all(mine <= count for count in live)


@given(counts_of)
def test_some_live_worker_may_always_accept(counts: list[int]) -> None:
    """Absent slots never hold the minimum down: a running worker always takes the next one."""
    live = [index for index, count in enumerate(counts) if count >= 0]
    if live:
        takers = [index for index in live if may_accept(counts, index)]
        assert takers
        assert {counts[index] for index in takers} == {min(counts[index] for index in live)}


def test_counts_are_shared_through_their_descriptor_and_start_absent() -> None:
    counts = ConnectionCounts.create(3)
    try:
        assert counts.read() == [ABSENT] * 3
        other = ConnectionCounts.attach(os.dup(counts.fd), 3)  # as a worker maps it
        try:
            gate = AcceptGate(other, 1)
            gate.opened()  # before join: still absent, so nobody defers to it
            assert counts.read() == [ABSENT, ABSENT, ABSENT]
            gate.join()
            assert counts.read() == [ABSENT, 1, ABSENT]
            gate.opened()
            gate.closed()
            gate.opened()
            assert counts.read() == [ABSENT, 2, ABSENT]
            assert gate.spread() == counts.read()
            gate.leave()
            gate.closed()
            assert counts.read() == [ABSENT] * 3
        finally:
            other.close()
    finally:
        counts.close()


def test_a_worker_reads_its_share_from_the_supervisor_s_spec() -> None:
    counts = ConnectionCounts.create(2)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        bind = f"127.0.0.1:{listening.getsockname()[1]}"
        spec = WorkerShare.spec({"fwd": (bind, [listening.fileno()])}, counts.fd, 2)
        share = WorkerShare.parse(spec, 1)
        assert share.gate is not None
        share.gate.join()
        assert counts.read() == [ABSENT, 0]
        assert share.sockets.described() == {"fwd": (bind, (listening.fileno(),))}
    counts.close()
    with pytest.raises(ValueError, match="--shared"):
        WorkerShare.parse('{"listeners": 3}', 0)


@pytest.mark.trio
async def test_inherited_sockets_are_served_as_duplicates_for_their_listener_and_address() -> None:
    original = socket.socket()
    original.bind(("127.0.0.1", 0))  # bound, not listening, as the supervisor hands it
    port = original.getsockname()[1]
    bind = f"127.0.0.1:{port}"
    sockets = InheritedSockets.of({"fwd": (bind, [original.detach()])})
    with pytest.raises(ConnectionRefusedError):  # nobody serves it yet
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert sockets.take("fwd", "127.0.0.1:1") is None  # moved by a reload: bind its own
    assert sockets.take("other", bind) is None
    for _ in range(2):  # a listener stopped and started again gets the same queue
        taken = sockets.take("fwd", bind)
        assert taken is not None
        assert taken[0].socket.fileno() not in sockets.fds()
        assert taken[0].socket.getsockname()[1] == port
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it listens now
        for listener in taken:
            await listener.aclose()
    assert sockets.drop({"fwd": bind}) == []
    assert sockets.drop({"fwd": "127.0.0.1:1"}) == ["fwd"]
    assert sockets.fds() == []
    with pytest.raises(ConnectionRefusedError):  # closed with the last descriptor
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


class _Queue:
    """A listening socket as a worker has it: trio's, and a non-blocking duplicate."""

    def __init__(self) -> None:
        self.trio = trio.socket.socket()
        self.raw = socket.socket(fileno=os.dup(self.trio.fileno()))
        self.raw.setblocking(False)

    async def listen(self) -> int:
        await self.trio.bind(("127.0.0.1", 0))
        self.trio.listen()
        port: int = self.trio.getsockname()[1]
        return port

    def close(self) -> None:
        self.raw.close()
        self.trio.close()


def _gate(counts: list[int], me: int) -> tuple[AcceptGate, ConnectionCounts]:
    shared = ConnectionCounts.create(len(counts))
    gate = AcceptGate(shared, me)
    gate.join()
    for index, count in enumerate(counts):
        shared.set(index, count)
    gate.open = max(counts[me], 0)
    return gate, shared


async def _time_to_accept(counts_now: list[int], me: int, has_room: bool = True) -> float:
    """Virtual seconds worker ``me`` takes to accept one queued connection at ``counts_now``."""
    queue = _Queue()
    gate, counts = _gate(counts_now, me=me)
    try:
        port = await queue.listen()
        client = await trio.open_tcp_stream("127.0.0.1", port)
        start = trio.current_time()
        stream = await _gated_accept(queue.trio, queue.raw, gate, _Backlog(), lambda: has_room)
        waited = trio.current_time() - start
        await stream.aclose()
        await client.aclose()
        return waited
    finally:
        queue.close()
        counts.close()


@pytest.mark.trio
async def test_the_least_busy_worker_accepts_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await _time_to_accept([0, 2, ABSENT], me=0) < ACCEPT_DEFER_SECONDS


@pytest.mark.trio
async def test_a_busier_worker_takes_a_connection_nobody_took_after_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A less busy worker that is stuck or gone strands nothing."""
    waited = await _time_to_accept([3, 0], me=0)
    assert ACCEPT_DEFER_SECONDS <= waited < 2 * ACCEPT_DEFER_SECONDS


@pytest.mark.trio
async def test_a_connection_another_worker_took_does_not_shorten_the_next_one_s_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = _Queue()
    gate, counts = _gate([3, 0], me=0)
    accepted: list[float] = []
    try:
        port = await queue.listen()

        async def busy_worker() -> None:
            stream = await _gated_accept(queue.trio, queue.raw, gate, _Backlog(), lambda: True)
            accepted.append(trio.current_time())
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy_worker)
            first = await trio.open_tcp_stream("127.0.0.1", port)
            await trio.sleep(ACCEPT_DEFER_SECONDS / 5)
            taken, _ = queue.raw.accept()  # the least busy worker takes it in time
            taken.close()
            await trio.sleep(ACCEPT_DEFER_SECONDS * 4)
            assert accepted == []
            second_at = trio.current_time()
            second = await trio.open_tcp_stream("127.0.0.1", port)
        assert len(accepted) == 1
        assert accepted[0] - second_at >= ACCEPT_DEFER_SECONDS
        await first.aclose()
        await second.aclose()
    finally:
        queue.close()
        counts.close()


@pytest.mark.trio
async def test_a_burst_is_weighed_one_connection_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two queued connections: the worker at the minimum takes one, then defers the other."""
    queue = _Queue()
    gate, counts = _gate([0, 0], me=0)
    try:
        port = await queue.listen()
        clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        first = await _gated_accept(queue.trio, queue.raw, gate, _Backlog(), lambda: True)
        assert trio.current_time() < ACCEPT_DEFER_SECONDS
        gate.opened()  # as the accept loop counts it
        assert counts.read() == [1, 0]
        start = trio.current_time()
        second = await _gated_accept(queue.trio, queue.raw, gate, _Backlog(), lambda: True)
        assert trio.current_time() - start >= ACCEPT_DEFER_SECONDS
        for stream in (first, second, *clients):
            await stream.aclose()
    finally:
        queue.close()
        counts.close()


@pytest.mark.trio
async def test_the_service_counts_each_connection_from_accept_to_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate, counts = _gate([0, 5], me=0)
    release = trio.Event()
    seen: list[list[int]] = []

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        seen.append(counts.read())
        await release.wait()

    service = TcpService("t", handler, ssl_context=None, tls_handshake_timeout=5,
                         max_connections=10, gate=gate, defer=True)  # fmt: skip
    try:
        async with trio.open_nursery() as nursery:
            sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = sockets[0].socket.getsockname()[1]
            nursery.start_soon(service.serve, sockets, nursery)
            clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
            while len(seen) < 2:
                await trio.sleep(0.01)
            assert counts.read() == [2, 5]
            release.set()
            while service.active:
                await trio.sleep(0.01)
            assert counts.read() == [0, 5]
            for client in clients:
                await client.aclose()
            nursery.cancel_scope.cancel()
    finally:
        counts.close()
    assert seen == [[1, 5], [2, 5]]


@pytest.mark.trio
async def test_a_backlog_left_by_a_stuck_least_busy_worker_is_drained_after_one_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Worker 1 holds the minimum but never accepts (stuck, SIGSTOPped, busy loop, exiting).

    20 connections have waited far longer than ACCEPT_DEFER_SECONDS: the
    busier worker takes them all after one grace, not one grace each (which
    would be 20 connections a second a socket).
    """
    queue = _Queue()
    gate, counts = _gate([5, 0], me=0)
    clients = []
    try:
        port = await queue.listen()
        for _ in range(20):
            clients.append(await trio.open_tcp_stream("127.0.0.1", port))
        await trio.sleep(1.0)  # they have all waited 20 graces already
        start = trio.current_time()
        backlog = _Backlog()  # the accept loop's state, kept across accepts
        for _ in range(20):
            stream = await _gated_accept(queue.trio, queue.raw, gate, backlog, lambda: True)
            await stream.aclose()
        took = trio.current_time() - start
        # A grace per connection would take 20 * ACCEPT_DEFER_SECONDS (1.0 s).
        assert took < 2 * ACCEPT_DEFER_SECONDS, f"{took:.2f}s to take 20 stale connections"
    finally:
        for client in clients:
            await client.aclose()
        queue.close()
        counts.close()


@pytest.mark.trio
async def test_a_worker_at_its_max_connections_leaves_the_connection_for_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At the minimum but full, taking it would only refuse it: a worker with room may first."""
    assert await _time_to_accept([0, 5], me=0, has_room=False) >= ACCEPT_DEFER_SECONDS
