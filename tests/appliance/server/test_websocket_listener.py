"""The WebSocket driver over in-memory streams: ordering, acks after commit, auth, tail drops,
refused blocks, cancellation, peers that vanish, bugs that must not be hidden."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.config import WebSocketListenerConfig
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.revocation import RECHECK_INTERVAL_SECONDS, OpenConnections
from appliance.server.websocket_listener import WebSocketHandler
from auth.tokens import TokenGrant

TOKENS = {
    "apt_ingest": TokenGrant("sender", "ingest", ("web.",)),
    "apt_admin": TokenGrant("operator", "admin", ()),
}


class FakeTicket:
    """The ticket contract (appliance.lake.writer.CommitTicket): ``wait()``
    returns None once committed, raises BlockRefused, never returns False."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._refused: BlockRefused | None = None

    def commit(self) -> None:
        self._done.set()

    def refuse(self, reason: str) -> None:
        self._refused = BlockRefused(reason)
        self._done.set()

    async def wait(self) -> None:
        await self._done.wait()
        if self._refused is not None:
            raise self._refused


class FakeWriter:
    """Holds every ticket until the test commits it; tells commit listeners like the writer.

    ``refuse_batches`` are refused by ``submit`` itself (the writer's check
    before a block joins a commit group); :meth:`refuse` refuses a pending one.
    """

    def __init__(self) -> None:
        self.commit_listeners: list[Any] = []
        self.pending: list[tuple[RowBlock, FakeTicket]] = []
        self.committed: list[RowBlock] = []
        self.refuse_batches: set[str] = set()
        self.failure: Exception | None = None

    async def submit(self, block: RowBlock) -> FakeTicket:
        if self.failure is not None:
            raise self.failure
        if block.batch_id in self.refuse_batches:
            raise BlockRefused(f"batch {block.batch_id} cannot be stored")
        ticket = FakeTicket()
        self.pending.append((block, ticket))
        return ticket

    def refuse(self, batch_id: str, reason: str) -> None:
        for block, ticket in self.pending:
            if block.batch_id == batch_id:
                ticket.refuse(reason)
        self.pending = [(b, t) for b, t in self.pending if b.batch_id != batch_id]

    def commit(self) -> None:
        blocks = [b for b, _ in self.pending]
        for _, ticket in self.pending:
            ticket.commit()
        self.pending.clear()
        self.committed += blocks
        for listener in self.commit_listeners:
            listener(blocks)


def make_handler(**settings: Any) -> tuple[WebSocketHandler, FakeWriter, ServiceContext]:
    writer = FakeWriter()
    context = ServiceContext(writer, Lifecycle())  # type: ignore[arg-type]
    config = WebSocketListenerConfig(allowed_origins=["https://ok.example"], **settings)
    return WebSocketHandler(config, context, tokens=TOKENS.get), writer, context


@asynccontextmanager
async def client(
    handler: WebSocketHandler,
    path: str = "/ingest",
    token: str | None = "apt_ingest",
    source: str = "anonymous",
    origin: str | None = None,
    origins: tuple[str, ...] = (),
) -> AsyncIterator[WebSocketConnection]:
    server_stream, client_stream = trio.testing.memory_stream_pair()
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if origin:
        headers.append((b"origin", origin.encode()))
    headers += [(b"origin", value.encode()) for value in origins]
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, source)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, server_stream, info)
        ws = await wrap_client_stream(nursery, client_stream, "localhost", path,
                                      extra_headers=headers)  # fmt: skip
        try:
            yield ws
        finally:
            await ws.aclose()
            nursery.cancel_scope.cancel()


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def rejection(handler: WebSocketHandler, **kwargs: Any) -> ConnectionRejected:
    found: list[BaseException] = []
    try:
        async with client(handler, **kwargs):
            pass
    except* ConnectionRejected as group:
        found = _leaves(group)
    assert found, "the handshake was accepted"
    refusal = found[0]
    assert isinstance(refusal, ConnectionRejected)
    return refusal


def msg(msg_id: object, tag: str = "web.app", n: int = 1) -> str:
    return json.dumps(
        {"id": msg_id, "tag": tag, "events": [{"record": {"i": i}} for i in range(n)]}
    )


@pytest.mark.trio
async def test_acks_wait_for_the_commit_and_keep_order() -> None:
    handler, writer, _ = make_handler()
    async with client(handler) as ws:
        await ws.send_message(msg("a"))
        await ws.send_message("not json")
        await ws.send_message(msg("b", n=2))
        await trio.testing.wait_all_tasks_blocked()
        assert len(writer.pending) == 2
        with trio.move_on_after(0.1) as nothing:
            await ws.get_message()
        assert nothing.cancelled_caught  # no ack before the commit
        writer.commit()
        answers = [json.loads(await ws.get_message()) for _ in range(3)]
    assert answers[0] == {"ack": "a"}
    assert answers[1]["id"] is None
    assert answers[1]["error"].startswith("invalid JSON")
    assert answers[2] == {"ack": "b"}
    assert [b.source for b in writer.committed] == ["token:sender", "token:sender"]


@pytest.mark.trio
async def test_messages_over_the_rate_are_refused(mock_clock: trio.testing.MockClock) -> None:
    # The mock clock stands still: the bucket never refills.
    handler, writer, _ = make_handler(max_messages_per_second=1)
    async with client(handler) as ws:
        await ws.send_message(msg("a"))
        await ws.send_message(msg("b"))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        first, second = [json.loads(await ws.get_message()) for _ in range(2)]
    assert first == {"ack": "a"}
    assert second == {"error": "more than 1 messages per second", "id": None}
    assert [b.batch_id for b in writer.committed] == ["a"]


@pytest.mark.trio
async def test_client_certificate_authenticates_ingest_but_not_the_tail() -> None:
    handler, writer, _ = make_handler()
    async with client(handler, token=None, source="CN=shipper") as ws:
        await ws.send_message(msg("a", tag="any.tag"))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        assert json.loads(await ws.get_message()) == {"ack": "a"}
    assert writer.committed[0].source == "CN=shipper"
    refusal = await rejection(handler, path="/tail", token=None, source="CN=shipper")
    assert refusal.status_code == 403


@pytest.mark.trio
@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"token": "apt_wrong"}, 401),
        ({"token": None}, 401),
        ({"origin": "https://evil.example"}, 403),
        ({"path": "/nope"}, 404),
        ({"path": "/tail"}, 403),
    ],
)
async def test_refusals(kwargs: dict[str, Any], status: int) -> None:
    handler, writer, _ = make_handler()
    refusal = await rejection(handler, **kwargs)
    assert refusal.status_code == status
    assert "error" in json.loads(refusal.body or b"{}")
    assert writer.pending == []


@pytest.mark.trio
@pytest.mark.parametrize(
    "origins",
    [
        ("https://ok.example", "https://evil.example"),
        ("https://evil.example", "https://ok.example"),
        ("https://ok.example", "https://ok.example"),
    ],
)
async def test_two_origin_headers_are_refused(origins: tuple[str, ...]) -> None:
    # One Origin alone passes; two, in any order, even both allowed, do not.
    handler, _, _ = make_handler()
    async with client(handler, origin="https://ok.example") as ws:
        await ws.send_message(msg("a"))
    refusal = await rejection(handler, origins=origins)
    assert refusal.status_code == 403
    assert json.loads(refusal.body or b"{}") == {"error": "more than one Origin header"}


@pytest.mark.trio
async def test_repeated_bad_tokens_are_throttled() -> None:
    handler, _, _ = make_handler()
    statuses = []
    for _ in range(5):
        statuses.append((await rejection(handler, token="apt_wrong")).status_code)
    assert statuses[:3] == [401, 401, 401]
    assert statuses[-1] == 429


@pytest.mark.trio
async def test_shutdown_acks_what_was_read_then_closes_1001() -> None:
    handler, writer, context = make_handler()
    async with client(handler) as ws:
        await ws.send_message(msg("a"))
        await trio.testing.wait_all_tasks_blocked()
        context.lifecycle.stop_reading()
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        assert json.loads(await ws.get_message()) == {"ack": "a"}
        with pytest.raises(ConnectionClosed) as caught:
            await ws.get_message()
    assert caught.value.reason is not None
    assert caught.value.reason.code == 1001


@pytest.mark.trio
async def test_tail_receives_committed_rows_filtered() -> None:
    handler, writer, _ = make_handler()
    async with client(handler, "/tail?tag=web.b", token="apt_admin") as tail:
        await trio.testing.wait_all_tasks_blocked()
        async with client(handler) as ws:
            await ws.send_message(msg("a", tag="web.a"))
            await ws.send_message(msg("b", tag="web.b", n=2))
            await trio.testing.wait_all_tasks_blocked()
            writer.commit()
            await ws.get_message()
            await ws.get_message()
        events = [json.loads(await tail.get_message()) for _ in range(2)]
    assert [e["record"]["i"] for e in events] == [0, 1]
    assert {e["tag"] for e in events} == {"web.b"}
    assert handler.hub.subscribers == 0


# -- the ticket contract: ack only after wait() returned; BlockRefused is an error answer --


async def answers(ws: WebSocketConnection, count: int) -> list[dict[str, Any]]:
    return [json.loads(await ws.get_message()) for _ in range(count)]


@pytest.mark.trio
async def test_a_block_refused_by_submit_gets_its_error_and_the_connection_goes_on() -> None:
    handler, writer, _ = make_handler()
    writer.refuse_batches.add("bad")
    async with client(handler) as ws:
        for message_id in ("a", "bad", "c"):
            await ws.send_message(msg(message_id))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        got = await answers(ws, 3)
    assert got == [
        {"ack": "a"},
        {"error": "not stored: batch bad cannot be stored", "id": "bad"},
        {"ack": "c"},
    ]
    assert [b.batch_id for b in writer.committed] == ["a", "c"]


@pytest.mark.trio
async def test_a_ticket_refused_at_commit_gets_its_error_not_an_ack() -> None:
    handler, writer, _ = make_handler()
    async with client(handler) as ws:
        for message_id in ("a", "b", "c"):
            await ws.send_message(msg(message_id))
        await trio.testing.wait_all_tasks_blocked()
        writer.refuse("b", "record is not valid UTF-8")
        writer.commit()
        got = await answers(ws, 3)
        await ws.send_message(msg("d"))  # still open and reading
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        (last,) = await answers(ws, 1)
    assert got == [
        {"ack": "a"},
        {"error": "not stored: record is not valid UTF-8", "id": "b"},
        {"ack": "c"},
    ]
    assert last == {"ack": "d"}


async def until_closed(ws: WebSocketConnection) -> tuple[list[str], int | None]:
    """Every message until the server closes, and its close code."""
    received: list[str] = []
    while True:
        try:
            message = await ws.get_message()
        except ConnectionClosed as closed:
            return received, closed.reason.code if closed.reason else None
        assert isinstance(message, str)
        received.append(message)


@pytest.mark.trio
async def test_cancellation_answers_nothing_for_an_unresolved_ticket() -> None:
    handler, writer, _ = make_handler()
    server_stream, client_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, "anonymous")
    headers = [(b"authorization", b"Bearer apt_ingest")]
    async with trio.open_nursery() as nursery:
        server = trio.CancelScope()

        async def serve() -> None:
            with server:
                await handler(server_stream, info)

        nursery.start_soon(serve)
        ws = await wrap_client_stream(nursery, client_stream, "localhost", "/ingest",
                                      extra_headers=headers)  # fmt: skip
        await ws.send_message(msg("a"))
        await ws.send_message(msg("b"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(writer.pending) == 2
        writer.pending[0][1].commit()  # "a" commits; "b" never resolves
        await trio.testing.wait_all_tasks_blocked()
        server.cancel()  # the service stops the connection task
        received, code = await until_closed(ws)
        nursery.cancel_scope.cancel()
    assert [json.loads(text) for text in received] == [{"ack": "a"}]
    assert code == 1001


# -- failures: the peer's doing is logged and ends quietly; a bug is never hidden ----------


UPGRADE = (
    b"GET /ingest HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Authorization: Bearer apt_ingest\r\n\r\n"
)


@pytest.mark.trio
@pytest.mark.parametrize(
    "sent",
    [
        b"garbage\r\n\r\n",  # trio-websocket answers 400 on a socket already closed
        b"GET /ingest HTTP/1.1\r\nHost: x\r\n\r\n",  # not an upgrade
        UPGRADE,  # the peer leaves before the 101 can be sent
    ],
    ids=["garbage", "no-upgrade", "gone-before-accept"],
)
async def test_a_peer_that_sends_junk_and_leaves_ends_only_its_connection(
    sent: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # Each of these raised ConnectionClosed out of the handler (and, with no
    # boundary above it, ended the service).
    handler, writer, _ = make_handler()
    server_stream, client_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, "anonymous")
    await client_stream.send_all(sent)
    await client_stream.aclose()
    with trio.fail_after(5):  # well before the handshake deadline (10 s)
        await handler(server_stream, info)  # returns: nothing escapes
    assert writer.pending == []
    logged = events(caplog, "websocket.aborted") + events(caplog, "websocket.handshake_failed")
    assert [fields["peer"] for fields in logged] == ["127.0.0.1:5000"]
    assert all(fields["reason"] for fields in logged)


@pytest.mark.trio
@pytest.mark.parametrize(
    "frame",
    [
        b"\x81\x85abcd\xff\xff\xff\xff\xff",  # a text frame that is not UTF-8
        b"\x8f\x80abcd",  # a reserved opcode
        b"\x01\x81abcd" + b"\x00" * 5,  # a text fragment, then an unmasked continuation
    ],
    ids=["bad-utf8", "reserved-opcode", "bad-continuation"],
)
async def test_a_bad_frame_after_the_handshake_ends_only_its_connection(
    frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    handler, writer, _ = make_handler()
    server_stream, client_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, "anonymous")

    async def peer() -> None:
        await client_stream.send_all(UPGRADE)
        head = b""
        while b"\r\n\r\n" not in head:
            head += await client_stream.receive_some()
        assert head.startswith(b"HTTP/1.1 101 ")
        await client_stream.send_all(frame)
        await client_stream.aclose()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer)
            await handler(server_stream, info)  # returns: nothing escapes
    assert writer.pending == []
    (closed,) = events(caplog, "websocket.closed")
    assert closed["peer"] == "127.0.0.1:5000"


@pytest.mark.trio
async def test_a_bug_closes_with_1011_and_propagates_to_the_listener() -> None:
    handler, writer, _ = make_handler()
    writer.failure = RuntimeError("a bug in the writer")
    server_stream, client_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, "anonymous")
    headers = [(b"authorization", b"Bearer apt_ingest")]
    bugs: list[BaseException] = []
    close_code: int | None = None

    async def serve() -> None:
        try:
            await handler(server_stream, info)
        except* RuntimeError as group:
            bugs.extend(_leaves(group))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ws = await wrap_client_stream(nursery, client_stream, "localhost", "/ingest",
                                      extra_headers=headers)  # fmt: skip
        await ws.send_message(msg("a"))
        with pytest.raises(ConnectionClosed) as caught:
            await ws.get_message()
        assert caught.value.reason is not None
        close_code = caught.value.reason.code
        nursery.cancel_scope.cancel()
    assert close_code == 1011
    assert [str(bug) for bug in bugs] == ["a bug in the writer"]


class StallingStream(trio.abc.Stream):
    """A server stream whose sends block once :attr:`stalled` (a client that
    reads nothing: its TCP window is full); a send cancelled there breaks the
    stream, as it does a TLS stream."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.stalled = False
        self.broken = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("a send was cancelled")
        if self.stalled:
            try:
                await trio.sleep_forever()
            finally:
                self.broken = True
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every ``name`` log line."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]


@pytest.mark.trio
async def test_a_client_that_reads_no_answers_is_closed(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that never reads must not hold its connection forever: each
    # answer must be taken within idle_timeout_seconds.
    caplog.set_level(logging.INFO)
    handler, writer, _ = make_handler(idle_timeout_seconds=5.0)
    server_stream, client_stream = trio.testing.memory_stream_pair()
    stalling = StallingStream(server_stream)
    info = ConnectionInfo("websocket", "127.0.0.1", 5000, True, "anonymous")
    headers = [(b"authorization", b"Bearer apt_ingest")]
    handled = trio.Event()

    async def serve() -> None:
        await handler(stalling, info)
        handled.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ws = await wrap_client_stream(nursery, client_stream, "localhost", "/ingest",
                                      extra_headers=headers)  # fmt: skip
        stalling.stalled = True
        await ws.send_message(msg("a"))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert not handled.is_set()  # the ack's send is stuck
        mock_clock.jump(5.0)
        await trio.testing.wait_all_tasks_blocked()
        assert handled.is_set()
        nursery.cancel_scope.cancel()
    (closed,) = events(caplog, "websocket.closed")
    assert (closed["code"], closed["reason"]) == (1008, "read nothing for 5.0s")


# -- strict strings through the driver ----------------------------------------------------


@pytest.mark.trio
async def test_a_tag_over_its_byte_limit_is_answered_and_the_connection_goes_on() -> None:
    handler, writer, _ = make_handler()
    async with client(handler) as ws:
        await ws.send_message(msg("a", tag="web." + "\u00e9" * 511))  # 1026 bytes
        await ws.send_message(msg("b"))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        got = await answers(ws, 2)
    assert got == [
        {"error": "tag is 1026 bytes, over the limit of 1024", "id": "a"},
        {"ack": "b"},
    ]
    assert [b.batch_id for b in writer.committed] == ["b"]


# -- revocation: a token revoked while its connection is open ------------------------------


@pytest.mark.trio
async def test_a_busy_tail_is_closed_within_the_recheck_interval_once_its_token_is_revoked(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = dict(TOKENS)
    writer = FakeWriter()
    # The look-up is a dict here: on the event loop, so the autojump clock
    # never jumps while a worker thread runs it.
    connections = OpenConnections(checks_in_thread=False)
    context = ServiceContext(writer, Lifecycle(), connections=connections)  # type: ignore[arg-type]
    handler = WebSocketHandler(WebSocketListenerConfig(), context, tokens=tokens.get)

    async def listener(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        # What the TCP listener does around every connection.
        with connections.watch(info.listener, info.peer) as guard:
            await handler(stream, replace(info, guard=guard))

    async def until_closed(ws: WebSocketConnection) -> None:
        while True:
            await ws.get_message()

    async def ingest_every_second(ws: WebSocketConnection) -> None:
        for n in range(10**6):
            await ws.send_message(msg(f"m{n}"))
            while not writer.pending:
                await trio.sleep(0.01)
            writer.commit()
            assert json.loads(await ws.get_message()) == {"ack": f"m{n}"}
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connections.run)
        # The handshakes verify their tokens in a worker thread: the clock
        # stands still until both are open, then jumps whenever all wait.
        async with (
            client(listener, "/tail", token="apt_admin") as tail,  # type: ignore[arg-type]
            client(listener, "/ingest", token="apt_ingest") as ingest,  # type: ignore[arg-type]
        ):
            mock_clock.autojump_threshold = 0
            with trio.fail_after(RECHECK_INTERVAL_SECONDS * 10):
                nursery.start_soon(ingest_every_second, ingest)
                for _ in range(3):  # busy: the committed events flow
                    assert json.loads(await tail.get_message())["tag"] == "web.app"
                del tokens["apt_admin"]  # appliance token revoke operator
                revoked_at = trio.current_time()
                with pytest.raises(ConnectionClosed) as caught:
                    await until_closed(tail)  # the events keep coming until the close
                closed_at = trio.current_time()
            nursery.cancel_scope.cancel()
    assert (caught.value.reason.code, caught.value.reason.reason) == (1008, "token revoked")
    assert closed_at - revoked_at <= RECHECK_INTERVAL_SECONDS + 5  # 5: the close handshake
    (line,) = events(caplog, "connection.revoked")
    assert (line["credential"], line["reason"]) == ("token:operator", "token revoked")
    assert (line["listener"], line["peer"], line["trigger"]) == (
        "websocket", "127.0.0.1:5000", "interval",
    )  # fmt: skip
