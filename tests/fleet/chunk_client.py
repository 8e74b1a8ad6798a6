"""Fluentd's ``out_forward`` in miniature, for the exactly-once rounds (test_exactly_once_rounds).

What it copies from ``out_forward`` (``require_ack_response``): every chunk
carries a unique 16-byte ``chunk`` id (base64, as ``out_forward`` sends its
chunk's unique id) that stays the same across retries; several chunks are in
flight on one connection; when a connection breaks, every unacknowledged
chunk is sent again, same id, on a new connection to whichever server the
balancer (here a :class:`Router`) picks. On top of that it resends some
chunks that *were* acknowledged, as a client does whose acks were lost with
the connection (the kernel drops what the client had not read yet).

A :class:`Streamer` is one client in a thread of its own; every random choice
it makes comes from its own seeded :class:`random.Random`, so a round is
described by its seed (the interleaving of threads and processes is not).
"""

from __future__ import annotations

import base64
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgpack

from tests.fleet.test_three_nodes import StreamClient

#: Seconds a socket operation may block before the connection counts as broken.
SOCKET_TIMEOUT_SECONDS = 30.0
#: Seconds a client waits for the others to finish streaming before its final resend.
BARRIER_SECONDS = 300.0
#: The tag every streamed event carries.
TAG = "eo.rounds"


class LinkBroken(Exception):
    """The connection is gone (the server died, or the client dropped it on purpose)."""


@dataclass(frozen=True)
class Chunk:
    """One PackedForward message with its ``chunk`` id and how many events it holds."""

    chunk_id: str
    events: int
    payload: bytes


def make_chunks(rng: random.Random, count: int, max_events: int) -> list[Chunk]:
    """``count`` chunks of 1..``max_events`` events, each with a fresh 16-byte id."""
    chunks = []
    for _ in range(count):
        chunk_id = base64.b64encode(rng.randbytes(16)).decode()
        events = rng.randint(1, max_events)
        now = int(time.time())
        entries = b"".join(msgpack.packb([now, {"n": n, "chunk": chunk_id}]) for n in range(events))
        options = {"chunk": chunk_id, "size": events}
        chunks.append(Chunk(chunk_id, events, msgpack.packb([TAG, entries, options])))
    return chunks


def open_tls(port: int, ca_file: Path) -> tuple[ssl.SSLSocket, Any]:
    """An anonymous TLS connection to a forward listener (no handshake: ``security`` off)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    raw = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS)
    try:
        tls = context.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise
    return tls, msgpack.Unpacker(raw=False)


class Link:
    """One connection of a client to one target (a node, or a worker behind a shared port)."""

    def __init__(
        self, tls: ssl.SSLSocket, unpacker: Any, target: int, on_close: Callable[[], None]
    ) -> None:
        self.tls, self.unpacker, self.target = tls, unpacker, target
        self._on_close: Callable[[], None] | None = on_close

    def send(self, chunk: Chunk) -> None:
        try:
            self.tls.sendall(chunk.payload)
        except (OSError, ValueError) as exc:  # ValueError: an SSLSocket already closed
            raise LinkBroken(f"send: {exc}") from exc

    def next_ack(self) -> str:
        """The chunk id of the next ack the server sends."""
        try:
            answer = StreamClient._read(self.tls, self.unpacker)
        except (OSError, ValueError, ConnectionError) as exc:
            raise LinkBroken(f"read: {exc}") from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("ack"), str):
            raise AssertionError(f"not an ack: {answer!r}")
        return str(answer["ack"])

    def close(self) -> None:
        # No TLS close_notify: from the server's side the connection just breaks.
        self.tls.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class Router(Protocol):
    """The balancer: a new connection, preferably not to ``avoid`` (the one that broke)."""

    def connect(self, avoid: int | None) -> Link: ...


@dataclass
class Tally:
    """What every client of a round sent and had acknowledged (thread-safe)."""

    events: dict[str, int] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    #: Chunks sent again after a broken connection (unacked ones and acked ones).
    resent: int = 0
    #: Of those, chunks that had been acknowledged (their acks "lost").
    resent_acked: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def sent(self, chunk: Chunk) -> None:
        with self._changed:
            self.events[chunk.chunk_id] = chunk.events

    def ack(self, chunk: Chunk) -> None:
        with self._changed:
            self.acked.add(chunk.chunk_id)
            self._changed.notify_all()

    def resend(self, unacked: int, acked: int) -> None:
        with self._changed:
            self.resent += unacked + acked
            self.resent_acked += acked

    def wait_acks(self, count: int, done: Callable[[], bool], seconds: float) -> int:
        """Wait until ``count`` chunks are acked (or ``done()``); how many are."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while len(self.acked) < count and not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.acked)} acks, not {count}, in {seconds}s")
                # Woken by every ack; the timeout only notices ``done()`` (no ack comes then).
                self._changed.wait(min(left, 0.2))
            return len(self.acked)


class Streamer(threading.Thread):
    """One client: streams its chunks through a :class:`Router` until every one is acked.

    ``drop_chance``: after each ack, the chance that the client drops the
    connection itself (the network broke, the server lives on). After every
    break it resends its unacked chunks and a random number (maybe none) of
    the chunks acked last on that connection, up to ``window``.

    Its last ``2 * window`` chunks are held back: once the others are acked
    it sets :attr:`streamed` and waits at ``barrier`` for the other clients
    and the test (which may still be restarting a server it killed); then it
    sends them, and with ``final_resend`` it resends at least one of the
    last acked ones to another target (their acks "lost" with the last
    connection). Every client does that at the same moment, right before the
    round stops every process, so the stop finds copies of one chunk in two
    servers' logs, uncommitted.
    """

    def __init__(
        self, name: str, chunks: list[Chunk], window: int, router: Router, tally: Tally,
        rng: random.Random, drop_chance: float, final_resend: bool, barrier: threading.Barrier,
    ) -> None:  # fmt: skip
        super().__init__(name=name, daemon=True)
        self.chunks, self.window, self.router, self.tally = chunks, window, router, tally
        self.rng, self.drop_chance, self.final_resend = rng, drop_chance, final_resend
        self.barrier = barrier
        self.error: BaseException | None = None
        #: Every chunk was acked once (before the final resend).
        self.streamed = threading.Event()
        self._order = {chunk.chunk_id: n for n, chunk in enumerate(chunks)}
        #: The target of the last connection, and what was acked on it.
        self._last_target: int | None = None
        self._last_acked: list[Chunk] = []

    def run(self) -> None:
        try:
            held = 2 * self.window
            self._deliver(deque(self.chunks[:-held]))
            self.streamed.set()
            self.barrier.wait(BARRIER_SECONDS)
            self._deliver(deque(self.chunks[-held:]))
            recent = self._last_acked[-self.window :]
            if self.final_resend and recent:
                lost = self._sample(recent, least=1)
                self.tally.resend(0, len(lost))
                self._deliver(deque(lost))
        except BaseException as exc:  # the test thread re-raises it
            self.error = exc
            self.barrier.abort()  # the others must not wait for this one

    def _sample(self, recent: list[Chunk], least: int) -> list[Chunk]:
        lost = self.rng.sample(recent, self.rng.randint(least, len(recent)))
        return sorted(lost, key=lambda chunk: self._order[chunk.chunk_id])

    def _deliver(self, todo: deque[Chunk]) -> None:
        """Send ``todo`` until every chunk is acked, over as many connections as it takes."""
        while todo:
            link = self.router.connect(self._last_target)
            self._last_target = link.target
            pending: dict[str, Chunk] = {}
            acked_here: list[Chunk] = []
            self._last_acked = acked_here
            try:
                while todo or pending:
                    while todo and len(pending) < self.window:
                        chunk = todo.popleft()
                        pending[chunk.chunk_id] = chunk
                        self.tally.sent(chunk)
                        link.send(chunk)
                    ack = link.next_ack()
                    if ack not in pending:
                        raise AssertionError(f"an ack for {ack!r}, which is not in flight")
                    chunk = pending.pop(ack)
                    self.tally.ack(chunk)
                    acked_here.append(chunk)
                    if self.rng.random() < self.drop_chance:
                        raise LinkBroken("dropped by the client")
            except LinkBroken:
                lost = self._sample(acked_here[-self.window :], least=0)
                again = list(pending.values()) + lost
                self.tally.resend(len(pending), len(lost))
                todo.extendleft(reversed(again))
            finally:
                link.close()
