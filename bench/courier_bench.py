"""Log Courier benchmark: JDAT payloads over TLS, each acked (ACKN) only after its commit.

What it does, per case (events per payload, payloads in flight, connections):

1. starts ``appliance serve`` as a subprocess with a fresh state directory and
   one TLS ``courier`` listener, pinned to core 0 (``os.sched_setaffinity``);
   the load generator runs in this process, pinned to core 1 (2+ cores);
2. opens ``CONNECTIONS`` TLS connections (plain ``ssl`` sockets, one thread
   each). Each does what the Go Log Courier client does: HELO (32-byte Go
   layout), reads VERS, then sends JDAT payloads (``--message evnt`` for the
   streamed form) of N Log Courier-shaped JSON events (``@timestamp``,
   ``host``, ``path``, ``offset``, ``message``), zlib level 3 like the client,
   each with a fresh random 16-byte nonce; it keeps ``IN_FLIGHT`` payloads
   unacknowledged (Log Courier's ``max pending payloads``, 10 by default) and
   checks that every final ACKN echoes the oldest nonce with count N. Partial
   ACKNs (count 0, the server's keepalives) are counted and skipped;
3. measures over a window (after a warm-up): events/s, MB/s of JSON before
   zlib and on the wire (compressed, before TLS), p50/p99 send->final-ACKN
   latency, server and generator CPU, the server's CPU by thread and its
   peak RSS (VmHWM);
4. stops sending, waits for every outstanding ACKN, SIGTERMs the server and
   checks that the table holds exactly the acknowledged events and nonces.

Next to each payload size it prints in-process ceilings on the same bytes,
on the server's core: the codec alone (``CourierServerConnection``, zlib and
``json.loads``); that plus ``payload_block`` (``record_json``, tag, host and
``@timestamp`` per event); that plus ``blocks_to_arrow``; and that plus the
Delta commit (``EventsTable.commit``).

Nothing here asserts a time: it reports. It exits 1 only when the table does
not hold exactly what was acknowledged, or the server did not exit 0.

    .venv/bin/python bench/courier_bench.py
    .venv/bin/python bench/courier_bench.py --cases 1024:10:4 --duration 15
    .venv/bin/python bench/courier_bench.py --message evnt
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import resource
import selectors
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: PAYLOAD:IN_FLIGHT[:CONNECTIONS]. 1024 events is Log Courier's default
#: ``spool size``, 10 in flight its default ``max pending payloads``.
DEFAULT_CASES = "100:1,1024:1,1024:10,4096:10"
HEADER = struct.Struct(">4sI")
U32 = struct.Struct(">I")
HELO = (
    b"HELO"
    + U32.pack(32)
    + b"\x00\x00\x00\x00"
    + struct.pack(">III", 2, 10, 0)
    + b"BNCH"
    + bytes(12)
)
_FILLER = (
    '{i} 10.0.{d}.7 - - "GET /api/v1/orders/{d}?page=2 HTTP/1.1" 200 512 '
    '"https://example.test/" "Mozilla/5.0 (X11; Linux x86_64)" rt=0.0{d} '
)


# -- machine -------------------------------------------------------------------


def cpu_reference_ms(core: int | None) -> float:
    """Milliseconds for ``sum(range(10**6))`` on ``core``: a rough speed yardstick."""
    previous = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        best = float("inf")
        for _ in range(15):
            start = time.perf_counter()
            sum(range(10**6))
            best = min(best, time.perf_counter() - start)
        return best * 1000
    finally:
        os.sched_setaffinity(0, previous)


def machine_info(usable: int) -> dict[str, str]:
    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    versions = []
    for name in ("trio", "deltalake", "pyarrow"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "cpus": f"{os.cpu_count()} (usable: {usable})",
        "cpu": cpu,
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "openssl": ssl.OPENSSL_VERSION,
        "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "libraries": ", ".join(versions),
        "commit": commit or "unknown",
    }


# -- workload ------------------------------------------------------------------


def make_event(i: int, target: int) -> dict[str, Any]:
    """A Log Courier-shaped event (docs/Events.md) whose JSON is about ``target`` bytes."""
    event: dict[str, Any] = {
        "@timestamp": f"2026-11-22T10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        "host": f"web-{i % 16:02d}",
        "path": "/var/log/nginx/access.log",
        "offset": i * 211,
        "type": "nginx",
        "message": "",
    }
    base = len(json.dumps(event, separators=(",", ":")))
    event["message"] = (_FILLER.format(i=i, d=i % 997) * 8)[: max(0, target - base)]
    return event


@dataclasses.dataclass(frozen=True)
class Workload:
    """One payload, compressed once; every send gives it a new nonce."""

    events: int
    compressed: bytes
    json_bytes: int
    event_bytes: float
    streamed: bool

    @classmethod
    def build(cls, events: int, event_bytes: int, streamed: bool) -> Workload:
        payloads = [
            json.dumps(make_event(i, event_bytes), separators=(",", ":")).encode()
            for i in range(events)
        ]
        stream = b"".join(U32.pack(len(p)) + p for p in payloads)
        return cls(
            events,
            zlib.compress(stream, 3),
            sum(map(len, payloads)),
            sum(map(len, payloads)) / events,
            streamed,
        )

    def message(self, nonce: bytes) -> bytes:
        if self.streamed:
            return b"EVNT\xff\xff\xff\xff" + nonce + self.compressed
        return b"JDAT" + U32.pack(16 + len(self.compressed)) + nonce + self.compressed

    @property
    def wire_bytes(self) -> int:
        return len(self.message(bytes(16)))


# -- in-process ceilings -------------------------------------------------------


def _rate(fn: Callable[[], int], seconds: float, repeats: int = 3) -> float:
    """Best events/s of ``fn`` (which returns the events it handled) over ``repeats`` runs."""
    fn()
    best = 0.0
    for _ in range(repeats):
        events = 0
        start = time.perf_counter()
        while True:
            events += fn()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, events / elapsed)
    return best


def measure_ceilings(
    workload: Workload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the bytes the generator sends."""
    from appliance.config import CourierListenerConfig
    from appliance.lake.rows import RowBlock, blocks_to_arrow
    from appliance.protocols.courier import CourierServerConnection, PayloadReceived
    from appliance.server.courier_driver import payload_block
    from appliance.server.listener import ConnectionInfo

    previous = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        group = max(1, 25_000 // workload.events)  # about one commit group of rows
        info = ConnectionInfo("courier", "127.0.0.1:50000", True)
        settings = CourierListenerConfig()
        data = b"".join(workload.message(os.urandom(16)) for _ in range(group))

        def payloads() -> list[PayloadReceived]:
            events = CourierServerConnection().receive_data(HELO + data)
            return [e for e in events if isinstance(e, PayloadReceived)]

        def codec() -> int:
            return sum(p.count for p in payloads())

        def blocks() -> list[RowBlock]:
            now = time.time_ns()
            return [payload_block(p, settings, info, now) for p in payloads()]

        def rows() -> int:
            return sum(b.rows for b in blocks())

        def arrow() -> int:
            return int(blocks_to_arrow(blocks()).num_rows)

        result = {"codec": _rate(codec, seconds), "rows": _rate(rows, seconds)}
        result["arrow"] = _rate(arrow, seconds)
        if with_commit:
            from appliance.lake.table import EventsTable

            tmp = tempfile.mkdtemp(prefix="courier-bench-ceiling-")
            try:
                table = EventsTable(str(Path(tmp) / "events"))
                table.open_or_create()
                version = [0]

                def commit() -> int:
                    table_data = blocks_to_arrow(blocks())
                    version[0] += 1
                    table.commit(table_data, "bench-ceiling", version[0])
                    return int(table_data.num_rows)

                result["commit"] = _rate(commit, seconds)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return result
    finally:
        os.sched_setaffinity(0, previous)


# -- server --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_groups(pid: int) -> dict[str, float]:
    """CPU seconds so far of the live threads of ``pid``, grouped by kind."""
    groups: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        if int(tid) == pid:
            name = "main (trio loop)"
        elif comm.startswith("tokio"):
            name = "tokio (deltalake)"
        else:
            name = "python worker threads"
        groups[name] += cpu
    return dict(groups)


def system_cpu_seconds() -> float:
    with open("/proc/stat", encoding="utf-8") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = (values + [0] * 7)[:7]
    return (user + nice + system + irq + softirq) / CLK_TCK


def vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclasses.dataclass
class Server:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    port: int
    ca_file: Path
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def start_server(state_dir: Path, args: argparse.Namespace, core: int | None) -> Server:
    port = free_port()
    config = state_dir / "bench.toml"
    config.write_text(
        f'state_dir = "{state_dir / "var"}"\n'
        "[lake]\n"
        f"commit_max_delay_seconds = {args.commit_delay}\n"
        f"commit_max_rows = {args.commit_max_rows}\n"
        "[[listeners]]\n"
        'name = "courier"\n'
        'protocol = "courier"\n'
        f'bind = "127.0.0.1:{port}"\n',
        encoding="utf-8",
    )

    def pin() -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})

    log_path = state_dir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "appliance"), "serve", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=log, preexec_fn=pin, cwd=state_dir,
        )  # fmt: skip
    server = Server(proc, state_dir, port, Path(), log_path)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    buffer = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"CA certificate for clients:" not in buffer or not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"server did not become ready:\n{server.log_tail()}")
            if sel.select(timeout=min(left, 0.5)):
                buffer += os.read(proc.stdout.fileno(), 4096)
    line = next(x for x in buffer.decode().splitlines() if "CA certificate for clients:" in x)
    server.ca_file = Path(line.split(":", 1)[1].strip())
    return server


def stop_server(server: Server, timeout: float = 120) -> tuple[int, dict[str, str]]:
    """SIGTERM, wait, and the fields of its ``service.stopped`` log line."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        code = server.proc.wait()
    if server.proc.stdout is not None:
        server.proc.stdout.close()
    stopped: dict[str, str] = {}
    for line in server.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "event=service.stopped" in line:
            stopped = dict(re.findall(r"(\w+)=(\S+)", line))
    return code, stopped


# -- load generator ------------------------------------------------------------


@dataclasses.dataclass
class ConnectionResult:
    ack_times: list[float] = dataclasses.field(default_factory=list)
    latencies: list[float] = dataclasses.field(default_factory=list)
    nonces_acked: list[bytes] = dataclasses.field(default_factory=list)
    keepalives: int = 0
    error: BaseException | None = None


def read_message(tls: ssl.SSLSocket, buffer: bytearray) -> tuple[bytes, bytes]:
    while True:
        if len(buffer) >= HEADER.size:
            kind, length = HEADER.unpack_from(buffer)
            if len(buffer) >= HEADER.size + length:
                body = bytes(buffer[HEADER.size : HEADER.size + length])
                del buffer[: HEADER.size + length]
                return kind, body
        data = tls.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        buffer += data


def run_connection(
    context: ssl.SSLContext,
    port: int,
    workload: Workload,
    in_flight: int,
    start: threading.Event,
    stop_at: list[float],
    result: ConnectionResult,
) -> None:
    """One Log Courier-like sender: up to ``in_flight`` payloads unacked, ACKNs in order."""
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=60)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.settimeout(120)
            buffer = bytearray()
            tls.sendall(HELO)
            kind, body = read_message(tls, buffer)
            if kind != b"VERS" or (workload.streamed and not body[0] & 0x01):
                raise ValueError(f"unexpected handshake reply {kind!r} {body.hex()}")
            sent: collections.deque[tuple[bytes, float]] = collections.deque()
            start.wait()
            while True:
                while len(sent) < in_flight and time.perf_counter() < stop_at[0]:
                    nonce = os.urandom(16)
                    sent.append((nonce, time.perf_counter()))
                    tls.sendall(workload.message(nonce))
                if not sent:
                    break
                kind, body = read_message(tls, buffer)
                if kind != b"ACKN" or len(body) != 20:
                    raise ValueError(f"unexpected message {kind!r} of {len(body)} bytes")
                nonce, count = body[:16], U32.unpack(body[16:])[0]
                if count == 0:
                    result.keepalives += 1  # a partial ACKN: the commit is still running
                    continue
                expected, sent_at = sent[0]
                if nonce != expected or count != workload.events:
                    raise ValueError(f"ACKN {nonce.hex()} {count} out of order or short")
                sent.popleft()
                now = time.perf_counter()
                result.ack_times.append(now)
                result.latencies.append(now - sent_at)
                result.nonces_acked.append(nonce)
    except BaseException as exc:
        result.error = exc


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


# -- one case ------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    events: int
    in_flight: int
    connections: int
    message: str
    seconds: float
    events_per_second: float
    json_mb_per_second: float
    wire_mb_per_second: float
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    events_per_server_cpu_second: float
    generator_cpu_pct: float
    other_cpu_pct: float
    server_peak_rss_mb: float
    server_threads: dict[str, float]
    acked_events: int
    acked_payloads: int
    keepalives: int
    table_rows: int
    table_batches: int
    commits: str
    server_exit: int
    ok: bool

    @property
    def label(self) -> str:
        return (
            f"{self.message} of {self.events}, {self.connections} conn x {self.in_flight} in flight"
        )


def table_counts(path: Path) -> tuple[int, int]:
    """Rows and distinct batch ids of the table."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table(columns=["batch_id"])
    return int(table.num_rows), len(set(table.column("batch_id").to_pylist()))


def run_case(
    events: int, in_flight: int, connections: int, args: argparse.Namespace, core: int | None
) -> CaseResult:
    workload = Workload.build(events, args.event_bytes, args.message == "evnt")
    state_dir = Path(tempfile.mkdtemp(prefix=f"courier-bench-{events}x{in_flight}-"))
    server = start_server(state_dir, args, core)
    pid = server.proc.pid
    try:
        context = ssl.create_default_context(cafile=str(server.ca_file))
        start = threading.Event()
        stop_at = [float("inf")]
        results = [ConnectionResult() for _ in range(connections)]
        threads = [
            threading.Thread(
                target=run_connection,
                args=(context, server.port, workload, in_flight, start, stop_at, r),
                name=f"conn-{i}",
                daemon=True,
            )
            for i, r in enumerate(results)
        ]
        for t in threads:
            t.start()
        time.sleep(0.2)  # TLS handshakes
        window_start = time.perf_counter() + args.warmup
        window_end = window_start + args.duration
        stop_at[0] = window_end
        start.set()
        time.sleep(max(0.0, window_start - time.perf_counter()))
        cpu0, threads0 = proc_cpu_seconds(pid), thread_groups(pid)
        gen0 = resource.getrusage(resource.RUSAGE_SELF)
        sys0 = system_cpu_seconds()
        w0 = time.perf_counter()
        time.sleep(max(0.0, window_end - time.perf_counter()))
        w1 = time.perf_counter()
        cpu1, threads1 = proc_cpu_seconds(pid), thread_groups(pid)
        gen1 = resource.getrusage(resource.RUSAGE_SELF)
        sys1 = system_cpu_seconds()
        for t in threads:
            t.join(timeout=300)
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"load generator failed: {errors[0]!r}") from errors[0]
        peak_rss = vm_hwm_mb(pid)
    except BaseException:
        server.proc.kill()
        server.proc.wait()
        print(server.log_tail(), file=sys.stderr)
        raise
    code, stopped = stop_server(server)
    seconds = w1 - w0
    in_window = sorted(
        lat
        for r in results
        for t, lat in zip(r.ack_times, r.latencies, strict=True)
        if w0 <= t <= w1
    )
    acked_payloads = sum(len(r.nonces_acked) for r in results)
    table_rows, table_batches = table_counts(state_dir / "var" / "lake" / "events")
    server_cpu = cpu1 - cpu0
    gen_cpu = (gen1.ru_utime + gen1.ru_stime) - (gen0.ru_utime + gen0.ru_stime)
    window_events = len(in_window) * events
    result = CaseResult(
        events=events,
        in_flight=in_flight,
        connections=connections,
        message=args.message.upper(),
        seconds=seconds,
        events_per_second=window_events / seconds,
        json_mb_per_second=len(in_window) * workload.json_bytes / seconds / 1e6,
        wire_mb_per_second=len(in_window) * workload.wire_bytes / seconds / 1e6,
        p50_ms=quantile(in_window, 0.50) * 1000,
        p99_ms=quantile(in_window, 0.99) * 1000,
        server_cpu_pct=100 * server_cpu / seconds,
        events_per_server_cpu_second=window_events / server_cpu if server_cpu else float("nan"),
        generator_cpu_pct=100 * gen_cpu / seconds,
        other_cpu_pct=max(0.0, 100 * ((sys1 - sys0) - server_cpu - gen_cpu) / seconds),
        server_peak_rss_mb=peak_rss,
        server_threads={k: v - threads0.get(k, 0.0) for k, v in threads1.items()},
        acked_events=acked_payloads * events,
        acked_payloads=acked_payloads,
        keepalives=sum(r.keepalives for r in results),
        table_rows=table_rows,
        table_batches=table_batches,
        commits=stopped.get("commits", "?"),
        server_exit=code,
        ok=(
            table_rows == acked_payloads * events and table_batches == acked_payloads and code == 0
        ),
    )
    if args.keep:
        print(f"  state kept in {state_dir}")
    else:
        shutil.rmtree(state_dir, ignore_errors=True)
    return result


# -- reporting -----------------------------------------------------------------


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value == value else "n/a"


def print_case(r: CaseResult) -> None:
    threads = ", ".join(
        f"{k} {v:.2f}s" for k, v in sorted(r.server_threads.items(), key=lambda kv: -kv[1])
    )
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.json_mb_per_second:.1f} MB/s of JSON ({r.wire_mb_per_second:.1f} MB/s on the "
        f"wire), p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms\n"
        f"    server CPU {r.server_cpu_pct:.0f}% of a core "
        f"({fmt_rate(r.events_per_server_cpu_second)} events per CPU-second), generator CPU "
        f"{r.generator_cpu_pct:.0f}%, other processes {r.other_cpu_pct:.0f}%, "
        f"server peak RSS {r.server_peak_rss_mb:.0f} MB, commits {r.commits}\n"
        f"    server CPU by thread over {r.seconds:.1f}s: {threads}\n"
        f"    verify: acked {r.acked_events:,} events in {r.acked_payloads:,} payloads "
        f"({r.keepalives} partial ACKNs seen); table has {r.table_rows:,} rows in "
        f"{r.table_batches:,} nonces; server exit {r.server_exit}: "
        f"{'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


def results_table(results: list[CaseResult]) -> str:
    lines = [
        "| payload | conn x in flight | events/s | MB/s JSON | MB/s wire | p50 ms | p99 ms "
        "| server CPU | events/server CPU-s | other CPU | peak RSS MB | check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.message} {r.events} | {r.connections} x {r.in_flight} "
            f"| {fmt_rate(r.events_per_second)} | {r.json_mb_per_second:.1f} "
            f"| {r.wire_mb_per_second:.1f} | {r.p50_ms:.0f} | {r.p99_ms:.0f} "
            f"| {r.server_cpu_pct:.0f}% | {fmt_rate(r.events_per_server_cpu_second)} "
            f"| {r.other_cpu_pct:.0f}% | {r.server_peak_rss_mb:.0f} "
            f"| {'OK' if r.ok else 'MISMATCH'} |"
        )
    return "\n".join(lines)


def parse_cases(text: str, connections: int) -> list[tuple[int, int, int]]:
    cases = []
    for item in text.split(","):
        parts = [int(p) for p in item.strip().split(":")]
        events, in_flight, conns = (parts + [1, connections][len(parts) - 1 :])[:3]
        cases.append((events, in_flight, conns))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--cases",
        default=DEFAULT_CASES,
        help="comma-separated EVENTS[:IN_FLIGHT[:CONNECTIONS]]: events per payload, payloads "
        f"unacked per connection (1), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--connections", type=int, default=4, help="TLS connections (4)")
    parser.add_argument("--message", choices=["jdat", "evnt"], default="jdat")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds (8)")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds (1.5)")
    parser.add_argument("--event-bytes", type=int, default=250, help="JSON bytes/event (250)")
    parser.add_argument("--commit-delay", type=float, default=0.25, help="[lake] max delay")
    parser.add_argument("--commit-max-rows", type=int, default=100_000, help="[lake] max rows")
    parser.add_argument("--ceiling-seconds", type=float, default=0.4, help="per ceiling run")
    parser.add_argument("--no-commit-ceiling", action="store_true")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and generator")
    parser.add_argument("--keep", action="store_true", help="keep the state directories")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    cpus = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(cpus) < 2:
        core: int | None = None
        pinning = "not pinned" + (" (fewer than 2 cores)" if len(cpus) < 2 else "")
    else:
        core = cpus[0]
        pinning = f"server pinned to core {cpus[0]}, load generator to core {cpus[1]}"
        os.sched_setaffinity(0, {cpus[1]})

    info = machine_info(len(cpus))
    info["speed"] = f"sum(range(10**6)) takes {cpu_reference_ms(core):.1f} ms on the server core"
    print("# Log Courier bench")
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    for key, value in info.items():
        print(f"{key}: {value}")
    print(f"pinning: {pinning}")
    print(
        f"settings: {args.message.upper()}, ~{args.event_bytes}-byte JSON events, zlib level 3, "
        f"warm-up {args.warmup}s, window {args.duration}s, "
        f"commit_max_delay_seconds={args.commit_delay}, commit_max_rows={args.commit_max_rows}"
    )
    ceilings: dict[int, dict[str, float]] = {}
    results: list[CaseResult] = []
    for events, in_flight, connections in parse_cases(args.cases, args.connections):
        if events not in ceilings:
            workload = Workload.build(events, args.event_bytes, args.message == "evnt")
            ceilings[events] = measure_ceilings(
                workload, args.ceiling_seconds, core, with_commit=not args.no_commit_ceiling
            )
            print(
                f"\npayload of {events}: {workload.wire_bytes:,} bytes on the wire "
                f"({workload.json_bytes:,} of JSON, {workload.event_bytes:.0f} bytes/event); "
                "in-process ceilings on one core (events/s): "
                + ", ".join(f"{k} {fmt_rate(v)}" for k, v in ceilings[events].items()),
                flush=True,
            )
        print(f"case: {events} events/payload, {connections} connections x {in_flight} in flight")
        results.append(run_case(events, in_flight, connections, args, core))
        print_case(results[-1])
    print("\n" + results_table(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "pinning": pinning,
                    "ceilings": ceilings,
                    "cases": [dataclasses.asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
