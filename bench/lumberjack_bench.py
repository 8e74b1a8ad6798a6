"""Lumberjack v2 benchmark: windows of compressed J frames over TLS, acked after the commit.

What it does, per case (a window size, windows in flight, connections):

1. starts ``appliance serve`` as a subprocess with a fresh state directory and
   one TLS ``lumberjack`` listener, pinned to core 0 (``os.sched_setaffinity``);
   the load generator runs in this process, pinned to core 1 (2+ cores);
2. opens ``CONNECTIONS`` TLS connections (plain ``ssl`` sockets, one thread
   each). Each sends what Filebeat's Logstash output sends: ``2W`` N, then one
   ``2C`` frame (zlib, level 3 like Beats' default ``compression_level``)
   holding N ``2J`` frames numbered 1..N, with Beats-shaped JSON events of
   about ``--event-bytes``; it keeps ``IN_FLIGHT`` windows unacknowledged
   (Beats' ``pipelining``, 2 by default) and checks every ack is ``2A`` N
   (keepalives, ``2A`` 0, are counted and skipped);
3. measures over a window (after a warm-up): events/s, MB/s on the wire
   (compressed frames before TLS), p50/p99 send->ack latency, server and
   generator CPU, the server's CPU by thread, its peak RSS (VmHWM);
4. stops sending, waits for every outstanding ack, SIGTERMs the server and
   checks that the table holds exactly the acknowledged events.

Next to each window size it prints in-process ceilings on the same bytes, on
the server's core: the codec alone (``LumberjackServerConnection``); that plus
``window_block`` (``record_json``, tag/host/time per event); that plus
``blocks_to_arrow``; and that plus the Delta commit (``EventsTable.commit``).

Nothing here asserts a time: it reports. It exits 1 only when the table does
not hold exactly what was acknowledged, or the server did not exit 0.

    .venv/bin/python bench/lumberjack_bench.py
    .venv/bin/python bench/lumberjack_bench.py --cases 1000:2:4 --duration 15
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import ssl
import struct
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from harness import (
    TABLE_TAIL,
    ConnectionResult,
    add_arguments,
    block_ceilings,
    cpu_lines,
    discard_state,
    fmt_ceilings,
    fmt_rate,
    machine_info,
    parse_cases,
    pin_cores,
    pinned,
    print_header,
    run_window,
    start_server,
    stop_server,
    table_counts,
    table_tail_cells,
    tls_connect,
    write_json,
)

DEFAULT_CASES = "1000:1,1000:2,1000:8,2048:2"
ACK = struct.Struct(">2sI")
_FILLER = (
    "{i} GET /api/v1/orders/{d}?page=2 HTTP/1.1 200 512 0.0{d} "
    '"Mozilla/5.0 (X11; Linux x86_64)" upstream=10.0.{d}.7:8080 '
)


# -- workload ------------------------------------------------------------------


def make_event(i: int, target: int) -> dict[str, Any]:
    """A Filebeat-shaped event whose JSON is about ``target`` bytes."""
    event: dict[str, Any] = {
        "@timestamp": f"2026-11-22T10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.15.0"},
        "host": {"name": f"web-{i % 16:02d}"},
        "log": {"file": {"path": "/var/log/nginx/access.log"}, "offset": i * 211},
        "message": "",
    }
    base = len(json.dumps(event, separators=(",", ":")))
    event["message"] = (_FILLER.format(i=i, d=i % 997) * 8)[: max(0, target - base)]
    return event


@dataclasses.dataclass(frozen=True)
class Workload:
    """One pre-encoded window; every send repeats it (sequences 1..N, as Beats number)."""

    window: int
    data: bytes
    event_bytes: float
    json_bytes: int

    @classmethod
    def build(cls, window: int, event_bytes: int) -> Workload:
        payloads = [
            json.dumps(make_event(i, event_bytes), separators=(",", ":")).encode()
            for i in range(window)
        ]
        frames = b"".join(
            b"2J" + struct.pack(">II", seq, len(p)) + p for seq, p in enumerate(payloads, 1)
        )
        compressed = zlib.compress(frames, 3)
        data = b"2W" + struct.pack(">I", window) + b"2C" + struct.pack(">I", len(compressed))
        data += compressed
        return cls(window, data, sum(map(len, payloads)) / window, len(frames))


# -- in-process ceilings -------------------------------------------------------


def measure_ceilings(
    workload: Workload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the bytes the generator sends."""
    from appliance.config import LumberjackListenerConfig
    from appliance.protocols.lumberjack import LumberjackServerConnection, Window
    from appliance.server.listener import ConnectionInfo
    from appliance.server.sessions.lumberjack import window_block

    with pinned(core):
        group = max(1, 25_000 // workload.window)  # about one commit group of rows
        info = ConnectionInfo("beats", "127.0.0.1", 50000, True)
        settings = LumberjackListenerConfig()

        def windows() -> list[Window]:
            codec = LumberjackServerConnection()
            out: list[Window] = []
            for _ in range(group):
                out += codec.receive_data(workload.data)
            return out

        return block_ceilings(
            windows,
            lambda w: len(w.texts),
            lambda w, now: window_block(w, settings, info, now),
            seconds,
            with_commit,
            "lumberjack-bench-ceiling-",
        )


# -- load generator ------------------------------------------------------------


@dataclasses.dataclass
class LumberjackResult(ConnectionResult):
    windows_acked: int = 0
    keepalives: int = 0


def run_connection(
    context: ssl.SSLContext,
    start: threading.Event,
    stop_at: list[float],
    *,
    port: int,
    workload: Workload,
    in_flight: int,
    result: LumberjackResult,
) -> None:
    """One Beats-like sender: up to ``in_flight`` windows unacked, acks checked in order."""
    try:
        with tls_connect(context, port) as tls:
            sent: collections.deque[float] = collections.deque()
            pending = b""
            start.wait()
            while True:
                while len(sent) < in_flight and time.perf_counter() < stop_at[0]:
                    sent.append(time.perf_counter())
                    tls.sendall(workload.data)
                if not sent:
                    break
                data = tls.recv(65536)
                if not data:
                    raise ConnectionError("server closed the connection")
                pending += data
                usable = len(pending) - len(pending) % ACK.size
                for offset in range(0, usable, ACK.size):
                    kind, seq = ACK.unpack_from(pending, offset)
                    if kind == b"2A" and seq == 0:
                        result.keepalives += 1
                        continue
                    if kind != b"2A" or seq != workload.window:
                        raise ValueError(f"unexpected ack {kind!r} {seq}")
                    now = time.perf_counter()
                    result.ack_times.append(now)
                    result.latencies.append(now - sent.popleft())
                    result.windows_acked += 1
                pending = pending[usable:]
    except BaseException as exc:
        result.error = exc


# -- one case ------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    window: int
    in_flight: int
    connections: int
    seconds: float
    events_per_second: float
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
    keepalives: int
    table_rows: int
    commits: str
    server_exit: int
    ok: bool

    @property
    def label(self) -> str:
        return f"W {self.window}, {self.connections} conn x {self.in_flight} in flight"


def run_case(
    window: int, in_flight: int, connections: int, args: argparse.Namespace, core: int | None
) -> CaseResult:
    workload = Workload.build(window, args.event_bytes)
    state_dir = Path(tempfile.mkdtemp(prefix=f"lumberjack-bench-{window}x{in_flight}-"))
    server = start_server(state_dir, args, 'name = "beats"\nprotocol = "lumberjack"\n', core)
    results = [LumberjackResult() for _ in range(connections)]
    senders = [
        functools.partial(
            run_connection, port=server.port, workload=workload, in_flight=in_flight, result=r
        )
        for r in results
    ]
    measured = run_window(server, senders, results, args.warmup, args.duration)
    code, stopped = stop_server(server)
    in_window = measured.latencies(results)
    acked_events = sum(r.windows_acked for r in results) * window
    table_rows = table_counts(state_dir / "var" / "lake" / "events")[0]
    result = CaseResult(
        window=window,
        in_flight=in_flight,
        connections=connections,
        seconds=measured.seconds,
        wire_mb_per_second=len(in_window) * len(workload.data) / measured.seconds / 1e6,
        server_threads=measured.thread_totals_delta(),
        acked_events=acked_events,
        keepalives=sum(r.keepalives for r in results),
        table_rows=table_rows,
        commits=stopped.get("commits", "?"),
        server_exit=code,
        ok=table_rows == acked_events and code == 0,
        **measured.metrics(len(in_window) * window, in_window),
    )
    discard_state(state_dir, args.keep)
    return result


# -- reporting -----------------------------------------------------------------


def print_case(r: CaseResult) -> None:
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.wire_mb_per_second:.1f} MB/s compressed, p50 {r.p50_ms:.0f} ms, "
        f"p99 {r.p99_ms:.0f} ms\n"
        + cpu_lines(r)
        + f"    verify: acked {r.acked_events:,} events ({r.keepalives} keepalives seen); "
        f"table has {r.table_rows:,} rows; server exit {r.server_exit}: "
        f"{'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


def results_table(results: list[CaseResult]) -> str:
    lines = [
        "| window | conn x in flight | events/s | MB/s (zlib) " + TABLE_TAIL,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.window} | {r.connections} x {r.in_flight} | {fmt_rate(r.events_per_second)} "
            f"| {r.wire_mb_per_second:.1f}" + table_tail_cells(r)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated WINDOW[:IN_FLIGHT[:CONNECTIONS]]: events per window, windows "
        f"unacked per connection (2), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--event-bytes", type=int, default=300, help="JSON bytes/event (300)")
    args = parser.parse_args(argv)

    (core, _), pinning, usable = pin_cores(args.no_pin)
    info = machine_info(usable, ("trio", "deltalake", "pyarrow"))
    print_header("lumberjack v2 bench", info, pinning, core)
    print(
        f"settings: ~{args.event_bytes}-byte JSON events, zlib level 3, warm-up {args.warmup}s, "
        f"window {args.duration}s, commit_max_delay_seconds={args.commit_delay}, "
        f"commit_max_rows={args.commit_max_rows}"
    )
    ceilings: dict[int, dict[str, float]] = {}
    results: list[CaseResult] = []
    for window, in_flight, connections in parse_cases(args.cases, 2, args.connections):
        if window not in ceilings:
            workload = Workload.build(window, args.event_bytes)
            ceilings[window] = measure_ceilings(
                workload, args.ceiling_seconds, core, with_commit=not args.no_commit_ceiling
            )
            print(
                f"\nwindow {window}: {len(workload.data):,} bytes on the wire "
                f"({workload.json_bytes:,} before zlib, {workload.event_bytes:.0f} JSON "
                f"bytes/event); in-process ceilings on one core (events/s): "
                + fmt_ceilings(ceilings[window]),
                flush=True,
            )
        print(f"case: window {window}, {connections} connections x {in_flight} in flight")
        results.append(run_case(window, in_flight, connections, args, core))
        print_case(results[-1])
    print("\n" + results_table(results))
    write_json(args.json, machine=info, pinning=pinning, ceilings=ceilings, cases=results)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
