"""The WebSocket listener end to end: the real service in-process, trio-websocket's client
and npm ``ws``, real TLS, a real Delta table and the real auth database."""

from __future__ import annotations

import functools
import json
import shutil
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
import trio
from deltalake import DeltaTable
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    open_websocket,
)

from appliance import service
from appliance.commands.tail import format_event, stream_tail
from appliance.config import (
    AdminConfig,
    Config,
    ForwardListenerConfig,
    LakeConfig,
    WebSocketListenerConfig,
)
from appliance.server import registry
from appliance.server.websocket_listener import WebSocketHandler
from auth.database import AuthDatabase, open_database
from auth.tokens import TokenStore
from tests.support.cli import run_cli

pytestmark = [pytest.mark.interop]

NODE_DIR = Path(__file__).parent / "node"
ORIGIN = "https://app.example"
FAST_LAKE = LakeConfig(ack="commit", commit_max_delay_seconds=0.05)  # rows read once acked
#: Seconds any single wait of a test may take before it fails (never a timing assertion).
WAIT_SECONDS = 30


@dataclass
class Harness:
    config: Config
    running: service.Running
    ingest_token: str
    admin_token: str
    store: TokenStore

    @property
    def port(self) -> int:
        return self.running.ports["websocket"]

    def ssl_context(self) -> ssl.SSLContext:
        assert self.running.ca_file is not None
        return ssl.create_default_context(cafile=str(self.running.ca_file))

    def rows(self) -> list[dict[str, Any]]:
        return DeltaTable(self.config.table_uri).to_pyarrow_table().to_pylist()

    def websocket(
        self,
        path: str = "/ingest",
        token: str | None = None,
        origin: str | None = ORIGIN,
        **kwargs: Any,
    ) -> Any:
        headers: list[tuple[bytes, bytes]] = []
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        return open_websocket(
            "localhost",
            self.port,
            path,
            use_ssl=self.ssl_context(),
            extra_headers=headers,
            connect_timeout=WAIT_SECONDS,
            disconnect_timeout=WAIT_SECONDS,
            **kwargs,
        )


@pytest.fixture
def wire_tokens(monkeypatch: pytest.MonkeyPatch) -> list[WebSocketHandler]:
    """The service's WebSocket handlers, as built by the real service wiring.

    The service itself attaches the auth database's token check; this only
    records the handlers so a test can read their counters (the tail hub).
    """
    original = registry.handler_for
    handlers: list[WebSocketHandler] = []

    def handler_for(listener: Any, context: Any) -> Any:
        handler = original(listener, context)
        if isinstance(handler, WebSocketHandler):
            assert handler.tokens is not None, "the service did not wire bearer tokens"
            handlers.append(handler)
        return handler

    monkeypatch.setattr(registry, "handler_for", handler_for)
    return handlers


@asynccontextmanager
async def harness(tmp_path: Path, **listener_settings: Any) -> AsyncIterator[Harness]:
    """The service in-process: a WebSocket listener (``listener_settings`` its overrides)
    and a forward listener, an ``ingest`` token "sender" limited to ``web.`` tags and an
    ``admin`` token "ops", both in the service's own auth database."""
    config = Config(
        state_dir=tmp_path / "state",
        admin=AdminConfig(bind="127.0.0.1:0"),  # not the machine-wide default port
        lake=FAST_LAKE,
        listeners=[
            WebSocketListenerConfig(
                bind="127.0.0.1:0", allowed_origins=[ORIGIN], **listener_settings
            ),
            ForwardListenerConfig(name="forward", bind="127.0.0.1:0"),
        ],
    )
    database: AuthDatabase = await trio.to_thread.run_sync(open_database, config.auth_settings)
    store = database.tokens
    try:
        _, ingest_token = await trio.to_thread.run_sync(
            lambda: store.add("sender", "ingest", ["web."], actor="test")
        )
        _, admin_token = await trio.to_thread.run_sync(
            lambda: store.add("ops", "admin", actor="test")
        )
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            running: service.Running = await nursery.start(
                lambda task_status: service.serve(config, stop=stop, task_status=task_status)
            )
            try:
                yield Harness(config, running, ingest_token, admin_token, store)
            finally:
                stop.set()
    finally:
        database.close()


async def answer(ws: WebSocketConnection) -> Any:
    """The next message of ``ws``, parsed as JSON (within WAIT_SECONDS)."""
    with trio.fail_after(WAIT_SECONDS):
        return json.loads(await ws.get_message())


def events(n: int) -> list[dict[str, Any]]:
    return [{"record": {"i": i, "msg": f"event {i}"}} for i in range(n)]


def message(msg_id: str, n: int, tag: str = "web.app") -> str:
    """An ingest message with ``n`` events (records ``{"i": i, "msg": "event i"}``)."""
    return json.dumps({"id": msg_id, "tag": tag, "events": events(n)})


async def refusal(h: Harness, **websocket: Any) -> tuple[int, Any]:
    """The HTTP status and the JSON body of a handshake that must be refused."""
    with pytest.raises(ConnectionRejected) as refused:
        async with h.websocket(**websocket):
            pass
    body = refused.value.body
    return refused.value.status_code, json.loads(body) if body else None


def batch_rows(h: Harness, batch_id: str) -> list[dict[str, Any]]:
    return [r for r in h.rows() if r["batch_id"] == batch_id]


async def forward_send(h: Harness, chunk: str, n: int, tag: str) -> None:
    """One PackedForward request with ``chunk`` over TLS to the forward listener, until acked."""
    now = int(time.time())
    entries = b"".join(
        msgpack.packb([msgpack.ExtType(0, now.to_bytes(4, "big") + i.to_bytes(4, "big")), {"i": i}])
        for i in range(n)
    )
    sock = await trio.open_tcp_stream("127.0.0.1", h.running.ports["forward"])
    stream = trio.SSLStream(sock, h.ssl_context(), server_hostname="localhost")
    try:
        await stream.send_all(msgpack.packb([tag, entries, {"chunk": chunk, "size": n}]))
        unpacker = msgpack.Unpacker()
        with trio.fail_after(WAIT_SECONDS):
            while True:
                data = await stream.receive_some(4096)
                assert data, f"the forward listener closed before acking {chunk}"
                unpacker.feed(data)
                acks = list(unpacker)
                if acks:
                    assert acks == [{"ack": chunk}]
                    return
    finally:
        await stream.aclose()


async def wait_for_tails(handler: WebSocketHandler, count: int) -> None:
    """Until ``count`` tail connections are subscribed (the server subscribes after the
    handshake's answer, so a commit right after the client's open could precede it)."""
    with trio.fail_after(WAIT_SECONDS):
        while handler.hub.subscribers < count:
            await trio.sleep(0.01)


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_ingest_is_acked_after_commit_and_resend_is_not_written_twice(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message(message("b-1", 3))
            assert await answer(ws) == {"ack": "b-1"}
            # Read at once, nothing awaited in between: the ack came after the commit.
            rows = batch_rows(h, "b-1")
            assert sorted(json.loads(r["record"])["i"] for r in rows) == [0, 1, 2]
            for row in rows:
                i = json.loads(row["record"])["i"]
                assert json.loads(row["record"]) == {"i": i, "msg": f"event {i}"}
                assert row["tag"] == "web.app"
                assert row["source"] == "token:sender"
                assert row["protocol"] == "websocket"
            # A resend of an acked id (a client that lost the ack) is acked again...
            await ws.send_message(message("b-1", 3))
            assert await answer(ws) == {"ack": "b-1"}
            # ...and another message's commit after it shows it was not written again.
            await ws.send_message(message("b-2", 1))
            assert await answer(ws) == {"ack": "b-2"}
        assert len(batch_rows(h, "b-1")) == 3
        assert len(h.rows()) == 4


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_bad_or_missing_token_is_refused_and_nothing_written(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        status, body = await refusal(h, token="apt_" + "x" * 43)
        assert (status, body) == (401, {"error": "invalid or revoked token"})
        status, body = await refusal(h, token=None)
        assert status == 401
        assert body["error"].startswith("authentication required")
        assert h.rows() == []


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_wrong_origin_is_refused_and_no_origin_is_accepted(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        status, body = await refusal(h, token=h.ingest_token, origin="https://evil.example")
        assert (status, body) == (403, {"error": "origin not allowed"})
        assert h.rows() == []
        # A non-browser client sends no Origin: only its token decides.
        async with h.websocket(token=h.ingest_token, origin=None) as ws:
            await ws.send_message(message("no-origin", 1))
            assert await answer(ws) == {"ack": "no-origin"}
        # Origins compare case-insensitively, a trailing slash ignored.
        async with h.websocket(token=h.ingest_token, origin="HTTPS://App.Example/") as ws:
            await ws.send_message(message("case", 1))
            assert await answer(ws) == {"ack": "case"}
        assert sorted(r["batch_id"] for r in h.rows()) == ["case", "no-origin"]


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_browser_subprotocol_token_is_accepted_and_not_echoed(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        offered = ["appliance.v1", f"bearer.{h.ingest_token}"]
        async with h.websocket(token=None, subprotocols=offered) as ws:
            assert ws.subprotocol == "appliance.v1"
            await ws.send_message(message("browser-1", 2))
            assert await answer(ws) == {"ack": "browser-1"}
        assert {r["source"] for r in batch_rows(h, "browser-1")} == {"token:sender"}
        status, body = await refusal(h, token=None, subprotocols=["appliance.v1", "bearer.apt_x"])
        assert (status, body) == (401, {"error": "invalid or revoked token"})


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_oversized_message_closes_with_1009_and_writes_nothing(tmp_path: Path) -> None:
    async with harness(tmp_path, max_message_bytes=4096) as h:
        oversized = big_message("big", 10, 1000)
        assert len(oversized) > 4096
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message(oversized)
            with pytest.raises(ConnectionClosed) as closed, trio.fail_after(WAIT_SECONDS):
                await ws.get_message()
        assert closed.value.reason is not None
        assert closed.value.reason.code == 1009
        assert "Exceeded maximum message size" in (closed.value.reason.reason or "")
        # A later commit shows the oversized message never reached the writer.
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message(message("after", 1))
            assert await answer(ws) == {"ack": "after"}
        assert [r["batch_id"] for r in h.rows()] == ["after"]


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_invalid_json_is_answered_and_the_connection_carries_on(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message('{"id": "broken", "tag": "web.app", "events": [')
            document = await answer(ws)
            assert document["id"] is None
            assert document["error"].startswith("invalid JSON")
            bad_record = {"id": "bad-1", "tag": "web.app", "events": [{"record": "text"}]}
            await ws.send_message(json.dumps(bad_record))
            assert await answer(ws) == {
                "error": "events[0].record: must be an object",
                "id": "bad-1",
            }
            await ws.send_message(message("ok-1", 2))
            assert await answer(ws) == {"ack": "ok-1"}
        assert [r["batch_id"] for r in h.rows()] == ["ok-1", "ok-1"]


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_too_many_events_and_foreign_tag_are_refused(tmp_path: Path) -> None:
    async with harness(tmp_path, max_events_per_message=5) as h:
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message(message("many", 6))
            assert await answer(ws) == {"error": "events: 6 events, more than 5", "id": "many"}
            await ws.send_message(message("foreign", 1, tag="app.web"))
            assert await answer(ws) == {
                "error": "tag 'app.web' is outside the token's tag prefixes",
                "id": "foreign",
            }
            await ws.send_message(message("fits", 5))
            assert await answer(ws) == {"ack": "fits"}
        rows = h.rows()
        assert {r["batch_id"] for r in rows} == {"fits"}
        assert len(rows) == 5


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_revoked_token_is_refused_for_a_new_connection(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        async with h.websocket(token=h.ingest_token) as ws:
            await ws.send_message(message("before", 1))
            assert await answer(ws) == {"ack": "before"}
            await trio.to_thread.run_sync(lambda: h.store.revoke("sender", actor="test"))
            status, body = await refusal(h, token=h.ingest_token)
            assert (status, body) == (401, {"error": "invalid or revoked token"})
            # The connection opened before the revocation keeps running (documented).
            await ws.send_message(message("still-open", 1))
            assert await answer(ws) == {"ack": "still-open"}
        assert sorted(r["batch_id"] for r in h.rows()) == ["before", "still-open"]


@pytest.mark.trio
async def test_tail_needs_admin_and_sees_forward_commits_filtered(
    tmp_path: Path, wire_tokens: list[WebSocketHandler]
) -> None:
    async with harness(tmp_path) as h:
        (handler,) = wire_tokens
        status, body = await refusal(h, path="/tail", token=h.ingest_token)
        assert (status, body) == (403, {"error": "the live tail needs an admin token"})
        admin = h.admin_token
        async with (
            h.websocket(path="/tail", token=admin, message_queue_size=64) as everything,
            h.websocket(path="/tail?tag=web.", token=admin, message_queue_size=64) as web,
            h.websocket(path="/tail?protocol=forward", token=admin, message_queue_size=64) as fwd,
        ):
            await wait_for_tails(handler, 3)
            async with h.websocket(token=h.ingest_token) as ws:
                # Commits in this order, each acked before the next is sent.
                await forward_send(h, "f-1", 2, tag="svc.fwd")
                await ws.send_message(message("w-1", 1))
                assert await answer(ws) == {"ack": "w-1"}
                await forward_send(h, "f-2", 1, tag="svc.fwd")
                await ws.send_message(message("w-2", 1))
                assert await answer(ws) == {"ack": "w-2"}
            seen = [await answer(everything) for _ in range(5)]
            assert [d["batch_id"] for d in seen] == ["f-1", "f-1", "w-1", "f-2", "w-2"]
            first = seen[0]
            assert first["protocol"] == "forward"
            assert first["tag"] == "svc.fwd"
            assert first["record"] == {"i": 0}
            assert seen[2]["protocol"] == "websocket"
            assert seen[2]["source"] == "token:sender"
            assert seen[2]["record"] == {"i": 0, "msg": "event 0"}
            # The filtered tails received only their events, in commit order.
            assert [(await answer(web))["batch_id"] for _ in range(2)] == ["w-1", "w-2"]
            assert [(await answer(fwd))["batch_id"] for _ in range(3)] == ["f-1", "f-1", "f-2"]


def big_message(msg_id: str, n: int, record_bytes: int) -> str:
    events = [{"record": {"i": i, "pad": "x" * record_bytes}} for i in range(n)]
    return json.dumps({"id": msg_id, "tag": "web.bulk", "events": events})


@pytest.mark.trio
async def test_stalled_tail_loses_events_counted_and_never_blocks_ingest(
    tmp_path: Path, wire_tokens: list[WebSocketHandler]
) -> None:
    #: Messages sent at most while waiting for the stalled tail to drop (about 1 MB each).
    max_messages = 200
    async with harness(tmp_path, tail_queue_events=100, max_message_bytes=2 * 1024 * 1024) as h:
        (handler,) = wire_tokens
        async with h.websocket(path="/tail", token=h.admin_token, message_queue_size=1) as tail:
            # The tail client reads nothing: once the socket buffers are full
            # its queue overflows, yet every ingest message is still acked.
            sent = 0
            async with h.websocket(token=h.ingest_token) as ws:
                while handler.hub.dropped_events == 0 and sent < max_messages:
                    await ws.send_message(big_message(f"s-{sent}", 1000, 1000))
                    assert await answer(ws) == {"ack": f"s-{sent}"}
                    sent += 1
            assert handler.hub.dropped_events > 0
            assert len(h.rows()) == sent * 1000
            received = 0
            dropped = 0
            while not dropped:
                document = await answer(tail)
                if "dropped" in document:
                    dropped = document["dropped"]
                else:
                    received += 1
        assert dropped > 0
        assert received + dropped <= sent * 1000


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_cli_tail_prints_the_stream(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        lines: list[str] = []
        errors: list[str] = []
        url = f"wss://localhost:{h.port}/tail?tag=web."
        async with trio.open_nursery() as nursery:

            async def tail() -> None:
                code = await stream_tail(
                    url, h.admin_token, h.ssl_context(), out=lines.append, err=errors.append,
                    limit=2,
                )  # fmt: skip
                assert code == 0

            nursery.start_soon(tail)
            async with h.websocket(token=h.ingest_token) as ws:
                # The tail may subscribe after the first commit: send until it saw two.
                i = 0
                with trio.fail_after(WAIT_SECONDS):
                    while len(lines) < 2:
                        await ws.send_message(message(f"cli-{i}", 1))
                        assert await answer(ws) == {"ack": f"cli-{i}"}
                        i += 1
                        await trio.sleep(0.05)
        printed = format_event(orjson.loads(lines[0]))
        assert " websocket web.app token:sender " in printed
        assert printed.endswith('{"i":0,"msg":"event 0"}')
        assert errors == []


@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_cli_tail_bad_token_exits_1(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        errors: list[str] = []
        url = f"wss://localhost:{h.port}/tail"
        code = await stream_tail(url, "apt_wrong", h.ssl_context(), out=print, err=errors.append)
        assert code == 1
        assert "refused (401)" in errors[0]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
@pytest.mark.trio
@pytest.mark.usefixtures("wire_tokens")
async def test_npm_ws_client_is_acked_after_commit(tmp_path: Path) -> None:
    if not (NODE_DIR / "node_modules" / "ws").is_dir():
        pytest.skip("npm ws not installed (npm install in tests/interop/node)")
    async with harness(tmp_path) as h:
        assert h.running.ca_file is not None
        command = [
            "node", str(NODE_DIR / "ws_send.mjs"), f"wss://localhost:{h.port}/ingest",
            str(h.running.ca_file), ORIGIN, "node-1", "3",
        ]  # fmt: skip
        result = await trio.run_process(
            command,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={"APPLIANCE_TOKEN": h.ingest_token, "PATH": "/usr/bin:/bin:/usr/local/bin"},
        )
        assert result.returncode == 0, result.stderr.decode()
        answers = [json.loads(line) for line in result.stdout.decode().splitlines()]
        assert answers == [
            {"ack": "node-1"},
            {"error": "invalid JSON: unexpected end of data: line 1 column 2 (char 1)", "id": None},
        ]
        rows = [r for r in h.rows() if r["batch_id"] == "node-1"]
        assert len(rows) == 3
        assert {r["source"] for r in rows} == {"token:sender"}


def test_subprocess_cli_token_add_list_revoke(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    # Admin commands create no state directory (docs/decisions.md, 16): it exists already.
    (tmp_path / "state").mkdir()
    run = functools.partial(run_cli, config=config)

    added = run("token", "add", "browser", "--scope", "ingest", "--tag-prefix", "web.", "--json")
    assert added.returncode == 0, added.stderr
    token = json.loads(added.stdout)["token"]
    assert token.startswith("apt_")
    listed = run("token", "list", "--json")
    assert token not in listed.stdout
    assert json.loads(listed.stdout)[0]["tag_prefixes"] == ["web."]
    assert run("token", "revoke", "browser").returncode == 0
    again = run("token", "revoke", "browser")
    assert again.returncode == 1
    assert "revoked already" in again.stderr
