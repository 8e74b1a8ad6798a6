"""The WebSocket driver over in-memory streams: ordering, acks after commit, auth, tail drops."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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

from appliance.config import WebSocketListenerConfig
from appliance.lake.rows import RowBlock
from appliance.lake.writer import CommitTicket
from appliance.protocols.websocket_messages import TailFilter
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.websocket_driver import TailHub, TailSubscription, WebSocketHandler
from auth.tokens import TokenGrant

TOKENS = {
    "apt_ingest": TokenGrant("sender", "ingest", ("web.",)),
    "apt_admin": TokenGrant("operator", "admin", ()),
}


class FakeWriter:
    """Holds every ticket until the test commits it; tells commit listeners like the writer."""

    def __init__(self) -> None:
        self.commit_listeners: list[Any] = []
        self.pending: list[tuple[RowBlock, CommitTicket]] = []
        self.committed: list[RowBlock] = []

    async def submit(self, block: RowBlock) -> CommitTicket:
        ticket = CommitTicket()
        self.pending.append((block, ticket))
        return ticket

    def commit(self) -> None:
        blocks = [b for b, _ in self.pending]
        for _, ticket in self.pending:
            ticket._resolve(True)
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
) -> AsyncIterator[WebSocketConnection]:
    server_stream, client_stream = trio.testing.memory_stream_pair()
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if origin:
        headers.append((b"origin", origin.encode()))
    info = ConnectionInfo("websocket", "127.0.0.1:5000", True, source)
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


def block(rows: int, tag: str = "t") -> RowBlock:
    return RowBlock("forward", "s", "p", 1, None, tag, None, [None] * rows, ["{}"] * rows, rows)


def test_full_tail_queue_drops_and_counts() -> None:
    sub = TailSubscription(TailFilter(), max_events=5)
    sub.offer([block(3), block(3), block(2)])
    assert sub.dropped == 3
    assert sub.dropped_total == 3


@pytest.mark.trio
async def test_subscription_reports_drops_after_the_queued_rows() -> None:
    hub = TailHub()
    with hub.subscribe(TailFilter("t"), 2) as sub:
        hub.publish([block(2), block(5), block(1, tag="x")])
        items, dropped = await sub.next()
        assert [len(rows) for _, rows in items] == [2]
        assert dropped == 5
        hub.publish([block(1)])
        items, dropped = await sub.next()
        assert ([len(rows) for _, rows in items], dropped) == ([1], 0)
    assert hub.subscribers == 0
