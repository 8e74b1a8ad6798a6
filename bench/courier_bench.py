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

    .venv/bin/python -m bench.courier_bench
    .venv/bin/python -m bench.courier_bench --cases 1024:10:4 --duration 15
    .venv/bin/python -m bench.courier_bench --message evnt
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import ssl
import struct
import sys
import zlib
from typing import Any

from bench import harness
from bench.harness import COURIER_HEADER, COURIER_HELO, fmt_rate

#: PAYLOAD:IN_FLIGHT[:CONNECTIONS]. 1024 events is Log Courier's default
#: ``spool size``, 10 in flight its default ``max pending payloads``.
DEFAULT_CASES = "100:1,1024:1,1024:10,4096:10"
U32 = struct.Struct(">I")
_FILLER = (
    '{i} 10.0.{d}.7 - - "GET /api/v1/orders/{d}?page=2 HTTP/1.1" 200 512 '
    '"https://example.test/" "Mozilla/5.0 (X11; Linux x86_64)" rt=0.0{d} '
)


# -- workload ------------------------------------------------------------------


def make_event(i: int, target: int) -> bytes:
    """A Log Courier-shaped event (docs/Events.md) whose JSON is about ``target`` bytes."""
    event: dict[str, Any] = {
        "@timestamp": harness.event_timestamp(i),
        "host": f"web-{i % 16:02d}",
        "path": "/var/log/nginx/access.log",
        "offset": i * 211,
        "type": "nginx",
        "message": "",
    }
    return harness.padded_json(event, _FILLER.format(i=i, d=i % 997), target)


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
        payloads = [make_event(i, event_bytes) for i in range(events)]
        return cls(
            events,
            zlib.compress(harness.courier_events(payloads), 3),
            sum(map(len, payloads)),
            sum(map(len, payloads)) / events,
            streamed,
        )

    def message(self, nonce: bytes) -> bytes:
        if self.streamed:
            return b"EVNT\xff\xff\xff\xff" + nonce + self.compressed
        return harness.courier_jdat(nonce, self.compressed)

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
    from appliance.rows.courier import payload_block
    from appliance.server.listener import ConnectionInfo

    with harness.pinned(core):
        group = max(1, 25_000 // workload.events)  # about one commit group of rows
        info = ConnectionInfo("courier", "127.0.0.1", 50000, True)
        settings = CourierListenerConfig()
        data = b"".join(workload.message(os.urandom(16)) for _ in range(group))

        def payloads() -> list[PayloadReceived]:
            events = CourierServerConnection().receive_data(COURIER_HELO + data)
            return [e for e in events if isinstance(e, PayloadReceived)]

        return harness.block_ceilings(
            payloads,
            lambda p: p.count,
            lambda p, now: payload_block(
                p, tag=settings.tag, source=info.source, peer=info.peer, received_at_ns=now
            ),
            seconds,
            with_commit,
            "courier-bench-ceiling-",
        )


# -- load generator ------------------------------------------------------------


def read_message(tls: ssl.SSLSocket, buffer: bytearray) -> tuple[bytes, bytes]:
    while True:
        if len(buffer) >= COURIER_HEADER.size:
            kind, length = COURIER_HEADER.unpack_from(buffer)
            if len(buffer) >= COURIER_HEADER.size + length:
                body = bytes(buffer[COURIER_HEADER.size : COURIER_HEADER.size + length])
                del buffer[: COURIER_HEADER.size + length]
                return kind, body
        buffer += harness.receive(tls)


class CourierClient:
    """A Log Courier-like sender (a :class:`harness.Pipeline`): a new nonce per payload."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.buffer = bytearray()

    def handshake(self, tls: ssl.SSLSocket) -> None:
        tls.sendall(COURIER_HELO)
        kind, body = read_message(tls, self.buffer)
        if kind != b"VERS" or (self.workload.streamed and not body[0] & 0x01):
            raise ValueError(f"unexpected handshake reply {kind!r} {body.hex()}")

    def request(self) -> tuple[bytes, bytes]:
        nonce = os.urandom(16)
        return nonce, self.workload.message(nonce)

    def answers(self, tls: ssl.SSLSocket) -> list[tuple[bytes, bytes]]:
        return [read_message(tls, self.buffer)]

    def acknowledges(self, answer: tuple[bytes, bytes], expected: bytes) -> bool:
        kind, body = answer
        if kind != b"ACKN" or len(body) != 20:
            raise ValueError(f"unexpected message {kind!r} of {len(body)} bytes")
        nonce, count = body[:16], U32.unpack(body[16:])[0]
        if count == 0:
            return False  # a partial ACKN: the commit is still running
        if nonce != expected or count != self.workload.events:
            raise ValueError(f"ACKN {nonce.hex()} {count} out of order or short")
        return True


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
    run = harness.run_tls_case(
        args,
        f"courier-bench-{events}x{in_flight}-",
        lambda state_dir: harness.start_server(
            state_dir, args, 'name = "courier"\nprotocol = "courier"\n', core
        ),
        [CourierClient(workload) for _ in range(connections)],
        in_flight,
    )
    in_window = len(run.latencies)
    seconds = run.window.seconds
    return CaseResult(
        events=events,
        in_flight=in_flight,
        connections=connections,
        message=args.message.upper(),
        json_mb_per_second=in_window * workload.json_bytes / seconds / 1e6,
        wire_mb_per_second=in_window * workload.wire_bytes / seconds / 1e6,
        acked_events=run.acked * events,
        acked_payloads=run.acked,
        keepalives=run.keepalives,
        table_rows=run.table_rows,
        table_batches=run.table_batches,
        ok=(
            run.table_rows == run.acked * events
            and run.table_batches == run.acked
            and run.server_exit == 0
        ),
        **run.measured(events),
    )


# -- reporting -----------------------------------------------------------------


def print_case(r: CaseResult) -> None:
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"{r.json_mb_per_second:.1f} MB/s of JSON ({r.wire_mb_per_second:.1f} MB/s on the "
        f"wire), p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms\n"
        + harness.cpu_lines(r)
        + f"    verify: acked {r.acked_events:,} events in {r.acked_payloads:,} payloads "
        f"({r.keepalives} partial ACKNs seen); table has {r.table_rows:,} rows in "
        f"{r.table_batches:,} nonces; server exit {r.server_exit}: "
        f"{'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


#: The columns of the results table before :data:`harness.RESULT_COLUMNS`.
COLUMNS: list[harness.Column] = [
    ("payload", "---", lambda r: f"{r.message} {r.events}"),
    ("conn x in flight", "---", lambda r: f"{r.connections} x {r.in_flight}"),
    ("events/s", "---:", lambda r: fmt_rate(r.events_per_second)),
    ("MB/s JSON", "---:", lambda r: f"{r.json_mb_per_second:.1f}"),
    ("MB/s wire", "---:", lambda r: f"{r.wire_mb_per_second:.1f}"),
]


def settings(args: argparse.Namespace) -> str:
    return (
        f"settings: {args.message.upper()}, ~{args.event_bytes}-byte JSON events, zlib level 3, "
        f"warm-up {args.warmup}s, window {args.duration}s, "
        f"commit_max_delay_seconds={args.commit_delay}, commit_max_rows={args.commit_max_rows}"
    )


BENCH = harness.SizedBench(
    title="Log Courier bench",
    packages=("trio", "deltalake", "pyarrow"),
    info={"zlib": zlib.ZLIB_RUNTIME_VERSION},
    in_flight=1,
    settings=settings,
    workload=lambda events, args: Workload.build(events, args.event_bytes, args.message == "evnt"),
    measure=measure_ceilings,
    describe=lambda events, workload: (
        f"payload of {events}: {workload.wire_bytes:,} bytes on the wire "
        f"({workload.json_bytes:,} of JSON, {workload.event_bytes:.0f} bytes/event)"
    ),
    announce=lambda events, in_flight, connections: (
        f"case: {events} events/payload, {connections} connections x {in_flight} in flight"
    ),
    run=run_case,
    report=print_case,
    table=lambda results: harness.results_table(results, COLUMNS),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    harness.add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated EVENTS[:IN_FLIGHT[:CONNECTIONS]]: events per payload, payloads "
        f"unacked per connection (1), connections (--connections); default {DEFAULT_CASES}",
    )
    parser.add_argument("--message", choices=["jdat", "evnt"], default="jdat")
    parser.add_argument("--event-bytes", type=int, default=250, help="JSON bytes/event (250)")
    return harness.run_bench(BENCH, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
