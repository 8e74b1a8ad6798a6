"""npm ``@fluent-org/logger`` and ``fluent-logger`` over TLS with ack required, every mode.

The sender script (tests/interop/node/send.mjs) exits 0 only when every
event was acknowledged, and prints what it sent; the test then reads the Delta
table and checks every event arrived exactly once, with its tag, its time to
the nanosecond (both clients send EventTime) and its record.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance import defaults
from tests.support.cli import run_cli
from tests.support.service import start_appliance

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).parent / "node"
CASES = [
    ("fluent-org", "message"),
    ("fluent-org", "forward"),
    ("fluent-org", "packed"),
    ("fluent-org", "compressed"),
    ("fluent-logger", "message"),
    ("fluent-logger", "packed"),
    ("fluent-logger", "compressed"),
]


def node_send(
    app,
    client: str,
    mode: str,
    *extra: str,
    count: int = 25,
    batch: int = 10,
    timeout_ms: int = 30000,
    tag: str | None = None,
) -> subprocess.CompletedProcess[str]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the npm interop clients cannot run")
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.skip(
            "tests/interop/node/node_modules missing: run 'make node-deps' (make test does)"
        )
    return subprocess.run(
        ["node", str(NODE_DIR / "send.mjs"), "--client", client, "--mode", mode,
         "--host", "127.0.0.1", "--port", str(app.ports["forward"]), "--ca", str(app.ca_file),
         "--tag", tag or f"node.{client}.{mode}", "--count", str(count), "--batch", str(batch),
         "--timeout-ms", str(timeout_ms), *extra],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory):
    """One TLS appliance for all the cases; each case uses its own tag."""
    from tests.support.service import start_appliance

    app = start_appliance(tmp_path_factory.mktemp("node"), {"forward": ""})
    yield app
    app.stop()


@pytest.mark.parametrize(("client", "mode"), CASES)
def test_node_client_over_tls_with_ack(shared_app, client: str, mode: str) -> None:
    result = node_send(shared_app, client, mode)
    assert result.returncode == 0, result.stderr
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(sent) == 25
    rows = [r for r in shared_app.rows() if r["tag"] == f"node.{client}.{mode}"]
    by_seq: dict[int, list[dict[str, object]]] = {}
    for row in rows:
        by_seq.setdefault(json.loads(row["record"])["seq"], []).append(row)
    for event in sent:
        matches = by_seq.get(event["record"]["seq"], [])
        assert len(matches) == 1, f"seq {event['record']['seq']} arrived {len(matches)} times"
        (row,) = matches
        assert row["tag"] == event["tag"]
        assert json.loads(row["record"]) == event["record"]
        assert row["event_time_ns"] == int(event["time_ns"])
    assert len(rows) == len(sent)


#: @fluent-org/logger's Message mode with acks: events a client emits at once.
PIPELINED_EVENTS = 2500
#: The client's ack timeout in that test: its own 20 s, not the suite's 30 s.
PIPELINED_ACK_TIMEOUT_MS = 20_000


def test_message_mode_with_thousands_of_pipelined_requests_is_all_acked(tmp_path: Path) -> None:
    """2,500 events emitted at once in Message mode: 2,500 requests in flight on one connection.

    Each is one event with its own chunk id; the client times out any ack not back within
    20 s. Pending work per connection is bounded by bytes (``max_pending_bytes``), so the
    connection keeps reading while these small requests wait for the table (choice 35 of
    docs/decisions.md; with a bound of 32 requests, 17 of 2,500 timed out).
    """
    tag = "node.pipelined.message"
    # The shipped commit delay, and acks only after the commit: the slowest answer path,
    # where a bound of 32 requests made 2,500 / 32 commits of 0.25 s, just under 20 s.
    lake = f"commit_max_delay_seconds = {defaults.LAKE_COMMIT_MAX_DELAY_SECONDS}"
    app = start_appliance(tmp_path, {"forward": ""}, lake=lake)
    try:
        result = node_send(
            app, "fluent-org", "message", count=PIPELINED_EVENTS, batch=PIPELINED_EVENTS,
            timeout_ms=PIPELINED_ACK_TIMEOUT_MS, tag=tag,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        rows = [r for r in app.rows() if r["tag"] == tag]
    finally:
        app.stop()
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(sent) == PIPELINED_EVENTS
    assert sorted(json.loads(r["record"])["seq"] for r in rows) == sorted(
        e["record"]["seq"] for e in sent
    )


def test_fluent_logger_has_no_forward_mode(shared_app) -> None:
    result = node_send(shared_app, "fluent-logger", "forward", count=1)
    assert result.returncode == 3, "the client gained Forward mode: add it to CASES"


@pytest.mark.parametrize("client", ["fluent-org", "fluent-logger"])
def test_npm_clients_with_client_certificates(appliance, tmp_path, client: str) -> None:
    """Mutual TLS required: a certificate from `appliance cert issue-client` is accepted
    and names the source; without one the client is refused and nothing is written."""
    app = appliance({"forward": 'client_auth = "required"'})
    run_cli("cert", "issue-client", f"{client}-host", "--out", str(tmp_path / "certs"),
            config=tmp_path / "appliance0.toml", check=True)  # fmt: skip
    cert = tmp_path / "certs" / f"{client}-host.crt"
    key = tmp_path / "certs" / f"{client}-host.key"
    accepted = node_send(app, client, "packed", "--cert", str(cert), "--key", str(key), count=5)
    assert accepted.returncode == 0, accepted.stderr
    refused = node_send(app, client, "message", count=1)
    assert refused.returncode != 0
    rows = app.rows()
    assert len(rows) == 5
    assert {r["source"] for r in rows} == {f"CN={client}-host"}
