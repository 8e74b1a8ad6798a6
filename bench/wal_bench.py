"""The write-ahead log alone: appends/s and latency to durable for 1, 4 and 16 concurrent appenders.

Each appender appends ~100 KB records (random bytes, a 1,000-event
PackedForward chunk's size) in a loop, waiting for each to be durable, for
``--seconds`` per case; a committer marks everything committed every
``--commit-interval`` seconds (as the Delta writer will), so segments are
deleted and the cap never binds. Before the cases, the raw cost of one
``pwrite`` + ``fdatasync`` of 100 KB on the same filesystem is measured as
the floor. Prints one table; never judges a time::

    .venv/bin/python bench/wal_bench.py
    .venv/bin/python bench/wal_bench.py --dir /var/lib/appliance --seconds 10 --appenders 1,4,16,64
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance.wal.log import open_wal  # noqa: E402
from appliance.wal.settings import WalSettings  # noqa: E402

RECORD_BYTES = 100_000


@dataclass
class Case:
    appenders: int
    appends: int
    seconds: float
    latencies: list[float]
    groups: int
    bytes_written: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def raw_fdatasync(directory: Path, size: int, count: int = 200) -> tuple[float, float]:
    """p50 and p99 seconds of one pwrite + fdatasync of ``size`` bytes appended to a file."""
    path = directory / "raw.bin"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    data = os.urandom(size)
    times: list[float] = []
    try:
        for i in range(count):
            started = time.perf_counter()
            os.pwrite(fd, data, i * size)
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times), percentile(times, 0.99)


async def run_case(directory: Path, appenders: int, seconds: float, commit_interval: float) -> Case:
    latencies: list[float] = []
    bodies = [os.urandom(RECORD_BYTES) for _ in range(8)]
    async with open_wal(directory, 0, WalSettings()) as wal:
        deadline = trio.current_time() + seconds

        async def appender(n: int) -> None:
            i = 0
            while trio.current_time() < deadline:
                started = time.perf_counter()
                await wal.append(bodies[i % len(bodies)], key=("bench", f"a{n}", str(i)), rows=1000)
                latencies.append(time.perf_counter() - started)
                i += 1

        async def committer() -> None:
            while True:
                await trio.sleep(commit_interval)
                await wal.mark_committed(wal.durable_end)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer)
            async with trio.open_nursery() as workers:
                for n in range(appenders):
                    workers.start_soon(appender, n)
            nursery.cancel_scope.cancel()
        elapsed = time.perf_counter() - started
        stats = wal.stats
    return Case(appenders, len(latencies), elapsed, latencies, stats.groups, stats.bytes_written)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="parent of the log directories")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each case")
    parser.add_argument("--appenders", default="1,4,16", help="concurrent appenders per case")
    parser.add_argument("--commit-interval", type=float, default=1.0, help="seconds")
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir))
    try:
        p50, p99 = raw_fdatasync(parent, RECORD_BYTES)
        print(f"filesystem of {parent}")
        print(
            f"raw pwrite+fdatasync of {RECORD_BYTES:,} bytes: "
            f"p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
        )
        print()
        header = (
            f"{'appenders':>9} {'appends/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'fdatasync/s':>11} {'records/sync':>12}"
        )
        print(header)
        print("-" * len(header))
        for count in (int(n) for n in args.appenders.split(",")):
            directory = parent / f"wal-{count}"
            case = trio.run(run_case, directory, count, args.seconds, args.commit_interval)
            shutil.rmtree(directory)
            print(
                f"{case.appenders:>9} {case.appends / case.seconds:>10,.0f} "
                f"{case.bytes_written / case.seconds / 1e6:>8.1f} "
                f"{percentile(case.latencies, 0.5) * 1000:>8.2f} "
                f"{percentile(case.latencies, 0.99) * 1000:>8.2f} "
                f"{case.groups / case.seconds:>11,.0f} {case.appends / max(case.groups, 1):>12.1f}"
            )
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
