"""Three appliances on one S3 table while the store fails: no transient failure ends a node.

Real parts: three ``appliance serve`` processes (each its own state
directory and write-ahead log, ``ack = "wal"``), moto's S3 server
(tests/s3server.py), and in front of it the fault-injecting proxy
(tests/fleet/faultproxy.py) through which every node reaches the table.
One Fluentd-like client per node (fixed chunk ids, several chunks in
flight, every unacknowledged chunk sent again after a broken connection)
streams the whole time, while the proxy cycles through ``403
AccessDenied``, ``500 InternalError``, ``503 SlowDown``, reset connections
and a blackhole (connections accepted, nothing answered), each followed by
a healthy spell. Each node's maintenance runs on a short schedule with the
maintenance lease, so compaction, checkpoints and lease renewals meet the
faults too.

What must hold:

* every node stays up (its process runs, no ``service.failed``);
* the write-ahead log keeps acknowledging: acks go on during the faults;
* ``/readyz`` drops during every fault (``503``, the ``table`` check not
  ok, with the reason) and comes back (``200``) after each;
* at the end every acknowledged chunk is in the table exactly once.

The blackhole lasts :data:`BLACKHOLE_SECONDS`: 12 s by default (CI), set
``APPLIANCE_BLACKHOLE_SECONDS=30`` for the 30-second run that a change of
the retry or timeout settings needs once, by hand::

    APPLIANCE_BLACKHOLE_SECONDS=30 .venv/bin/pytest -s tests/fleet/test_faulty_store.py

The nodes' object-store client gets short timeouts here (:data:`FAST_STORE`:
a request gives up after 3 s, one retry, 4 s in all) so that a blackhole of
a few seconds already shows as failures; the service's defaults are longer
(appliance/lake/retry.py, ``STORE_DEFAULTS``; docs/fleet.md).

The start-up tests: a store that refuses the credentials (``403``) or a
bucket that does not exist stops the start with a message naming it; a
store that answers ``503`` at start is waited for, ``/readyz`` saying
``opening: <reason>`` meanwhile, and the node starts once it heals.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from deltalake import DeltaTable

from tests.fleet.faultproxy import Fault, FaultProxy, fault_proxy
from tests.fleet.test_three_nodes import StreamClient
from tests.s3server import SECRET_ACCESS_KEY, S3Server
from tests.support.service import ApplianceProcess, start_appliance

pytestmark = pytest.mark.slow

#: Seconds the blackhole lasts (30 by hand, see the module's docstring).
BLACKHOLE_SECONDS = float(os.environ.get("APPLIANCE_BLACKHOLE_SECONDS", "12"))
#: Seconds each of the other faults lasts.
FAULT_SECONDS = 6.0
#: Seconds a fault may be held past its length until every node's /readyz has
#: dropped: a loaded machine may take that long to reach its next commit (a
#: bound, not a measure).
DROP_BOUND_SECONDS = 120.0
#: The faults in turn, and how long each lasts at least.
CYCLE: list[tuple[Fault, float]] = [
    ("forbidden", FAULT_SECONDS),
    ("internal", FAULT_SECONDS),
    ("slowdown", FAULT_SECONDS),
    ("reset", FAULT_SECONDS),
    ("blackhole", BLACKHOLE_SECONDS),
]
#: The object store client's settings for the nodes here (see the module's docstring).
FAST_STORE = {"timeout": "3s", "connect_timeout": "2s", "max_retries": "1", "retry_timeout": "4s"}
#: Seconds a node has to be ready again after a fault ends (generous: a bound, not a measure).
RECOVER_SECONDS = 120.0
#: Seconds for every acked chunk to reach the table after the clients stop.
SETTLE_SECONDS = 120.0
#: Seconds between looks at the nodes' /readyz.
POLL_SECONDS = 0.2
#: Events per chunk, chunks in flight per client, pause between chunks.
EVENTS_PER_CHUNK, IN_FLIGHT, PAUSE_SECONDS = 10, 4, 0.05
#: Seconds a client socket may block before the connection counts as broken.
SOCKET_TIMEOUT_SECONDS = 30.0
LISTENERS = {"forward": ""}
_ADMIN_PORT = re.compile(r"event=admin\.ready bind=127\.0\.0\.1:(\d+)")


def _lake(uri: str, endpoint: str, store: dict[str, str] | None = None) -> str:
    options = {**_options(endpoint), **(store or {})}
    pairs = ", ".join(f'"{k}" = "{v}"' for k, v in options.items())
    return (
        f'path = "{uri}"\nack = "wal"\ncommit_interval_seconds = 1\n'
        "retry_initial_seconds = 0.2\nretry_max_seconds = 2\n"
        f"storage_options = {{ {pairs} }}\n"
    )


def _options(endpoint: str) -> dict[str, str]:
    from tests.s3server import ACCESS_KEY_ID, REGION

    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
        "conditional_put": "etag",
    }


#: The nodes' admin listener on a free port, and maintenance on a short schedule.
EXTRA = """[admin]
bind = "127.0.0.1:0"
[maintenance]
compact_interval_seconds = 4
checkpoint_interval_seconds = 7
vacuum_interval_seconds = 11
lease_seconds = 30
"""


def admin_port(node: ApplianceProcess) -> int:
    deadline = time.monotonic() + RECOVER_SECONDS
    while time.monotonic() < deadline:
        found = _ADMIN_PORT.search(node.log())
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no admin.ready line:\n{node.log()[-3000:]}")


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- the client -------------------------------------------------------------------------------


class Client(threading.Thread):
    """Streams chunks to one node until stopped; resends what was not acked after a break."""

    def __init__(self, node: ApplianceProcess, prefix: str) -> None:
        super().__init__(name=prefix, daemon=True)
        self.node = node
        self.prefix = prefix
        self.acked: set[str] = set()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.reconnects = 0
        self._lock = threading.Lock()

    def acks(self) -> int:
        with self._lock:
            return len(self.acked)

    def chunk(self, i: int) -> tuple[str, bytes]:
        chunk_id = f"{self.prefix}-{i:06d}"
        now = int(time.time())
        entries = b"".join(
            msgpack.packb([now, {"chunk": chunk_id, "n": n}]) for n in range(EVENTS_PER_CHUNK)
        )
        return chunk_id, msgpack.packb(
            ["fleet.faulty", entries, {"chunk": chunk_id, "size": EVENTS_PER_CHUNK}]
        )

    def _connect(self) -> tuple[ssl.SSLSocket, Any]:
        context = ssl.create_default_context(cafile=str(self.node.ca_file))
        raw = socket.create_connection(
            ("127.0.0.1", self.node.ports["forward"]), timeout=SOCKET_TIMEOUT_SECONDS
        )
        return context.wrap_socket(raw, server_hostname="localhost"), msgpack.Unpacker(raw=False)

    def run(self) -> None:
        try:
            self._stream()
        except BaseException as exc:  # the test thread re-raises it
            self.error = exc

    def _stream(self) -> None:
        next_chunk = 0
        pending: list[int] = []  # sent, not acked, in order
        while pending or not self.stopping.is_set():
            try:
                tls, unpacker = self._connect()
            except OSError:
                self.reconnects += 1
                time.sleep(0.5)
                continue
            try:
                for i in pending:  # resend what the last connection left unacked
                    tls.sendall(self.chunk(i)[1])
                while pending or not self.stopping.is_set():
                    while not self.stopping.is_set() and len(pending) < IN_FLIGHT:
                        pending.append(next_chunk)
                        tls.sendall(self.chunk(next_chunk)[1])
                        next_chunk += 1
                        time.sleep(PAUSE_SECONDS)
                    if not pending:
                        break
                    answer = self._read(tls, unpacker)
                    expected = self.chunk(pending[0])[0]
                    assert answer == {"ack": expected}, (answer, expected)
                    with self._lock:
                        self.acked.add(expected)
                    pending.pop(0)
            except (OSError, ssl.SSLError, ConnectionError):
                self.reconnects += 1
            finally:
                tls.close()

    _read = staticmethod(StreamClient._read)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint) as running:
        yield running


def _assert_up(nodes: list[ApplianceProcess], when: str) -> None:
    for i, node in enumerate(nodes):
        assert node.process.poll() is None, f"node {i} exited {when}:\n{node.log()[-4000:]}"
        assert "event=service.failed" not in node.log(), f"node {i} {when}"


# -- three nodes through a fault cycle --------------------------------------------------------


def test_three_nodes_stay_up_through_every_fault_and_store_each_acked_chunk_once(
    s3_server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    lake = _lake(uri, proxy.endpoint, FAST_STORE)
    nodes = [start_appliance(tmp_path, LISTENERS, EXTRA, index=i, lake=lake) for i in range(3)]
    clients = [Client(node, f"node{i}") for i, node in enumerate(nodes)]
    try:
        ports = [admin_port(node) for node in nodes]
        for client in clients:
            client.start()
        drops: dict[Fault, list[str | None]] = {}
        for fault, seconds in CYCLE:
            acks_before = sum(c.acks() for c in clients)
            proxy.fail(fault)
            reasons: list[str | None] = [None] * len(nodes)
            end = time.monotonic() + seconds
            bound = end + DROP_BOUND_SECONDS
            while (now := time.monotonic()) < end or (not all(reasons) and now < bound):
                for i, port in enumerate(ports):
                    status, body = readyz(port)
                    if status == 503 and not body["checks"]["table"]["ok"]:
                        reasons[i] = reasons[i] or body["checks"]["table"]["reason"]
                time.sleep(POLL_SECONDS)
            served = proxy.counts[fault]
            proxy.heal()
            drops[fault] = reasons
            assert served > 0, f"{fault}: no request met the fault"
            # The log acknowledged meanwhile: the table's failure held back no client.
            assert sum(c.acks() for c in clients) > acks_before, f"no ack during {fault}"
            _assert_up(nodes, f"during {fault}")
            for i, port in enumerate(ports):
                deadline = time.monotonic() + RECOVER_SECONDS
                while (status := readyz(port)[0]) != 200:
                    assert time.monotonic() < deadline, f"node {i} not ready after {fault}"
                    time.sleep(POLL_SECONDS)
        for fault, reasons in drops.items():
            assert all(reasons), f"/readyz did not drop on every node during {fault}: {reasons}"
        print({fault: reasons[0] for fault, reasons in drops.items()})
        for client in clients:
            client.stopping.set()
        for client in clients:
            client.join(SETTLE_SECONDS)
            assert client.error is None, client.error
            assert not client.is_alive()
        acked = set().union(*(client.acked for client in clients))
        direct = _options(s3_server.endpoint)
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            table = DeltaTable(uri, storage_options=direct).to_pyarrow_table(
                columns=["batch_id", "tag"]
            )
            rows = Counter(r["batch_id"] for r in table.to_pylist() if r["tag"] == "fleet.faulty")
            if acked <= set(rows) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        _assert_up(nodes, "after the cycle")
    finally:
        for client in clients:
            client.stopping.set()
        for node in nodes:
            node.stop()
    assert not acked - set(rows), f"acked, not stored: {sorted(acked - set(rows))[:10]}"
    twice = {k: v for k, v in rows.items() if v != EVENTS_PER_CHUNK}
    assert not twice, f"stored more than once: {list(twice.items())[:10]}"
    # Every chunk sent was acked in the end (a client resends until it is).
    assert set(rows) == acked
    for i, node in enumerate(nodes):
        assert node.process.returncode == 0, f"node {i}:\n{node.log()[-3000:]}"
        text = node.log()
        assert "event=table.retry" in text or "event=commit.failed" in text, f"node {i}"
        assert SECRET_ACCESS_KEY not in text


# -- start-up -------------------------------------------------------------------------------------


def _failed_start(tmp_path: Path, lake: str) -> str:
    """Start a node that must not start; its log."""
    with pytest.raises(RuntimeError, match="exited with 1") as caught:
        start_appliance(tmp_path, LISTENERS, EXTRA, lake=lake)
    return str(caught.value)


def test_a_store_that_refuses_the_credentials_at_start_stops_the_node_naming_them(
    s3_server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    proxy.fail("forbidden")
    log = _failed_start(tmp_path, _lake(f"s3://{s3_server.bucket()}/events", proxy.endpoint))
    failed = [line for line in log.splitlines() if "event=service.failed" in line]
    assert len(failed) == 1, log
    assert "refuses these credentials" in failed[0]
    assert "AWS_ACCESS_KEY_ID" in failed[0]
    assert "403 Forbidden (AccessDenied)" in failed[0]
    assert "event=admin.ready" in log  # /readyz answered while it tried
    assert SECRET_ACCESS_KEY not in log


def test_a_missing_bucket_at_start_stops_the_node_naming_it(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/events"
    log = _failed_start(tmp_path, _lake(uri, s3_server.endpoint))
    failed = [line for line in log.splitlines() if "event=service.failed" in line]
    assert len(failed) == 1, log
    assert "the bucket does not exist" in failed[0]
    assert "NoSuchBucket" in failed[0]
    assert uri in failed[0]


def test_a_store_failing_at_start_is_waited_for_and_readyz_says_why(
    s3_server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    proxy.fail("slowdown")
    started: list[ApplianceProcess] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            started.append(
                start_appliance(tmp_path, LISTENERS, EXTRA, lake=_lake(uri, proxy.endpoint))
            )
        except BaseException as exc:  # the test thread re-raises it
            errors.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    log_path = tmp_path / "appliance0.log"
    deadline = time.monotonic() + RECOVER_SECONDS
    while not (log_path.exists() and _ADMIN_PORT.search(log_path.read_text())):
        assert not errors, errors
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)
    port = int(_ADMIN_PORT.search(log_path.read_text()).group(1))  # type: ignore[union-attr]
    while True:
        status, body = readyz(port)
        reason = body["checks"]["table"].get("reason") or ""
        if "SlowDown" in reason:
            break
        assert time.monotonic() < deadline, body
        time.sleep(POLL_SECONDS)
    assert status == 503
    assert reason == "opening: Generic S3 error: 503 Service Unavailable (SlowDown)"
    assert body["checks"]["listeners"] == {"ok": False, "reason": "not open: forward"}
    proxy.heal()
    starter.join(RECOVER_SECONDS)
    assert not errors, errors
    node = started[0]
    try:
        assert readyz(port)[0] == 200
        text = node.log()
        assert re.search(r'event=table\.retry op="opening the table s3://[^"]+" attempt=1 ', text)
        assert re.search(r'event=table\.recovered op="opening the table s3://', text)
    finally:
        assert node.stop() == 0
