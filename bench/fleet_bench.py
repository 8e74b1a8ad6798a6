"""Commits per second that one Delta table on S3 takes from 1, 2 and 4 writers (issue 16).

Each writer is a process of its own with its own app id, as a node of a
fleet is: it commits small appends to one ``events`` table on moto's S3
server (``moto[server]``, loopback, ``conditional_put = "etag"``) through
:meth:`appliance.lake.table.EventsTable.commit` (the writer's own call, with
its app transaction), as fast as it can, for ``--seconds``. Reported per N:
commits/s in all, per writer, the p50/p99 latency of one commit, the commits
that failed and were retried by the writer (``CommitError``), and the lost
races that delta-rs retried itself (moto's ``412 Precondition Failed``
answers to a conditional put of a log entry).

    python -m bench.fleet_bench [--writers 1,2,4] [--seconds 20] [--rows 100]

moto is an in-memory S3 in one Python process: its own CPU is part of what
is measured, so the absolute rates are a floor for real S3 (whose per-request
latency, 10-30 ms, is higher). The shape (how rates and retries change
with N) is the point.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import free_port, machine_info, quantile

#: moto's dummy credentials.
_OPTIONS_BASE = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
    "conditional_put": "etag",
}
#: Seconds moto's server may take to start.
START_TIMEOUT_SECONDS = 60


def _writer(uri: str, options: dict[str, str], app_id: str, rows: int, until: float) -> str:
    """One node: commit ``rows``-row appends until ``until``; JSON of latencies and retries."""
    import pyarrow as pa

    from appliance.lake.blocks import blocks_to_arrow
    from appliance.lake.errors import CommitError
    from appliance.lake.table import EventsTable
    from appliance.rows.block import RowBlock

    table = EventsTable(uri, options)
    table.open_or_create()
    latencies: list[float] = []
    retries = 0
    version = 0
    while time.time() < until:
        version += 1
        now = time.time_ns()
        block = RowBlock(
            protocol="forward", source="bench", peer="127.0.0.1:1", received_at_ns=now,
            batch_id=f"{app_id}-{version}", tag="bench.fleet", host=None,
            times_ns=[now] * rows, records=['{"m":1}'] * rows,
        )  # fmt: skip
        data: pa.Table = blocks_to_arrow([block])
        started = time.perf_counter()
        while True:
            try:
                table.commit(data, app_id, version)
                break
            except CommitError:
                retries += 1
        latencies.append(time.perf_counter() - started)
    return json.dumps({"latencies": latencies, "retries": retries})


def _run(args: tuple[str, dict[str, str], str, int, float]) -> str:
    return _writer(*args)


def _moto(port: int, log: Path) -> subprocess.Popen[bytes]:
    import socket

    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"moto's server did not start: {log.read_text()[-1000:]}")


def measure(endpoint: str, log: Path, writers: int, seconds: float, rows: int) -> dict[str, Any]:
    """One case: ``writers`` processes on a fresh table for ``seconds``."""
    import boto3

    options = {**_OPTIONS_BASE, "AWS_ENDPOINT_URL": endpoint}
    bucket = f"fleet-{uuid.uuid4().hex[:10]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="bench",
        aws_secret_access_key="bench", region_name="us-east-1",
    ).create_bucket(Bucket=bucket)  # fmt: skip
    uri = f"s3://{bucket}/events"
    from appliance.lake.table import EventsTable

    EventsTable(uri, options).open_or_create()
    before_412 = log.read_text().count('" 412')
    until = time.time() + seconds
    jobs = [(uri, options, f"node-{i}", rows, until) for i in range(writers)]
    with multiprocessing.get_context("spawn").Pool(writers) as pool:
        results = [json.loads(r) for r in pool.map(_run, jobs)]
    latencies = sorted(x for r in results for x in r["latencies"])
    commits = len(latencies)
    return {
        "writers": writers,
        "commits": commits,
        "commits_per_second": commits / seconds,
        "per_writer": commits / seconds / writers,
        "p50_ms": quantile(latencies, 0.5) * 1000,
        "p99_ms": quantile(latencies, 0.99) * 1000,
        "writer_retries": sum(r["retries"] for r in results),
        "lost_races_412": log.read_text().count('" 412') - before_412,
    }


def main() -> int:
    """Run the cases and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,2,4", help="writer counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="each case's window")
    parser.add_argument("--rows", type=int, default=100, help="rows per commit")
    args = parser.parse_args()
    counts = [int(n) for n in args.writers.split(",")]
    info = machine_info(os.cpu_count() or 1, ["deltalake", "moto"])
    print("fleet bench: commits to one Delta table on moto S3 (conditional_put = etag)")
    for key, value in info.items():
        print(f"  {key}: {value}")
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "moto.log"
        port = free_port()
        moto = _moto(port, log)
        try:
            rows = [measure(f"http://127.0.0.1:{port}", log, n, args.seconds, args.rows)
                    for n in counts]  # fmt: skip
        finally:
            moto.terminate()
            moto.wait(10)
    header = ("writers", "commits/s", "per writer", "p50 ms", "p99 ms", "writer retries",
              "lost races (412)")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for r in rows:
        print(
            f"| {r['writers']} | {r['commits_per_second']:.1f} | {r['per_writer']:.1f} | "
            f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['writer_retries']} | "
            f"{r['lost_races_412']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
