"""The forward driver over trio memory streams, with an autojump clock.

The writer here is a stand-in that resolves tickets when the test says so:
these tests are about the driver's ordering, deadlines and closes. The real
writer against a real table is tested in tests/appliance/lake and, with the
driver, in tests/appliance/test_service.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from appliance.config import ForwardListenerConfig
from appliance.protocols.forward import MAX_PING_BYTES
from appliance.protocols.forward.handshake import password_digest, ping_digest
from appliance.server.connection import Submit
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.revocation import OpenConnections
from appliance.server.sessions.forward import ForwardSession, forward_handler
from auth.policy import SourcePolicy
from tests.appliance.server.support import (
    StandInWriter,
    arrival,
    handler_factory,
    serving,
)

INFO = ConnectionInfo(listener="test", address="192.0.2.1", port=5000, tls=True)


def request(chunk: str | None, n: int = 2, tag: str = "app") -> bytes:
    entries = b"".join(msgpack.packb([1700000000 + i, {"i": i}]) for i in range(n))
    option = {"chunk": chunk} if chunk else {}
    return msgpack.packb([tag, entries, option])


def ack(chunk: str) -> bytes:
    return msgpack.packb({"ack": chunk})


async def receive_within(stream: trio.abc.ReceiveStream, seconds: float) -> bytes | None:
    """The first piece that arrives within ``seconds``, or None."""
    with trio.move_on_after(seconds):
        return await stream.receive_some(65536)
    return None


handler_for = handler_factory(forward_handler, ForwardListenerConfig)


@pytest.mark.trio
async def test_request_without_chunk_is_committed_but_not_acked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(msgpack.packb(None) + request(None) + request("c2"))
        await trio.sleep(1)
        assert [b.batch_id for b in writer.blocks] == [None, "c2"]
        writer.commit(0)
        writer.commit(1)
        assert await receive_within(client, 1) == ack("c2")
        await client.aclose()


@pytest.mark.trio
async def test_protocol_error_closes_after_acking_what_came_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("good") + msgpack.packb({"not": "an array"}))
        await trio.sleep(1)
        writer.commit(0)
        assert await receive_within(client, 1) == ack("good")
    # The handler returned: the connection is over for this peer only.
    assert len(writer.blocks) == 1


@pytest.mark.trio
async def test_rows_carry_tag_time_source_and_peer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = StandInWriter()
    async with serving(handler_for(writer), INFO) as client:
        await client.send_all(request("c", n=3, tag="web.access"))
        await trio.sleep(1)
        await client.aclose()
        writer.commit(0)
    (block,) = writer.blocks
    assert block.tag == "web.access"
    assert block.peer == "192.0.2.1:5000"
    assert block.source == "anonymous"
    assert list(block.times_ns) == [(1700000000 + i) * 10**9 for i in range(3)]
    assert list(block.records) == ['{"i":0}', '{"i":1}', '{"i":2}']


# -- strict strings, no ack for what is not stored, the handshake's bounds -------------
#
# These use the real clock: reads over the driver's inline limit are decoded in a
# worker thread, and an autojump clock would jump every deadline while it runs.
# Nothing here waits for a deadline; each wait ends when the server answers or closes.


@asynccontextmanager
async def served(handler: Any, info: ConnectionInfo) -> AsyncIterator[Any]:
    """Like ``serving``, but the server end is closed when the handler returns,
    as the listener does: the client then sees the connection end."""
    client, server = trio.testing.memory_stream_pair()

    async def run() -> None:
        try:
            await handler(server, info)
        finally:
            await server.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield client


async def until_closed(client: trio.abc.ReceiveStream) -> bytes:
    """Every byte the server sends until it closes the connection."""
    received = b""
    with trio.fail_after(30):
        while data := await client.receive_some(65536):
            received += data
    return received


@pytest.mark.trio
async def test_unreadable_entries_stream_is_not_acked() -> None:
    writer = StandInWriter()
    corrupt = msgpack.packb([1700000000, {"a": 1}]) + b"\xc1" + msgpack.packb([1, {"lost": 1}])
    bad = msgpack.packb(["app", corrupt, {"chunk": "bad"}])
    async with served(handler_for(writer), INFO) as client:
        await client.send_all(request("good") + bad)
        with trio.fail_after(30):
            await writer.wait_blocks(1)
        writer.commit(0)
        # The good request before it is acked, then the connection closes:
        # the unreadable one is not acked (before: one "dropped" event was
        # counted and the chunk acked).
        assert await until_closed(client) == ack("good")
    assert [b.batch_id for b in writer.blocks] == ["good"]


@pytest.mark.trio
@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb(["a\udcffb", 1700000000, {"a": 1}, {"chunk": "x"}],
                      unicode_errors="surrogateescape"),
        b'["\\ud800", 1700000000, {"a": 1}, {"chunk": "x"}]',
        b'["t", 1700000000, {"a": 1}, {"chunk": "\\ud800"}]',
        msgpack.packb(["t" * 1_000_000, [[1700000000, {"i": i}] for i in range(3000)]]),
        msgpack.packb(["t", [[1700000000, {"i": i}] for i in range(3000)], {"chunk": "c" * 10**6}]),
    ],
    ids=["tag-not-utf8", "json-tag-surrogate", "json-chunk-surrogate", "tag-1mb", "chunk-1mb"],
)  # fmt: skip
async def test_crash_inputs_close_only_their_connection(bad: bytes) -> None:
    writer = StandInWriter()
    async with served(handler_for(writer), INFO) as client:
        await client.send_all(bad)
        assert await until_closed(client) == b""
    # The handler returned normally: no block, no ack, nothing escaped.
    assert writer.blocks == []


def test_session_buffered_bytes_follows_the_codec() -> None:
    session = ForwardSession(ForwardListenerConfig(), INFO, None)
    data = request("c1")
    assert session.buffered_bytes() == 0
    assert session.receive(data[:10], arrival(0)) == []
    assert session.buffered_bytes() == 10
    (submit,) = session.receive(data[10:], arrival(0))
    assert isinstance(submit, Submit)
    assert session.buffered_bytes() == 0


def packed_request(chunk: str, events: int) -> bytes:
    entries = b"".join(
        msgpack.packb([1_767_225_600 + i, {"message": "x" * 100, "n": i}]) for i in range(events)
    )
    return msgpack.packb(["app.bench", entries, {"chunk": chunk, "size": events}])


def test_reads_that_cannot_finish_a_packed_request_are_taken_without_a_thread() -> None:
    """Only the read that completes a PackedForward request counts its bytes for a thread.

    Pieces of 16 KiB (one TLS record each) of two 1,000-event requests: every
    piece that merely fills the unfinished request has decode_bytes 0 (the
    loop takes it inline), and the loop still hands the read that completes
    a request, with all the bytes held, to a worker thread. The connection's
    first read goes to a thread too: it picks msgpack or JSON.
    """
    session = ForwardSession(ForwardListenerConfig(), INFO, None)
    requests = [packed_request("p1", 1000), packed_request("p2", 1000)]
    data = b"".join(requests)
    ends = [len(requests[0]), len(data)]
    submits = 0
    for start in range(0, len(data), 16384):
        piece = data[start : start + 16384]
        completes = any(start < end <= start + len(piece) for end in ends)
        cost = session.decode_bytes(piece)
        if completes:
            assert cost == len(piece) + session.buffered_bytes()
            assert cost > 16384
        elif start == 0:
            assert cost == len(piece)  # the connection's first read picks its transport
        else:
            assert cost == 0
        submits += sum(isinstance(a, Submit) for a in session.receive(piece, arrival(0)))
    assert submits == 2


# -- with the handshake (security = "shared_key") ---------------------------------------

KEY = b"foobar1"


class _Store:
    """A credential store with one network that admits everyone with ``KEY``."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.audits: list[tuple[str, str, str]] = []

    def resolve_source(self, address: str) -> SourcePolicy:
        return SourcePolicy("192.0.2.0/24", (KEY,), allow_anonymous=True)

    def password_of(self, username: str) -> bytes | None:
        return None

    def note_login(self, username: str | None, address: str) -> None:
        pass

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        self.failures.append(reason)

    def record_audit(self, action: str, target: str, **fields: Any) -> None:
        self.audits.append((action, target, fields.get("detail", "")))


class _UserStore(_Store):
    """Users: alice (password ``wonderland``) may log in only as an allowed user."""

    def __init__(self, allowed: frozenset[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def resolve_source(self, address: str) -> SourcePolicy:
        return SourcePolicy("192.0.2.0/24", (KEY,), allowed_users=self.allowed)

    def password_of(self, username: str) -> bytes | None:
        return b"wonderland" if username == "alice" else None


async def _user_handshake(store: _UserStore, info: ConnectionInfo) -> tuple[Any, StandInWriter]:
    """Log in as alice over the handshake; returns the PONG and the writer."""
    writer = StandInWriter(resolve_empty=True)
    settings = ForwardListenerConfig(security="users", self_hostname="server.example")
    context = ServiceContext(writer, Lifecycle(), credentials=store)  # type: ignore[arg-type]
    async with served(forward_handler(settings, context), info) as client:
        unpacker = msgpack.Unpacker()
        (_, options) = await read_message(client, unpacker)
        digest = ping_digest(b"salt", "client.example", options["nonce"], KEY)
        secret = password_digest(options["auth"], "alice", b"wonderland")
        await client.send_all(msgpack.packb(
            ["PING", "client.example", "salt", digest, "alice", secret], use_bin_type=True
        ))  # fmt: skip
        pong = await read_message(client, unpacker)
        if pong[1]:
            await client.send_all(request("c1"))
            with trio.fail_after(30):
                await writer.wait_blocks(1)
            writer.commit(0)
            assert await read_message(client, unpacker) == {"ack": "c1"}
        await client.aclose()
    return pong, writer


@pytest.mark.trio
async def test_a_user_refused_by_the_client_network_gets_its_own_audit_reason() -> None:
    """The client sees in_forward's generic reason; the audit log says which rule."""
    store = _UserStore(allowed=frozenset({"bob"}))
    pong, writer = await _user_handshake(store, INFO)
    assert pong[:3] == ["PONG", False, "username/password mismatch"]
    assert store.failures == [
        "username/password mismatch: user not allowed from this client network (192.0.2.0/24)"
    ]
    assert writer.blocks == []


@pytest.mark.trio
async def test_a_certificate_and_a_handshake_user_are_both_kept() -> None:
    """The user is the rows' source; the certificate subject goes to the audit record."""
    store = _UserStore(allowed=None)
    info = ConnectionInfo(
        listener="test", address="192.0.2.1", port=5000, tls=True, source="CN=laptop-7"
    )
    pong, writer = await _user_handshake(store, info)
    assert pong[:2] == ["PONG", True]
    assert writer.blocks[0].source == "alice"
    assert store.audits == [("auth.login", "alice", "certificate=CN=laptop-7")]


def secured_handler(writer: StandInWriter) -> Any:
    settings = ForwardListenerConfig(security="shared_key", self_hostname="server.example")
    context = ServiceContext(writer, Lifecycle(), credentials=_Store())  # type: ignore[arg-type]
    return forward_handler(settings, context)


def ping(helo: bytes, hostname: str | bytes = "client.example") -> bytes:
    (_, options) = msgpack.unpackb(helo)
    host = hostname.decode("utf-8", "surrogateescape") if isinstance(hostname, bytes) else hostname
    digest = ping_digest(b"salt", host, options["nonce"], KEY)
    return msgpack.packb(["PING", hostname, "salt", digest, "", ""], use_bin_type=True)


async def read_message(client: trio.abc.ReceiveStream, unpacker: msgpack.Unpacker) -> Any:
    with trio.fail_after(30):
        while True:
            for message in unpacker:
                return message
            data = await client.receive_some(65536)
            assert data, "closed before a whole message"
            unpacker.feed(data)


@pytest.mark.trio
async def test_handshake_client_hostname_becomes_the_host() -> None:
    writer = StandInWriter()
    async with served(secured_handler(writer), INFO) as client:
        unpacker = msgpack.Unpacker()
        helo = msgpack.packb(await read_message(client, unpacker), use_bin_type=True)
        await client.send_all(ping(helo))
        pong = await read_message(client, unpacker)
        assert pong[:2] == ["PONG", True]
        await client.send_all(request("c1"))
        with trio.fail_after(30):
            await writer.wait_blocks(1)
        writer.commit(0)
        assert await read_message(client, unpacker) == {"ack": "c1"}
        await client.aclose()
    assert writer.blocks[0].host == "client.example"


@pytest.mark.trio
async def test_handshake_with_a_hostname_that_is_not_utf8_is_refused() -> None:
    writer = StandInWriter()
    async with served(secured_handler(writer), INFO) as client:
        unpacker = msgpack.Unpacker()
        helo = msgpack.packb(await read_message(client, unpacker), use_bin_type=True)
        await client.send_all(ping(helo, b"host\xff"))
        assert await read_message(client, unpacker) == [
            "PONG", False, "invalid ping message", "", "",
        ]  # fmt: skip
        assert await until_closed(client) == b""
    assert writer.blocks == []


@pytest.mark.trio
async def test_ping_followed_by_too_much_in_one_read_is_refused_cleanly() -> None:
    # Regression: this crashed the connection task (and, then, the service).
    writer = StandInWriter()
    async with served(secured_handler(writer), INFO) as client:
        unpacker = msgpack.Unpacker()
        helo = msgpack.packb(await read_message(client, unpacker), use_bin_type=True)
        await client.send_all(ping(helo) + request("early", n=400))
        pong = await read_message(client, unpacker)
        assert pong[:2] == ["PONG", False]
        assert f"more than {MAX_PING_BYTES} bytes sent before the PONG" in pong[2]
        assert await until_closed(client) == b""
    assert writer.blocks == []


# -- revocation: the user or shared key of an open connection taken away ---------------------


class _Revocable(_UserStore):
    """alice (password ``wonderland``) and the shared key ``fleet``, until a test changes them."""

    def __init__(self) -> None:
        super().__init__(allowed=None)
        self.keys = {"fleet": KEY}
        self.passwords = {"alice": b"wonderland"}

    def resolve_source(self, address: str) -> SourcePolicy:
        return SourcePolicy(
            "192.0.2.0/24", tuple(self.keys.values()), allowed_users=self.allowed,
            shared_key_names=tuple(self.keys),
        )  # fmt: skip

    def password_of(self, username: str) -> bytes | None:
        return self.passwords.get(username)


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]


async def _revoked_while_busy(
    security: str, store: _Revocable, revoke: Callable[[], None]
) -> tuple[StandInWriter, bytes]:
    """Log in, send and get acks, then ``revoke`` with a request in flight and check again.

    Returns the writer and what the client received after the check (until the close).
    """
    connections = OpenConnections()
    writer = StandInWriter()
    settings = ForwardListenerConfig(security=security, self_hostname="server.example")  # type: ignore[arg-type]
    context = ServiceContext(writer, Lifecycle(), credentials=store, connections=connections)  # type: ignore[arg-type]
    handler = forward_handler(settings, context)

    async def listener(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        # What the TCP listener does around every connection.
        with connections.watch(info.listener, info.peer) as guard:
            await handler(stream, replace(info, guard=guard))

    async with served(listener, INFO) as client:
        unpacker = msgpack.Unpacker()
        (_, options) = await read_message(client, unpacker)
        digest = ping_digest(b"salt", "client.example", options["nonce"], KEY)
        user, secret = ("alice", password_digest(options["auth"], "alice", b"wonderland")) if (
            security == "users"
        ) else ("", "")  # fmt: skip
        await client.send_all(msgpack.packb(
            ["PING", "client.example", "salt", digest, user, secret], use_bin_type=True
        ))  # fmt: skip
        assert (await read_message(client, unpacker))[:2] == ["PONG", True]
        for n in range(3):  # busy: one request after another
            await client.send_all(request(f"c{n}"))
            with trio.fail_after(30):
                await writer.wait_blocks(n + 1)
            writer.commit(n)
            assert await read_message(client, unpacker) == {"ack": f"c{n}"}
        await client.send_all(request("in-flight"))
        with trio.fail_after(30):
            await writer.wait_blocks(4)
        revoke()
        # The check a reload makes (and every RECHECK_INTERVAL_SECONDS).
        with trio.fail_after(30):
            await connections.recheck("SIGHUP")
        writer.commit(3)
        rest = await until_closed(client)  # within 30 s, or the test fails
    assert connections.count() == 0
    return writer, rest


@pytest.mark.trio
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("disable", "user disabled or deleted"),
        ("passwd", "password changed"),
        ("deny", "user no longer allowed from this client network"),
    ],
)
async def test_a_busy_connection_is_closed_once_its_user_is_revoked(
    change: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = _Revocable()

    def revoke() -> None:
        if change == "disable":
            del store.passwords["alice"]
        elif change == "passwd":
            store.passwords["alice"] = b"new password"
        else:
            store.allowed = frozenset({"bob"})

    writer, rest = await _revoked_while_busy("users", store, revoke)
    assert rest == b""  # closed, and the request in flight is not acked
    assert [b.source for b in writer.blocks] == ["alice"] * 4
    (line,) = _events(caplog, "connection.revoked")
    assert (line["credential"], line["reason"]) == ("user:alice", reason)
    assert (line["listener"], line["peer"], line["trigger"]) == ("test", "192.0.2.1:5000", "SIGHUP")


@pytest.mark.trio
async def test_a_busy_connection_is_closed_once_its_shared_key_is_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _Revocable()
    store.keys["other"] = b"another key"  # a key that stays: only the one used counts
    writer, rest = await _revoked_while_busy("shared_key", store, lambda: store.keys.pop("fleet"))
    assert rest == b""
    assert len(writer.blocks) == 4
    (line,) = _events(caplog, "connection.revoked")
    assert (line["credential"], line["reason"]) == ("key:fleet", "shared key deleted or changed")
