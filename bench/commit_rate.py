"""Commits and data files per minute at full load, for ``ack = "wal"`` and ``ack = "commit"``.

Run from the repository root::

    python -m bench.commit_rate [--duration 60] [--connections 4] [--in-flight 16]

For each mode a fresh ``appliance serve`` of this tree (pinned to one core,
the load generator to the other, as the other TLS benchmarks) takes
PackedForward chunks of ``--batch`` events from ``--connections`` TLS
connections, each keeping ``--in-flight`` chunks unacknowledged (the
Fluentd-like client of ``bench/forward_bench.py``), through a warm-up and a
measured window. Afterwards the table's ``_delta_log`` says what the window
cost the table: every commit whose ``commitInfo.timestamp`` lies in the
window and that adds data files, and those files. Commits without files (a
lease renewal, a claim) are not counted; the graceful stop's last commit falls
after the window.

The other ``[lake]`` settings are the defaults (``commit_interval_seconds``
5, ``commit_max_bytes`` 64 MiB for ``"wal"``; ``commit_max_delay_seconds``
0.25 and ``commit_max_rows`` 100,000 for ``"commit"``) unless given.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.forward_bench import FluentdClient, Workload

#: Seconds per minute, for the rates.
MINUTE = 60.0


@dataclasses.dataclass
class ModeResult:
    """What one ``ack`` mode did in its window."""

    mode: str
    seconds: float
    events_per_second: float
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    commits: int
    data_files: int
    rows: int
    table_rows: int
    acked_events: int

    @property
    def commits_per_minute(self) -> float:
        return self.commits * MINUTE / self.seconds

    @property
    def files_per_minute(self) -> float:
        return self.data_files * MINUTE / self.seconds

    @property
    def rows_per_commit(self) -> float:
        return self.rows / self.commits if self.commits else 0.0

    @property
    def ok(self) -> bool:
        """Every acked event is in the table (resent ones are deduplicated)."""
        return self.table_rows >= self.acked_events


def window_commits(log_dir: Path, start_ms: float, end_ms: float) -> tuple[int, int, int]:
    """(commits adding data, data files added, rows added) with a timestamp in the window."""
    commits = files = rows = 0
    for path in sorted(log_dir.glob("*.json")):
        adds: list[dict[str, Any]] = []
        stamp: float | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                adds.append(action["add"])
            elif "commitInfo" in action:
                stamp = action["commitInfo"].get("timestamp")
        if not adds or stamp is None or not start_ms <= stamp <= end_ms:
            continue
        commits += 1
        files += len(adds)
        rows += sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in adds)
    return commits, files, rows


def run_mode(
    mode: str, args: argparse.Namespace, workload: Workload, core: int | None
) -> ModeResult:
    state_dir = Path(tempfile.mkdtemp(prefix=f"commit-rate-{mode}-"))
    lake = f'ack = "{mode}"\n' + "".join(f"{line}\n" for line in args.lake)
    server = harness.start_server(
        state_dir, args, 'name = "forward"\n', core,
        preamble='[log]\nlevel = "info"\n[admin]\nenabled = false\n', lake=lake,
    )  # fmt: skip
    nonce = int.from_bytes(os.urandom(6), "big")
    clients = [FluentdClient(workload, nonce, i) for i in range(args.connections)]
    results = [harness.ConnectionResult() for _ in clients]
    senders = [
        functools.partial(
            harness.pipelined, port=server.port, in_flight=args.in_flight, client=c, result=r
        )
        for c, r in zip(clients, results, strict=True)
    ]
    # run_window measures on perf_counter; the Delta log stamps wall-clock milliseconds.
    wall_offset = time.time() - time.perf_counter()
    window = harness.run_window(server, senders, results, args.warmup, args.duration)
    harness.stop_server(server)
    table = state_dir / "var" / "lake" / "events"
    commits, files, rows = window_commits(
        table / "_delta_log",
        (window.start + wall_offset) * 1000,
        (window.end + wall_offset) * 1000,
    )
    table_rows, _ = harness.table_counts(table)
    latencies = window.latencies(results)
    measured = window.metrics(len(latencies) * workload.batch, latencies)
    harness.discard_state(state_dir, args.keep)
    return ModeResult(
        mode=mode,
        seconds=window.seconds,
        events_per_second=measured["events_per_second"],
        p50_ms=measured["p50_ms"],
        p99_ms=measured["p99_ms"],
        server_cpu_pct=measured["server_cpu_pct"],
        commits=commits,
        data_files=files,
        rows=rows,
        table_rows=table_rows,
        acked_events=sum(len(r.ack_times) for r in results) * workload.batch,
    )


def results_table(results: list[ModeResult]) -> str:
    lines = [
        "ack     events/s  p50 ms  p99 ms  server CPU  commits/min  files/min  rows/commit  ok",
        "-" * 86,
    ]
    for r in results:
        lines.append(
            f"{r.mode:<7} {r.events_per_second:>8,.0f} {r.p50_ms:>7.1f} {r.p99_ms:>7.1f}"
            f" {r.server_cpu_pct:>10.0f}% {r.commits_per_minute:>12.1f} {r.files_per_minute:>10.1f}"
            f" {r.rows_per_commit:>12,.0f}  {'yes' if r.ok else 'NO'}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="wal,commit", help="ack modes, in order (wal,commit)")
    parser.add_argument("--connections", type=int, default=4, help="TLS connections (4)")
    parser.add_argument("--in-flight", type=int, default=16, help="chunks unacked per connection")
    parser.add_argument("--batch", type=int, default=1000, help="events per chunk (1000)")
    parser.add_argument("--record-bytes", type=int, default=100, help="msgpack bytes per record")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (60)")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds (5)")
    parser.add_argument("--commit-delay", type=float, default=0.25, help="[lake] max delay")
    parser.add_argument("--commit-max-rows", type=int, default=100_000, help="[lake] max rows")
    parser.add_argument(
        "--lake",
        action="append",
        default=[],
        help="another [lake] line, e.g. 'commit_interval_seconds = 2'",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and generator")
    parser.add_argument("--keep", action="store_true", help="keep the state directories")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    (server_core, _), pinning, usable = harness.pin_cores(args.no_pin)
    info = harness.machine_info(usable, ["deltalake", "pyarrow", "trio"])
    harness.print_header(
        "commits and data files per minute, by ack mode", info, pinning, server_core
    )
    workload = Workload.build(args.batch, args.record_bytes)
    print(
        f"load: {args.connections} TLS connections x {args.in_flight} PackedForward chunks in "
        f"flight, {args.batch} events of ~{workload.record_bytes:.0f} B each; window "
        f"{args.duration:g} s after {args.warmup:g} s",
        flush=True,
    )
    results: list[ModeResult] = []
    for mode in args.modes.split(","):
        results.append(run_mode(mode, args, workload, server_core))
        print(results_table(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(results_table(results))
    if args.json is not None:
        args.json.write_text(
            json.dumps([dataclasses.asdict(r) for r in results], indent=2), encoding="utf-8"
        )


if __name__ == "__main__":
    main()
