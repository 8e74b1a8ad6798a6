"""Fleet commits on one S3 Delta table: the exactly-once check against the blind append.

Each writer is a process of its own with its own app id, as a node of a
fleet is. All of a case's writers commit one-block groups (a unique batch
id, ``--rows`` rows each) to one fresh ``events`` table on a fresh moto S3
server (``moto[server]``, loopback, ``conditional_put = "etag"``), as fast
as they can, for ``--seconds``. Two implementations, each in the same run
for every writer count of ``--writers``:

* ``new``: the writer's own code path as the tree the bench sits in has it.
  A :class:`appliance.lake.committer.TableCommitter` is opened (``open``:
  claim, table scan) and then ``await committer.commit_group([block])`` is
  called in a loop: read the commits made since the last check (one
  ``commitInfo`` per commit of another writer), leave out the batches
  already stored, commit at exactly ``read_version + 1`` with delta-rs's
  retries off, and on a lost race (``CommitConflict``) read and try again.
* ``old``: what the writer did per group on a shared table before the
  change, imported from another tree (``--baseline REV``: a ``git worktree``
  of REV made, and removed, by the bench; or ``--baseline-tree PATH``). Per
  group: ``EventsTable.batch_keys_present`` for the group's key (a scan of
  the data files whose ``received_at`` reaches back ``CLOCK_SKEW_NS``), then
  the blind ``EventsTable.commit(data, app_id, version, token, now_ms, ())``
  through the old writer's ``_to_arrow`` and ``_timed_commit``; delta-rs
  moves a commit that lost its race to the next version itself.

Every writer is a subprocess started with ``PYTHONPATH`` set to its
implementation's tree and that tree as working directory; the module files
each side imported are printed once. A writer opens, says it is ready, and
all of a case's writers start their window at the same moment (startup is
not in the window). Reported per (implementation, writers): commits/s in
all and per writer, p50/p99 latency of one group (conversion, check and
commit), lost races (``new``: the committers' ``lost_races``; ``old``: moto's
``412 Precondition Failed`` answers, delta-rs's own retries; both columns
are printed for both), storage retries, and batches stored twice (the
table's rows counted per ``batch_id`` at the end of every case); then the
ratios new/old of commits/s and of p50 per writer count.

    python -m bench.fleet_bench [--writers 1,2,4] [--seconds 15] [--rows 100]
        [--baseline REV | --baseline-tree PATH]

moto is an in-memory S3 in one Python process on the same cores: its CPU is
part of what is measured, so the absolute rates are a floor for real S3
(whose per-request latency, 10-30 ms, is higher). Same-run ratios are the
point.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: The tree this file sits in: the ``new`` side.
ROOT = Path(__file__).resolve().parents[1]
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
#: Seconds between the go signal and the start of the window (every writer
#: reads it before the window opens).
GO_DELAY_SECONDS = 0.5
#: The worker's lines on stdout (anything else there is ignored).
_READY = "READY "
_RESULT = "RESULT "
#: The modules whose files each side reports.
_NEW_MODULES = ("appliance", "appliance.lake.committer", "appliance.lake.table")
_OLD_MODULES = ("appliance", "appliance.lake.writer", "appliance.lake.table")


# -- the writer process (runs with its implementation's tree on PYTHONPATH) ----


def _block(row_block: Any, app_id: str, n: int, rows: int) -> Any:
    """The ``n``-th group's one block: ``rows`` rows under the unique batch id ``app_id-n``."""
    now = time.time_ns()
    return row_block(
        protocol="forward", source="bench", peer="127.0.0.1:1", received_at_ns=now,
        batch_id=f"{app_id}-{n}", tag="bench.fleet", host=None,
        times_ns=[now] * rows, records=['{"m":1}'] * rows,
    )  # fmt: skip


def _module_files(names: Sequence[str]) -> dict[str, str]:
    return {name: str(getattr(sys.modules[name], "__file__", "?")) for name in names}


def _ready(modules: dict[str, str]) -> float:
    """Say the writer is open (with its modules) and wait for the window's end time."""
    print(_READY + json.dumps({"modules": modules}), flush=True)
    line = sys.stdin.readline()
    if not line.startswith("GO "):
        raise SystemExit(f"expected GO, got {line!r}")
    start, until = (float(x) for x in line.split()[1:3])
    time.sleep(max(0.0, start - time.time()))
    return until


async def _new_writer(spec: dict[str, Any]) -> dict[str, Any]:
    """``new``: the real TableCommitter, one ``commit_group([block])`` after another."""
    from appliance.blocks.block import RowBlock
    from appliance.lake.committer import TableCommitter
    from appliance.lake.settings import WriterSettings
    from appliance.lake.table import EventsTable

    app_id: str = spec["app_id"]
    table = EventsTable(spec["uri"], spec["options"])
    committer = TableCommitter(table, app_id, WriterSettings(), secrets.randbits(62) + 1)
    await committer.open()
    until = _ready(_module_files(_NEW_MODULES))
    latencies: list[float] = []
    n = 0
    while time.time() < until:
        n += 1
        block = _block(RowBlock, app_id, n, spec["rows"])
        started = time.perf_counter()
        outcome = await committer.commit_group([block])
        latencies.append(time.perf_counter() - started)
        if outcome.stored_elsewhere or not outcome.committed:
            raise SystemExit(f"{app_id}: batch {n} was taken as stored elsewhere")
    return {
        "latencies": latencies,
        "lost_races": committer.lost_races,
        "storage_retries": committer.failed_attempts,
        "commits_read": committer.protocol.commits_read,
    }


async def _old_writer(spec: dict[str, Any]) -> dict[str, Any]:
    """``old``: per group, ``batch_keys_present`` for its key, then the blind commit.

    What the writer of the old tree did with a group on a shared table
    (``_without_stored_elsewhere``, then ``_store`` and ``_write``): the
    same calls, in worker threads behind one limiter, with its backoff on
    a ``CommitError``.
    """
    import importlib

    import trio

    from appliance.blocks.block import RowBlock
    from appliance.blocks.identity import dedupe_key
    from appliance.lake.errors import CommitError
    from appliance.lake.table import EventsTable

    # The old tree's module, not the one a type checker of this tree sees.
    writer: Any = importlib.import_module("appliance.lake.writer")
    app_id: str = spec["app_id"]
    settings = writer.WriterSettings()
    token = secrets.randbits(62) + 1
    table = EventsTable(spec["uri"], spec["options"])
    limiter = trio.CapacityLimiter(1)
    # The old LakeWriter.open: open or create, claim, sequence, recent batches.
    await trio.to_thread.run_sync(table.open_or_create, limiter=limiter)
    await trio.to_thread.run_sync(
        table.claim, app_id, token, time.time_ns() // 1_000_000,
        int(settings.lease_seconds * 1000), limiter=limiter,
    )  # fmt: skip
    last = await trio.to_thread.run_sync(table.committed_version, app_id, limiter=limiter)
    version = (last or 0) + 1
    cutoff_ns = time.time_ns() - int(settings.dedupe_window_seconds * 1e9)
    await trio.to_thread.run_sync(table.recent_batch_keys, cutoff_ns, limiter=limiter)
    # Instrumentation only: the version each refresh of the handle read, so
    # a commit that delta-rs moved past it (a lost race it retried itself,
    # with or without a 412) shows as committed above ``read + 1``.
    handle = table._dt
    refresh = handle.update_incremental
    read: list[int] = [handle.version()]

    def update_incremental() -> None:
        refresh()
        read[0] = handle.version()

    handle.update_incremental = update_incremental  # type: ignore[method-assign]
    until = _ready(_module_files(_OLD_MODULES))
    latencies: list[float] = []
    retries = 0
    moved = 0
    n = 0
    while time.time() < until:
        n += 1
        block = _block(RowBlock, app_id, n, spec["rows"])
        started = time.perf_counter()
        key = dedupe_key(block)
        assert key is not None
        since = block.received_at_ns - writer.CLOCK_SKEW_NS
        present = await trio.to_thread.run_sync(
            table.batch_keys_present, [key], since, limiter=limiter
        )
        if present:
            raise SystemExit(f"{app_id}: batch {n} was found in the table before its commit")
        data = await trio.to_thread.run_sync(writer._to_arrow, [block], limiter=limiter)
        backoff = settings.retry_initial_seconds
        while True:
            try:
                _, _, committed_at = await trio.to_thread.run_sync(
                    writer._timed_commit, table, data, app_id, version, token,
                    time.time_ns() // 1_000_000, (), limiter=limiter,
                )  # fmt: skip
                moved += committed_at > read[0] + 1
            except CommitError:
                retries += 1
                await trio.sleep(backoff)
                backoff = min(backoff * 2, settings.retry_max_seconds)
                continue
            break
        version += 1
        latencies.append(time.perf_counter() - started)
    return {"latencies": latencies, "lost_races": 0, "moved": moved, "storage_retries": retries}


def _worker_main(spec_json: str) -> int:
    """A writer process: run one implementation and print its result."""
    import trio

    from appliance.logs import configure

    configure("warning")  # to the case's stderr file: why a commit failed
    spec = json.loads(spec_json)
    run = _new_writer if spec["impl"] == "new" else _old_writer
    result = trio.run(run, spec)
    print(_RESULT + json.dumps(result), flush=True)
    return 0


# -- the driver ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One (implementation, writers) case."""

    impl: str
    writers: int
    seconds: float
    commits: int
    p50_ms: float
    p99_ms: float
    lost_races: int
    moto_412: int
    moved: int
    storage_retries: int
    commits_read: int
    batches: int
    doubled: int
    rows_ok: bool

    @property
    def per_second(self) -> float:
        return self.commits / self.seconds

    @property
    def per_writer(self) -> float:
        return self.per_second / self.writers


@contextmanager
def _moto(scratch: Path) -> Iterator[tuple[str, Path]]:
    """A fresh moto S3 server: its endpoint and its log."""
    import socket

    from bench.harness import free_port

    port = free_port()
    log = scratch / f"moto-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"moto did not start: {log.read_text()[-1000:]}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _count_412(log: Path) -> int:
    return log.read_text(errors="replace").count('" 412')


class _Writer:
    """One writer subprocess and the lines it prints."""

    def __init__(self, tree: Path, spec: dict[str, Any], stderr: IO[bytes]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tree)
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, text=True,
        )  # fmt: skip
        self.name = spec["app_id"]
        self.stderr_path = Path(stderr.name)

    def expect(self, prefix: str) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(prefix):
                parsed: dict[str, Any] = json.loads(line[len(prefix) :])
                return parsed
        self.process.wait()
        tail = self.stderr_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"writer {self.name} ended without {prefix.strip()}:\n{tail}")

    def go(self, start: float, until: float) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(f"GO {start} {until}\n")
        stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _table_check(uri: str, options: dict[str, str], rows: int) -> tuple[int, int, bool]:
    """Distinct batch ids, those stored more than once, and whether every batch has ``rows``."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    ids = DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=["batch_id"])
    counts = ids.group_by("batch_id").aggregate([("batch_id", "count")])
    per_batch = counts.column("batch_id_count")
    doubled = int(pc.sum(pc.greater(per_batch, rows)).as_py() or 0)
    exact = counts.num_rows == 0 or (
        pc.min(per_batch).as_py() == rows and pc.max(per_batch).as_py() == rows
    )
    return counts.num_rows, doubled, bool(exact)


def measure(
    impl: str,
    tree: Path,
    writers: int,
    seconds: float,
    rows: int,
    scratch: Path,
    modules_seen: dict[str, dict[str, str]],
) -> Case:
    """One case: ``writers`` processes of ``impl`` on a fresh table of a fresh moto."""
    import boto3  # type: ignore[import-untyped]

    from bench.harness import quantile

    with _moto(scratch) as (endpoint, log):
        options = {**_OPTIONS_BASE, "AWS_ENDPOINT_URL": endpoint}
        bucket = f"fleet-{uuid.uuid4().hex[:10]}"
        boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="bench",
            aws_secret_access_key="bench", region_name="us-east-1",
        ).create_bucket(Bucket=bucket)  # fmt: skip
        uri = f"s3://{bucket}/events"
        procs: list[_Writer] = []
        try:
            for i in range(writers):
                spec = {
                    "impl": impl, "uri": uri, "options": options,
                    "app_id": f"{impl}-node-{i}", "rows": rows,
                }  # fmt: skip
                stderr = (scratch / f"{impl}-{writers}-{i}.err").open("wb")
                procs.append(_Writer(tree, spec, stderr))
                if i == 0:
                    # The first writer creates the table before the others open it.
                    ready = procs[0].expect(_READY)
                    modules_seen.setdefault(impl, ready["modules"])
            for proc in procs[1:]:
                proc.expect(_READY)
            before_412 = _count_412(log)
            start = time.time() + GO_DELAY_SECONDS
            for proc in procs:
                proc.go(start, start + seconds)
            results = [proc.expect(_RESULT) for proc in procs]
            moto_412 = _count_412(log) - before_412
        finally:
            for proc in procs:
                proc.stop()
        batches, doubled, rows_ok = _table_check(uri, options, rows)
    latencies = sorted(x for r in results for x in r["latencies"])
    return Case(
        impl=impl,
        writers=writers,
        seconds=seconds,
        commits=len(latencies),
        p50_ms=quantile(latencies, 0.5) * 1000,
        p99_ms=quantile(latencies, 0.99) * 1000,
        lost_races=sum(r["lost_races"] for r in results),
        moto_412=moto_412,
        moved=sum(r.get("moved", 0) for r in results),
        storage_retries=sum(r["storage_retries"] for r in results),
        commits_read=sum(r.get("commits_read", 0) for r in results),
        batches=batches,
        doubled=doubled,
        rows_ok=rows_ok and batches == len(latencies),
    )


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


@contextmanager
def _baseline_tree(rev: str | None, path: str | None) -> Iterator[Path | None]:
    """The old tree: ``path`` as given, or a worktree of ``rev`` removed afterwards."""
    if path is not None:
        yield Path(path).resolve()
        return
    if rev is None:
        yield None
        return
    where = Path(tempfile.gettempdir()) / f"fleet-old-{rev}-{os.getpid()}"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        raise SystemExit(f"git worktree add {where} {rev} failed: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            capture_output=True, check=False,
        )  # fmt: skip


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def report(cases: Sequence[Case], out: Callable[[str], None] = print) -> None:
    """The Markdown table: every case by writer count, old then new; new rows carry new/old."""
    header = ("impl", "writers", "commits/s", "per writer", "p50 ms", "p99 ms", "lost races",
              "moto 412s", "moved by delta-rs", "backoff waits", "doubled",
              "commits/s new/old", "p50 new/old")  # fmt: skip
    out("| " + " | ".join(header) + " |")
    out("|---|" + "---:|" * (len(header) - 1))
    by = {(c.impl, c.writers): c for c in cases}
    for c in sorted(cases, key=lambda c: (c.writers, c.impl != "old")):
        lost = c.lost_races if c.impl == "new" else c.moto_412
        moved = str(c.moved) if c.impl == "old" else "-"
        old = by.get(("old", c.writers))
        ratios = "| | |"
        if c.impl == "new" and old is not None:
            ratios = f"| {_ratio(c.per_second, old.per_second)} | {_ratio(c.p50_ms, old.p50_ms)} |"
        out(
            f"| {c.impl} | {c.writers} | {c.per_second:.1f} | {c.per_writer:.1f} | "
            f"{c.p50_ms:.0f} | {c.p99_ms:.0f} | {lost} | {c.moto_412} | {moved} | "
            f"{c.storage_retries} | {c.doubled} " + ratios
        )


def main() -> int:
    """Run the cases and print the tables."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return _worker_main(sys.argv[2])
    from bench.harness import command_line, machine_info

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--writers", default="1,2,4", help="writer counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0, help="each case's window")
    parser.add_argument("--rows", type=int, default=100, help="rows per group (one block)")
    old = parser.add_mutually_exclusive_group()
    old.add_argument("--baseline", metavar="REV", help="measure REV too (a git worktree of it)")
    old.add_argument("--baseline-tree", metavar="PATH", help="measure the tree at PATH too")
    args = parser.parse_args()
    counts = [int(n) for n in args.writers.split(",")]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    info = machine_info(os.cpu_count() or 1, ["deltalake", "pyarrow", "moto", "trio"],
                        {"load average before": load})  # fmt: skip
    print("fleet bench: one-block groups to one Delta table on moto S3 (conditional_put = etag)")
    print(f"command: {command_line()}")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    lake_changes = _git(ROOT, "status", "--short", "--", "appliance/lake") or "none"
    print(f"new: {ROOT} at {_git(ROOT, 'describe', '--always', '--dirty')}; "
          f"appliance/lake changed against its HEAD: {lake_changes}")  # fmt: skip
    cases: list[Case] = []
    modules: dict[str, dict[str, str]] = {}
    printed: set[str] = set()
    with (
        tempfile.TemporaryDirectory() as tmp,
        _baseline_tree(args.baseline, args.baseline_tree) as old_tree,
    ):
        if old_tree is not None:
            print(f"old: {old_tree} at {_git(old_tree, 'describe', '--always', '--dirty')}")
        trees = {"new": ROOT} | ({} if old_tree is None else {"old": old_tree})
        for k, n in enumerate(counts):
            # Alternate which implementation runs first, against drift.
            order = list(trees) if k % 2 == 0 else list(reversed(trees))
            for impl in order:
                case = measure(impl, trees[impl], n, args.seconds, args.rows, Path(tmp), modules)
                for side in sorted(set(modules) - printed):
                    files = modules[side]
                    print(f"{side} imported: " + ", ".join(f"{m} {f}" for m, f in files.items()))
                    printed.add(side)
                print(
                    f"  {impl} x{n}: {case.commits} commits, {case.per_second:.1f}/s, "
                    f"p50 {case.p50_ms:.0f} ms, lost races {case.lost_races}, "
                    f"412s {case.moto_412}, moved by delta-rs {case.moved}, "
                    f"other writers' commits read {case.commits_read}, "
                    f"batches {case.batches}, doubled: {case.doubled}, "
                    f"rows per batch exact: {'yes' if case.rows_ok else 'NO'}",
                    flush=True,
                )
                cases.append(case)
    print()
    report(cases)
    new_doubled = sum(c.doubled for c in cases if c.impl == "new")
    print(f"\nbatches stored twice in the new runs: doubled: {new_doubled}")
    bad = [c for c in cases if c.doubled or not c.rows_ok]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
