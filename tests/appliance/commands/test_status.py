"""``appliance status``: the table, ``--json`` and ``--watch`` from a real service.

Also: the write-ahead log's section and its refusals (a log filled to its
cap by a table that does not commit), which appliance answered (another
state directory's admin listener is an error), metric names taken from
appliance/metrics.py (a renamed one fails status), and ``--watch`` going on
through failed scrapes.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.cli import main
from appliance.commands.status import (
    WATCH_RETRY_MAX_SECONDS,
    Scrape,
    StatusError,
    _num,
    _quantile,
    check_instance,
    render,
    summarize,
)
from appliance.metrics import Instance, MetricNames, Metrics, WalSample
from tests.appliance.commands.support import redirecting_server
from tests.appliance.test_one_writer import send_chunk
from tests.support.cli import run_cli, start_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

#: What ``--watch`` writes before each table (appliance/commands/status.py): home, clear.
REDRAW = "\x1b[H\x1b[2J"


def status(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("status", *args, config=config)


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
    assert summary["ack"] == "commit"
    assert summary["log"] is None
    assert summary["process"]["resident_memory_bytes"] > 0
    instance = summary["instance"]
    assert instance["state_dir"] == str(service.state_dir.resolve())
    assert instance["pid"] == service.process.pid
    assert instance["worker"] is None
    assert instance["node_id"] == (service.state_dir / "node-id").read_text().strip()


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
    assert lines[1].startswith(
        f"instance: node {(service.state_dir / 'node-id').read_text().strip()}"
    )
    assert f"state {service.state_dir.resolve()}, pid {service.process.pid}, worker -" in lines[1]
    assert any(line.startswith("table: version ") for line in lines)
    assert any("10 rows in 1 commits" in line for line in lines)
    assert "queue: 0/64 batches" in lines  # ack = "commit": the writer's queue, and no log
    assert not any(line.startswith("log") for line in lines)

    # Interrupted once it has drawn three tables: then it is past its imports and in the
    # loop, where Ctrl-C ends it with 0 (a fixed sleep could interrupt it still importing).
    watch = start_cli("status", "--watch", "--interval", "0.3", config=config)
    try:
        watch.wait_for_output(lambda out: out.count(REDRAW) >= 3)
    finally:
        watch.process.send_signal(signal.SIGINT)
        done = watch.finish(timeout=30)
    assert done.returncode == 0, done.stderr
    frames = done.stdout.split(REDRAW)[1:]
    assert len(frames) >= 3
    last = frames[-1].splitlines()
    row = next(line for line in last if line.startswith("forward"))
    assert row.split()[-1] == "0"  # errors in the last minute: a number, not "-"


def test_status_of_a_service_that_is_not_there(tmp_path: Path) -> None:
    config = tmp_path / "a.toml"
    config.write_text(
        f'state_dir = "{tmp_path}"\nworkers = 1\n[admin]\nbind = "127.0.0.1:{free_port()}"\n'
    )
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
        other.write_text(
            f'state_dir = "{app.state_dir}"\nworkers = 1\n[admin]\nbind = "127.0.0.1:{admin}"\n'
        )
        denied = status(other)
        assert denied.returncode == 1
        assert "wants a bearer token" in denied.stderr
        env = {"APPLIANCE_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"}
        allowed = run_cli("status", "--json", config=other, env=env)
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
                               "failed": 0, "batches_refused": 0}  # fmt: skip
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
    from appliance.commands.status import _Client

    with redirecting_server("/metrics") as (url, seen):
        status, _ = _Client(url, "s3cret", None).get("/metrics")
    assert status == 302
    assert seen == []


# -- which appliance answered ------------------------------------------------------------------


def test_another_appliance_s_admin_listener_is_an_error(
    service: ApplianceProcess, tmp_path: Path
) -> None:
    """The configured address answers, but for another state directory: exit 1, saying which."""
    admin = tomllib_admin_bind(tmp_path / "appliance0.toml")
    elsewhere = tmp_path / "elsewhere"
    config = tmp_path / "elsewhere.toml"
    config.write_text(f'state_dir = "{elsewhere}"\nworkers = 1\n[admin]\nbind = "{admin}"\n')
    result = status(config, "--interval", "0.1")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "belongs to another appliance" in result.stderr
    assert f"state directory {service.state_dir.resolve()}" in result.stderr
    assert f"pid {service.process.pid}" in result.stderr
    assert f"expected {elsewhere.resolve()}; no appliance runs on" in result.stderr
    # --url asks that appliance on purpose.
    on_purpose = status(config, "--interval", "0.1", "--url", f"http://{admin}")
    assert on_purpose.returncode == 0, on_purpose.stderr


def tomllib_admin_bind(config: Path) -> str:
    import tomllib

    bind = tomllib.loads(config.read_text())["admin"]["bind"]
    assert isinstance(bind, str)
    return bind


def test_check_instance_compares_state_directories(tmp_path: Path) -> None:
    mine = tmp_path.resolve()
    answer = {"instance": Instance("n1", str(mine), 7, "0", None).to_json()}
    check_instance(answer, mine, "http://127.0.0.1:1")
    with pytest.raises(StatusError, match=f"state directory {mine} .node n1, pid 7. answered"):
        check_instance(answer, mine / "other", "http://127.0.0.1:1")
    with pytest.raises(StatusError, match="does not say which appliance it is"):
        check_instance({"status": "ready", "checks": {}}, mine, "http://127.0.0.1:1")
    with pytest.raises(StatusError, match="does not say which appliance it is"):
        check_instance(None, mine, "http://127.0.0.1:1")
    # One that cannot tell its state directory passes while nothing says it is another's.
    unknown = {"instance": Instance("n1", None, 7, "0", None).to_json()}
    check_instance(unknown, mine, "http://127.0.0.1:1")


# -- the metric names come from appliance/metrics.py ---------------------------------------------


def _registry(wal: WalSample | None = None) -> Metrics:
    """A registry with one listener, and the log's collector reporting ``wal`` if given."""
    metrics = Metrics(process=False)
    metrics.listener("in", "forward").requests.inc()
    if wal is not None:
        metrics.watch_wal(lambda: wal)
    return metrics


def _wal(**changes: Any) -> WalSample:
    values: dict[str, Any] = dict(
        file_bytes=60 * 1024, max_bytes=64 * 1024, uncommitted_bytes=50 * 1024, segments=4,
        at_cap=True, appends=100, syncs=50, failed_syncs=0, written_bytes=100_000, cap_waits=3,
        cap_refusals=2, sync_wait_seconds=0.1, cache_bytes=2048, groups_from_cache=5,
        groups_read_back=1, committed=0, oldest_cached=(0, time.time_ns() - 42 * 10**9),
    )  # fmt: skip
    values.update(changes)
    return WalSample(**values)


@pytest.mark.parametrize(
    "constant", ["WAL_UNCOMMITTED_BYTES", "LAKE_COMMITTED_ROWS", "REQUESTS", "BATCHES_REFUSED"]
)
def test_a_renamed_metric_fails_status_instead_of_showing_zero(
    monkeypatch: pytest.MonkeyPatch, constant: str
) -> None:
    text = _registry(_wal()).exposition()[0].decode()
    scrape = Scrape.parse(text, at=1.0)
    summarize(scrape, readiness={"status": "ready", "checks": {}})  # the names as exported
    renamed = f"{getattr(MetricNames, constant)}_renamed"
    monkeypatch.setattr(MetricNames, constant, renamed)
    with pytest.raises(StatusError, match=f"does not export {renamed}"):
        summarize(scrape, readiness={"status": "ready", "checks": {}})


def test_a_renamed_metric_fails_the_status_command(
    service: ApplianceProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The same through the command, against a real service: exit 1 and the name, not a 0."""
    config = str(tmp_path / "appliance0.toml")
    assert main(["status", "--config", config, "--interval", "0.1", "--json"]) == 0
    renamed = "appliance_lake_commits_renamed_total"
    monkeypatch.setattr(MetricNames, "LAKE_COMMITS", renamed)
    capsys.readouterr()
    assert main(["status", "--config", config, "--interval", "0.1", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"does not export {renamed}" in captured.err


# -- the write-ahead log's section, the queue, the refusals ----------------------------------------


def test_the_log_section_replaces_the_queue_with_ack_wal() -> None:
    sample = [_wal()]
    metrics = Metrics(process=False)
    listener = metrics.listener("in", "forward")
    metrics.watch_wal(lambda: sample[0])
    before = Scrape.parse(metrics.exposition()[0].decode(), at=100.0)
    listener.batch_refused("write-ahead log full: the table is not keeping up")
    listener.batch_refused("write-ahead log full: the table is not keeping up")
    listener.batch_refused("disk nearly full: 1 GiB free")
    sample[0] = _wal(cap_waits=10, cap_refusals=4, appends=160, written_bytes=160_000)
    now = Scrape.parse(metrics.exposition()[0].decode(), at=102.0)
    summary = summarize(now, before, {"status": "ready", "checks": {"wal": {"ok": True}}})
    assert summary["ack"] == "wal"
    assert summary["lake"]["queue_blocks"] is None
    log = summary["log"]
    assert (log["file_bytes"], log["max_bytes"], log["uncommitted_bytes"]) == (
        60 * 1024, 64 * 1024, 50 * 1024,
    )  # fmt: skip
    assert log["at_cap"] is True
    assert 41 < log["oldest_uncommitted_age_seconds"] < 600
    assert (log["cap_waits"], log["cap_refusals"]) == (10, 4)
    # The waits and refusals of the window (here the two scrapes; --watch: the last minute).
    assert log["recent"] == {"seconds": 2.0, "cap_waits": 7, "cap_refusals": 2, "failed_syncs": 0}
    assert log["appends_per_second"] == 30
    (entry,) = summary["listeners"]
    assert entry["batches_refused"] == {"disk_nearly_full": 1, "wal_full": 2}
    assert entry["errors"]["batches_refused"] == 3
    text = render(summary, "http://127.0.0.1:9880")
    lines = text.splitlines()
    assert not any(line.startswith("queue:") for line in lines)
    assert "log: 60.0 KiB of 64.0 KiB (94%), 50.0 KiB uncommitted, oldest 4" in text
    assert "; AT CAP: connections wait for commits" in text
    assert (
        "log backpressure, last 2.0 s: 7 waits, 2 refused, 0 failed syncs "
        "(since start 10 waits, 4 refused, 0 failed syncs)" in lines
    )
    assert "errors since start: batches_refused 3 (disk_nearly_full 1, wal_full 2)" in lines


def test_an_unknown_oldest_age_and_a_log_not_open_yet() -> None:
    summary = summarize(
        Scrape.parse(_registry(_wal(oldest_cached=None)).exposition()[0].decode(), at=1.0),
        readiness={"status": "ready", "checks": {"wal": {"ok": True}}},
    )
    assert summary["log"]["oldest_uncommitted_age_seconds"] is None  # NaN: the cache is off
    assert "uncommitted, oldest unknown" in render(summary, "http://x")
    # With ack = "wal" before the log opened: no figures yet, and not an error.
    opening = summarize(
        Scrape.parse(_registry().exposition()[0].decode(), at=1.0),
        readiness={"status": "not ready", "checks": {"wal": {"ok": True}}},
    )
    assert opening["ack"] == "wal"
    assert opening["log"] is None
    assert "log: not open yet" in render(opening, "http://x").splitlines()


def test_rates_keep_their_precision_and_a_window_without_commits_says_so() -> None:
    assert _num(0.0) == "0"
    assert _num(0.04) == "0.04"
    assert _num(0.004) == "<0.01"
    assert _num(3.25) == "3.2"
    assert _num(3600.0) == "3,600"
    metrics = _registry()
    before = Scrape.parse(metrics.exposition()[0].decode(), at=10.0)
    now = Scrape.parse(metrics.exposition()[0].decode(), at=11.0)
    summary = summarize(now, before, {"status": "ready", "checks": {}})
    assert summary["lake"]["commits_in_window"] == 0
    assert "no commit in the last 1.0 s," in render(summary, "http://x")
    metrics.lake.commits.inc()
    metrics.lake.committed_rows.inc(45)
    later = Scrape.parse(metrics.exposition()[0].decode(), at=70.0)
    # --watch: over the last minute's window (60 s): 45 rows are 0.75 rows/s, not "0.0".
    summary = summarize(later, now, {"status": "ready", "checks": {}}, minute_ago=before)
    assert summary["lake"]["rows_per_second"] == 0.75
    assert "0.02 commits/s, 0.75 rows/s" in render(summary, "http://x")


def test_watch_says_a_failed_scrape_and_keeps_trying_with_a_bounded_pause() -> None:
    from appliance.commands.status import _Client, _Watch

    metrics = _registry()
    answers: list[str | None] = [None, "down", "down", "down", "down", "down", "down", None]

    class Flaky(_Client):
        def scrape(self) -> Scrape:
            answer = answers.pop(0)
            if answer is not None:
                raise StatusError(f"cannot reach the admin listener at {self.url}: {answer}")
            return Scrape.parse(metrics.exposition()[0].decode(), at=time.monotonic())

        def readiness(self) -> dict[str, Any] | None:
            return {"status": "ready", "checks": {}, "instance": {"pid": 1}}

    shown: list[str] = []
    watch = _Watch(Flaky("http://127.0.0.1:1", None, None), 2.0, shown.append, as_json=False)
    assert watch.round() == 2.0
    assert "LISTENER" in shown[-1]
    pauses = [watch.round() for _ in range(6)]
    assert pauses == [2.0, 4.0, 8.0, 16.0, WATCH_RETRY_MAX_SECONDS, WATCH_RETRY_MAX_SECONDS]
    assert "NO ANSWER" in shown[-1]
    assert "(6 failed tries since" in shown[-1]
    assert "cannot reach the admin listener at http://127.0.0.1:1: down" in shown[-1]
    assert f"next try in {WATCH_RETRY_MAX_SECONDS:g} s" in shown[-1]
    assert "last answer, " in shown[-1]
    assert "LISTENER" in shown[-1]
    assert watch.round() == 2.0  # answering again: back to the interval
    assert "NO ANSWER" not in shown[-1]


# -- the log at its cap, end to end ---------------------------------------------------------------

#: A log of 64 KiB whose records are never committed (an hour's interval, and
#: far below commit_max_bytes): a few chunks fill it, and a batch that finds
#: no room within 0.3 s is refused.
FULL_LOG = (
    "[wal]\nsegment_bytes = 16384\nmax_record_bytes = 16384\nmax_bytes = 65536\n"
    "full_wait_seconds = 0.3\n"
)
NEVER_COMMITS = 'ack = "wal"\ncommit_interval_seconds = 3600\ncommit_max_bytes = 67108864\n'


def test_a_full_log_shows_in_status_and_metrics(tmp_path: Path) -> None:
    admin = free_port()
    app = start_appliance(
        tmp_path, {"forward": ""}, extra=f'[admin]\nbind = "127.0.0.1:{admin}"\n' + FULL_LOG,
        lake=NEVER_COMMITS,
    )  # fmt: skip
    try:
        port = app.ports["forward"]
        acked = 0
        for n in range(200):
            answer = send_chunk(app, port, f"fill-{n}", events=100)
            if answer is None:
                break  # refused: the connection was closed without an ack
            assert answer == {"ack": f"fill-{n}"}
            acked += 1
        else:
            pytest.fail("the log never refused a batch")
        assert acked > 0
        config = tmp_path / "appliance0.toml"

        # Batches keep coming (each refused after 0.3 s at the cap) while status looks.
        stop = threading.Event()

        def keep_sending() -> None:
            n = 0
            while not stop.is_set():
                send_chunk(app, port, f"more-{n}", events=100)
                n += 1

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        try:
            deadline = time.monotonic() + 120
            while True:
                result = status(config, "--json", "--interval", "1")
                assert result.returncode in (0, 1), result.stderr  # at the cap: not ready
                summary = json.loads(result.stdout)
                if summary["log"]["recent"]["cap_refusals"] > 0:
                    break
                assert time.monotonic() < deadline, summary["log"]
        finally:
            stop.set()
            sender.join(timeout=60)
        log = summary["log"]
        assert summary["ack"] == "wal"
        assert summary["lake"]["queue_blocks"] is None  # no queue with ack = "wal"
        assert log["max_bytes"] == 65536
        # Full: the next 100-event record (about 4 KB) did not fit.
        assert 65536 - 16384 < log["file_bytes"] <= 65536
        assert log["uncommitted_bytes"] > 0
        assert log["oldest_uncommitted_age_seconds"] > 0
        assert log["cap_refusals"] >= 1
        assert log["cap_waits"] >= log["cap_refusals"]
        (forward,) = summary["listeners"]
        assert forward["batches_refused"]["wal_full"] >= 1
        assert forward["errors"]["batches_refused"] == sum(forward["batches_refused"].values())
        assert summary["lake"]["rows_committed"] == 0  # nothing committed: the log holds it all

        # The same in /metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        labels = (("listener", "forward"), ("protocol", "forward"), ("reason", "wal_full"))
        assert samples[("appliance_batches_refused_total", labels)] >= 1
        assert samples[("appliance_wal_cap_refusals_total", ())] >= 1
        assert samples[("appliance_wal_max_bytes", ())] == 65536
        assert samples[("appliance_wal_file_bytes", ())] > 65536 - 16384
        assert samples[("appliance_wal_uncommitted_bytes", ())] > 0
        age = samples[("appliance_wal_oldest_uncommitted_age_seconds", ())]
        assert not math.isnan(age)
        assert age > 0

        # And the human table.
        human = status(config, "--interval", "0.2")
        lines = human.stdout.splitlines()
        assert any(line.startswith("log: ") and "of 64.0 KiB" in line for line in lines), lines
        assert any(line.startswith("log backpressure") for line in lines), lines
        refused = next(line for line in lines if line.startswith("errors since start:"))
        assert "batches_refused" in refused
        assert "wal_full" in refused
        assert not any(line.startswith("queue:") for line in lines)
    finally:
        assert app.stop() == 0


def test_with_workers_the_configured_address_is_worker_0_s(tmp_path: Path) -> None:
    from appliance.commands.status import expected_state_dir
    from appliance.config import Config

    assert expected_state_dir(Config(state_dir=tmp_path, workers=1)) == tmp_path.resolve()
    workers = Config(state_dir=tmp_path, workers=2)
    assert expected_state_dir(workers) == (tmp_path / "workers" / "0").resolve()
    # Worker 0's own identity names that directory.
    zero = Instance.of("n-w0", workers.worker_state_dir(0) / "wal")
    assert (zero.state_dir, zero.worker) == (str(expected_state_dir(workers)), 0)
