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
import functools
import json
import os
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


def measure_ceilings(
    workload: Workload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the bytes the generator sends."""
    from appliance.config import CourierListenerConfig
    from appliance.protocols.courier import CourierServerConnection, PayloadReceived
    from appliance.server.listener import ConnectionInfo
    from appliance.server.sessions.courier import payload_block

    with pinned(core):
        group = max(1, 25_000 // workload.events)  # about one commit group of rows
        info = ConnectionInfo("courier", "127.0.0.1", 50000, True)
        settings = CourierListenerConfig()
        data = b"".join(workload.message(os.urandom(16)) for _ in range(group))

        def payloads() -> list[PayloadReceived]:
            events = CourierServerConnection().receive_data(HELO + data)
            return [e for e in events if isinstance(e, PayloadReceived)]

        return block_ceilings(
            payloads,
            lambda p: p.count,
            lambda p, now: payload_block(p, settings, info, now),
            seconds,
            with_commit,
            "courier-bench-ceiling-",
        )


# -- load generator ------------------------------------------------------------


@dataclasses.dataclass
class CourierResult(ConnectionResult):
    nonces_acked: list[bytes] = dataclasses.field(default_factory=list)
    keepalives: int = 0


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
    start: threading.Event,
    stop_at: list[float],
    *,
    port: int,
    workload: Workload,
    in_flight: int,
    result: CourierResult,
) -> None:
    """One Log Courier-like sender: up to ``in_flight`` payloads unacked, ACKNs in order."""
    try:
        with tls_connect(context, port) as tls:
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


def run_case(
    events: int, in_flight: int, connections: int, args: argparse.Namespace, core: int | None
) -> CaseResult:
    workload = Workload.build(events, args.event_bytes, args.message == "evnt")
    state_dir = Path(tempfile.mkdtemp(prefix=f"courier-bench-{events}x{in_flight}-"))
    server = start_server(state_dir, args, 'name = "courier"\nprotocol = "courier"\n', core)
    results = [CourierResult() for _ in range(connections)]
    senders = [
        functools.partial(
            run_connection, port=server.port, workload=workload, in_flight=in_flight, result=r
        )
        for r in results
    ]
    measured = run_window(server, senders, results, args.warmup, args.duration)
    code, stopped = stop_server(server)
    in_window = measured.latencies(results)
    acked_payloads = sum(len(r.nonces_acked) for r in results)
    table_rows, table_batches = table_counts(state_dir / "var" / "lake" / "events")
    seconds = measured.seconds
    result = CaseResult(
        events=events,
        in_flight=in_flight,
        connections=connections,
        message=args.message.upper(),
        seconds=seconds,
        json_mb_per_second=len(in_window) * workload.json_bytes / seconds / 1e6,
        wire_mb_per_second=len(in_window) * workload.wire_bytes / seconds / 1e6,
        server_threads=measured.thread_totals_delta(),
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
        **measured.metrics(len(in_window) * events, in_window),
    )
    discard_state(state_dir, args.keep)
    return result


# -- reporting -----------------------------------------------------------------


def print_case(r: CaseResult) -> None:
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.json_mb_per_second:.1f} MB/s of JSON ({r.wire_mb_per_second:.1f} MB/s on the "
        f"wire), p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms\n"
        + cpu_lines(r)
        + f"    verify: acked {r.acked_events:,} events in {r.acked_payloads:,} payloads "
        f"({r.keepalives} partial ACKNs seen); table has {r.table_rows:,} rows in "
        f"{r.table_batches:,} nonces; server exit {r.server_exit}: "
        f"{'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


def results_table(results: list[CaseResult]) -> str:
    lines = [
        "| payload | conn x in flight | events/s | MB/s JSON | MB/s wire " + TABLE_TAIL,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.message} {r.events} | {r.connections} x {r.in_flight} "
            f"| {fmt_rate(r.events_per_second)} | {r.json_mb_per_second:.1f} "
            f"| {r.wire_mb_per_second:.1f}" + table_tail_cells(r)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated EVENTS[:IN_FLIGHT[:CONNECTIONS]]: events per payload, payloads "
        f"unacked per connection (1), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--message", choices=["jdat", "evnt"], default="jdat")
    parser.add_argument("--event-bytes", type=int, default=250, help="JSON bytes/event (250)")
    args = parser.parse_args(argv)

    (core, _), pinning, usable = pin_cores(args.no_pin)
    info = machine_info(
        usable, ("trio", "deltalake", "pyarrow"), {"zlib": zlib.ZLIB_RUNTIME_VERSION}
    )
    print_header("Log Courier bench", info, pinning, core)
    print(
        f"settings: {args.message.upper()}, ~{args.event_bytes}-byte JSON events, zlib level 3, "
        f"warm-up {args.warmup}s, window {args.duration}s, "
        f"commit_max_delay_seconds={args.commit_delay}, commit_max_rows={args.commit_max_rows}"
    )
    ceilings: dict[int, dict[str, float]] = {}
    results: list[CaseResult] = []
    for events, in_flight, connections in parse_cases(args.cases, 1, args.connections):
        if events not in ceilings:
            workload = Workload.build(events, args.event_bytes, args.message == "evnt")
            ceilings[events] = measure_ceilings(
                workload, args.ceiling_seconds, core, with_commit=not args.no_commit_ceiling
            )
            print(
                f"\npayload of {events}: {workload.wire_bytes:,} bytes on the wire "
                f"({workload.json_bytes:,} of JSON, {workload.event_bytes:.0f} bytes/event); "
                "in-process ceilings on one core (events/s): " + fmt_ceilings(ceilings[events]),
                flush=True,
            )
        print(f"case: {events} events/payload, {connections} connections x {in_flight} in flight")
        results.append(run_case(events, in_flight, connections, args, core))
        print_case(results[-1])
    print("\n" + results_table(results))
    write_json(args.json, machine=info, pinning=pinning, ceilings=ceilings, cases=results)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
