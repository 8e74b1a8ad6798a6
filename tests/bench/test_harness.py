"""bench.harness's per-connection latency breakdown: no server and no benchmark run here."""

from __future__ import annotations

from pathlib import Path

from bench import harness


def window(start: float, end: float) -> harness.Window:
    return harness.Window(
        pid=1, start=start, end=end, server_cpu=1.0, generator_cpu=0.0, system_busy=1.0,
        steal=0.0, threads_before={}, threads_after={}, server_peak_rss_mb=0.0,
    )  # fmt: skip


def test_workers_by_port_reads_the_peer_of_each_connection_open(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "ts=1 level=info logger=server event=connection.open worker=1 listener=forward "
        "peer=127.0.0.1:50001 tls=true source=forward\n"
        "ts=2 level=info logger=server event=connection.open worker=0 listener=forward "
        "peer=[::1]:50002 tls=true source=forward\n"
        "ts=3 level=info logger=server event=connection.closed worker=0 listener=forward "
        "peer=127.0.0.1:50003 reason=eof\n"
        "ts=4 level=info logger=server event=connection.open listener=forward "
        "peer=127.0.0.1:50004 tls=true source=forward\n",
        encoding="utf-8",
    )
    assert harness.workers_by_port(log) == {50001: 1, 50002: 0}


def test_latency_breakdown_per_connection_and_when_the_tail_came() -> None:
    # Connection 0 (worker 0) is slow in the window's second half; connection 1 never is.
    # An ack outside the window (t = 5.0) counts nowhere.
    slow = harness.ConnectionResult(
        ack_times=[0.1 * k + 0.02 for k in range(20)] + [5.0],
        latencies=[0.010] * 10 + [0.100] * 10 + [9.0],
        local_port=50001,
    )
    fast = harness.ConnectionResult(
        ack_times=[0.1 * k + 0.02 for k in range(20)], latencies=[0.010] * 20, local_port=50002
    )
    text = harness.latency_breakdown(window(0.0, 2.0), [slow, fast], {50001: 0, 50002: 1})
    lines = text.splitlines()
    assert "window p99 100.0" in lines[0]
    assert lines[1].strip() == (
        "conn 0 worker 0: 20 acks, p50 10.0 p90 100.0 p99 100.0 max 100.0, "
        "10 at or above the window's p99"
    )
    assert lines[2].strip() == (
        "conn 1 worker 1: 20 acks, p50 10.0 p90 10.0 p99 10.0 max 10.0, "
        "0 at or above the window's p99"
    )
    # Eight slots of 0.25 s: the slow acks came at 1.02-1.92 s.
    assert lines[3].split(": ")[1] == "0 0 0 0 3 2 3 2"


def test_latency_breakdown_of_an_empty_window() -> None:
    assert "no acks" in harness.latency_breakdown(window(0.0, 1.0), [], {})
