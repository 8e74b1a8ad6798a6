"""WebSocket live tail benchmark: forward ingest throughput with and without a stalled tail.

Runs the service in-process (real TLS, real Delta table, real auth database)
with a forward and a WebSocket listener. Each case sends PackedForward chunks
with ack over ``--connections`` TLS connections for ``--duration`` seconds and
reports events/s:

* ``no tail``: nobody watches;
* ``stalled tail``: an admin tail client subscribed to every event that never
  reads, so its socket buffers fill and its queue (``tail_queue_events``)
  overflows: the service drops and counts, and ingest must not slow down.

First, though, the ingest cases (``--cases``, default ``1000:8``: events
per message, messages unacked per connection, connections): ``appliance
serve`` of this tree as a subprocess with one WebSocket listener, pinned to
core 0, and ``CONNECTIONS`` ``/ingest`` clients (a bearer token made with
the CLI; plain ``ssl`` sockets, one thread each, core 1) that keep
``IN_FLIGHT`` messages of Beats-like events unacked, each with a unique
``id``. It reports events/s, p50/p99 send-to-ack latency and, from
``/proc``, the server's CPU and events per server CPU-second, like
``lumberjack_bench`` (bench/harness.py), and checks the table. Before the
case it prints the in-process ceilings on the same messages: the parse
(``parse_ingest``), that plus the rows, plus Arrow, plus the Delta commit.

The tail cases run the service in-process; ``python -m`` from the tree's
root imports that tree's ``appliance`` (the header prints which file), so
every case measures the tree the bench sits in. ``--no-tail`` skips them.

It reports; it never asserts a time. It exits 1 only if the table does not
hold exactly the acknowledged events.

    .venv/bin/python -m bench.websocket_bench --duration 8
    .venv/bin/python -m bench.websocket_bench --duration 8 --warmup 2 --no-tail
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import ssl
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import trio
from trio_websocket import open_websocket

from appliance import service
from appliance.config import (
    Config,
    ForwardListenerConfig,
    LakeConfig,
    WebSocketListenerConfig,
)
from appliance.server.websocket_listener import WebSocketHandler
from auth.database import open_database
from bench import harness
from bench.harness import fmt_rate

RECORD = {"message": "x" * 80, "level": "info"}


def chunk_bytes(chunk: str, n: int) -> bytes:
    now = int(time.time())
    return harness.packed_forward("bench.ws", [[now, dict(RECORD, i=i)] for i in range(n)], chunk)


async def sender(
    info: service.Running, ctx: ssl.SSLContext, ident: int, batch: int, stop_at: float,
    counts: list[int],
) -> None:  # fmt: skip
    sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
    stream = trio.SSLStream(sock, ctx, server_hostname="localhost")
    unpacker = msgpack.Unpacker()
    seq = 0
    while trio.current_time() < stop_at:
        chunk = f"c{ident}-{seq}"
        await stream.send_all(chunk_bytes(chunk, batch))
        while True:
            data = await stream.receive_some(4096)
            unpacker.feed(data)
            acks = list(unpacker)
            if acks:
                break
        counts[0] += batch
        seq += 1
    await stream.aclose()


async def stalled_tail(port: int, ctx: ssl.SSLContext, token: str, ready: trio.Event) -> None:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with open_websocket("localhost", port, "/tail", use_ssl=ctx, extra_headers=headers,
                              message_queue_size=1):  # fmt: skip
        ready.set()
        await trio.sleep_forever()  # never reads


async def run_case(tail: bool, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        config = Config(
            state_dir=state,
            lake=LakeConfig(commit_max_delay_seconds=0.05),
            listeners=[
                ForwardListenerConfig(bind="127.0.0.1:0", udp_heartbeat=False),
                WebSocketListenerConfig(bind="127.0.0.1:0", tail_queue_events=args.tail_queue),
            ],
        )
        with open_database(config.auth_settings) as database:
            _, token = database.tokens.add("bench", "admin", actor="bench")
        handlers: list[WebSocketHandler] = []
        original = service.handler_for

        def handler_for(listener: Any, context: Any) -> Any:
            handler = original(listener, context)
            if isinstance(handler, WebSocketHandler):
                handlers.append(handler)  # to read the tail hub's counters
            return handler

        service.handler_for = handler_for  # type: ignore[assignment]
        stop = trio.Event()
        counts = [0]
        async with trio.open_nursery() as nursery:
            info: service.Running = await nursery.start(
                lambda task_status: service.serve(config, stop=stop, task_status=task_status)
            )
            assert info.ca_file is not None
            ctx = harness.tls_context(info.ca_file)
            async with trio.open_nursery() as tails:
                if tail:
                    ready = trio.Event()
                    tails.start_soon(stalled_tail, info.ports["websocket"], ctx, token, ready)
                    await ready.wait()
                start = trio.current_time()
                async with trio.open_nursery() as senders:
                    for i in range(args.connections):
                        senders.start_soon(
                            sender, info, ctx, i, args.batch, start + args.duration, counts
                        )
                elapsed = trio.current_time() - start
                dropped = handlers[0].hub.dropped_events if handlers else 0
                tails.cancel_scope.cancel()
            stop.set()
        service.handler_for = original  # type: ignore[assignment]
        rows = harness.table_counts(Path(config.table_uri))[0]
    return {
        "case": "stalled tail" if tail else "no tail",
        "events": counts[0],
        "events_per_second": round(counts[0] / elapsed),
        "tail_dropped": dropped,
        "table_rows": rows,
        "ok": rows == counts[0],
    }


# -- ingest: the WebSocket listener's own throughput ----------------------------------------

DEFAULT_CASES = "1000:8"
_FILLER = (
    "{i} GET /api/v1/orders/{d}?page=2 HTTP/1.1 200 512 0.0{d} "
    '"Mozilla/5.0 (X11; Linux x86_64)" upstream=10.0.{d}.7:8080 '
)
#: The id's text in the message template, replaced per message by one as wide.
_ID_PLACEHOLDER = "X" * 24


def ingest_event(i: int, target: int) -> dict[str, Any]:
    """One ``/ingest`` event: an RFC 3339 time and a Beats-like record of about ``target`` bytes."""
    record: dict[str, Any] = {
        "host": {"name": f"web-{i % 16:02d}"},
        "log": {"file": {"path": "/var/log/nginx/access.log"}, "offset": i * 211},
        "level": "info",
        "message": "",
    }
    padded = harness.padded_json(record, _FILLER.format(i=i, d=i % 997), target)
    return {"time": harness.event_timestamp(i), "record": json.loads(padded)}


@dataclasses.dataclass(frozen=True)
class IngestWorkload:
    """One message's text with a placeholder id; each send puts a unique id in it."""

    events: int
    template: bytes
    record_bytes: float

    @classmethod
    def build(cls, events: int, record_bytes: int) -> IngestWorkload:
        body = [ingest_event(i, record_bytes) for i in range(events)]
        text = json.dumps({"id": _ID_PLACEHOLDER, "tag": "bench.ws", "events": body},
                          separators=(",", ":"))  # fmt: skip
        size = sum(len(json.dumps(e["record"], separators=(",", ":"))) for e in body)
        return cls(events, text.encode(), size / events)

    def message(self, ident: str) -> bytes:
        """The message with id ``ident`` (at most as wide as the placeholder)."""
        return self.template.replace(_ID_PLACEHOLDER.encode(), ident.ljust(24).encode(), 1)


def client_frame(payload: bytes) -> bytes:
    """A client's text frame (RFC 6455 section 5.2): FIN, masked, with the all-zero key.

    A client must mask; a zero key makes the masked bytes the payload itself,
    so the generator spends no CPU on it (the server unmasks as always).
    """
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x81, 0x80 | 127, n)
    return head + bytes(4) + payload


def _times_cache() -> Any:
    """The session's RFC 3339 cache of the tree measured, or None if it has none."""
    try:
        from appliance.blocks.timecache import Rfc3339Cache
    except ImportError:
        return None
    return Rfc3339Cache()


def measure_ceilings(
    workload: IngestWorkload, seconds: float, core: int | None, with_commit: bool
) -> dict[str, float]:
    """Single-core in-process rates on the generator's messages."""
    from appliance.protocols.websocket_messages import IngestMessage, MessageLimits, parse_ingest
    from appliance.rows.websocket import ingest_block

    with harness.pinned(core):
        group = max(1, 25_000 // workload.events)
        texts = [workload.message(f"m-{i}").decode() for i in range(group)]
        limits = MessageLimits()

        # One connection's cache of RFC 3339 prefixes, as the server's session
        # keeps (appliance/blocks/timecache.py); a tree without it takes two arguments.
        times = _times_cache()

        def messages() -> list[IngestMessage]:
            if times is None:
                return [parse_ingest(text, limits) for text in texts]
            return [parse_ingest(text, limits, times) for text in texts]  # type: ignore[call-arg,unused-ignore]

        return harness.block_ceilings(
            messages,
            lambda m: len(m.records),
            lambda m, now: ingest_block(
                m, source="token:bench", peer="127.0.0.1:50000", received_at_ns=now
            ),
            seconds,
            with_commit,
            "websocket-bench-ceiling-",
        )


class IngestClient:
    """A ``/ingest`` client (a :class:`harness.Pipeline`): unique ids, acks in order."""

    def __init__(self, workload: IngestWorkload, ident: int, token: list[str]) -> None:
        from wsproto import ConnectionType, WSConnection

        self.workload = workload
        self.ident = ident
        self.token = token  # filled in once the server runs
        self.seq = 0
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.parts: list[str] = []

    def handshake(self, tls: ssl.SSLSocket) -> None:
        from wsproto.events import AcceptConnection, Request

        headers = [(b"authorization", f"Bearer {self.token[0]}".encode())]
        tls.sendall(self.ws.send(Request(host="localhost", target="/ingest",
                                         extra_headers=headers)))  # fmt: skip
        while True:
            self.ws.receive_data(harness.receive(tls))
            for event in self.ws.events():
                if isinstance(event, AcceptConnection):
                    return
                raise ValueError(f"handshake refused: {event!r}")

    def request(self) -> tuple[str, bytes]:
        ident = f"c{self.ident}-{self.seq}"
        self.seq += 1
        return ident, client_frame(self.workload.message(ident))

    def answers(self, tls: ssl.SSLSocket) -> list[Any]:
        from wsproto.events import Ping, TextMessage

        self.ws.receive_data(harness.receive(tls))
        out: list[Any] = []
        for event in self.ws.events():
            if isinstance(event, Ping):
                tls.sendall(self.ws.send(event.response()))
            elif isinstance(event, TextMessage):
                self.parts.append(event.data)
                if event.message_finished:
                    out.append(json.loads("".join(self.parts)))
                    self.parts = []
            else:
                raise ValueError(f"unexpected {event!r}")
        return out

    def acknowledges(self, answer: Any, expected: str) -> bool:
        if answer != {"ack": expected.ljust(24)}:
            raise ValueError(f"unexpected answer {answer!r} for {expected!r}")
        return True


@dataclasses.dataclass
class IngestResult:
    events: int
    in_flight: int
    connections: int
    seconds: float
    events_per_second: float
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    events_per_server_cpu_second: float
    generator_cpu_pct: float
    other_cpu_pct: float
    server_peak_rss_mb: float
    server_threads: dict[str, float]
    acked_events: int
    table_rows: int
    table_batches: int
    commits: str
    server_exit: int
    ok: bool

    @property
    def label(self) -> str:
        return f"{self.events} events/message, {self.connections} conn x {self.in_flight} in flight"


def run_ingest_case(
    events: int, in_flight: int, connections: int, args: argparse.Namespace, core: int | None
) -> IngestResult:
    from bench.fairness_bench import add_token

    workload = IngestWorkload.build(events, args.record_bytes)
    token: list[str] = []

    def start(state_dir: Path) -> harness.Server:
        server = harness.start_server(
            state_dir, args, 'name = "websocket"\nprotocol = "websocket"\n', core
        )
        token.append(add_token(state_dir / "bench.toml", args.server_tree))
        return server

    run = harness.run_tls_case(
        args,
        f"websocket-bench-{events}x{in_flight}-",
        start,
        [IngestClient(workload, i, token) for i in range(connections)],
        in_flight,
    )
    acked_events = run.acked * events
    return IngestResult(
        events=events,
        in_flight=in_flight,
        connections=connections,
        acked_events=acked_events,
        table_rows=run.table_rows,
        table_batches=run.table_batches,
        ok=(
            run.table_rows == acked_events
            and run.table_batches == run.acked
            and run.server_exit == 0
        ),
        **run.measured(events),
    )


def print_ingest_case(r: IngestResult) -> None:
    print(
        f"  {r.label}: {fmt_rate(r.events_per_second)} events/s, "
        f"p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms\n"
        + harness.cpu_lines(r)
        + f"    verify: acked {r.acked_events:,} events; table has {r.table_rows:,} rows in "
        f"{r.table_batches:,} ids; server exit {r.server_exit}: {'OK' if r.ok else 'MISMATCH'}",
        flush=True,
    )


INGEST_COLUMNS: list[harness.Column] = [
    ("events/message", "---:", lambda r: str(r.events)),
    ("conn x in flight", "---", lambda r: f"{r.connections} x {r.in_flight}"),
    ("events/s", "---:", lambda r: fmt_rate(r.events_per_second)),
]


def ingest_settings(args: argparse.Namespace) -> str:
    return (
        f"settings: ~{args.record_bytes}-byte records, RFC 3339 times, warm-up {args.warmup}s, "
        f"window {args.duration}s, commit_max_delay_seconds={args.commit_delay}, "
        f"commit_max_rows={args.commit_max_rows}"
    )


INGEST_BENCH = harness.SizedBench(
    title="websocket bench",
    packages=("trio", "trio-websocket", "wsproto", "deltalake", "pyarrow"),
    info={"appliance": ""},  # filled in by main: the module file this tree imports
    in_flight=8,
    settings=ingest_settings,
    workload=lambda events, args: IngestWorkload.build(events, args.record_bytes),
    measure=measure_ceilings,
    describe=lambda events, workload: (
        f"message of {events} events: {len(workload.template):,} bytes "
        f"({workload.record_bytes:.0f} record JSON bytes/event)"
    ),
    announce=lambda events, in_flight, connections: (
        f"case: ingest, {events} events/message, {connections} connections x {in_flight} in flight"
    ),
    run=run_ingest_case,
    report=print_ingest_case,
    table=lambda results: harness.results_table(results, INGEST_COLUMNS),
)


# -- the tail cases -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import appliance

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    harness.add_arguments(
        parser,
        DEFAULT_CASES,
        "comma-separated EVENTS[:IN_FLIGHT[:CONNECTIONS]] of the ingest cases: events per "
        f"message, messages unacked per connection (8), connections; default {DEFAULT_CASES}",
    )
    parser.add_argument("--record-bytes", type=int, default=250, help="JSON bytes/record (250)")
    parser.add_argument("--no-tail", action="store_true", help="skip the tail cases")
    parser.add_argument("--batch", type=int, default=1000, help="tail cases: records per chunk")
    parser.add_argument("--tail-queue", type=int, default=10_000, help="tail_queue_events")
    args = parser.parse_args(argv)
    module = Path(appliance.__file__).resolve()
    if harness.ROOT not in module.parents:
        print(f"appliance imported from {module}, not this tree ({harness.ROOT})", file=sys.stderr)
        return 2
    INGEST_BENCH.info["appliance"] = str(module)
    # run_bench writes the machine and the ingest cases; the tail cases are added to them.
    ok = harness.run_bench(INGEST_BENCH, args) == 0
    results = []
    if not args.no_tail:
        for tail in (False, True, False, True):
            result = trio.run(run_case, tail, args)
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        data = json.loads(args.json.read_text(encoding="utf-8"))
        data["tail"] = results
        args.json.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 0 if ok and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
