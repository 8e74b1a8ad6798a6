"""``appliance status`` (issue 15): the table, ``--json`` and ``--watch`` from a real service."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.commands.status import Scrape, _quantile, render, summarize
from appliance.metrics import Metrics
from tests.appliance.test_one_writer import send_chunk
from tests.conftest import ApplianceProcess, free_port, start_appliance


def status(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "status", "--config", str(config), *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def service(tmp_path: Path) -> ApplianceProcess:
    admin = free_port()
    app = start_appliance(tmp_path, {"forward": ""}, extra=f'[admin]\nbind = "127.0.0.1:{admin}"\n')
    yield app  # type: ignore[misc]
    assert app.stop() == 0


def test_status_json_reports_what_was_sent(service: ApplianceProcess, tmp_path: Path) -> None:
    for i in range(4):
        assert send_chunk(service, service.ports["forward"], f"c{i}", events=25) == {"ack": f"c{i}"}
    result = status(tmp_path / "appliance0.toml", "--json", "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["ready"] is True
    (forward,) = summary["listeners"]
    assert forward["listener"] == "forward"
    assert forward["protocol"] == "forward"
    assert (forward["requests"], forward["events"], forward["acks"]) == (4, 100, 4)
    assert forward["connections_accepted"] == 4
    assert forward["connections_open"] == 0
    assert sum(forward["errors"].values()) == 0
    assert forward["ack_latency_p99_seconds"] > 0
    assert summary["lake"]["rows_committed"] == 100
    assert summary["lake"]["queue_capacity_blocks"] == 64
    assert summary["process"]["resident_memory_bytes"] > 0


def test_status_table_and_watch(service: ApplianceProcess, tmp_path: Path) -> None:
    assert send_chunk(service, service.ports["forward"], "one", events=10) == {"ack": "one"}
    config = tmp_path / "appliance0.toml"
    result = status(config, "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": ready")
    header = next(line for line in lines if line.startswith("LISTENER"))
    assert "EVENTS/S" in header
    assert "ERR/MIN" in header
    row = next(line for line in lines if line.startswith("forward"))
    assert row.split()[:4] == ["forward", "forward", "0", "1"]
    assert any(line.startswith("table: version ") for line in lines)
    assert any("10 rows in 1 commits" in line for line in lines)

    watch = subprocess.Popen(
        [sys.executable, "-m", "appliance", "status", "--config", str(config), "--watch",
         "--interval", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(3)
    finally:
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    frames = out.split("\x1b[H\x1b[2J")[1:]
    assert len(frames) >= 3
    last = frames[-1].splitlines()
    row = next(line for line in last if line.startswith("forward"))
    assert row.split()[-1] == "0"  # errors in the last minute: a number, not "-"


def test_status_of_a_service_that_is_not_there(tmp_path: Path) -> None:
    config = tmp_path / "a.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n[admin]\nbind = "127.0.0.1:{free_port()}"\n')
    result = status(config)
    assert result.returncode == 1
    assert "cannot reach the admin listener at http://127.0.0.1:" in result.stderr


def test_status_asks_for_the_token_it_lacks(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    token.chmod(0o600)
    admin = free_port()
    app = start_appliance(
        tmp_path, {"forward": ""},
        extra=f'[admin]\nbind = "127.0.0.1:{admin}"\ntoken_file = "{token}"\n',
    )  # fmt: skip
    try:
        config = tmp_path / "appliance0.toml"
        # The configured token_file is readable here: it is used.
        assert status(config, "--interval", "0.1").returncode == 0
        other = tmp_path / "other.toml"
        other.write_text(f'state_dir = "{tmp_path}"\n[admin]\nbind = "127.0.0.1:{admin}"\n')
        denied = status(other)
        assert denied.returncode == 1
        assert "wants a bearer token" in denied.stderr
        env = {**os.environ, "APPLIANCE_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"}
        allowed = subprocess.run(
            [sys.executable, "-m", "appliance", "status", "--config", str(other), "--json"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
    finally:
        app.stop()


# -- the arithmetic, on a registry of its own ------------------------------------------------


def test_summary_rates_latency_and_errors_from_two_scrapes() -> None:
    metrics = Metrics(process=False)
    forward = metrics.listener("in", "forward")
    forward.requests.inc(10)
    forward.events.inc(1000)
    before = Scrape.parse(metrics.exposition()[0].decode(), at=100.0)
    minute_ago = before
    forward.requests.inc(20)
    forward.events.inc(2000)
    forward.received_bytes.inc(4096)
    for _ in range(98):
        forward.ack_latency.observe(0.2)
    for _ in range(2):
        forward.ack_latency.observe(20.0)
    forward.protocol_error("request exceeds max_request_bytes=1")
    forward.tls_failure("no handshake within 10s")
    metrics.lake.commits.inc(3)
    now = Scrape.parse(metrics.exposition()[0].decode(), at=102.0)
    summary = summarize(now, before, {"status": "ready", "checks": {}}, minute_ago, wall_time=0)
    (entry,) = summary["listeners"]
    assert entry["requests_per_second"] == 10
    assert entry["events_per_second"] == 1000
    assert entry["received_bytes_per_second"] == 2048
    assert 0.1 < entry["ack_latency_p50_seconds"] <= 0.25
    assert entry["ack_latency_p99_seconds"] == 20  # halfway through the (10, 30] bucket
    assert entry["errors"] == {"tls": 1, "refused": 0, "protocol": 1, "dropped_events": 0,
                               "failed": 0}  # fmt: skip
    assert entry["errors_last_minute"] == 2
    assert summary["lake"]["commits_per_second"] == 1.5
    text = render(summary, "http://127.0.0.1:9880")
    assert "errors since start: tls 1, protocol 1" in text


def test_quantile_is_promql_histogram_quantile() -> None:
    buckets = [(0.1, 0.0), (0.5, 50.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert _quantile(0.5, buckets) == 0.5
    assert _quantile(0.75, buckets) == 0.75
    assert _quantile(0.5, [(float("inf"), 0.0)]) is None
    assert _quantile(0.99, [(1.0, 0.0), (float("inf"), 10.0)]) == 1.0


def test_the_token_goes_only_over_https_or_to_loopback() -> None:
    from appliance.commands.status import token_may_go_to

    assert token_may_go_to("https://admin.example:9880")
    assert token_may_go_to("http://127.0.0.1:9880")
    assert token_may_go_to("http://[::1]:9880")
    assert token_may_go_to("http://localhost:9880")
    assert not token_may_go_to("http://10.1.2.3:9880")
    assert not token_may_go_to("http://admin.example:9880")


def test_a_redirect_is_not_followed_with_the_token() -> None:
    """The admin URL answers 302 to another server: that server never sees the token."""
    import http.server
    import threading

    from appliance.commands.status import _Client

    seen: list[str | None] = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Other)

    class Redirect(Other):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}/metrics")
            self.end_headers()

    first = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (first, other)]
    for thread in threads:
        thread.start()
    try:
        status, _ = _Client(f"http://127.0.0.1:{first.server_port}", "s3cret", None).get("/metrics")
    finally:
        first.shutdown()
        other.shutdown()
    assert status == 302
    assert seen == []
