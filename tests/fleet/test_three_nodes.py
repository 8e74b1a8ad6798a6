"""Three appliances, one PostgreSQL auth database, one S3 table; one node SIGKILLed mid-stream.

Real parts: three ``appliance serve`` processes (each its own state directory,
so its own node id and write-ahead log; ``ack = "wal"``, the default), the
session's PostgreSQL server (tests/postgres.py), moto's S3 server
(tests/s3server.py), HAProxy, npm ``@fluent-org/logger``, Go
``fluent-logger-golang`` and PyPI ``pylogbeat``.

1. A user added through node 0's CLI while the nodes run logs in (forward
   ``users`` handshake) with the real npm client on every node.
2. pylogbeat sends to node 1.
3. A Fluentd-like client (this module: chunk ids fixed per chunk, as
   ``out_forward`` keeps them across retries) streams chunks to node 2 with
   several in flight; node 2 is SIGKILLed mid-stream; the client resends every
   unacknowledged chunk, same ids, to node 0. Node 2 is then restarted on its
   state directory and replays its log.
4. Go ``fluent-logger-golang`` (a real client that resends: sync Posts with
   ``RequestAck`` and retries) posts through a real HAProxy (send-proxy-v2,
   health checks, redispatch) to the nodes' ``proxy_protocol`` listeners; the
   node holding its connection is SIGKILLed mid-stream, the client's retry
   reaches a live node, and the killed node restarts and replays.

Every acknowledged event is in the table exactly once: the chunks node 2 had
logged but not acked were resent to node 0, which stored them, and node 2's
replay skipped them (the table already held their batch ids).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from deltalake import DeltaTable
from pylogbeat import PyLogBeatClient

from tests.hostile.clients import sha512_hex
from tests.interop.haproxy import Balancer, HAProxy, ensure_haproxy, start_haproxy
from tests.interop.test_forward_node import node_send
from tests.postgres import PostgresServer
from tests.s3server import S3Server
from tests.support.cli import run_cli
from tests.support.service import ApplianceProcess, start_appliance

pytestmark = pytest.mark.interop

SHARED_KEY = "fleet-shared-key"
USER, PASSWORD = "fleet-user", "fleet-password"
#: The streamed chunks, their events, and how many are in flight at once.
CHUNKS, EVENTS_PER_CHUNK, IN_FLIGHT = 400, 20, 8
#: Acks seen from node 2 before it is killed.
KILL_AFTER_ACKS = 120
#: Acked chunks resent anyway, as if their acks had been lost with the connection.
LOST_ACKS = 16
LISTENERS = {
    "forward": 'security = "users"',
    "beats": 'protocol = "lumberjack"',
    # Behind HAProxy (send-proxy-v2): the Go client's way in.
    "relayed": 'proxy_protocol = true\ntrusted_proxies = ["127.0.0.1/32"]\nudp_heartbeat = false',
}
#: Events the Go client posts (sync, RequestAck: one event per request, each acked).
GO_EVENTS = 3000
#: Seconds to wait for the table to hold what was acked (commit_interval_seconds = 1).
SETTLE_SECONDS = 60


class StreamClient:
    """Fluentd's out_forward in miniature: fixed chunk ids, resend what was not acked."""

    def __init__(self, secret_key: str) -> None:
        self.key = secret_key
        self.acked: set[str] = set()

    def _connect(self, app: ApplianceProcess) -> tuple[ssl.SSLSocket, Any]:
        context = ssl.create_default_context(cafile=str(app.ca_file))
        raw = socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=30)
        tls = context.wrap_socket(raw, server_hostname="localhost")
        unpacker = msgpack.Unpacker(raw=False)
        helo = self._read(tls, unpacker)
        nonce, auth = helo[1]["nonce"], helo[1]["auth"]
        salt = os.urandom(16).hex().encode()
        tls.sendall(msgpack.packb([
            "PING", "stream-client", salt,
            sha512_hex(salt, b"stream-client", nonce, self.key.encode()),
            USER, sha512_hex(auth, USER.encode(), PASSWORD.encode()),
        ]))  # fmt: skip
        pong = self._read(tls, unpacker)
        assert pong[1] is True, pong
        return tls, unpacker

    @staticmethod
    def _read(tls: ssl.SSLSocket, unpacker: Any) -> Any:
        while True:
            for message in unpacker:
                return message
            data = tls.recv(65536)
            if not data:
                raise ConnectionError("closed")
            unpacker.feed(data)

    @staticmethod
    def chunk(i: int) -> tuple[str, bytes]:
        chunk_id = f"stream-{i:05d}"
        entries = [[1_700_000_000 + i, {"chunk": i, "n": n}] for n in range(EVENTS_PER_CHUNK)]
        return chunk_id, msgpack.packb(["fleet.stream", entries, {"chunk": chunk_id}])

    def stream(self, app: ApplianceProcess, chunks: list[int], on_ack: Any = None) -> list[int]:
        """Send ``chunks`` with IN_FLIGHT unacked; the chunks not acked when the node dies."""
        pending: list[int] = []
        todo = list(chunks)
        try:
            tls, unpacker = self._connect(app)
            while todo or pending:
                while todo and len(pending) < IN_FLIGHT:
                    i = todo.pop(0)
                    tls.sendall(self.chunk(i)[1])
                    pending.append(i)
                answer = self._read(tls, unpacker)
                expected = self.chunk(pending[0])[0]
                assert answer == {"ack": expected}, answer
                self.acked.add(expected)
                pending.pop(0)
                if on_ack is not None:
                    on_ack(len(self.acked))
        except (OSError, ssl.SSLError, ConnectionError):
            return pending + todo  # the node is gone: what it did not ack
        return []


def _go_stream(go_sender: Path, proxy: HAProxy, roots: Path) -> subprocess.Popen[str]:
    """fluent-logger-golang through HAProxy: sync Posts with RequestAck, retried on failure."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env["SSL_CERT_FILE"] = str(roots)
    return subprocess.Popen(
        [str(go_sender), "-host", proxy.host, "-port", str(proxy.port), "-tag-prefix",
         "fleet.go", "-count", str(GO_EVENTS), "-timeout", "120s"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _serving_go(nodes: list[ApplianceProcess]) -> int:
    """The node HAProxy relayed the Go client's connection to (its connection.proxied line)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for i, node in enumerate(nodes):
            if "event=connection.proxied listener=relayed" in node.log():
                return i
        time.sleep(0.05)
    raise AssertionError("no node got the Go client's connection")


def test_three_nodes_one_killed_every_acked_event_once(
    postgres_server: PostgresServer, s3_server: S3Server, tmp_path: Path, go_sender: Path
) -> None:
    ensure_haproxy()
    if postgres_server.url is None:
        pytest.fail(f"PostgreSQL is needed here: {postgres_server.reason}")
    database = postgres_server.create_database()
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    auth = f'[auth]\ndatabase_url = "{database}"\nsecret_key_file = "{tmp_path / "secret.key"}"\n'
    lake = f'path = "{uri}"\nack = "wal"\ncommit_interval_seconds = 1\n'
    lake += s3_server.toml_options()
    setup = tmp_path / "setup.toml"
    setup.write_text(f'state_dir = "{tmp_path / "setup"}"\n{auth}')
    run_cli("db", "upgrade", config=setup, check=True)
    run_cli(
        "key", "add", "fleet", "--secret-stdin", config=setup, stdin=SHARED_KEY + "\n", check=True
    )
    nodes = [start_appliance(tmp_path, LISTENERS, auth, index=i, lake=lake) for i in range(3)]
    try:
        # 1. A user added through node 0's CLI, live, logs in on every node.
        run_cli("user", "add", USER, "--password-stdin", config=tmp_path / "appliance0.toml",
                stdin=PASSWORD + "\n", check=True)  # fmt: skip
        npm_sent: list[dict[str, Any]] = []
        for i, node in enumerate(nodes):
            result = node_send(
                node, "fluent-org", "packed", "--shared-key", SHARED_KEY, "--username", USER,
                "--password", PASSWORD, count=50, tag=f"fleet.npm{i}",
            )  # fmt: skip
            assert result.returncode == 0, f"node {i}: {result.stderr}"
            npm_sent += [json.loads(line) for line in result.stdout.splitlines()]

        # 2. pylogbeat to node 1.
        with PyLogBeatClient(
            "127.0.0.1", nodes[1].ports["beats"], timeout=30, ssl_enable=True,
            ssl_verify=True, ca_certs=str(nodes[1].ca_file),
        ) as beats:  # fmt: skip
            beats.send([{"message": f"beat {i}", "seq": i,
                         "@metadata": {"beat": "filebeat"}} for i in range(100)])  # fmt: skip

        # 3. Stream to node 2, kill it mid-stream, resend the rest to node 0.
        client = StreamClient(SHARED_KEY)
        victim = nodes[2]

        def maybe_kill(acks: int) -> None:
            if acks == KILL_AFTER_ACKS:
                threading.Thread(target=victim.process.send_signal, args=(signal.SIGKILL,)).start()

        left = client.stream(victim, list(range(CHUNKS)), maybe_kill)
        victim.process.wait(30)
        assert left, "node 2 died with nothing in flight: the test proves nothing"
        # An ack can be lost with the connection (the kernel drops what the client had
        # not read): resend the last acked chunks too, as a client that never saw those
        # acks would. Node 2 logged them; node 0 stores them; node 2's replay must not.
        lost_acks = [i for i in range(CHUNKS) if i not in left][-LOST_ACKS:]
        assert client.stream(nodes[0], sorted(lost_acks + left)) == []
        assert len(client.acked) == CHUNKS
        time.sleep(3)  # node 0 commits the resent chunks (commit_interval_seconds = 1)
        nodes[2] = start_appliance(tmp_path, LISTENERS, auth, index=2, lake=lake)

        # 4. A real client that resends: fluent-logger-golang behind HAProxy. The node
        # holding its connection is killed mid-stream; the client's retry reaches a live
        # node through the balancer with the same chunk id.
        roots = tmp_path / "roots.pem"
        roots.write_text("".join(node.ca_file.read_text() for node in nodes))
        relayed = [node.ports["relayed"] for node in nodes]
        balancer = Balancer(relayed, send_proxy="v2", check=True, redispatch=True)
        with start_haproxy(tmp_path / "haproxy", balancer) as proxy:
            go = _go_stream(go_sender, proxy, roots)
            serving = _serving_go(nodes)
            time.sleep(0.5)  # mid-stream
            nodes[serving].process.send_signal(signal.SIGKILL)
            nodes[serving].process.wait(30)
            go_out, go_err = go.communicate(timeout=180)
            assert go.returncode == 0, f"{go_err[-2000:]}\n{proxy.log()[-2000:]}"
        # It reconnected through the balancer to a live node and went on there.
        reached = [i for i, n in enumerate(nodes) if i != serving and "listener=relayed" in n.log()]
        assert reached, "the Go client finished before the kill: nothing was resent"
        nodes[serving] = start_appliance(tmp_path, LISTENERS, auth, index=serving, lake=lake)
        go_sent = [json.loads(line) for line in go_out.splitlines()]
        assert len(go_sent) == GO_EVENTS

        # Everything acked is in the table, once.
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
            streamed = Counter(r["batch_id"] for r in rows if r["tag"] == "fleet.stream")
            go_rows = [r for r in rows if str(r["tag"]).startswith("fleet.go.")]
            done = len(streamed) >= CHUNKS and len(go_rows) >= GO_EVENTS
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.stop()
        postgres_server.drop_database(database)
    assert set(streamed) == client.acked
    assert set(streamed.values()) == {EVENTS_PER_CHUNK}, [
        (k, v) for k, v in streamed.items() if v != EVENTS_PER_CHUNK
    ]
    for i in range(3):
        seqs = Counter(json.loads(r["record"])["seq"] for r in rows if r["tag"] == f"fleet.npm{i}")
        assert sorted(seqs) == sorted(
            e["record"]["seq"] for e in npm_sent if e["tag"] == f"fleet.npm{i}"
        )
        assert set(seqs.values()) == {1}
    go_seqs = Counter(json.loads(str(r["record"]))["seq"] for r in go_rows)
    assert sorted(go_seqs) == sorted(e["record"]["seq"] for e in go_sent)
    assert set(go_seqs.values()) == {1}, [k for k, v in go_seqs.items() if v != 1][:10]
    beats = Counter(json.loads(r["record"])["seq"] for r in rows if r["protocol"] == "lumberjack")
    assert sorted(beats) == list(range(100))
    assert set(beats.values()) == {1}
    skipped = (tmp_path / "appliance2.log").read_text().count("event=wal.duplicate_skipped")
    # The lost-ack chunks were in node 2's log, uncommitted, and node 0 stored them.
    assert skipped >= LOST_ACKS, skipped
