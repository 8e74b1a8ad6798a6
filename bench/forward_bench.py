"""Forward-protocol benchmark: PackedForward over TLS with ack, into durable Delta commits.

What it does, per case (a batch size and a number of outstanding chunks):

1. starts ``appliance serve`` as a subprocess with a fresh state directory,
   pinned to core 0 (``os.sched_setaffinity``); the load generator runs in
   this process, pinned to core 1 (when the machine has 2+ cores);
2. opens ``--connections`` TLS connections (plain ``ssl`` sockets, one thread
   each), each sending PackedForward requests
   ``["bench.tag", <bin entries>, {"chunk": <unique base64 id>, "size": n}]``
   with EventTime entries and ~100-byte records, and waiting for the acks
   (Fluentd out_forward with ``require_ack_response``: one chunk in flight per
   connection, or ``pipeline`` chunks);
3. measures over a window (after a warm-up): events/s, MB/s of request bytes,
   p50/p99 send->ack latency, server and generator CPU, the server's CPU by
   thread, and the server's peak RSS (VmHWM);
4. stops sending, waits for every outstanding ack, SIGTERMs the server and
   checks that the table holds exactly the acked events and chunks.

Next to each case it prints in-process ceilings on the same bytes, on one core:
``msgpack`` decode only; the appliance's codec (``ForwardServerConnection``
plus ``record_json``); that plus ``forward_block``/``blocks_to_arrow``; and that
plus the Delta commit (``EventsTable.commit``), i.e. everything but TLS and trio.

``--profile`` runs one case (``--profile-case``) with the server under
cProfile in every Python thread (``bench.profile_server``) and prints the top
functions by cumulative and by own time. ``--profile py-spy`` samples the
running server with py-spy instead (``pip install -r bench/requirements.txt``):
much less overhead, so the shares are closer to an unprofiled run.

Nothing here asserts a time: it reports. It fails (exit 1) only when the
table does not hold exactly what was acknowledged.

    .venv/bin/python -m bench.forward_bench
    .venv/bin/python -m bench.forward_bench --cases 1000:16 --duration 15
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import functools
import os
import platform
import pstats
import re
import shutil
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from bench import harness
from bench.harness import (
    ROOT,
    VENV_BIN,
    Server,
    cpu_model,
    fmt_rate,
    fmt_threads,
    git_commit,
    memory_gib,
    package_versions,
)

TAG = "bench.tag"
DEFAULT_CASES = "1:1,100:1,1000:1,100:32:8,1000:16"


# -- machine -------------------------------------------------------------------


def machine_info(usable: int) -> dict[str, str]:
    """What the results were measured on."""
    return {
        "cpus": f"{os.cpu_count()} (usable: {usable})",
        "cpu_model": cpu_model(),
        "memory": memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "openssl": ssl.OPENSSL_VERSION,
        "packages": package_versions(("trio", "msgpack", "deltalake", "pyarrow", "cryptography")),
        "source": f"{ROOT} at {git_commit()}",
    }


# -- workload ------------------------------------------------------------------

_FILLER = (
    "GET /api/v1/items/{i} HTTP/1.1 status=200 bytes=5120 duration_ms={d} "
    "ua=bench-agent/1.0 ref=https://example.test/page "
)


def make_record(i: int, target: int) -> dict[str, Any]:
    """A log-like record whose msgpack encoding is about ``target`` bytes."""
    record: dict[str, Any] = {
        "host": f"web-{i % 16:02d}",
        "level": ("info", "warn", "error", "debug")[i % 4],
        "seq": i,
        "msg": "",
    }
    text = (_FILLER.format(i=i, d=i % 997) * 4)[: max(target, 0)]
    record["msg"] = text[: max(0, target - len(msgpack.packb(record)))]
    while len(msgpack.packb(record)) > target and record["msg"]:
        record["msg"] = record["msg"][:-1]
    return record


def event_time(seconds: int, nanoseconds: int) -> msgpack.ExtType:
    """Fluentd EventTime: msgpack ext type 0 holding two big-endian u32."""
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


@dataclasses.dataclass(frozen=True)
class Workload:
    """One pre-encoded PackedForward request; only the chunk id changes per send."""

    batch: int
    entries: bytes
    record_bytes: float
    prefix: bytes
    suffix: bytes

    @classmethod
    def build(cls, batch: int, record_bytes: int) -> Workload:
        now = int(time.time())
        records = [make_record(i, record_bytes) for i in range(batch)]
        entries = b"".join(
            msgpack.packb([event_time(now, i * 1000), r], use_bin_type=True)
            for i, r in enumerate(records)
        )
        prefix = (
            b"\x93"
            + msgpack.packb(TAG)
            + msgpack.packb(entries, use_bin_type=True)
            + b"\x82"
            + msgpack.packb("chunk")
        )
        suffix = msgpack.packb("size") + msgpack.packb(batch)
        avg = sum(len(msgpack.packb(r)) for r in records) / batch
        return cls(batch, entries, avg, prefix, suffix)

    def request(self, chunk: str) -> bytes:
        return self.prefix + msgpack.packb(chunk) + self.suffix

    @property
    def request_bytes(self) -> int:
        return len(self.request(chunk_id(0, 0, 0)))


def chunk_id(nonce: int, connection: int, seq: int) -> str:
    """A unique chunk id as Fluentd makes them: base64 of 16 bytes."""
    return base64.b64encode(struct.pack(">QII", nonce, connection, seq)).decode("ascii")


# -- in-process ceilings -------------------------------------------------------


def measure_ceilings(
    workload: Workload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the bytes the generator sends."""
    from appliance.blocks.records import record_json
    from appliance.lake.arrow import blocks_to_arrow
    from appliance.protocols.forward import EventsReceived, ForwardServerConnection
    from appliance.rows.forward import forward_block
    from appliance.server.listener import ConnectionInfo

    with harness.pinned(core):
        request = workload.request(chunk_id(1, 0, 0))
        # Requests per call: about one commit group's worth of rows.
        group = max(1, 25_000 // workload.batch)
        info = ConnectionInfo("forward", "127.0.0.1", 50000, True)

        def decode_only() -> int:
            n = 0
            for _ in range(group):
                _tag, entries, _option = msgpack.unpackb(request, raw=False)
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(entries)
                for _entry in unpacker:
                    n += 1
            return n

        def codec_events() -> list[EventsReceived]:
            conn = ForwardServerConnection()
            out = []
            for _ in range(group):
                for event in conn.receive_data(request):
                    assert isinstance(event, EventsReceived)
                    out.append(event)
            return out

        def codec() -> int:
            n = 0
            for event in codec_events():
                n += len([record_json(r) for r in event.records])
            return n

        def codec_arrow_table() -> tuple[int, Any]:
            now = time.time_ns()
            blocks = [
                forward_block(e, source=info.source, peer=info.peer, received_at_ns=now)
                for e in codec_events()
            ]
            table = blocks_to_arrow(blocks)
            return table.num_rows, table

        def codec_arrow() -> int:
            return int(codec_arrow_table()[0])

        result = {
            "decode": harness.best_rate(decode_only, seconds),
            "codec": harness.best_rate(codec, seconds),
            "arrow": harness.best_rate(codec_arrow, seconds),
        }
        if with_commit:
            result["commit"] = harness.commit_rate(
                lambda: codec_arrow_table()[1], seconds, "forward-bench-ceiling-"
            )
        return result


# -- server --------------------------------------------------------------------


def start_server(
    state_dir: Path,
    args: argparse.Namespace,
    server_core: int | None,
    profile_dir: Path | None,
) -> Server:
    """``python -m appliance serve`` on this tree (or under ``bench.profile_server``)."""
    command: list[str] = list(harness.APPLIANCE_SERVE)
    if profile_dir is not None:
        command = [
            *harness.bench_module("profile_server"),
            str(profile_dir),
            "--timer",
            args.profile_timer,
            "serve",
        ]
    lake = f'ack = "{args.ack}"\n' if args.ack else ""
    # workers = N: the supervisor runs N appliance processes on the port and the table
    # (docs/performance.md); pinned to N cores from the server's on, they float on those.
    preamble = f"workers = {args.processes}\n" if args.processes > 1 else ""
    preamble += '[log]\nlevel = "info"\n'
    if args.no_metrics:
        preamble += "[admin]\nenabled = false\n"
    else:
        preamble += f'[admin]\nbind = "127.0.0.1:{harness.free_port()}"\n'
    return harness.start_server(
        state_dir, args, 'name = "forward"\n', server_core, command=command, lake=lake,
        preamble=preamble, cores=args.processes,
    )  # fmt: skip


#: The reference server (bench/fluent_server.mjs: npm @fluent-org/logger's FluentServer).
REFERENCE_SCRIPT = Path(__file__).resolve().parent / "fluent_server.mjs"


def start_reference(state_dir: Path, args: argparse.Namespace, server_core: int | None) -> Server:
    """The reference forward server over TLS with acks, on a certificate made here (trustme)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca.cert_pem.write_to_path(str(state_dir / "ref-ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(state_dir / "ref-cert.pem"))
    cert.private_key_pem.write_to_path(str(state_dir / "ref-key.pem"))
    return harness.start_server(
        state_dir, args, 'name = "forward"\n', server_core,
        command=("node", str(REFERENCE_SCRIPT)),
    )  # fmt: skip


@dataclasses.dataclass
class ReferenceResult:
    """The reference's figures for one case (the same load, the same client)."""

    events_per_second: float
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    events_per_server_cpu_second: float
    rows: int
    acked_events: int


def run_reference_case(
    batch: int,
    pipeline: int,
    connections: int,
    args: argparse.Namespace,
    cores: tuple[int | None, int | None],
) -> ReferenceResult:
    """The case against the reference server: same workload, client, window and pinning."""
    server_core, _ = cores
    workload = Workload.build(batch, args.record_bytes)
    nonce = int.from_bytes(os.urandom(8), "big")
    clients = [FluentdClient(workload, nonce, i) for i in range(connections)]
    state_dir = Path(tempfile.mkdtemp(prefix=f"forward-reference-{batch}x{pipeline}-"))
    server = start_reference(state_dir, args, server_core)
    results = [harness.ConnectionResult() for _ in clients]
    senders = [
        functools.partial(harness.pipelined, port=server.port, in_flight=pipeline, client=c,
                          result=r)
        for c, r in zip(clients, results, strict=True)
    ]  # fmt: skip
    window = harness.run_window(server, senders, results, args.warmup, args.duration)
    _, stopped = harness.stop_server(server)
    harness.discard_state(state_dir, args.keep)
    latencies = window.latencies(results)
    metrics = window.metrics(len(latencies) * batch, latencies)
    if args.latencies:
        print("  reference:\n" + harness.latency_breakdown(window, results, {}))
    if args.latency_dump is not None:
        harness.latency_dump(
            args.latency_dump / f"reference-{batch}x{pipeline}x{connections}-{nonce:x}.json",
            window, results, {},
        )  # fmt: skip
    return ReferenceResult(
        events_per_second=metrics["events_per_second"],
        p50_ms=metrics["p50_ms"],
        p99_ms=metrics["p99_ms"],
        server_cpu_pct=metrics["server_cpu_pct"],
        events_per_server_cpu_second=metrics["events_per_server_cpu_second"],
        rows=int(stopped.get("rows", "0")),
        acked_events=sum(len(r.ack_times) for r in results) * batch,
    )


def comparison_table(pairs: list[tuple[CaseResult, ReferenceResult]]) -> str:
    """The appliance next to the reference, case by case, with the ratio of events/s."""
    lines = [
        "| conns x in flight | appliance events/s | reference events/s | ratio | "
        "appliance p50/p99 ms | reference p50/p99 ms | appliance events/CPU-s | "
        "reference events/CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ours, ref in pairs:
        ratio = ours.events_per_second / ref.events_per_second if ref.events_per_second else 0
        lines.append(
            f"| {ours.connections} x {ours.pipeline} | {ours.events_per_second:,.0f} | "
            f"{ref.events_per_second:,.0f} | {ratio:.2f} | "
            f"{ours.p50_ms:.1f} / {ours.p99_ms:.1f} | {ref.p50_ms:.1f} / {ref.p99_ms:.1f} | "
            f"{ours.events_per_server_cpu_second:,.0f} | "
            f"{ref.events_per_server_cpu_second:,.0f} |"
        )
    return "\n".join(lines)


# -- load generator ------------------------------------------------------------


class FluentdClient:
    """A Fluentd-like sender (a :class:`harness.Pipeline`): a new chunk id per request."""

    def __init__(self, workload: Workload, nonce: int, index: int) -> None:
        self.workload = workload
        self.nonce = nonce
        self.index = index
        self.seq = 0
        self.acks = msgpack.Unpacker(raw=False)

    def handshake(self, tls: ssl.SSLSocket) -> None:
        pass

    def request(self) -> tuple[str, bytes]:
        chunk = chunk_id(self.nonce, self.index, self.seq)
        self.seq += 1
        return chunk, self.workload.request(chunk)

    def answers(self, tls: ssl.SSLSocket) -> list[Any]:
        self.acks.feed(harness.receive(tls))
        return list(self.acks)

    def acknowledges(self, answer: Any, expected: str) -> bool:
        if answer != {"ack": expected}:
            raise ValueError(f"unexpected ack {answer!r}, waiting for {expected!r}")
        return True


# -- one case ------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    batch: int
    pipeline: int
    connections: int
    window_seconds: float
    events_per_second: float
    mb_per_second: float
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    events_per_server_cpu_second: float
    generator_cpu_pct: float
    #: CPU used by every other process (and py-spy) in the window: disturbance.
    other_cpu_pct: float
    #: CPU stolen by the hypervisor in the window.
    steal_pct: float
    server_peak_rss_mb: float
    acked_events: int
    acked_chunks: int
    table_rows: int
    table_chunks: int
    commits: str
    server_exit: int
    server_threads: dict[str, float]
    request_bytes: int
    record_bytes: float
    ceilings: dict[str, float]
    ok: bool
    #: Connections per worker (``--processes``): how the kernel spread them.
    connections_by_worker: dict[int, int] = dataclasses.field(default_factory=dict)
    #: ``--latencies``: each connection's latency distribution and the tail's timeline.
    latency_breakdown: str = ""

    @property
    def label(self) -> str:
        return f"{self.batch}/req, {self.connections} conn x {self.pipeline} in flight"


def run_case(
    batch: int,
    pipeline: int,
    connections: int,
    args: argparse.Namespace,
    cores: tuple[int | None, int | None],
    ceilings: dict[str, float],
    profiler: str | None = None,
    profile_dir: Path | None = None,
) -> CaseResult:
    """One case: a fresh server, the load, the window, the stop and the check."""
    server_core, client_core = cores
    workload = Workload.build(batch, args.record_bytes)
    cprofile_dir = profile_dir if profiler == "cprofile" else None
    nonce = int.from_bytes(os.urandom(8), "big")
    sampler = None
    if profiler == "py-spy":
        assert profile_dir is not None
        sampler = functools.partial(
            start_py_spy,
            output=profile_dir / "py-spy.txt",
            core=client_core,
            rate=args.spy_rate,
            extra=args.spy_args.split(),
        )

    run = harness.run_tls_case(
        args,
        f"forward-bench-{batch}x{pipeline}-",
        lambda state_dir: start_server(state_dir, args, server_core, cprofile_dir),
        [FluentdClient(workload, nonce, i) for i in range(connections)],
        pipeline,
        sampler,
    )
    window = run.window
    acked_events = run.acked * batch
    breakdown = ""
    if args.latencies:
        breakdown = harness.latency_breakdown(window, run.results, run.workers_by_port)
    if args.latency_dump is not None:
        harness.latency_dump(
            args.latency_dump / f"appliance-{batch}x{pipeline}x{connections}-{nonce:x}.json",
            window, run.results, run.workers_by_port,
        )  # fmt: skip
    return CaseResult(
        batch=batch,
        pipeline=pipeline,
        connections=connections,
        window_seconds=window.seconds,
        mb_per_second=len(run.latencies) * workload.request_bytes / window.seconds / 1e6,
        steal_pct=100 * window.steal / window.seconds,
        acked_events=acked_events,
        acked_chunks=run.acked,
        table_rows=run.table_rows,
        table_chunks=run.table_batches,
        commits=run.commits,
        server_exit=run.server_exit,
        server_threads=window.threads_by_kind(),
        request_bytes=workload.request_bytes,
        record_bytes=workload.record_bytes,
        ceilings=ceilings,
        connections_by_worker=run.connections_by_worker,
        latency_breakdown=breakdown,
        ok=(
            run.table_rows == acked_events
            and run.table_batches == run.acked
            and run.server_exit == 0
        ),
        **window.metrics(len(run.latencies) * batch, run.latencies),
    )


def py_spy_path() -> str | None:
    candidate = VENV_BIN / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def start_py_spy(
    pid: int, output: Path, core: int | None, rate: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    """Sample the Python threads of ``pid`` until SIGINT (py-spy then writes ``output``)."""
    exe = py_spy_path()
    if exe is None:
        raise RuntimeError("py-spy is not installed: pip install -r bench/requirements.txt")

    def pin() -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})

    cmd = [exe, "record", "--pid", str(pid), "--rate", str(rate), *extra]
    cmd += ["--format", "raw", "--output", str(output)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin
    )


# -- reporting -----------------------------------------------------------------


def print_case(r: CaseResult) -> None:
    verdict = "OK" if r.ok else "MISMATCH"
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.mb_per_second:.1f} MB/s, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms\n"
        f"    server CPU {r.server_cpu_pct:.0f}% of a core "
        f"({fmt_rate(r.events_per_server_cpu_second)} events per CPU-second), "
        f"generator CPU {r.generator_cpu_pct:.0f}%, server peak RSS "
        f"{r.server_peak_rss_mb:.0f} MB, commits {r.commits}\n"
        f"    server CPU by thread over {r.window_seconds:.1f}s: {fmt_threads(r.server_threads)}\n"
        f"    other processes used {r.other_cpu_pct:.0f}% of a core in the window, "
        f"hypervisor steal {r.steal_pct:.0f}%\n"
        + (
            "    connections per worker: "
            + ", ".join(f"worker {k}: {n}" for k, n in r.connections_by_worker.items())
            + "\n"
            if r.connections_by_worker
            else ""
        )
        + (r.latency_breakdown + "\n" if r.latency_breakdown else "")
        + f"    verify: acked {r.acked_events:,} events in {r.acked_chunks:,} chunks; "
        f"table has {r.table_rows:,} rows in {r.table_chunks:,} batch ids; "
        f"server exit {r.server_exit}: {verdict}",
        flush=True,
    )


def results_table(results: list[CaseResult]) -> str:
    head = (
        "| batch | conns x in flight | events/s | MB/s | p50 ms | p99 ms | server CPU | "
        "events/server CPU-s | gen CPU | other CPU | server peak RSS MB | rows = acked | "
        "ceiling: msgpack decode | ceiling: codec + record_json | ceiling: + Arrow | "
        "ceiling: + Delta commit |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in results:
        c = r.ceilings
        lines.append(
            f"| {r.batch} | {r.connections} x {r.pipeline} | {fmt_rate(r.events_per_second)} "
            f"| {r.mb_per_second:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.server_cpu_pct:.0f}% | {fmt_rate(r.events_per_server_cpu_second)} "
            f"| {r.generator_cpu_pct:.0f}% | {r.other_cpu_pct:.0f}% | {r.server_peak_rss_mb:.0f} "
            f"| {'yes' if r.ok else 'NO'} ({r.table_rows:,}) "
            f"| {fmt_rate(c.get('decode', float('nan')))} "
            f"| {fmt_rate(c.get('codec', float('nan')))} "
            f"| {fmt_rate(c.get('arrow', float('nan')))} "
            f"| {fmt_rate(c.get('commit', float('nan')))} |"
        )
    return "\n".join(lines)


def _short(filename: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def top_functions(stats: pstats.Stats, key: str, n: int) -> str:
    """The top ``n`` functions by ``key`` ("cumulative" or "tottime"), one line each."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    index = 3 if key == "cumulative" else 2
    rows = sorted(raw.items(), key=lambda item: item[1][index], reverse=True)[:n]
    out = [f"{'calls':>10} {'tottime':>9} {'cumtime':>9} {'%tot':>6}  function"]
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in rows:
        where = name if filename == "~" else f"{_short(filename)}:{line}({name})"
        share = 100 * tt / total if total else 0.0
        out.append(f"{nc:>10} {tt:>9.3f} {ct:>9.3f} {share:>5.1f}%  {where}")
    return "\n".join(out)


def print_profile(profile_dir: Path, n: int = 25) -> None:
    main = pstats.Stats(str(profile_dir / "main.prof"))
    workers = sorted(profile_dir.glob("worker-*.prof"))
    sections = [("main thread (trio event loop)", main)]
    if workers:
        sections.append(
            (f"worker threads ({len(workers)}: trio.to_thread)", pstats.Stats(*map(str, workers)))
        )
    notes = {
        "main": "idle is <method 'poll' of 'select.epoll' objects> (trio waiting for I/O)",
        "worker": "idle is <method 'acquire' of '_thread.lock' objects> (waiting for a job)",
    }
    for title, stats in sections:
        raw = stats.stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in raw.values())
        note = notes["main" if title.startswith("main") else "worker"]
        print(f"\n### {title}: {total:.2f} s profiled; {note}\n")
        print(f"Top {n} by cumulative time:\n")
        print(top_functions(stats, "cumulative", n))
        print(f"\nTop {n} by total (own) time:\n")
        print(top_functions(stats, "tottime", n))


_PY_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _spy_frame(frame: str) -> tuple[str, str]:
    """(function, where) of a py-spy frame, line numbers and raw addresses dropped."""
    match = _PY_FRAME.match(frame)
    if match is None:
        return frame, ""
    name, where = match["name"], match["file"]
    if name.startswith("0x"):
        name = "[native]"
    return name, where


def _spy_library(where: str) -> str:
    """What a leaf frame's time is charged to, in the by-library summary."""
    if not where:
        return "?"
    if ".so" in where:
        return where
    if where.endswith((".c", ".h")):
        return f"C: {where}"
    return f"python: {where.split('/', 1)[0].removesuffix('.py')}"


def print_py_spy(path: Path, n: int) -> None:
    """Top functions of a py-spy raw profile: own samples and samples on the stack."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    libraries: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_spy_frame(f) for f in stack.split(";")]
        labels = [f"{name} ({where})" if where else name for name, where in frames]
        own[labels[-1]] += count
        libraries[_spy_library(frames[-1][1])] += count
        for label in set(labels):
            inclusive[label] += count
    if not total:
        print("py-spy recorded no samples")
        return
    print(f"\n### py-spy: {total} samples of busy Python threads (idle waits excluded)\n")
    print(
        "Own samples by Python package (without --native, time in C code counts for the\n"
        "Python function that called it) or native library (with --native):\n"
    )
    for name, count in libraries.most_common(15):
        print(f"{100 * count / total:>6.1f}%  {name}")
    for title, counter in (("on the stack (inclusive)", inclusive), ("own (self)", own)):
        print(f"\nTop {n} functions, samples {title}:\n")
        for name, count in counter.most_common(n):
            print(f"{100 * count / total:>6.1f}%  {name}")


# -- main ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated BATCH[:IN_FLIGHT[:CONNECTIONS]]: records per request, chunks in "
        f"flight per connection (1), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--record-bytes", type=int, default=100, help="msgpack bytes/record")
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="[admin] enabled = false: no admin listener, no metrics counted (their cost)",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="cprofile",
        choices=("cprofile", "py-spy"),
        help="run only --profile-case, the server under cProfile (default) or sampled by "
        "py-spy, and print the top functions",
    )
    parser.add_argument(
        "--profile-case", default="1000:16", help="BATCH[:IN_FLIGHT[:CONNECTIONS]] (1000:16)"
    )
    parser.add_argument("--profile-out", type=Path, help="directory for the profile files")
    parser.add_argument(
        "--profile-timer",
        choices=("cpu", "wall"),
        default="wall",
        help="cProfile clock: wall (default, least overhead) or per-thread CPU time",
    )
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument(
        "--ack", choices=("wal", "commit"), help="[lake] ack of the appliance (default: its own)"
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also run each case against npm @fluent-org/logger's FluentServer (TLS, acks, "
        "in memory) with the same client, and print both with their ratio",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="appliance processes: workers = N (a supervisor and N workers on one port and "
        "one table, docs/performance.md), on N cores from the server's core on; 1",
    )
    parser.add_argument(
        "--latencies",
        action="store_true",
        help="print each connection's latency distribution (and its worker) and when the "
        "window's slowest 1%% of acks came",
    )
    parser.add_argument(
        "--latency-dump",
        type=Path,
        help="write every ack's time and latency, by connection, to a JSON file per run here",
    )
    parser.add_argument("--spy-rate", type=int, default=100, help="py-spy samples/s (100)")
    parser.add_argument(
        "--spy-args", default="--nonblocking", help="more py-spy record flags (--nonblocking)"
    )
    args = parser.parse_args(argv)
    if args.latency_dump is not None:
        args.latency_dump.mkdir(parents=True, exist_ok=True)

    cores, pinning, usable = harness.pin_cores(args.no_pin)
    info = machine_info(usable)
    harness.print_header("forward bench", info, pinning, cores[0])
    print(
        f"settings: {args.record_bytes}-byte records, "
        f"warm-up {args.warmup}s, window {args.duration}s, "
        f"commit_max_delay_seconds={args.commit_delay}, commit_max_rows={args.commit_max_rows}"
    )

    if args.profile:
        args.cases = args.profile_case
    ceilings_by_batch: dict[int, dict[str, float]] = {}
    profile_dirs: list[Path] = []

    def ceilings_of(batch: int) -> tuple[dict[str, float], str]:
        found = measure_ceilings(
            Workload.build(batch, args.record_bytes),
            args.ceiling_seconds,
            cores[0],
            with_commit=not args.no_commit_ceiling,
        )
        ceilings_by_batch[batch] = found
        line = f"\nbatch {batch}: in-process ceilings on one core (events/s): "
        return found, line + harness.fmt_ceilings(found)

    references: list[tuple[CaseResult, ReferenceResult]] = []

    def run(batch: int, pipeline: int, connections: int) -> CaseResult:
        result = run_appliance(batch, pipeline, connections)
        if args.reference:
            reference = run_reference_case(batch, pipeline, connections, args, cores)
            references.append((result, reference))
            print(
                f"  reference: {reference.events_per_second:,.0f} events/s, p50 "
                f"{reference.p50_ms:.1f} ms, p99 {reference.p99_ms:.1f} ms, "
                f"{reference.events_per_server_cpu_second:,.0f} events/CPU-s, "
                f"ratio {result.events_per_second / reference.events_per_second:.2f}"
            )
        return result

    def run_appliance(batch: int, pipeline: int, connections: int) -> CaseResult:
        profile_dir = None
        if args.profile:
            profile_dir = args.profile_out or Path(tempfile.mkdtemp(prefix="forward-profile-"))
            profile_dir.mkdir(parents=True, exist_ok=True)
            for stale in [*profile_dir.glob("*.prof"), *profile_dir.glob("py-spy.txt")]:
                stale.unlink()
            profile_dirs.append(profile_dir)
        return run_case(
            batch,
            pipeline,
            connections,
            args,
            cores,
            ceilings_by_batch[batch],
            args.profile,
            profile_dir,
        )

    def report(result: CaseResult) -> None:
        print_case(result)
        if args.profile == "cprofile":
            print(f"\ncProfile (timer: {args.profile_timer}) written to {profile_dirs[-1]}")
            print_profile(profile_dirs[-1], args.profile_top)
        elif args.profile:
            print(
                f"\npy-spy ({args.spy_rate}/s, measured window only) written to {profile_dirs[-1]}"
            )
            print_py_spy(profile_dirs[-1] / "py-spy.txt", args.profile_top)

    _, results = harness.run_cases(
        args,
        1,
        ceilings_of,
        lambda batch, pipeline, connections: (
            f"case: batch {batch}, {connections} connections x {pipeline} in flight"
        ),
        run,
        report,
    )

    workload = Workload.build(1, args.record_bytes)
    print(
        f"\nrecords: {workload.record_bytes:.0f} bytes of msgpack each "
        f"(+11 bytes EventTime and array header per entry); MB/s counts request bytes "
        "before TLS; latency is send() of a request to its ack; CPU % is of one core."
    )
    print()
    print(results_table(results))
    if references:
        print("\nagainst the reference (same client, same load, same run):\n")
        print(comparison_table(references))
    harness.write_json(
        args.json,
        machine=info,
        pinning=pinning,
        results=results,
        # Each reference run with the case it ran beside (bench.summary reads the ratio).
        references=[
            {"batch": r.batch, "pipeline": r.pipeline, "connections": r.connections,
             **dataclasses.asdict(ref)}
            for r, ref in references
        ],
    )  # fmt: skip
    failed = [r for r in results if not r.ok]
    if failed:
        for r in failed:
            print(
                f"\nFAIL: {r.label}: acked {r.acked_events} events in {r.acked_chunks} chunks, "
                f"table has {r.table_rows} rows in {r.table_chunks} batch ids, "
                f"server exit {r.server_exit}",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
