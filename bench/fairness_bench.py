"""Fairness: a normal client's ack latency alone, and next to a hostile one.

Per protocol (``--protocols``; forward, lumberjack, courier, websocket):

1. start ``python -m appliance serve`` on this tree with a fresh state directory
   and one TLS listener of that protocol at its default limits, the server
   pinned to one core and this process (the clients) to another
   (``harness.pin_cores``; ``--no-pin`` turns it off);
2. **alone**: a normal client sends a small batch (``--events`` events of
   about 100 bytes), waits for its ack, and repeats ``--batches`` times; each
   send-to-ack time is kept;
3. **with a neighbour**: the same again while hostile clients (``--neighbours``,
   each its own TLS connection) send worst-case-but-valid-sized requests in a
   loop, as fast as the server takes them (each waits for its answer, or
   reconnects when the server closes it). What a neighbour sends, per protocol:

   * forward ``gzip-empty``: CompressedPackedForward whose entries inflate to
     just under ``max_decompressed_bytes`` (64 MiB) of empty msgpack maps,
     about 64 KB of gzip (before the limits, a 4 KB gzip request holding millions of
     empty values stalled every other client's ack for seconds);
     ``max-events``: ``max_events_per_request`` (250,000) minimal events
     ``[0, {}]`` in one gzip request of a few KB, all stored;
   * lumberjack ``max-window``: a window of ``max_window_size`` (100,000) ``{}``
     J frames in one ``C`` frame (a few KB), all stored;
   * courier ``max-events``: a payload of ``max_events`` (250,000) ``{}`` events
     (a few KB of zlib), all stored;
   * websocket ``max-events``: messages of ``max_events_per_message`` (10,000)
     empty records, all stored (at most ``max_messages_per_second``);

4. report the normal client's p50 and p99 ack latency alone and with the
   neighbour, and their ratio, as a markdown table; the neighbours' requests
   answered in the window; then SIGTERM, and the table must hold every normal
   batch exactly once (the only check: the bench never judges a time).

    .venv/bin/python -m bench.fairness_bench
    .venv/bin/python -m bench.fairness_bench --protocols forward --batches 300
    .venv/bin/python -m bench.fairness_bench --append-results   # also into RESULTS.md

Every server has ``commit_max_delay_seconds`` = ``--commit-delay`` (0.1): the
normal client's latency alone is about that; "the commit delay plus a small
margin" is the goal for it with a neighbour (docs/security.md, the threat model: no peer
stalls the others beyond a small, measured margin).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gzip
import json
import os
import resource
import ssl
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench import harness
from bench.harness import COURIER_HELO, Server, quantile, tls_connect

RESULTS = Path(__file__).with_name("RESULTS.md")
#: Seconds one normal batch may wait for its ack before the bench gives up (not a judgement).
ACK_TIMEOUT_SECONDS = 300.0

# -- the protocols' clients ----------------------------------------------------------


class Client:
    """One TLS connection that sends a request and blocks until its answer."""

    def __init__(self, context: ssl.SSLContext, port: int) -> None:
        self.sock = tls_connect(context, port)
        self.sock.settimeout(ACK_TIMEOUT_SECONDS)

    def request(self, data: bytes, done: Callable[[bytearray], bool]) -> bytes:
        self.sock.sendall(data)
        received = bytearray()
        while not done(received):
            received += harness.receive(self.sock)
        return bytes(received)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _has_msgpack_answer(buffer: bytearray) -> bool:
    unpacker = msgpack.Unpacker()
    unpacker.feed(bytes(buffer))
    try:
        return any(True for _ in unpacker)
    except ValueError:
        return False


def record(i: int, tag: str) -> dict[str, Any]:
    return {"seq": i, "client": tag, "msg": "GET /api/v1/orders?page=2 200 512 0.012 upstream=ok"}


class ForwardNormal:
    def __init__(self, context: ssl.SSLContext, port: int, events: int) -> None:
        self.client = Client(context, port)
        self.events = events

    def batch(self, batch_id: str) -> None:
        now = int(time.time())
        entries = [[now, record(i, batch_id)] for i in range(self.events)]
        data = harness.packed_forward("normal", entries, batch_id)
        answer = self.client.request(data, _has_msgpack_answer)
        assert msgpack.unpackb(answer) == {"ack": batch_id}, answer

    def close(self) -> None:
        self.client.close()


def _lumberjack_ack(n: int) -> Callable[[bytearray], bool]:
    want = b"2A" + struct.pack(">I", n)

    def done(buffer: bytearray) -> bool:
        # Keepalives are "2A" 0; the window's ack carries n.
        return any(buffer[i : i + 6] == want for i in range(0, len(buffer) - 5, 6))

    return done


class LumberjackNormal:
    def __init__(self, context: ssl.SSLContext, port: int, events: int) -> None:
        self.client = Client(context, port)
        self.events = events

    def batch(self, batch_id: str) -> None:
        events = [
            json.dumps({"@metadata": {"beat": "normal"}, **record(i, batch_id)}).encode()
            for i in range(self.events)
        ]
        self.client.request(harness.lumberjack_window(events), _lumberjack_ack(self.events))

    def close(self) -> None:
        self.client.close()


def _courier_ack(nonce: bytes, count: int) -> Callable[[bytearray], bool]:
    def done(buffer: bytearray) -> bool:
        offset = 0
        while len(buffer) - offset >= 8:
            kind, length = harness.COURIER_HEADER.unpack_from(buffer, offset)
            if len(buffer) - offset < 8 + length:
                return False
            body = buffer[offset + 8 : offset + 8 + length]
            if (
                kind == b"ACKN"
                and body[:16] == nonce
                and struct.unpack(">I", body[16:20])[0] >= count
            ):
                return True
            offset += 8 + length
        return False

    return done


class CourierNormal:
    def __init__(self, context: ssl.SSLContext, port: int, events: int) -> None:
        self.client = Client(context, port)
        self.client.request(COURIER_HELO, lambda b: len(b) >= 8)  # VERS
        self.events = events

    def batch(self, batch_id: str) -> None:
        nonce = os.urandom(16)
        events = [json.dumps(record(i, batch_id)).encode() for i in range(self.events)]
        data = harness.courier_jdat(nonce, zlib.compress(harness.courier_events(events), 3))
        self.client.request(data, _courier_ack(nonce, self.events))

    def close(self) -> None:
        self.client.close()


class WebSocketClient:
    """A minimal blocking WebSocket client (wsproto) for ``/ingest``."""

    def __init__(self, context: ssl.SSLContext, port: int, token: str) -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, Request

        self.sock = tls_connect(context, port)
        self.sock.settimeout(ACK_TIMEOUT_SECONDS)
        self.ws = WSConnection(ConnectionType.CLIENT)
        headers = [(b"authorization", f"Bearer {token}".encode())]
        self.sock.sendall(self.ws.send(Request(host="localhost", target="/ingest",
                                               extra_headers=headers)))  # fmt: skip
        self.pending: list[Any] = []
        event = self.next_event()
        assert isinstance(event, AcceptConnection), event

    def next_event(self) -> Any:
        from wsproto.events import Ping

        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, Ping):
                    self.sock.sendall(self.ws.send(event.response()))
                else:
                    self.pending.append(event)
        return self.pending.pop(0)

    def message(self, text: str) -> Any:
        from wsproto.events import CloseConnection, Message, TextMessage

        self.sock.sendall(self.ws.send(Message(data=text)))
        parts: list[str] = []
        while True:
            event = self.next_event()
            if isinstance(event, CloseConnection):
                raise ConnectionError(f"closed with {event.code}")
            if isinstance(event, TextMessage):
                parts.append(event.data)
                if event.message_finished:
                    return json.loads("".join(parts))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class WebSocketNormal:
    def __init__(self, context: ssl.SSLContext, port: int, events: int, token: str) -> None:
        self.client = WebSocketClient(context, port, token)
        self.events = events

    def batch(self, batch_id: str) -> None:
        events = [{"record": record(i, batch_id)} for i in range(self.events)]
        answer = self.client.message(
            json.dumps({"id": batch_id, "tag": "normal", "events": events})
        )
        assert answer == {"ack": batch_id}, answer

    def close(self) -> None:
        self.client.close()


# -- the neighbours ----------------------------------------------------------------------


@dataclasses.dataclass
class NeighbourStats:
    answered: int = 0
    closed: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


#: A neighbour's request number ``n`` and the test that its answer has come.
Request = Callable[[int], tuple[bytes, Callable[[bytearray], bool]]]


def _forward(body: bytes) -> Request:
    """CompressedPackedForward with ``body``; a fresh chunk id each time (no dedupe)."""
    head = b"\x93" + msgpack.packb("hostile") + msgpack.packb(body)

    def request(n: int) -> tuple[bytes, Callable[[bytearray], bool]]:
        return head + msgpack.packb({"chunk": f"hostile-{n}", "compressed": "gzip"}), (
            _has_msgpack_answer
        )

    return request


def forward_gzip_empty() -> Request:
    """Entries inflating to just under 64 MiB of empty maps (not ``[time, record]``)."""
    return _forward(gzip.compress(b"\x80" * (64 * 1024 * 1024 - 4096), 9))


def forward_max_events() -> Request:
    """250,000 events ``[0, {}]`` (receive time, empty record), gzip."""
    return _forward(gzip.compress(b"\x92\x00\x80" * 250_000, 9))


def lumberjack_max_window() -> Request:
    data = harness.lumberjack_window([b"{}"] * 100_000)
    return lambda n: (data, _lumberjack_ack(100_000))


def courier_max_events() -> Request:
    compressed = zlib.compress((struct.pack(">I", 2) + b"{}") * 250_000, 9)

    def request(n: int) -> tuple[bytes, Callable[[bytearray], bool]]:
        nonce = n.to_bytes(16, "big")  # a fresh nonce each time (no dedupe)
        return harness.courier_jdat(nonce, compressed), _courier_ack(nonce, 250_000)

    return request


def websocket_max_events() -> Request:
    events: list[dict[str, Any]] = [{"record": {}}] * 10_000

    def request(n: int) -> tuple[bytes, Callable[[bytearray], bool]]:
        text = json.dumps({"id": f"hostile-{n}", "tag": "hostile", "events": events})
        return text.encode(), lambda b: True

    return request


#: protocol -> neighbour kind -> its requests.
NEIGHBOURS: dict[str, dict[str, Callable[[], Request]]] = {
    "forward": {"gzip-empty": forward_gzip_empty, "max-events": forward_max_events},
    "lumberjack": {"max-window": lumberjack_max_window},
    "courier": {"max-events": courier_max_events},
    "websocket": {"max-events": websocket_max_events},
}


def run_neighbour(
    protocol: str,
    requests: Request,
    context: ssl.SSLContext,
    port: int,
    stop: threading.Event,
    stats: NeighbourStats,
    token: str,
) -> None:
    """Send hostile requests until ``stop``; reconnect whenever the server closes."""
    sequence = 0
    while not stop.is_set():
        try:
            if protocol == "websocket":
                ws = WebSocketClient(context, port, token)
                try:
                    while not stop.is_set():
                        sequence += 1
                        ws.message(requests(sequence)[0].decode())
                        stats.answered += 1
                finally:
                    ws.close()
                continue
            client = Client(context, port)
            try:
                if protocol == "courier":
                    client.request(COURIER_HELO, lambda b: len(b) >= 8)
                while not stop.is_set():
                    sequence += 1
                    data, done = requests(sequence)
                    client.request(data, done)
                    stats.answered += 1
            finally:
                client.close()
        except (OSError, ssl.SSLError, ConnectionError, AssertionError) as exc:
            stats.closed += 1
            if len(stats.errors) < 3:
                stats.errors.append(repr(exc)[:120])
            time.sleep(0.01)


# -- one protocol ----------------------------------------------------------------------------


LISTENERS = {
    "forward": 'name = "forward"\nprotocol = "forward"\n',
    "lumberjack": 'name = "beats"\nprotocol = "lumberjack"\n',
    "courier": 'name = "courier"\nprotocol = "courier"\n',
    "websocket": 'name = "websocket"\nprotocol = "websocket"\n',
}


@dataclasses.dataclass
class Phase:
    latencies: list[float]
    neighbour: NeighbourStats | None = None
    #: Share of one core the server used over the phase, in %.
    server_cpu_pct: float = float("nan")
    #: CPU of every other process on the machine over the phase, in % of one core
    #: (a neighbour running tests shows up here).
    other_cpu_pct: float = float("nan")

    @property
    def p50_ms(self) -> float:
        return quantile(sorted(self.latencies), 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return quantile(sorted(self.latencies), 0.99) * 1000


@dataclasses.dataclass
class Result:
    protocol: str
    neighbour: str
    alone: Phase
    loaded: Phase
    table_ok: bool
    server_exit: int


def make_normal(protocol: str, context: ssl.SSLContext, port: int, args: argparse.Namespace,
                token: str) -> Any:  # fmt: skip
    if protocol == "forward":
        return ForwardNormal(context, port, args.events)
    if protocol == "lumberjack":
        return LumberjackNormal(context, port, args.events)
    if protocol == "courier":
        return CourierNormal(context, port, args.events)
    return WebSocketNormal(context, port, args.events, token)


def normal_phase(normal: Any, prefix: str, batches: int) -> list[float]:
    latencies = []
    for n in range(batches):
        start = time.perf_counter()
        normal.batch(f"{prefix}-{n}")
        latencies.append(time.perf_counter() - start)
    return latencies


def measured_phase(
    normal: Any, prefix: str, batches: int, pid: int, neighbour: NeighbourStats | None = None
) -> Phase:
    """:func:`normal_phase`, with the server's and the other processes' CPU over it."""
    server0, busy0 = harness.proc_cpu_seconds(pid), harness.system_cpu_seconds()[0]
    wall0 = time.perf_counter()
    own0 = resource.getrusage(resource.RUSAGE_SELF)
    latencies = normal_phase(normal, prefix, batches)
    server1, busy1 = harness.proc_cpu_seconds(pid), harness.system_cpu_seconds()[0]
    wall1 = time.perf_counter()
    own1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = wall1 - wall0
    server = server1 - server0
    own = (own1.ru_utime + own1.ru_stime) - (own0.ru_utime + own0.ru_stime)
    other = max(0.0, (busy1 - busy0) - server - own)
    return Phase(latencies, neighbour, 100 * server / wall, 100 * other / wall)


def add_token(server_config: Path, tree: Path = harness.ROOT) -> str:
    """An ingest token for the WebSocket listener, with the real CLI of the server's ``tree``.

    The server's own CLI: the auth database is the server's, in its schema.
    """
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "appliance", "token", "add", "bench", "--config",
         str(server_config), "--json"],
        capture_output=True, text=True, check=True, env=harness.tree_env(tree),
    )  # fmt: skip
    return str(json.loads(out.stdout)["token"])


def run_protocol(protocol: str, kind: str, args: argparse.Namespace, core: int | None) -> Result:
    state_dir = Path(tempfile.mkdtemp(prefix=f"fairness-{protocol}-"))
    server: Server = harness.start_server(state_dir, args, LISTENERS[protocol], core)
    try:
        token = add_token(state_dir / "bench.toml") if protocol == "websocket" else ""
        context = harness.tls_context(server.ca_file)
        normal = make_normal(protocol, context, server.port, args, token)
        try:
            normal_phase(normal, "warmup", 5)
            pid = server.proc.pid
            alone = measured_phase(normal, "alone", args.batches, pid)
            stop = threading.Event()
            stats = NeighbourStats()
            requests = NEIGHBOURS[protocol][kind]()
            threads = [
                threading.Thread(
                    target=run_neighbour,
                    args=(protocol, requests, context, server.port, stop, stats, token),
                    daemon=True,
                )
                for _ in range(args.neighbours)
            ]
            for thread in threads:
                thread.start()
            time.sleep(args.neighbour_head_start)
            loaded = measured_phase(normal, "loaded", args.batches, pid, stats)
            stop.set()
            for thread in threads:
                thread.join(ACK_TIMEOUT_SECONDS)
        finally:
            normal.close()
    except BaseException:
        server.proc.kill()
        server.proc.wait()
        print(server.log_tail(), file=sys.stderr)
        raise
    code, _ = harness.stop_server(server)
    table_ok = normal_batches_once(state_dir / "var" / "lake" / "events", args)
    harness.discard_state(state_dir, args.keep)
    return Result(protocol, kind, alone, loaded, table_ok, code)


def normal_batches_once(table: Path, args: argparse.Namespace) -> bool:
    """Every normal batch (warm-up, alone, loaded) is in the table exactly once."""
    from deltalake import DeltaTable

    records = DeltaTable(str(table)).to_pyarrow_table(columns=["record"]).column("record")
    counts: dict[str, int] = {}
    for text in records.to_pylist():
        if '"client"' in text:
            batch = json.loads(text)["client"]
            counts[batch] = counts.get(batch, 0) + 1
    expected = {f"warmup-{n}" for n in range(5)}
    expected |= {f"{p}-{n}" for p in ("alone", "loaded") for n in range(args.batches)}
    return set(counts) == expected and all(c == args.events for c in counts.values())


# -- report ---------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    lines = [
        "| protocol | neighbour | p50 alone ms | p99 alone ms | p50 with ms | p99 with ms "
        "| p50 ratio | p99 ratio | neighbour requests answered / connections closed "
        "| server CPU alone / with | other CPU alone / with | table = acked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        stats = r.loaded.neighbour or NeighbourStats()
        lines.append(
            f"| {r.protocol} | {r.neighbour} | {r.alone.p50_ms:.0f} | {r.alone.p99_ms:.0f} "
            f"| {r.loaded.p50_ms:.0f} | {r.loaded.p99_ms:.0f} "
            f"| {r.loaded.p50_ms / r.alone.p50_ms:.1f} | {r.loaded.p99_ms / r.alone.p99_ms:.1f} "
            f"| {stats.answered} / {stats.closed} "
            f"| {r.alone.server_cpu_pct:.0f}% / {r.loaded.server_cpu_pct:.0f}% "
            f"| {r.alone.other_cpu_pct:.0f}% / {r.loaded.other_cpu_pct:.0f}% "
            f"| {'yes' if r.table_ok and r.server_exit == 0 else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--protocols", default="forward,lumberjack,courier,websocket",
        help="comma-separated protocols, or protocol:neighbour (default: every neighbour "
        "of forward, lumberjack, courier, websocket)",
    )  # fmt: skip
    parser.add_argument("--batches", type=int, default=100, help="normal batches per phase (100)")
    parser.add_argument("--events", type=int, default=10, help="events per normal batch (10)")
    parser.add_argument("--neighbours", type=int, default=1, help="hostile connections (1)")
    parser.add_argument(
        "--neighbour-head-start", type=float, default=1.0,
        help="seconds the neighbours run before the normal client starts again (1)",
    )  # fmt: skip
    parser.add_argument("--commit-delay", type=float, default=0.1, help="[lake] max delay (0.1)")
    parser.add_argument("--commit-max-rows", type=int, default=100_000, help="[lake] max rows")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and clients")
    parser.add_argument("--keep", action="store_true", help="keep the state directories")
    parser.add_argument(
        "--append-results", action="store_true", help=f"append the table to {RESULTS.name}"
    )
    args = parser.parse_args(argv)

    (core, _), pinning, usable = harness.pin_cores(args.no_pin)
    command = " ".join([".venv/bin/python", "-m", "bench.fairness_bench", *sys.argv[1:]])
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{os.cpu_count()} CPUs (usable: {usable}), {harness.cpu_model()}; {pinning}"
    print(f"# fairness bench\ncommand: {command}\ndate: {started}\nmachine: {machine}")
    print(
        f"normal client: {args.events} events per batch, {args.batches} batches per phase, one "
        f"at a time; {args.neighbours} neighbour connection(s); "
        f"commit_max_delay_seconds={args.commit_delay}",
        flush=True,
    )
    cases: list[tuple[str, str]] = []
    for item in args.protocols.split(","):
        protocol, _, kind = item.strip().partition(":")
        kinds = [kind] if kind else list(NEIGHBOURS[protocol])
        cases += [(protocol, k) for k in kinds]
    results = []
    for protocol, kind in cases:
        print(f"\n{protocol}, neighbour {kind} ...", flush=True)
        result = run_protocol(protocol, kind, args, core)
        stats = result.loaded.neighbour or NeighbourStats()
        print(
            f"  alone p50 {result.alone.p50_ms:.0f} ms p99 {result.alone.p99_ms:.0f} ms; with the "
            f"neighbour p50 {result.loaded.p50_ms:.0f} ms p99 {result.loaded.p99_ms:.0f} ms; "
            f"neighbour requests answered {stats.answered}, connections closed {stats.closed} "
            f"{stats.errors}",
            flush=True,
        )
        results.append(result)
    report = table(results)
    print("\n" + report)
    if args.append_results:
        section = (
            f"\n## Fairness: a normal client next to a hostile one ({started})\n\n"
            f"`{command}`\n\nMachine: {machine}. Normal client: {args.events} events per batch, "
            f"one batch at a time, {args.batches} batches alone, then {args.batches} with "
            f"{args.neighbours} hostile connection(s) sending the neighbour's request in a loop "
            f"(bench/fairness_bench.py docstring); commit_max_delay_seconds={args.commit_delay}; "
            "default listener limits.\n\n" + report + "\n"
        )
        with RESULTS.open("a", encoding="utf-8") as f:
            f.write(section)
    ok = all(r.table_ok and r.server_exit == 0 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
