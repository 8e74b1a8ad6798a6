"""Two appliance processes on one machine sharing a port (``reuse_port``) and one local table.

This is the building block of one process per core (docs/performance.md,
"Several processes on one machine"): each process has its own state
directory (node id, write-ahead log), both bind the same forward port with
``SO_REUSEPORT`` (its UDP heartbeat too), the second serves the first's
server certificate, and both commit to one local Delta table with ``[lake]
shared = "on"`` and the maintenance lease on.

Real processes, real TLS, a real table; the kernel spreads the connections.
Checks: both processes accept connections and answer heartbeats; every
acknowledged chunk is in the table once, also when each chunk is resent on
new connections that may land on the other process.
"""

from __future__ import annotations

import re
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.appliance.test_one_writer import send_chunk
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

#: Connections per round: with two processes, the chance that the kernel hands
#: every one to the same process is 2 ** -(CONNECTIONS - 1).
CONNECTIONS = 40
EVENTS_PER_CHUNK = 25


def worker(tmp_path: Path, index: int, port: int, table: Path, tls: str) -> ApplianceProcess:
    listener = f'bind = "127.0.0.1:{port}"\nreuse_port = true\nprotocol = "forward"\n'
    lake = f'path = "{table}"\nshared = "on"\nack = "wal"\ncommit_interval_seconds = 0.2\n'
    extra = f'{tls}\n[maintenance]\nlease = "on"\n'
    return start_appliance(tmp_path, {"forward": listener}, extra, index, lake=lake)


def acked(app: ApplianceProcess, port: int, chunk: str) -> str:
    """One PackedForward chunk on a new connection (to either process); the ack's chunk id."""
    answer = send_chunk(app, port, chunk, events=EVENTS_PER_CHUNK)
    assert isinstance(answer, dict), answer
    return str(answer["ack"])


def heartbeat(port: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(b"", ("127.0.0.1", port))
        return sock.recv(16)


def opened(app: ApplianceProcess) -> int:
    return len(re.findall(r"event=connection\.open\b", app.log()))


def chunk_counts(table: Path) -> Counter[str]:
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["batch_id"]).to_pylist()
    return Counter(str(row["batch_id"]) for row in rows)


def wait_for_rows(table: Path, rows: int) -> Counter[str]:
    deadline = time.monotonic() + 60
    while True:
        counts = chunk_counts(table)
        if sum(counts.values()) >= rows or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def test_two_processes_share_a_port_and_a_table_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    table = tmp_path / "shared" / "events"
    first = worker(tmp_path, 0, port, table, "")
    pki = first.state_dir / "pki"
    tls = f'[tls]\ncert_file = "{pki / "server.pem"}"\nkey_file = "{pki / "server.key"}"'
    second = worker(tmp_path, 1, port, table, tls)
    try:
        assert first.ports["forward"] == second.ports["forward"] == port
        chunks = [f"chunk-{i}" for i in range(CONNECTIONS)]
        assert [acked(first, port, chunk) for chunk in chunks] == chunks
        assert opened(first) > 0
        assert opened(second) > 0, "the kernel gave every connection to one process"
        assert heartbeat(port) == b"\x00"

        # Once committed, every chunk resent on a new connection (to either
        # process) is acked and not stored again.
        counts = wait_for_rows(table, CONNECTIONS * EVENTS_PER_CHUNK)
        assert counts == dict.fromkeys(chunks, EVENTS_PER_CHUNK)
        assert [acked(first, port, chunk) for chunk in chunks] == chunks
    finally:
        assert second.stop() == 0
        assert first.stop() == 0
    assert chunk_counts(table) == dict.fromkeys(chunks, EVENTS_PER_CHUNK)
    # Each process committed its own share from its own log, under its own node id.
    delta = DeltaTable(str(table))
    for app in (first, second):
        node_id = (app.state_dir / "node-id").read_text().strip()
        assert delta.transaction_version(f"{node_id}#wal") is not None, node_id


def test_without_reuse_port_a_second_process_cannot_bind(tmp_path: Path) -> None:
    port = free_port()
    listener = f'bind = "127.0.0.1:{port}"\nprotocol = "forward"\n'
    first = start_appliance(tmp_path, {"forward": listener}, index=0)
    try:
        with pytest.raises(RuntimeError, match="cannot bind"):
            start_appliance(tmp_path, {"forward": listener}, index=1)
    finally:
        first.stop()
