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

    .venv/bin/python -m bench.lumberjack_bench
    .venv/bin/python -m bench.lumberjack_bench --cases 1000:2:4 --duration 15
"""

from __future__ import annotations

import argparse
import dataclasses
import ssl
import struct
import sys
from typing import Any

from bench import harness
from bench.harness import fmt_rate

DEFAULT_CASES = "1000:1,1000:2,1000:8,2048:2"
ACK = struct.Struct(">2sI")
_FILLER = (
    "{i} GET /api/v1/orders/{d}?page=2 HTTP/1.1 200 512 0.0{d} "
    '"Mozilla/5.0 (X11; Linux x86_64)" upstream=10.0.{d}.7:8080 '
)


# -- workload ------------------------------------------------------------------


def make_event(i: int, target: int) -> bytes:
    """A Filebeat-shaped event whose JSON is about ``target`` bytes."""
    event: dict[str, Any] = {
        "@timestamp": harness.event_timestamp(i),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.15.0"},
        "host": {"name": f"web-{i % 16:02d}"},
        "log": {"file": {"path": "/var/log/nginx/access.log"}, "offset": i * 211},
        "message": "",
    }
    return harness.padded_json(event, _FILLER.format(i=i, d=i % 997), target)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One pre-encoded window; every send repeats it (sequences 1..N, as Beats number)."""

    window: int
    data: bytes
    event_bytes: float
    json_bytes: int

    @classmethod
    def build(cls, window: int, event_bytes: int) -> Workload:
        payloads = [make_event(i, event_bytes) for i in range(window)]
        return cls(
            window,
            harness.lumberjack_window(payloads),
            sum(map(len, payloads)) / window,
            len(harness.lumberjack_frames(payloads)),
        )


# -- in-process ceilings -------------------------------------------------------


def measure_ceilings(
    workload: Workload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the bytes the generator sends."""
    from appliance.config import LumberjackListenerConfig
    from appliance.protocols.lumberjack import LumberjackServerConnection, Window
    from appliance.rows.lumberjack import window_block
    from appliance.server.listener import ConnectionInfo

    with harness.pinned(core):
        group = max(1, 25_000 // workload.window)  # about one commit group of rows
        info = ConnectionInfo("beats", "127.0.0.1", 50000, True)
        settings = LumberjackListenerConfig()

        def windows() -> list[Window]:
            codec = LumberjackServerConnection()
            out: list[Window] = []
            for _ in range(group):
                out += codec.receive_data(workload.data)
            return out

        return harness.block_ceilings(
            windows,
            lambda w: len(w.texts),
            lambda w, now: window_block(
                w, tag=settings.tag, source=info.source, peer=info.peer, received_at_ns=now
            ),
            seconds,
            with_commit,
            "lumberjack-bench-ceiling-",
        )


# -- load generator ------------------------------------------------------------


class BeatsClient:
    """A Beats-like sender (a :class:`harness.Pipeline`): the same window again and again."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.pending = b""

    def handshake(self, tls: ssl.SSLSocket) -> None:
        pass

    def request(self) -> tuple[int, bytes]:
        return self.workload.window, self.workload.data

    def answers(self, tls: ssl.SSLSocket) -> list[tuple[bytes, int]]:
        self.pending += harness.receive(tls)
        usable = len(self.pending) - len(self.pending) % ACK.size
        acks = [ACK.unpack_from(self.pending, offset) for offset in range(0, usable, ACK.size)]
        self.pending = self.pending[usable:]
        return acks

    def acknowledges(self, answer: tuple[bytes, int], expected: int) -> bool:
        kind, seq = answer
        if kind == b"2A" and seq == 0:
            return False  # a keepalive: the commit is still running
        if kind != b"2A" or seq != expected:
            raise ValueError(f"unexpected ack {kind!r} {seq}")
        return True


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
    run = harness.run_tls_case(
        args,
        f"lumberjack-bench-{window}x{in_flight}-",
        lambda state_dir: harness.start_server(
            state_dir, args, 'name = "beats"\nprotocol = "lumberjack"\n', core
        ),
        [BeatsClient(workload) for _ in range(connections)],
        in_flight,
    )
    acked_events = run.acked * window
    return CaseResult(
        window=window,
        in_flight=in_flight,
        connections=connections,
        wire_mb_per_second=len(run.latencies) * len(workload.data) / run.window.seconds / 1e6,
        acked_events=acked_events,
        keepalives=run.keepalives,
        table_rows=run.table_rows,
        ok=run.table_rows == acked_events and run.server_exit == 0,
        **run.measured(window),
    )


# -- reporting -----------------------------------------------------------------


def print_case(r: CaseResult) -> None:
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.wire_mb_per_second:.1f} MB/s compressed, p50 {r.p50_ms:.0f} ms, "
        f"p99 {r.p99_ms:.0f} ms\n"
        + harness.cpu_lines(r)
        + f"    verify: acked {r.acked_events:,} events ({r.keepalives} keepalives seen); "
        f"table has {r.table_rows:,} rows; server exit {r.server_exit}: "
        f"{'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


#: The columns of the results table before :data:`harness.RESULT_COLUMNS`.
COLUMNS: list[harness.Column] = [
    ("window", "---:", lambda r: str(r.window)),
    ("conn x in flight", "---", lambda r: f"{r.connections} x {r.in_flight}"),
    ("events/s", "---:", lambda r: fmt_rate(r.events_per_second)),
    ("MB/s (zlib)", "---:", lambda r: f"{r.wire_mb_per_second:.1f}"),
]


def settings(args: argparse.Namespace) -> str:
    return (
        f"settings: ~{args.event_bytes}-byte JSON events, zlib level 3, warm-up {args.warmup}s, "
        f"window {args.duration}s, commit_max_delay_seconds={args.commit_delay}, "
        f"commit_max_rows={args.commit_max_rows}"
    )


BENCH = harness.SizedBench(
    title="lumberjack v2 bench",
    packages=("trio", "deltalake", "pyarrow"),
    in_flight=2,
    settings=settings,
    workload=lambda window, args: Workload.build(window, args.event_bytes),
    measure=measure_ceilings,
    describe=lambda window, workload: (
        f"window {window}: {len(workload.data):,} bytes on the wire "
        f"({workload.json_bytes:,} before zlib, {workload.event_bytes:.0f} JSON bytes/event)"
    ),
    announce=lambda window, in_flight, connections: (
        f"case: window {window}, {connections} connections x {in_flight} in flight"
    ),
    run=run_case,
    report=print_case,
    table=lambda results: harness.results_table(results, COLUMNS),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated WINDOW[:IN_FLIGHT[:CONNECTIONS]]: events per window, windows "
        f"unacked per connection (2), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--event-bytes", type=int, default=300, help="JSON bytes/event (300)")
    return harness.run_bench(BENCH, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
