"""npm ``lumberjack-client`` (v2, compressed) and ``lumberjack-protocol`` (v1) over TLS.

The sender script is tests/interop/node/lumberjack_send.mjs; what each client
really sends is in docs/lumberjack.md. In short:

* ``lumberjack-client`` never reads from its socket, so it never sees an ack:
  the script ends once its last write is flushed (and the server has closed
  the connection it half-closed); the test then polls the table. It numbers
  every window from 1 and sends each window as ``2W`` + one ``2C``.
* ``lumberjack-protocol`` sends ``1W`` once per connection and then ``1D``
  frames numbered 1, 2, 3, ... for the whole connection; the script ends only
  when the last sequence is acked with a ``1A`` (its parser rejects any other
  version).

Each test reads the Delta table and finds every event exactly once.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.service import ApplianceProcess, start_appliance

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).parent / "node"
#: 2026-11-22T10:00:00Z in ns; the script's record i is stamped i ms later.
BASE_NS = 1795341600 * 10**9


def node_send(
    app: ApplianceProcess,
    listener: str,
    client: str,
    run: str,
    *extra: str,
    timeout_ms: int = 30000,
) -> subprocess.CompletedProcess[str]:
    if shutil.which("node") is None:
        reason = "node is not installed: the npm lumberjack clients cannot run"
        print(reason)
        pytest.skip(reason)
    assert (NODE_DIR / "node_modules" / client).is_dir(), (
        f"tests/interop/node/node_modules/{client} missing: run 'make node-deps'"
    )
    return subprocess.run(
        ["node", str(NODE_DIR / "lumberjack_send.mjs"), "--client", client,
         "--host", "127.0.0.1", "--port", str(app.ports[listener]), "--ca", str(app.ca_file),
         "--run", run, "--timeout-ms", str(timeout_ms), *extra],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApplianceProcess]:
    """One appliance with a TLS listener where client certificates are optional."""
    started = start_appliance(
        tmp_path_factory.mktemp("lumberjack-node"),
        {"beats": 'protocol = "lumberjack"\nclient_auth = "optional"\nkeepalive_seconds = 1'},
    )
    yield started
    started.stop()


def issue_client(app: ApplianceProcess, name: str) -> tuple[Path, Path]:
    config = app.state_dir.parent / "appliance0.toml"
    out = app.state_dir.parent / "certs"
    run_cli("cert", "issue-client", name, "--out", str(out), config=config, check=True)
    return out / f"{name}.crt", out / f"{name}.key"


def rows_of_run(app: ApplianceProcess, run: str, expected: int) -> list[dict[str, object]]:
    """The run's rows, once ``expected`` are committed (or 30 s have passed)."""
    deadline = time.monotonic() + 30
    while True:
        rows = [r for r in app.rows() if json.loads(str(r["record"])).get("run") == run]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def check_exactly_once(
    app: ApplianceProcess, run: str, sent: list[dict[str, Any]], seq: type
) -> dict[int, dict[str, object]]:
    """Every event of ``sent`` is in the table once, as sent; returns the rows by seq."""
    rows = rows_of_run(app, run, len(sent))
    by_seq: dict[int, list[dict[str, object]]] = {}
    for row in rows:
        by_seq.setdefault(int(json.loads(str(row["record"]))["seq"]), []).append(row)
    counts = {i: len(by_seq.get(i, [])) for i in range(len(sent))}
    assert {i: n for i, n in counts.items() if n != 1} == {}, "events not there exactly once"
    assert len(rows) == len(sent)
    for event in sent:
        (row,) = by_seq[event["seq"]]
        assert json.loads(str(row["record"])) == event["record"]
        assert row["protocol"] == "lumberjack"
        assert row["host"] == "interop-node"
        assert row["event_time_ns"] == BASE_NS + event["seq"] * 10**6
        assert isinstance(json.loads(str(row["record"]))["seq"], seq)
    assert "event=protocol.error" not in app.log(), "a connection broke the protocol"
    return {i: matches[0] for i, matches in by_seq.items()}


def test_lumberjack_client_v2_compressed_never_reading_acks(app: ApplianceProcess) -> None:
    # 120 events queued before the connection is up go out as one window; the
    # other 180 go out one window each, several in one TLS write.
    result = node_send(app, "beats", "lumberjack-client", "ljc", "--count", "300", "--batch", "120")
    assert result.returncode == 0, result.stderr
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(sent) == 300
    # The script drained what the client never read, only to see the server
    # close: one 6-byte ack per window (1 + 180), and perhaps keepalives.
    discarded = re.search(r"discarded (\d+) bytes", result.stderr)
    assert discarded, result.stderr
    assert int(discarded[1]) % 6 == 0
    assert int(discarded[1]) >= 181 * 6
    rows = check_exactly_once(app, "ljc", sent, int)
    assert {row["tag"] for row in rows.values()} == {"nodebeat"}
    assert {row["source"] for row in rows.values()} == {"anonymous"}


def test_lumberjack_protocol_v1_uncompressed_over_tls(app: ApplianceProcess) -> None:
    # One 1W 50 for the connection, then 1D 1..200: four windows, acked 1A 50 ... 1A 200.
    result = node_send(
        app, "beats", "lumberjack-protocol", "ljp", "--count", "200", "--window-size", "50"
    )
    assert result.returncode == 0, result.stderr
    # Every ack the client parsed (a keepalive repeats the last acked sequence).
    acks = [int(a) for a in result.stderr.split("acks: ")[1].split()[0].split(",")]
    assert acks == sorted(acks)
    assert sorted(set(acks) - {0}) == [50, 100, 150, 200]
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(sent) == 200
    rows = check_exactly_once(app, "ljp", sent, str)
    assert {row["tag"] for row in rows.values()} == {"nodelog"}


@pytest.mark.parametrize("client", ["lumberjack-client", "lumberjack-protocol"])
def test_client_certificate_becomes_the_source(app: ApplianceProcess, client: str) -> None:
    cert, key = issue_client(app, f"node-{client}")
    run = f"mtls-{client}"
    result = node_send(
        app, "beats", client, run, "--count", "40", "--batch", "10", "--window-size", "10",
        "--cert", str(cert), "--key", str(key),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    seq_type = int if client == "lumberjack-client" else str
    rows = check_exactly_once(app, run, sent, seq_type)
    assert {row["source"] for row in rows.values()} == {f"CN=node-{client}"}
