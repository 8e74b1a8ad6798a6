"""The Logjam listener with real ZeroMQ sockets: replies, order, backpressure, CURVE, CLI.

The listener runs in-process (:func:`logjam_service`); clients are plain
pyzmq sockets used from worker threads, with receive timeouts as deadlines.
Where a test is about *when* a reply goes out, the writer is a stand-in that
commits when the test says so; the end-to-end tests with the real writer and
the Delta table are in tests/interop/test_logjam_zmq.py, which reuses the
harness below.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import stat
import subprocess
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import zmq
from zmq.utils.monitor import recv_monitor_message

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.blocks.text import MAX_BATCH_ID_BYTES
from appliance.config import ConfigError, LogjamListenerConfig, parse_config, settings_from
from appliance.lake.table import EventsTable
from appliance.lake.writer import CommitTicket, LakeWriter, WriterSettings
from appliance.metrics import Metrics
from appliance.protocols.logjam import (
    MAX_MESSAGE_FRAMES,
    Compression,
    LogjamLimits,
    pack_meta,
)
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.logjam_listener import LogjamPorts, serve_logjam
from appliance.server.sessions.logjam import INLINE_DECODE_BYTES, LogjamSession
from auth import schema
from auth.curve import generate_keypair, load_server_public_key
from auth.database import open_database
from auth.settings import AuthSettings
from tests.appliance.server.support import StandInWriter
from tests.support.cli import run_cli

T = TypeVar("T")

#: Receive deadline of the test clients, in ms (a reply that takes longer fails the test).
REPLY_TIMEOUT_MS = 10_000
#: How long a test waits to see that *no* reply comes, in ms.
QUIET_MS = 300
APP_ENV = b"shop-production"
TOPIC = b"logs.shop.production"


def body(**fields: Any) -> bytes:
    return json.dumps({"host": "web1.example", **fields}).encode()


def meta(sequence: int = 1, **fields: Any) -> bytes:
    fields.setdefault("created_ms", 1795341600456)
    return pack_meta(sequence=sequence, **fields)


def message(sequence: int = 1, **fields: Any) -> list[bytes]:
    return [APP_ENV, TOPIC, body(seq=sequence, **fields), meta(sequence)]


@dataclass
class Harness:
    """A running listener and what the test needs to reach it."""

    ports: LogjamPorts
    lifecycle: Lifecycle
    writer: Any
    state_dir: Path
    table_uri: str
    keys: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    #: The service context the listener runs in (its open connections).
    context: ServiceContext | None = None

    @property
    def router(self) -> str:
        return f"tcp://127.0.0.1:{self.ports.router}"

    @property
    def pull(self) -> str:
        return f"tcp://127.0.0.1:{self.ports.pull}"

    async def add_key(self, name: str) -> tuple[bytes, bytes]:
        """A new client keypair (Z85), authorised under ``name``."""
        public, secret = generate_keypair()

        def add() -> None:
            with open_database(AuthSettings.under(self.state_dir)) as database:
                database.curve_keys.add(name, public, actor="test")

        await trio.to_thread.run_sync(add)
        self.keys[name] = (public.encode(), secret.encode())
        return self.keys[name]

    async def revoke(self, name: str) -> None:
        def revoke() -> None:
            with open_database(AuthSettings.under(self.state_dir)) as database:
                database.curve_keys.revoke(name, actor="test")

        await trio.to_thread.run_sync(revoke)

    def rows(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.table_uri)
        except TableNotFoundError:
            return []
        rows: list[dict[str, Any]] = table.to_pyarrow_table().to_pylist()
        return rows


@asynccontextmanager
async def logjam_service(
    tmp_path: Path,
    *,
    writer: Any = None,
    curve: bool = False,
    metrics: Metrics | None = None,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """Run :func:`serve_logjam` (and a real writer unless one is given) until the block ends.

    The end is a graceful stop: reading stops, the writer commits what it has,
    the replies go out, and the listener returns.
    """
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    table_uri = str(tmp_path / "lake" / "events")
    real = writer is None
    if real:
        writer = LakeWriter(
            EventsTable(table_uri), "node-test", WriterSettings(commit_max_delay_seconds=0.02)
        )
        await writer.open()
    settings.setdefault("bind", "127.0.0.1:0")
    settings.setdefault("pull_bind", "127.0.0.1:0")
    settings.setdefault("self_hostname", "logjam.test.example")
    config = LogjamListenerConfig(curve=curve, **settings)
    lifecycle = Lifecycle()
    context = ServiceContext(writer, lifecycle)
    if metrics is not None:
        context = replace(context, metrics=metrics)
    async with trio.open_nursery() as nursery:
        if real:
            nursery.start_soon(writer.run)
        ports = await nursery.start(functools.partial(serve_logjam, config, context, state))
        try:
            yield Harness(ports, lifecycle, writer, state, table_uri, context=context)
        finally:
            lifecycle.stop_reading()
            await lifecycle.wait_no_readers()
            if real:
                await writer.close_input()
            else:
                writer.close()


# -- clients (blocking pyzmq, run in worker threads) ------------------------------------


def _socket(
    kind: int, linger: int, server_key: str | None, keypair: tuple[bytes, bytes] | None
) -> zmq.Socket[bytes]:
    """A socket with the test clients' receive deadline, a CURVE client with a server key."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(kind)
    sock.set(zmq.LINGER, linger)
    sock.set(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    if server_key is not None:
        public, secret = keypair or (b"", b"")
        sock.set(zmq.CURVE_SERVERKEY, server_key.encode())
        sock.set(zmq.CURVE_PUBLICKEY, public)
        sock.set(zmq.CURVE_SECRETKEY, secret)
    return sock


def client(
    kind: int,
    endpoint: str,
    *,
    server_key: str | None = None,
    keypair: tuple[bytes, bytes] | None = None,
) -> zmq.Socket[bytes]:
    sock = _socket(kind, 2000, server_key, keypair)
    sock.connect(endpoint)
    return sock


async def in_thread(func: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(func, *args)


def send(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    sock.send_multipart(frames)


def receive(sock: zmq.Socket[bytes]) -> list[bytes]:
    return sock.recv_multipart()


def quiet(sock: zmq.Socket[bytes]) -> bool:
    """True when nothing arrives within QUIET_MS."""
    return sock.poll(QUIET_MS) == 0


async def request(sock: zmq.Socket[bytes], frames: list[bytes]) -> list[bytes]:
    await in_thread(send, sock, [b"", *frames])
    return await in_thread(receive, sock)


def monitored(kind: int, endpoint: str, **keys: Any) -> tuple[zmq.Socket[bytes], str]:
    """Connect with a monitor attached before the handshake starts."""
    sock = _socket(kind, 0, keys.get("server_key"), keys.get("keypair"))
    monitor = sock.get_monitor_socket()
    monitor.set(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    sock.connect(endpoint)
    outcome = "refused"
    try:
        while True:
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                outcome = "ok"
                break
            if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                         zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):  # fmt: skip
                break
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
    return sock, outcome


# -- replies and their timing (stand-in writer) --------------------------------------------


@pytest.mark.trio
async def test_202_goes_out_only_after_the_commit(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await writer.wait_blocks(1)
        assert await in_thread(quiet, dealer)
        writer.commit(0)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()


@pytest.mark.trio
async def test_a_202_counts_as_an_ack_and_a_400_or_a_pong_does_not(tmp_path: Path) -> None:
    # Logjam's 202s are its acks, in acks_sent and ack_latency.
    writer, metrics = StandInWriter(), Metrics(process=False)
    async with logjam_service(tmp_path, writer=writer, metrics=metrics) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await in_thread(send, dealer, [b"", b"ping", APP_ENV, b"{}", meta()])
        await in_thread(send, dealer, [b"", APP_ENV, b"bad topic", body(), meta(3)])
        await writer.wait_blocks(1)
        writer.commit(0)
        for _ in range(3):
            await in_thread(receive, dealer)
        dealer.close()
    text = metrics.exposition()[0].decode()
    assert 'appliance_acks_sent_total{listener="logjam",protocol="logjam"} 1.0' in text
    assert 'appliance_ack_latency_seconds_count{listener="logjam",protocol="logjam"} 1.0' in text


@pytest.mark.trio
async def test_replies_keep_each_peers_order(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await in_thread(send, dealer, [b"", b"ping", APP_ENV, b"{}", meta()])
        await in_thread(send, dealer, [b"", APP_ENV, b"bad topic", body(), meta(3)])
        await in_thread(send, dealer, [b"", *message(4)])
        await writer.wait_blocks(2)
        # The ping and the 400 are ready at once but wait behind the first request.
        assert await in_thread(quiet, dealer)
        writer.commit(0)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        assert await in_thread(receive, dealer) == [b"ping", b"200 OK", b"logjam.test.example"]
        assert await in_thread(receive, dealer) == [APP_ENV, b"400 Bad Request"]
        assert await in_thread(quiet, dealer)
        writer.commit(1)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()


@pytest.mark.trio
async def test_one_peer_waiting_for_a_commit_holds_up_no_other(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        slow = client(zmq.DEALER, service.router)
        other = client(zmq.DEALER, service.router)
        await in_thread(send, slow, [b"", *message(1)])
        await writer.wait_blocks(1)
        assert await request(other, [b"ping", APP_ENV, b"{}", meta()]) == [
            b"ping", b"200 OK", b"logjam.test.example"
        ]  # fmt: skip
        await in_thread(send, other, [b"", *message(2)])
        await writer.wait_blocks(2)
        writer.commit(1)
        assert await in_thread(receive, other) == [APP_ENV, b"202 Accepted"]
        writer.commit(0)
        assert await in_thread(receive, slow) == [APP_ENV, b"202 Accepted"]
        slow.close()
        other.close()


@pytest.mark.trio
async def test_nothing_uncommitted_is_acknowledged(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await writer.wait_blocks(1)
    # The stand-in refuses what it still holds when it closes: a 400, never a 202.
    assert await in_thread(receive, dealer) == [APP_ENV, b"400 Bad Request"]
    assert await in_thread(quiet, dealer)
    dealer.close()


@pytest.mark.trio
async def test_no_reply_when_the_listener_is_cancelled_before_the_commit(tmp_path: Path) -> None:
    # Once, the 202 went out from a ``finally`` when the listener was cancelled.
    writer = StandInWriter()
    config = LogjamListenerConfig(bind="127.0.0.1:0", pull_bind="", curve=False,
                                  self_hostname="logjam.test.example")  # fmt: skip
    context = ServiceContext(writer, Lifecycle())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        ports = await nursery.start(functools.partial(serve_logjam, config, context, tmp_path))
        dealer = client(zmq.DEALER, f"tcp://127.0.0.1:{ports.router}")
        await in_thread(send, dealer, [b"", *message(1)])
        await in_thread(send, dealer, [b"", b"ping", APP_ENV, b"{}", meta()])
        await writer.wait_blocks(1)
        nursery.cancel_scope.cancel()  # a hard stop: the ticket never resolves
    # serve_logjam has returned: its sockets are closed and every reply has left.
    assert not writer.tickets[0].done
    assert await in_thread(quiet, dealer)
    dealer.close()


@pytest.mark.trio
async def test_max_pending_replies_stops_reading(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer, max_pending_replies=1) as service:
        dealer = client(zmq.DEALER, service.router)
        for sequence in (1, 2, 3):
            await in_thread(send, dealer, [b"", *message(sequence)])
        await writer.wait_blocks(1)
        assert await in_thread(quiet, dealer)
        assert len(writer.blocks) == 1  # the others wait in ZeroMQ's queue
        writer.commit(0)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        await writer.wait_blocks(2)
        writer.commit(1)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        await writer.wait_blocks(3)
        writer.commit(2)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()


@pytest.mark.trio
async def test_async_messages_get_no_reply_and_malformed_ones_are_not_submitted(
    tmp_path: Path,
) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        push = client(zmq.PUSH, service.pull)
        await in_thread(send, push, [APP_ENV, TOPIC, b"{not json", meta(1)])
        await in_thread(send, push, [APP_ENV, TOPIC, body()])
        await in_thread(send, dealer, [APP_ENV, b"nope", body(), meta(2)])
        await in_thread(send, push, message(3))
        await in_thread(send, dealer, message(4))
        await writer.wait_blocks(2)
        assert sorted(json.loads(b.records[0])["seq"] for b in writer.blocks) == [3, 4]
        assert await in_thread(quiet, dealer)
        dealer.close()
        push.close()


@pytest.mark.trio
async def test_large_bodies_are_decoded_off_the_event_loop(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        big = body(lines=["x" * 1000] * (INLINE_DECODE_BYTES // 1000 + 10))
        assert len(big) > INLINE_DECODE_BYTES
        await in_thread(send, dealer, [b"", APP_ENV, TOPIC, big, meta()])
        await writer.wait_blocks(1)
        writer.commit(0)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        assert len(json.loads(writer.blocks[0].records[0])["lines"]) > 60
        dealer.close()


# -- hostile input -----------------------------------------------------------------------------


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every ``name`` log event captured so far."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Every call of the session's decode: (frames it got, ran on the trio thread)."""
    calls: list[tuple[int, bool]] = []
    original = LogjamSession.decode

    def spy(self: LogjamSession, frames: Any) -> Any:
        calls.append((len(frames), threading.current_thread() is threading.main_thread()))
        return original(self, frames)

    monkeypatch.setattr(LogjamSession, "decode", spy)
    return calls


@pytest.mark.trio
async def test_a_host_that_cannot_be_stored_becomes_null_and_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Once, a lone surrogate in host reached the writer after a 202.
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        bodies = [b'{"host": "\\ud800", "seq": 1}', json.dumps({"host": "h" * 256}).encode(),
                  json.dumps({"host": "w\u00e9b1"}).encode()]  # fmt: skip
        for sequence, text in enumerate(bodies):
            await in_thread(send, dealer, [b"", APP_ENV, TOPIC, text, meta(sequence)])
        await writer.wait_blocks(3)
        for index in range(3):
            writer.commit(index)
            assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()
    assert [block.host for block in writer.blocks] == [None, None, "w\u00e9b1"]
    # The record keeps what was sent, in a form that is valid UTF-8.
    assert json.loads(writer.blocks[0].records[0])["host"] == {"$binary": "7aCA"}
    reasons = [fields["reason"] for fields in events(caplog, "message.host_dropped")]
    assert reasons == ["host is not valid UTF-8", "host is 256 bytes, over the limit of 255"]


@pytest.mark.trio
async def test_a_long_app_env_makes_a_batch_id_the_writer_accepts(tmp_path: Path) -> None:
    writer = StandInWriter()  # checks blocks as the real writer does
    app_env = b"a" * 240 + b"-production"
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", app_env, TOPIC, body(), meta()])
        await writer.wait_blocks(1)
        writer.commit(0)
        assert await in_thread(receive, dealer) == [app_env, b"202 Accepted"]
        dealer.close()
    batch_id = writer.blocks[0].batch_id
    assert batch_id is not None
    assert len(batch_id.encode()) <= MAX_BATCH_ID_BYTES


@pytest.mark.trio
async def test_where_a_body_decodes_depends_on_its_decompressed_size(
    tmp_path: Path, decode_calls: list[tuple[int, bool]]
) -> None:
    # Once, 33 KB of deflate inflating to 32 MiB was decoded on the event loop.
    bomb = zlib.compress(b'{"a":"' + b"x" * (1 << 20) + b'"}', 9)
    assert len(bomb) < INLINE_DECODE_BYTES // 16
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await in_thread(send, dealer, [b"", APP_ENV, TOPIC, bomb,
                                       meta(2, compression=Compression.ZLIB)])  # fmt: skip
        await writer.wait_blocks(2)
        writer.commit(0)
        writer.commit(1)
        for _ in range(2):
            assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()
    assert [on_loop for _, on_loop in decode_calls] == [True, False]
    assert len(json.loads(writer.blocks[1].records[0])["a"]) == 1 << 20


@pytest.mark.trio
async def test_frames_past_the_limit_are_refused_without_being_copied(
    tmp_path: Path, decode_calls: list[tuple[int, bool]], caplog: pytest.LogCaptureFixture
) -> None:
    extra = 100_000
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        push = client(zmq.PUSH, service.pull)
        await in_thread(send, push, [*message(1), *[b""] * extra])
        await in_thread(send, dealer, [b"", *message(2), *[b""] * extra])
        assert await in_thread(receive, dealer) == [APP_ENV, b"400 Bad Request"]
        # Both sockets read on: the next messages are stored and acknowledged.
        await in_thread(send, push, message(3))
        await in_thread(send, dealer, [b"", *message(4)])
        await writer.wait_blocks(2)
        writer.commit(0)
        writer.commit(1)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        dealer.close()
        push.close()
    assert sorted(json.loads(b.records[0])["seq"] for b in writer.blocks) == [3, 4]
    assert max(frames for frames, _ in decode_calls) <= MAX_MESSAGE_FRAMES + 1
    counted = sorted(fields["frames"] for fields in events(caplog, "message.malformed"))
    assert counted == [4 + extra, 6 + extra]


class RefusingWriter(StandInWriter):
    """Refuses at submit every block whose record has ``"refuse": true``."""

    async def submit(self, block: RowBlock) -> CommitTicket:
        if json.loads(block.records[0]).get("refuse"):
            raise BlockRefused("refused by the test")
        return await super().submit(block)


@pytest.mark.trio
async def test_a_refused_block_gets_400_in_the_peers_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = RefusingWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        await in_thread(send, dealer, [b"", *message(1)])
        await in_thread(send, dealer, [b"", *message(2, refuse=True)])  # refused at submit
        await in_thread(send, dealer, [b"", *message(3)])  # refused at commit
        await in_thread(send, dealer, [b"", *message(4)])
        await writer.wait_blocks(3)
        writer.refuse(1, "cannot be stored")
        writer.commit(2)
        assert await in_thread(quiet, dealer)  # all wait behind the first request
        writer.commit(0)
        assert [await in_thread(receive, dealer) for _ in range(4)] == [
            [APP_ENV, b"202 Accepted"], [APP_ENV, b"400 Bad Request"],
            [APP_ENV, b"400 Bad Request"], [APP_ENV, b"202 Accepted"],
        ]  # fmt: skip
        dealer.close()
    reasons = {fields["reason"] for fields in events(caplog, "message.refused")}
    assert reasons == {"refused by the test", "cannot be stored"}


@pytest.mark.trio
async def test_an_unexpected_exception_fails_that_message_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = LogjamSession.decode

    def decode(self: LogjamSession, frames: Any) -> Any:
        if b"explode" in bytes(frames[-2]):
            raise RuntimeError("a bug nothing anticipated")
        return original(self, frames)

    monkeypatch.setattr(LogjamSession, "decode", decode)
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        dealer = client(zmq.DEALER, service.router)
        push = client(zmq.PUSH, service.pull)
        await in_thread(send, push, message(1, explode=True))
        await in_thread(send, dealer, [b"", *message(2, explode=True)])
        await in_thread(send, dealer, [b"", *message(3)])
        await writer.wait_blocks(1)
        writer.commit(0)
        # No reply for the failed request; the next one is answered.
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]
        await in_thread(send, push, message(4))
        await writer.wait_blocks(2)
        dealer.close()
        push.close()
    assert [json.loads(b.records[0])["seq"] for b in writer.blocks] == [3, 4]
    failed = events(caplog, "message.failed")
    assert [fields["error"] for fields in failed] == ["RuntimeError", "RuntimeError"]
    assert {fields["socket"] for fields in failed} == {"router", "pull"}


@pytest.mark.trio
async def test_rows_carry_peer_and_anonymous_source_without_curve(tmp_path: Path) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer) as service:
        assert service.ports.server_public_key is None
        push = client(zmq.PUSH, service.pull)
        await in_thread(send, push, message(1))
        await writer.wait_blocks(1)
        block = writer.blocks[0]
        assert (block.protocol, block.source, block.peer) == ("logjam", "anonymous", "127.0.0.1")
        push.close()


@pytest.mark.trio
async def test_bind_failure_is_an_os_error(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, writer=StandInWriter()) as first:
        taken = f"127.0.0.1:{first.ports.router}"
        config = LogjamListenerConfig(bind=taken, pull_bind="", curve=False)
        context = ServiceContext(StandInWriter(), Lifecycle())  # type: ignore[arg-type]
        with pytest.raises(OSError, match="cannot bind"):
            await serve_logjam(config, context, tmp_path)


# -- CURVE -----------------------------------------------------------------------------------


@pytest.mark.trio
async def test_curve_source_is_the_key_name_and_keys_are_checked_at_each_handshake(
    tmp_path: Path,
) -> None:
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer, curve=True) as service:
        server_key = service.ports.server_public_key
        assert server_key is not None
        assert load_server_public_key(service.state_dir) == server_key
        web1 = await service.add_key("web1")

        dealer, outcome = await in_thread(
            functools.partial(
                monitored, zmq.DEALER, service.router, server_key=server_key, keypair=web1
            )
        )
        assert outcome == "ok"
        await in_thread(send, dealer, [b"", *message(1)])
        await writer.wait_blocks(1)
        assert writer.blocks[0].source == "web1"
        writer.commit(0)
        assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]

        # An unknown key, and a client without CURVE, are refused at the handshake.
        stranger = tuple(k.encode() for k in generate_keypair())
        refused, outcome = await in_thread(
            functools.partial(
                monitored, zmq.DEALER, service.router, server_key=server_key, keypair=stranger
            )
        )
        assert outcome == "refused"
        refused.close()
        plain, outcome = await in_thread(functools.partial(monitored, zmq.DEALER, service.router))
        assert outcome == "refused"
        plain.close()

        # Revocation applies to the next connection, without a restart.
        await service.revoke("web1")
        again, outcome = await in_thread(
            functools.partial(
                monitored, zmq.PUSH, service.pull, server_key=server_key, keypair=web1
            )
        )
        assert outcome == "refused"
        again.close()
        assert len(writer.blocks) == 1
        dealer.close()


@pytest.mark.trio
async def test_a_revoked_key_is_refused_on_the_connection_it_already_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """libzmq cannot drop one peer: from the check on, the key's messages are dropped."""
    caplog.set_level(logging.INFO, logger="appliance.logjam")  # listener.closed
    writer = StandInWriter()
    async with logjam_service(tmp_path, writer=writer, curve=True) as service:
        server_key = service.ports.server_public_key
        connect = functools.partial(monitored, zmq.DEALER, service.router, server_key=server_key)
        web1 = await service.add_key("web1")
        web2 = await service.add_key("web2")
        dealer, outcome = await in_thread(functools.partial(connect, keypair=web1))
        assert outcome == "ok"
        other, outcome = await in_thread(functools.partial(connect, keypair=web2))
        assert outcome == "ok"
        for n in range(3):  # busy: one request after another on one connection
            await in_thread(send, dealer, [b"", *message(n)])
            await writer.wait_blocks(n + 1)
            writer.commit(n)
            assert await in_thread(receive, dealer) == [APP_ENV, b"202 Accepted"]

        await service.revoke("web1")
        assert service.context is not None
        # The check a reload makes (and every RECHECK_INTERVAL_SECONDS).
        with trio.fail_after(30):
            await service.context.connections.recheck("SIGHUP")
        await in_thread(send, dealer, [b"", *message(10)])  # the same connection
        with trio.fail_after(30):
            while not events(caplog, "message.revoked"):
                await trio.sleep(0.01)
        assert await in_thread(quiet, dealer)  # no reply: its client times out and reconnects
        await in_thread(send, other, [b"", *message(11)])  # another key is not affected
        await writer.wait_blocks(4)
        writer.commit(3)
        assert await in_thread(receive, other) == [APP_ENV, b"202 Accepted"]
        assert [b.source for b in writer.blocks] == ["web1", "web1", "web1", "web2"]
        dealer.close()
        other.close()
    (line,) = events(caplog, "connection.revoked")
    assert (line["listener"], line["peer"], line["trigger"]) == ("logjam", "127.0.0.1", "SIGHUP")
    assert (line["credential"], line["reason"]) == ("curve:web1", "CURVE key revoked")
    (dropped,) = events(caplog, "message.revoked")
    assert (dropped["credential"], dropped["socket"]) == ("curve:web1", "router")
    (closed,) = events(caplog, "listener.closed")
    assert closed["revoked"] == 1


def test_server_keypair_is_created_once_with_private_modes(tmp_path: Path) -> None:
    from auth.curve import ensure_server_keypair, server_key_paths

    first = ensure_server_keypair(tmp_path)
    public_file, secret_file = server_key_paths(tmp_path)
    assert (public_file.name, secret_file.name) == ("server.key", "server.key_secret")
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_file.parent.stat().st_mode) == 0o700
    assert b"secret-key" not in public_file.read_bytes()
    assert zmq.auth.load_certificate(secret_file) == (first.public, first.secret)
    assert ensure_server_keypair(tmp_path) == first


# -- config ------------------------------------------------------------------------------------


def test_logjam_listener_config_defaults_and_toml() -> None:
    default = LogjamListenerConfig()
    assert (default.bind, default.pull_bind, default.curve, default.tls) == (
        "127.0.0.1:9604", "127.0.0.1:9605", True, False
    )  # fmt: skip
    config = parse_config(
        '[[listeners]]\nprotocol = "logjam"\nbind = "0.0.0.0:19604"\npull_bind = ""\n'
        "curve = false\nmax_body_bytes = 1000\nmax_message_bytes = 2000\nrcvhwm = 50\n"
    )
    listener = config.listeners[0]
    assert isinstance(listener, LogjamListenerConfig)
    assert (listener.pull_bind, listener.pull_port, listener.curve) == (None, None, False)
    assert settings_from(listener, LogjamLimits).max_body_bytes == 1000


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("tls = true", "tls does not apply"),
        ('client_auth = "required"', "client_auth"),
        ('pull_bind = "nowhere"', "pull_bind must be host:port"),
        ('pull_bind = "127.0.0.1:9604"', "pull_bind must differ"),
        ("max_body_bytes = 5000\nmax_message_bytes = 100", "max_message_bytes"),
    ],
)
def test_logjam_listener_config_errors(body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(f'[[listeners]]\nprotocol = "logjam"\n{body}\n')


# -- CLI ---------------------------------------------------------------------------------------


def test_curve_cli_add_list_revoke_server_key(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    # Admin commands create no state directory (docs/decisions.md, 16): it exists already.
    (tmp_path / "state").mkdir()

    def run(command: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        # --config before the arguments, so a key can follow "--" (Z85 may begin with "-").
        result = run_cli("curve", command, "--config", str(config), *args)
        assert (result.returncode == 0) == ok, result.stderr
        return result

    server_key = run("server-key").stdout.strip()
    assert len(server_key) == 40
    assert json.loads(run("server-key", "--json").stdout)["public_key"] == server_key

    public, _ = generate_keypair()
    assert public in run("add", "web1", "--", public).stdout
    generated = json.loads(run("add", "web2", "--generate", "--json").stdout)
    assert len(generated["secret_key"]) == 40
    assert generated["status"] == "active"

    already = run("add", "web3", "--", public, ok=False).stderr
    assert "already registered as CURVE key 'web1'" in already
    assert "40 characters" in run("add", "bad", "not-a-key", ok=False).stderr
    assert "--generate" in run("add", "nothing", ok=False).stderr

    assert "refused" in run("revoke", "web1").stdout
    assert "revoked already" in run("revoke", "web1", ok=False).stderr
    assert "no CURVE key named 'ghost'" in run("revoke", "ghost", ok=False).stderr
    listed = {k["name"]: k["status"] for k in json.loads(run("list", "--json").stdout)}
    assert listed == {"web1": "revoked", "web2": "active"}
    assert "revoked" in run("list").stdout
    secret_file = tmp_path / "state" / "curve" / "server.key_secret"
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    assert server_key not in run("list").stdout  # only client keys are listed
    url = f"sqlite:///{tmp_path / 'state' / 'auth' / 'auth.db'}"
    assert schema.status(url).up_to_date
