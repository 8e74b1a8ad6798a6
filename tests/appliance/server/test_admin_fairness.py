"""The admin listener stays answerable: its admission, the exact head limit, ``/tail``.

Three layers:

* :class:`~appliance.server.admin_slots.Pool` alone: who makes room for whom;
* the admin handler over in-memory streams: the head limit counts every byte
  read while a head is incomplete, whatever the reads' sizes;
* the whole service in-process, its clients in threads: 20 hostile
  connections from the probe's own address, re-opened whenever closed,
  while ``/livez`` answers every probe within 2 s (the one time bound these
  tests assert: it is the requirement), and ``/tail``'s cap.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trio.testing

from appliance.blocks.block import RowBlock
from appliance.config import AdminConfig, Config, ForwardListenerConfig
from appliance.metrics import Metrics
from appliance.server import admin
from appliance.server.admin_slots import TAIL_SUBSCRIBERS, Pool, Seat
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.tail import TailHub

TOKEN = "0123456789abcdef0123456789abcdef"
#: Hostile connections, all from the probe's own address (127.0.0.1).
HOSTILE = 20
#: Probes of /livez while they run, and the answer time each must meet.
PROBES = 10
PROBE_DEADLINE_SECONDS = 2.0
#: Pause between probes: the probes span more than a first-byte and a head
#: deadline, so every hostile connection is closed and re-opened meanwhile.
PROBE_INTERVAL_SECONDS = 0.5
#: Pause between the trickled bytes of a hostile head.
TRICKLE_SECONDS = 0.05


# -- who makes room for whom ---------------------------------------------------------------------


def seats(pool: Pool, *addresses: str) -> list[Seat]:
    joined = [Seat(address, f"{address}:1") for address in addresses]
    for seat in joined:
        pool.join(seat)
    return joined


def test_an_address_at_its_share_makes_room_among_its_own() -> None:
    pool = Pool("reading", capacity=8, share=2)
    a1, a2, b1 = seats(pool, "a", "a", "b")
    (a3,) = seats(pool, "a")
    assert a1.evicted is not None
    assert a1.scope.cancel_called
    assert [seat.evicted for seat in (a2, b1, a3)] == [None, None, None]
    assert (pool.held_by("a"), pool.held_by("b"), len(pool)) == (2, 1, 3)


def test_a_full_pool_makes_room_from_the_address_holding_most() -> None:
    pool = Pool("waiting", capacity=4, share=3)
    b1, a1, a2, a3 = seats(pool, "b", "a", "a", "a")
    (c1,) = seats(pool, "c")
    assert a1.evicted is not None
    assert b1.evicted is None  # b held its place longer, but holds the least
    (d1,) = seats(pool, "d")
    assert a2.evicted is not None
    # Equal holdings: the place held longest goes first.
    seats(pool, "e")
    assert b1.evicted is not None  # b, a, c, d hold one each: b's is the oldest
    assert [seat.evicted for seat in (a3, c1, d1)] == [None, None, None]
    assert len(pool) == 4


# -- the handler over in-memory streams ------------------------------------------------------


class _Writer:
    app_id = "node-test"
    wal = None

    def __init__(self) -> None:
        self.commit_listeners: list[Any] = []


def handler(token: str | None = None, hub: TailHub | None = None) -> admin._AdminHandler:
    readiness = admin.Readiness(
        expected_listeners=lambda: [],
        open_listeners=lambda: set(),
        lifecycle=Lifecycle(),
        writer=_Writer(),  # type: ignore[arg-type]
        auth_database_url=lambda: None,
    )
    return admin._AdminHandler(Metrics(enabled=False), readiness, token, hub=hub)


async def exchange(pieces: list[bytes], token: str | None = None) -> bytes:
    """Send ``pieces`` one at a time (each read on its own), then read until the server closes."""
    server, client = trio.testing.memory_stream_pair()
    info = ConnectionInfo("admin", "127.0.0.1", 5000, False)
    received = bytearray()

    async def serve() -> None:
        try:
            await handler(token)(server, info)
        finally:
            await server.aclose()  # as the listener does

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        for piece in pieces:
            await client.send_all(piece)
            await trio.testing.wait_all_tasks_blocked()
        await client.send_eof()
        while data := await client.receive_some(65536):
            received += data
    return bytes(received)


def head_of(size: int) -> bytes:
    """A GET /livez head of exactly ``size`` bytes."""
    start, end = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    head = start + b"a" * (size - len(start) - len(end)) + end
    assert len(head) == size
    return head


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


LIMIT = admin.MAX_REQUEST_HEAD_BYTES


@pytest.mark.trio
@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param(lambda head: [head], id="one write"),
        pytest.param(lambda head: split(head, admin.READ_SIZE_BYTES), id="reads of 4 KiB"),
        pytest.param(lambda head: split(head, 4000), id="reads of 4000"),
        pytest.param(lambda head: split(head, 7), id="reads of 7"),
        pytest.param(lambda head: [head[:-3], head[-3:]], id="all but 3 bytes, then 3"),
        pytest.param(
            lambda head: [b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" + head],
            id="pipelined after a short request",
        ),
    ],
)
@pytest.mark.parametrize(
    ("size", "status"),
    [(LIMIT, b"200"), (LIMIT + 1, b"431"), (LIMIT + 3000, b"431"), (LIMIT + 4095, b"431")],
)
async def test_the_head_limit_counts_every_byte_whatever_the_reads(
    pieces: Callable[[bytes], list[bytes]], size: int, status: bytes
) -> None:
    answer = await exchange(pieces(head_of(size)))
    assert answer.rsplit(b"HTTP/1.1 ", 1)[1].startswith(status), answer[-300:]
    if status == b"431":
        assert f"larger than {LIMIT} bytes".encode() in answer


@pytest.mark.trio
async def test_a_wrong_token_is_answered_401_and_the_connection_closed() -> None:
    two = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    answer = await exchange([two], token=TOKEN)
    assert answer.count(b"HTTP/1.1 ") == 1
    assert answer.startswith(b"HTTP/1.1 401 ")


@pytest.mark.trio
async def test_a_body_is_refused_before_it_arrives() -> None:
    answer = await exchange([b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 413 ")


def block(rows: int, tag: str = "t.app") -> RowBlock:
    records = [f'{{"n": {i}}}' for i in range(rows)]
    return RowBlock("forward", "s", "p", 1, None, tag, None, [None] * rows, records)


class TailClient:
    """A /tail request over in-memory streams, its chunked body parsed by h11's client side."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.status = 0
        self.ended = False
        self._text = b""

    async def request(self, target: bytes) -> None:
        request = h11.Request(method="GET", target=target, headers=[("host", "x")])
        await self.stream.send_all(self.h11.send(request) + self.h11.send(h11.EndOfMessage()))

    async def lines(self, wanted: int) -> list[bytes]:
        """The next ``wanted`` lines of the body (fewer when it ends)."""
        while self._text.count(b"\n") < wanted and not self.ended:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(bytes(await self.stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                self.status = event.status_code
            elif isinstance(event, h11.Data):
                self._text += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.ended = True
        parts = self._text.split(b"\n")
        self._text = b"\n".join(parts[wanted:])
        return parts[:wanted]


@pytest.mark.trio
async def test_a_tail_that_falls_behind_gets_a_counted_gap_marker() -> None:
    hub = TailHub()
    server, client = trio.testing.memory_stream_pair()
    info = ConnectionInfo("admin", "127.0.0.1", 5000, False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler(hub=hub), server, info)
        tail = TailClient(client)
        await tail.request(b"/tail?tag=t.")
        await trio.testing.wait_all_tasks_blocked()
        assert hub.subscribers == 1
        # More than the subscriber's queue at once: the rest is dropped and counted.
        hub.publish([block(admin.TAIL_QUEUE_EVENTS), block(5), block(3, tag="x.other")])
        lines = await tail.lines(admin.TAIL_QUEUE_EVENTS + 1)
        assert tail.status == 200
        events = [json.loads(line) for line in lines[:-1]]
        assert [e["record"] for e in events[:2]] == [{"n": 0}, {"n": 1}]
        assert {e["tag"] for e in events} == {"t.app"}
        assert json.loads(lines[-1]) == {"dropped": 5}
        hub.publish([block(2)])
        assert [json.loads(line)["record"] for line in await tail.lines(2)] == [{"n": 0}, {"n": 1}]
        # The service stops: the body still ends properly (its last chunk).
        nursery.cancel_scope.cancel()
    with trio.fail_after(5):
        await tail.lines(1)
    assert tail.ended
    assert hub.subscribers == 0


@pytest.mark.trio
async def test_a_quiet_tail_sends_an_empty_line_now_and_then(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = TailHub()
    server, client = trio.testing.memory_stream_pair()
    info = ConnectionInfo("admin", "127.0.0.1", 5000, False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler(hub=hub), server, info)
        tail = TailClient(client)
        await tail.request(b"/tail")
        started = trio.current_time()
        assert await tail.lines(1) == [b""]
        assert trio.current_time() - started == pytest.approx(admin.TAIL_HEARTBEAT_SECONDS)
        await client.aclose()  # the client leaves: the tail ends
    assert hub.subscribers == 0


# -- the whole service under hostile connections ---------------------------------------------


def make_config(tmp_path: Path, settings: AdminConfig) -> Config:
    from tests.support.service import service_config

    return replace(service_config(tmp_path, ForwardListenerConfig), admin=settings)


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


class Hostile:
    """``count`` threads, each holding one connection and opening another once it is closed."""

    def __init__(self, port: int, count: int, *, trickle: bool) -> None:
        self._port = port
        self._trickle = trickle
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.opened = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def __enter__(self) -> Hostile:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self._port), timeout=30)
            except OSError:
                continue  # refused: open the next one at once
            with self._lock:
                self.opened += 1
            with sock:
                self._hold(sock)

    def _hold(self, sock: socket.socket) -> None:
        """Until the server closes it: send nothing, or a head one byte at a time."""
        endless = iter(b"GET /livez HTTP/1.1\r\nX-Slow: " + b"a" * 1_000_000)
        while not self._stop.is_set():
            try:
                if self._trickle:
                    sock.sendall(bytes([next(endless)]))
                readable, _, _ = select.select([sock], [], [], TRICKLE_SECONDS)
                if readable and not sock.recv(4096):
                    return
            except OSError:
                return


def probe(port: int, context: ssl.SSLContext | None, token: str | None) -> tuple[int, float]:
    """One /livez on a new connection, as an orchestrator's probe: its status and seconds."""
    started = time.monotonic()
    if context is not None:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=PROBE_DEADLINE_SECONDS, context=context
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_DEADLINE_SECONDS)
    try:
        conn.request("GET", "/livez", headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except OSError as exc:
        return -1, time.monotonic() - started if not isinstance(exc, TimeoutError) else float("inf")
    finally:
        conn.close()


@contextmanager
def hostile_load(port: int, *, trickle: bool) -> Iterator[Hostile]:
    with Hostile(port, HOSTILE, trickle=trickle) as load:
        deadline = time.monotonic() + 30
        while load.opened < HOSTILE and time.monotonic() < deadline:
            time.sleep(0.01)
        yield load


def probes_under_load(
    port: int, context: ssl.SSLContext | None, token: str | None, trickle: bool
) -> tuple[list[tuple[int, float]], int]:
    with hostile_load(port, trickle=trickle) as load:
        results = []
        for _ in range(PROBES):
            results.append(probe(port, context, token))
            time.sleep(PROBE_INTERVAL_SECONDS)
        return results, load.opened


@pytest.mark.trio
@pytest.mark.parametrize(
    "trickle",
    [
        pytest.param(False, id="silent plain TCP, tls and a token"),
        pytest.param(True, id="trickled heads, the loopback default"),
    ],
)
async def test_livez_answers_while_one_address_holds_hostile_connections(
    tmp_path: Path, trickle: bool
) -> None:
    from tests.support.service import running

    if trickle:
        settings = AdminConfig(bind="127.0.0.1:0")
    else:
        settings = AdminConfig(bind="127.0.0.1:0", tls=True, token_file=token_file(tmp_path))
    async with running(make_config(tmp_path, settings)) as info:
        assert info.admin_port is not None
        assert info.ca_file is not None
        context = None if trickle else ssl.create_default_context(cafile=str(info.ca_file))
        token = None if trickle else TOKEN
        results, opened = await trio.to_thread.run_sync(
            probes_under_load, info.admin_port, context, token, trickle
        )
    print(f"{opened} hostile connections opened; probes: {results}")
    assert [status for status, _ in results] == [200] * PROBES, results
    assert max(seconds for _, seconds in results) < PROBE_DEADLINE_SECONDS, results
    assert opened > HOSTILE  # closed and re-opened meanwhile: the load was kept up


# -- /tail -----------------------------------------------------------------------------------------


def open_tail(port: int) -> tuple[socket.socket, bytes]:
    """A /tail request on a raw socket: the socket and the response head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /tail?tag=nothing. HTTP/1.1\r\nHost: x\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data:
            break
        head += data
    return sock, head


@pytest.mark.trio
async def test_tails_are_capped_and_take_nothing_livez_needs(tmp_path: Path) -> None:
    from tests.support.service import running

    async with running(make_config(tmp_path, AdminConfig(bind="127.0.0.1:0"))) as info:
        port = info.admin_port
        assert port is not None
        held = []
        try:
            for _ in range(TAIL_SUBSCRIBERS):
                sock, head = await trio.to_thread.run_sync(open_tail, port)
                held.append(sock)
                assert head.startswith(b"HTTP/1.1 200 "), head
                assert b"application/x-ndjson" in head
                assert b"chunked" in head
            sock, head = await trio.to_thread.run_sync(open_tail, port)
            sock.close()
            assert head.startswith(b"HTTP/1.1 503 "), head
            status, _ = await trio.to_thread.run_sync(probe, port, None, None)
            assert status == 200
        finally:
            for sock in held:
                sock.close()
