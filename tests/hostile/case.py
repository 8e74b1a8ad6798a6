"""One hostile case (:func:`hostile_case`): a good client beside it, and what must hold after.

The suite's modules: limits.py (the service's listeners and limits), service.py
(the service, its log, memory and rows), clients.py (sockets, well-behaved
clients, frames), inputs.py (shared hostile inputs), this one.

Every module of ``tests/hostile/`` runs ONE real ``appliance serve`` subprocess
(:class:`HostileService`, a module-scoped fixture in ``conftest.py``) with a
listener of every protocol: forward (TLS, no handshake), forward with the
shared-key handshake, Lumberjack, Log Courier and WebSocket over real TLS,
and Logjam over real ZeroMQ with CURVE. Credentials (a shared key, a CURVE
client key, a WebSocket token) are made with the real CLI code, in-process.

Each test runs its hostile input inside :func:`hostile_case`, which:

* starts a well-behaved client of the same protocol in a thread (:class:`GoodTraffic`):
  it sends small batches and waits for each ack, from ``127.0.0.1``, for the
  whole time the hostile input is sent, and at least :data:`GOOD_BATCHES_AFTER`
  batches after it;
* gives the hostile client its own loopback source address (``127.1.x.y``,
  :func:`next_address`: Linux routes all of ``127.0.0.0/8`` to ``lo``), so its
  rows (``peer`` column), its log lines (``peer=``) and the per-address
  connection limit are its own and nobody else's;
* afterwards asserts the service process is still up (``poll() is None``),
  every good batch is stored exactly once, no ``connection.failed`` /
  ``message.failed`` line was logged (that is the catch-all at the connection
  boundary: it keeps the service up, but it means an exception escaped a
  codec, which is a bug), and the memory bound below held.

Memory bound (asserted per test): the service's peak RSS during the test
(``VmHWM`` of ``/proc/PID/status``, reset to the current RSS before the test
by writing ``5`` to ``/proc/PID/clear_refs``) may exceed its RSS at the start
of the test by at most :data:`RSS_GROWTH_BOUND_BYTES` = 384 MiB. That is the
largest documented per-connection worst case under this suite's listener
limits plus headroom for the writer: forward decodes at most
``DECODE_MEMORY_FACTOR`` (120) bytes of Python objects per msgpack byte, and
its requests and decompressed entries are limited to 2 MiB here, so 240 MiB;
every other codec's documented factor times its limit here is below that
(Lumberjack: an unfinished window up to ``max_window_bytes``, 64 MiB, held
as text, about 1 to 3 times for ASCII JSON, plus 352 bytes per event; Log
Courier ``max_payload_memory_bytes`` 16 MiB; Logjam 16 x 2 MiB plus
containers; WebSocket about 30 x 1 MiB); plus 144 MiB for the writer's
Arrow conversion, the commit and allocator slack. The hostile inputs once found
(1.2 GiB for 16 MiB of msgpack, 1 GiB for a 33 KB Logjam body) are far
above it. The growth of every test is kept in :data:`RSS_GROWTH` and the
largest are printed at the end of the run (``conftest.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.hostile.clients import GOOD_CLIENTS, GoodClient, peer_name, read_until_closed
from tests.hostile.limits import (
    GOOD_BATCHES_AFTER,
    GOOD_EVENTS,
    GOOD_PAUSE_SECONDS,
    MIB,
    RSS_GROWTH,
    RSS_GROWTH_BOUND_BYTES,
    WAIT_SECONDS,
    next_address,
)
from tests.hostile.service import (
    BUG_EVENTS,
    CLOSE_EVENTS,
    HostileService,
    peak_rss,
    reset_peak_rss,
    rows_from,
)


@dataclass
class GoodTraffic:
    """A good client sending batch after batch in a thread, each after the last was acked."""

    client_factory: Callable[[], GoodClient]
    prefix: str = field(default_factory=lambda: f"good-{uuid.uuid4().hex[:12]}")
    acked: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def _run(self) -> None:
        client: GoodClient | None = None
        try:
            client = self.client_factory()
            for n in itertools.count():
                if self._stop.is_set():
                    return
                batch_id = f"{self.prefix}-{n}"
                start = time.monotonic()
                client.send_batch(batch_id, GOOD_EVENTS)
                with self._progress:
                    self.latencies.append(time.monotonic() - start)
                    self.acked.append(batch_id)
                    self._progress.notify_all()
                self._stop.wait(GOOD_PAUSE_SECONDS)
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            with self._progress:
                self._progress.notify_all()
            if client is not None:
                with contextlib.suppress(OSError):
                    client.close()

    def _wait_for(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        with self._progress:
            while len(self.acked) < count and self.error is None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._progress.wait(left)

    def __enter__(self) -> GoodTraffic:
        self._thread.start()
        self._wait_for(1)
        self._check(1, "before the hostile input")
        return self

    def _check(self, count: int, when: str) -> None:
        if self.error is not None:
            raise AssertionError(f"the good client failed {when}: {self.error!r}") from self.error
        if len(self.acked) < count:
            raise AssertionError(
                f"the good client got {len(self.acked)} acks {when}, not {count} "
                f"within {WAIT_SECONDS}s"
            )

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                target = len(self.acked) + GOOD_BATCHES_AFTER
                self._wait_for(target)
                self._check(target, "after the hostile input")
        finally:
            self._stop.set()
            self._thread.join(WAIT_SECONDS)

    def assert_stored(self, rows: list[dict[str, Any]]) -> None:
        """Every acked batch is in ``rows`` exactly once: GOOD_EVENTS rows, i = 0..n-1."""
        mine = set(self.acked)
        seen: dict[str, list[int]] = {}
        for row in rows:
            if self.prefix not in row["record"]:
                continue
            data = json.loads(row["record"])
            batch = data.get("good")
            if isinstance(batch, str) and batch.startswith(self.prefix + "-"):
                seen.setdefault(batch, []).append(data["i"])
        missing = sorted(mine - set(seen))
        assert not missing, f"acked good batches not in the table: {missing}"
        for batch in mine:
            assert sorted(seen[batch]) == list(range(GOOD_EVENTS)), (batch, seen[batch])


# -- one hostile case ---------------------------------------------------------------


@dataclass
class Case:
    """What a hostile test needs: the service, its own source address and the log mark."""

    service: HostileService
    protocol: str
    address: str
    mark: int
    good: GoodTraffic
    #: Set by a test whose hostile input must leave no row from its address.
    expect_no_rows: bool = False
    #: The table read once when the case ends (one read per case: it is the slow part).
    final_rows: list[dict[str, Any]] | None = None

    def log_for(self, peer: str, events: frozenset[str] | set[str]) -> dict[str, str] | None:
        """The first line after the mark with one of ``events`` for exactly ``peer``."""
        return self.service.wait_log(
            self.mark, lambda f: f.get("event") in events and f.get("peer") == peer
        )

    def expect_closed_with_reason(
        self, sock: socket.socket, peer: str, *, timeout: float = 30.0, what: str = ""
    ) -> bytes:
        """The service closes ``sock`` and logs why; returns what it sent before closing.

        ``what`` names the input in failure messages.
        """
        received, closed = read_until_closed(sock, timeout)
        sock.close()
        assert closed, f"{what}: the hostile connection {peer} was not closed within {timeout}s"
        line = self.log_for(peer, CLOSE_EVENTS | BUG_EVENTS)
        assert line is not None, (
            f"{what}: no log line with a reason for {peer}:\n{self.service.log_tail(self.mark)}"
        )
        assert line["event"] not in BUG_EVENTS, f"{what}: an exception escaped for {peer}: {line}"
        assert line.get("reason") or line["event"] == "request.timeout", (what, line)
        return received

    def hostile_rows(self) -> list[dict[str, Any]]:
        """The rows from the case's address (as the case ended, when it has)."""
        rows = self.final_rows if self.final_rows is not None else self.service.rows()
        return rows_from(rows, self.address)


def expect_connection_refused(case: Case) -> None:
    """One more TCP connection from the case's address is closed at once, with a log line.

    For the listeners where the case's address already holds
    ``max_connections_per_address`` connections.
    """
    raw = socket.create_connection(
        ("127.0.0.1", case.service.port(case.protocol)), timeout=30,
        source_address=(case.address, 0),
    )  # fmt: skip
    peer = peer_name(raw)
    try:
        line = case.log_for(peer, {"connection.refused"})
        assert line is not None, case.service.log_tail(case.mark)
        assert "max_connections_per_address" in line.get("reason", ""), line
        received, closed = read_until_closed(raw, 10)
        assert closed, f"the refused connection {peer} stayed open"
        assert received == b""
    finally:
        raw.close()


@contextlib.contextmanager
def hostile_case(service: HostileService, protocol: str) -> Iterator[Case]:
    """Run a hostile input next to a good client of ``protocol``; check what must hold after."""
    service.ensure_running()
    app = service.running
    pid = app.process.pid
    mark = service.log_mark()
    rss_before = reset_peak_rss(pid)
    traffic = GoodTraffic(lambda: GOOD_CLIENTS[protocol](service))
    with traffic:
        case = Case(service, protocol, next_address(), mark, traffic)
        yield case
    assert app.process.poll() is None, (
        f"the service exited ({app.process.returncode}):\n{service.log_tail(mark)}"
    )
    growth = peak_rss(pid) - rss_before
    RSS_GROWTH[os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]] = growth
    assert growth <= RSS_GROWTH_BOUND_BYTES, (
        f"peak RSS grew by {growth / MIB:.0f} MiB (bound {RSS_GROWTH_BOUND_BYTES / MIB:.0f} MiB)"
    )
    case.final_rows = service.rows()
    traffic.assert_stored(case.final_rows)
    if case.expect_no_rows:
        assert case.hostile_rows() == [], "rows of a refused hostile input were stored"
    bugs = [f for f in service.log_lines(mark) if f.get("event") in BUG_EVENTS]
    assert not bugs, f"an exception escaped a codec or driver: {bugs}"
