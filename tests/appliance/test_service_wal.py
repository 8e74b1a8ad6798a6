"""The service with ``[lake] ack = "wal"``: real processes, real TLS, a real Delta table.

* SIGKILL during a stream: every acked chunk is in the table exactly once
  after the restart and the client's resend, including the chunks that were
  only in the log when the process died (the commit interval is an hour, so
  the log holds them; the test checks that it did).
* Disk full under the log (a small tmpfs): no ack for what was not written,
  the connection is closed with a reason, other work goes on, and once there
  is room again the same chunk is acked and stored once.
* The log at its cap while the table refuses commits: connections wait
  (backpressure), ``/readyz`` says why, and everything flows once the table heals.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from deltalake import DeltaTable

from appliance.config import AdminConfig, Config, ForwardListenerConfig, WalConfig
from tests.appliance.test_metrics import http_get
from tests.appliance.test_service import packed, read_ack, tls_client
from tests.appliance.wal.walsupport import logged
from tests.faults import read_only_dir, small_tmpfs
from tests.support.service import (
    FAST_WAL_LAKE,
    ApplianceProcess,
    running,
    service_config,
    start_appliance,
    table_rows,
)

#: Events per chunk, and chunks a client keeps unacknowledged.
EVENTS = 20
IN_FLIGHT = 8


def chunk_bytes(chunk: str, events: int = EVENTS) -> bytes:
    """A PackedForward request of ``events`` events (about 115 bytes each) asking for an ack."""
    now = int(time.time())
    entries = b"".join(
        msgpack.packb([now, {"chunk": chunk, "i": i, "message": "x" * 80}]) for i in range(events)
    )
    return msgpack.packb(["wal.test", entries, {"chunk": chunk, "size": events}])


def batch_counts(table_uri: str) -> collections.Counter[str]:
    """Rows per batch id in the table."""
    rows = DeltaTable(table_uri).to_pyarrow_table(columns=["batch_id"]).column("batch_id")
    return collections.Counter(str(b) for b in rows.to_pylist())


class StreamingClient:
    """A forward client in a thread: up to :data:`IN_FLIGHT` chunks unacked, acks read in order."""

    def __init__(self, app: ApplianceProcess, prefix: str) -> None:
        context = ssl.create_default_context(cafile=str(app.ca_file))
        raw = socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=30)
        self.tls = context.wrap_socket(raw, server_hostname="localhost")
        self.prefix = prefix
        self.sent: list[str] = []
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.ended: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        unpacker = msgpack.Unpacker()
        waiting: collections.deque[str] = collections.deque()
        try:
            while True:
                while len(waiting) < IN_FLIGHT and not self.stop.is_set():
                    chunk = f"{self.prefix}-{len(self.sent)}"
                    self.tls.sendall(chunk_bytes(chunk))
                    self.sent.append(chunk)
                    waiting.append(chunk)
                if not waiting:
                    return
                data = self.tls.recv(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                unpacker.feed(data)
                for answer in unpacker:
                    assert answer == {"ack": waiting[0]}, answer
                    self.acked.append(waiting.popleft())
        except (OSError, ConnectionError) as exc:
            self.ended = str(exc) or type(exc).__name__
        finally:
            self.tls.close()

    def wait_acked(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            assert self.ended is None, self.ended
            assert time.monotonic() < deadline, f"only {len(self.acked)} acks"
            time.sleep(0.01)


def send_and_ack(app: ApplianceProcess, chunks: list[str]) -> None:
    """Send ``chunks`` on one connection, one at a time, and check each ack."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    with (
        socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=60) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        unpacker = msgpack.Unpacker()
        for chunk in chunks:
            tls.sendall(chunk_bytes(chunk))
            while True:
                data = tls.recv(65536)
                assert data, f"closed before the ack of {chunk}"
                unpacker.feed(data)
                answers = list(unpacker)
                if answers:
                    assert answers == [{"ack": chunk}]
                    break


@pytest.fixture
def apps(tmp_path: Path) -> Iterator[list[ApplianceProcess]]:
    started: list[ApplianceProcess] = []
    yield started
    for app in started:
        if app.process.poll() is None:
            app.process.kill()
            app.process.wait()


#: The log commits only when this many bytes wait (or at the stop): about 40
#: chunks per commit, so at a kill the last chunks are only in the log.
WAL_LAKE = 'ack = "wal"\ncommit_interval_seconds = 3600\ncommit_max_bytes = 100000\n'


def test_sigkill_during_a_stream_loses_no_acked_chunk_and_writes_each_once(
    tmp_path: Path, apps: list[ApplianceProcess]
) -> None:
    listeners = {"forward": 'protocol = "forward"\nudp_heartbeat = false'}
    app = start_appliance(tmp_path, listeners, lake=WAL_LAKE)
    apps.append(app)
    client = StreamingClient(app, "k")
    client.wait_acked(150)
    # The first commit also loads pyarrow (docs/performance.md#idle-memory):
    # the stream goes on until one is in the table, and no longer.
    deadline = time.monotonic() + 60
    while not batch_counts(app.table_uri) and time.monotonic() < deadline:
        time.sleep(0.05)
    # Killed mid-stream: chunks are in flight, some acked ones only in the log.
    app.process.send_signal(signal.SIGKILL)
    app.process.wait()
    client.stop.set()
    client.thread.join(timeout=30)
    acked, sent = list(client.acked), list(client.sent)
    unacked = sent[len(acked) :]
    assert unacked, "the kill came after every chunk was acked"
    before = batch_counts(app.table_uri)
    only_in_log = [c for c in acked if c not in before]
    assert before, "nothing was committed before the kill (commit_max_bytes not reached)"
    assert only_in_log, "every acked chunk was committed already: the log was not tested"
    assert set(before) <= set(sent)

    # The restart replays the log before its listeners open: the acked chunks
    # are in the table, once, by the time it is ready.
    (tmp_path / "appliance0.log").rename(tmp_path / "killed.log")
    app = start_appliance(tmp_path, listeners, lake=WAL_LAKE)
    apps.append(app)
    replayed = batch_counts(app.table_uri)
    assert {c: replayed[c] for c in acked} == dict.fromkeys(acked, EVENTS)
    assert "event=wal.replayed" in app.log()
    # The client resends what it had no ack for, and (a resend after a lost
    # ack) a few acked ones: committed, or replayed from the log.
    resend = unacked + acked[:2] + only_in_log[-2:]
    send_and_ack(app, resend)
    assert app.stop() == 0
    after = batch_counts(app.table_uri)
    assert set(after) == set(acked) | set(unacked)
    assert set(after.values()) == {EVENTS}, "a chunk was written twice, or in part"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (it needs root: skipped, saying why, when it cannot be mounted)."""
    with small_tmpfs(tmp_path / "disk", 2 * 1024 * 1024) as mountpoint:
        yield mountpoint


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


def wal_config(tmp_path: Path, **wal: int | float) -> Config:
    config = service_config(tmp_path, ForwardListenerConfig, udp_heartbeat=False)
    settings = WalConfig(segment_bytes=64 * 1024, max_record_bytes=64 * 1024, **wal)  # type: ignore[arg-type]
    return replace(config, lake=FAST_WAL_LAKE, wal=settings)


@pytest.mark.trio
async def test_disk_full_under_the_log_means_no_ack_and_the_service_recovers(
    tmp_path: Path, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = wal_config(tmp_path, max_bytes=64 * 1024 * 1024)
    # The log's directory is on the small disk; the table and the rest are not.
    config.state_dir.mkdir(parents=True)
    (small_disk / "wal").mkdir(mode=0o700)
    (config.state_dir / "wal").symlink_to(small_disk / "wal")
    caplog.set_level(logging.INFO)
    async with running(config) as info:
        warm = await tls_client(info)
        await warm.send_all(packed("before"))
        assert await read_ack(warm) == {"ack": "before"}
        # Fill the disk.
        filler = small_disk / "filler"
        fill(filler)
        victim = await tls_client(info)
        # 200 events: more than the free rest of the segment's last page.
        await victim.send_all(chunk_bytes("during", 200))
        # No ack: the connection is closed, with the reason in the log.
        assert await read_ack(victim, seconds=10) is None
        assert info.writer is not None
        wal = info.writer.wal
        assert wal is not None
        assert wal.failing is not None
        assert wal.stats.failed_groups >= 1
        reasons = [f["reason"] for f in logged(caplog, "block.refused")]
        assert reasons, "the connection was closed without a logged reason"
        assert all(str(r).startswith("write-ahead log: disk full") for r in reasons), reasons
        # Counted as the listener's error, with its reason (appliance status shows it).
        assert info.metrics is not None
        refused = 'listener="forward",protocol="forward",reason="disk_full"'
        assert (
            f"appliance_batches_refused_total{{{refused}}}" in info.metrics.exposition()[0].decode()
        )
        filler.unlink()  # space returns
        # The service went on: the other connection was not touched, and the
        # client's resend of the refused chunk is stored, once.
        await warm.send_all(packed("after"))
        assert await read_ack(warm) == {"ack": "after"}
        again = await tls_client(info)
        await again.send_all(chunk_bytes("during", 200))
        assert await read_ack(again) == {"ack": "during"}
        assert wal.failing is None
        await again.aclose()
        await warm.aclose()
        await victim.aclose()
    counts = collections.Counter(r["batch_id"] for r in table_rows(config))
    assert counts == {"before": 3, "after": 3, "during": 200}


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    status, body = await trio.to_thread.run_sync(http_get, port, "/readyz")
    return status, json.loads(body)


@pytest.mark.trio
async def test_at_the_cap_connections_wait_and_readyz_says_why(tmp_path: Path) -> None:
    # 256 KiB of log; commits fail while the table's _delta_log is read-only.
    config = wal_config(tmp_path, max_bytes=256 * 1024, full_wait_seconds=120)
    config = replace(config, admin=AdminConfig(bind="127.0.0.1:0"))
    async with running(config) as info:
        assert info.admin_port is not None
        status, body = await readyz(info.admin_port)
        assert status == 200, body
        assert body["checks"]["wal"] == {"ok": True}
        stream = await tls_client(info)
        acked: list[str] = []

        async def send_all(count: int) -> None:
            for n in range(count):
                await stream.send_all(chunk_bytes(f"cap-{n}"))
                assert await read_ack(stream) == {"ack": f"cap-{n}"}
                acked.append(f"cap-{n}")

        with read_only_dir(Path(config.table_uri) / "_delta_log") as fault:
            fault.break_()
            async with trio.open_nursery() as nursery:
                # About 2.3 KB per chunk: 300 chunks are over twice the cap.
                nursery.start_soon(send_all, 300)
                with trio.fail_after(60):
                    while True:
                        status, body = await readyz(info.admin_port)
                        if status == 503 and not body["checks"]["wal"]["ok"]:
                            break
                        await trio.sleep(0.1)
                reason = body["checks"]["wal"]["reason"]
                assert "at its cap" in reason
                assert info.writer is not None
                wal = info.writer.wal
                assert wal is not None
                assert wal.total_bytes <= 256 * 1024
                stuck = len(acked)
                await trio.sleep(0.5)
                assert len(acked) == stuck, "acked beyond the cap while the table was down"
                fault.heal()
        status, body = await readyz(info.admin_port)
        assert status == 200, body
        await stream.aclose()
    counts = collections.Counter(r["batch_id"] for r in table_rows(config))
    assert counts == dict.fromkeys(acked, EVENTS)
    assert len(acked) == 300


def test_ack_commit_starts_without_a_log_and_drains_one_left_behind(
    tmp_path: Path, apps: list[ApplianceProcess]
) -> None:
    listeners = {"forward": 'protocol = "forward"\nudp_heartbeat = false'}
    app = start_appliance(tmp_path, listeners, lake=WAL_LAKE)
    apps.append(app)
    send_and_ack(app, ["left-1", "left-2"])
    app.process.send_signal(signal.SIGKILL)
    app.process.wait()
    assert not DeltaTable(app.table_uri).to_pyarrow_table(columns=["batch_id"]).num_rows
    # The operator switches to ack = "commit": what the log holds was acked,
    # and is committed before the listeners open.
    app = start_appliance(tmp_path, listeners, lake='ack = "commit"\n')
    apps.append(app)
    assert batch_counts(app.table_uri) == {"left-1": EVENTS, "left-2": EVENTS}
    send_and_ack(app, ["left-2", "new-1"])
    assert app.stop() == 0
    assert batch_counts(app.table_uri) == {"left-1": EVENTS, "left-2": EVENTS, "new-1": EVENTS}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    other = start_appliance(fresh, listeners, lake='ack = "commit"\n')
    apps.append(other)
    assert not (other.state_dir / "wal").exists()
