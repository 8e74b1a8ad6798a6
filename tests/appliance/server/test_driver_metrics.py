"""What the WebSocket driver counts (the forward path is tested end to end in
tests/appliance/test_metrics.py), read back through the registry's exposition."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, WebSocketConnection, wrap_client_stream

from appliance.metrics import ListenerMetrics, Metrics
from appliance.server.listener import ConnectionInfo
from appliance.server.websocket_listener import WebSocketHandler
from tests.appliance.server.test_websocket_listener import make_handler, msg

LABELS = {"listener": "ws", "protocol": "websocket"}


@asynccontextmanager
async def client(
    handler: WebSocketHandler, metrics: ListenerMetrics, token: str
) -> AsyncIterator[WebSocketConnection]:
    server_stream, client_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("ws", "127.0.0.1", 5000, True, metrics=metrics)
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, server_stream, info)
        ws = await wrap_client_stream(nursery, client_stream, "localhost", "/ingest",
                                      extra_headers=headers)  # fmt: skip
        try:
            yield ws
        finally:
            await ws.aclose()
            nursery.cancel_scope.cancel()


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = metrics.exposition()[0].decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.trio
async def test_websocket_messages_acks_errors_and_tokens_are_counted() -> None:
    metrics = Metrics(process=False)
    listener = metrics.listener("ws", "websocket")
    handler, writer, _ = make_handler()
    async with client(handler, listener, "apt_ingest") as ws:
        await ws.send_message(msg("a", n=3))
        await ws.send_message("not json")
        await ws.send_message(msg("b", n=2))
        await trio.testing.wait_all_tasks_blocked()
        writer.commit()
        answers = [json.loads(await ws.get_message()) for _ in range(3)]
    assert [a.get("ack") for a in answers] == ["a", None, "b"]
    with pytest.raises(BaseExceptionGroup) as caught:
        async with client(handler, listener, "apt_wrong"):
            pass
    assert caught.group_contains(ConnectionRejected)

    found = samples(metrics)

    def value(name: str, **extra: str) -> float:
        return found.get((name, frozenset({**LABELS, **extra}.items())), 0.0)

    assert value("appliance_requests_total") == 2
    assert value("appliance_events_received_total") == 5
    assert value("appliance_acks_sent_total") == 2
    assert value("appliance_ack_latency_seconds_count") == 2
    assert value("appliance_received_bytes_total") == len(msg("a", n=3)) + len("not json") + len(
        msg("b", n=2)
    )
    assert value("appliance_protocol_errors_total", reason="encoding") == 1
    assert value("appliance_auth_attempts_total", mechanism="token", result="success") == 1
    assert value("appliance_auth_attempts_total", mechanism="token", result="failure") == 1
