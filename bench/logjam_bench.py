"""Logjam benchmark: async PUSH throughput into the table, with and without CURVE.

What it does, per case (``COMPRESSION:SECURITY``, e.g. ``snappy:curve``):

1. starts this module with ``--serve`` as a subprocess: a fresh state
   directory, the real lake writer and :func:`serve_logjam` with one Logjam
   listener (what ``appliance serve`` runs for a ``[[listeners]]`` entry with
   ``protocol = "logjam"``), pinned to core 0; it prints its ports and then,
   every 0.1 s, how many rows are committed. With CURVE it authorises one
   client key in the auth database first;
2. opens ``--senders`` PUSH sockets (pyzmq, one thread each, pinned to core 1)
   that send ``--messages`` messages in all, as fast as ZeroMQ takes them
   (a full ``rcvhwm`` blocks the sender: backpressure). Each message is a
   Logjam request body of about ``--body-bytes`` of JSON, compressed once
   with the case's method, with its own sequence number;
3. reports messages/s from the first send to the commit that holds the last
   row, MB/s of body bytes on the wire, the server's CPU seconds and peak RSS;
4. stops the server (graceful) and checks the table holds exactly
   ``--messages`` rows.

Next to the cases it prints in-process ceilings on the same bytes, on one
core: the codec (``LogjamReceiver.receive_pull``) per compression method, and
that plus ``message_block``.

Nothing here asserts a time: it reports. It exits 1 only when the table does
not hold every message sent, or the server did not stop cleanly.

    .venv/bin/python -m bench.logjam_bench
    .venv/bin/python -m bench.logjam_bench --cases none:plain,snappy:curve --messages 50000

``--server-tree DIR`` runs the server (``--serve`` of this module) from another
checkout with this tree's senders: a same-run A/B of two commits. Its
``--serve`` must print the same lines (the ports first, then the rows).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
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

from bench import harness

DEFAULT_CASES = "none:plain,none:curve,snappy:curve,zlib:curve,lz4:curve"
#: Seconds the whole case may take before it is abandoned as failed.
CASE_TIMEOUT_SECONDS = 600
#: How the server subprocess is started (a profiler may wrap it).
SERVER_COMMAND = harness.bench_module("logjam_bench")


def body_json(size: int) -> bytes:
    """A Logjam request body (logjam_agent's fields) of about ``size`` bytes."""
    lines = []
    record: dict[str, Any] = {
        "action": "Orders#show",
        "host": "web1.example",
        "process_id": 4242,
        "request_id": "8b2d0d4b0f6c4e4f9a1e7f3c2d1b0a99",
        "started_at": "2026-11-22T10:00:00+00:00",
        "started_ms": 1795341600000,
        "total_time": 12.5,
        "code": 200,
        "lines": lines,
    }
    while len(json.dumps(record)) < size:
        lines.append([1, "2026-11-22T10:00:00.000123", f"Processing line {len(lines)} of request"])
    return json.dumps(record).encode()


def compressors() -> dict[str, tuple[int, Callable[[bytes], bytes]]]:
    import cramjam

    return {
        "none": (0, lambda data: data),
        "zlib": (1, zlib.compress),
        "gzip": (1, gzip.compress),
        "snappy": (2, lambda data: bytes(cramjam.snappy.compress_raw(data))),
        "lz4": (
            3,
            lambda data: (
                struct.pack(">I", len(data))
                + bytes(cramjam.lz4.compress_block(data, store_size=False))
            ),
        ),
    }


# -- the server side (--serve) -----------------------------------------------------------


def serve(state: Path, curve: bool) -> None:
    import trio

    from appliance.config import LogjamListenerConfig
    from appliance.lake.table import EventsTable
    from appliance.lake.writer import LakeWriter
    from appliance.logs import configure
    from appliance.server.context import ServiceContext
    from appliance.server.lifecycle import Lifecycle
    from appliance.server.logjam_listener import serve_logjam
    from auth.curve import generate_keypair
    from auth.database import open_database
    from auth.settings import AuthSettings

    configure("warning", "logfmt")
    client_keys: tuple[str, str] | None = None
    if curve:
        client_keys = generate_keypair()
        with open_database(AuthSettings.under(state)) as database:
            database.curve_keys.add("bench", client_keys[0], actor="bench")

    async def main() -> None:
        writer = LakeWriter(EventsTable(str(state / "lake" / "events")), "bench-node")
        await writer.open()
        lifecycle = Lifecycle()
        context = ServiceContext(writer, lifecycle)
        config = LogjamListenerConfig(
            bind="127.0.0.1:0", pull_bind="127.0.0.1:0", curve=curve, self_hostname="bench"
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            async with trio.open_nursery() as listeners:
                ports = await listeners.start(serve_logjam, config, context, state)
                print(json.dumps({"router": ports.router, "pull": ports.pull,
                                  "server_key": ports.server_public_key,
                                  "client_keys": client_keys}), flush=True)  # fmt: skip

                async def report() -> None:
                    while True:
                        print(json.dumps({"rows": writer.rows_committed, "t": time.time()}),
                              flush=True)  # fmt: skip
                        await trio.sleep(0.1)

                reporter = trio.CancelScope()

                async def run_report() -> None:
                    with reporter:
                        await report()

                listeners.start_soon(run_report)
                await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
                lifecycle.stop_reading()
                await lifecycle.wait_no_readers()
                await writer.close_input()
                reporter.cancel()
        print(json.dumps({"done": writer.rows_committed}), flush=True)

    trio.run(main)


# -- the client side ---------------------------------------------------------------------


def run_case(case: str, args: argparse.Namespace, server_core: int | None) -> dict[str, Any]:
    import zmq

    from appliance.protocols.logjam import pack_meta

    method_name, security = case.split(":")
    method, compress = compressors()[method_name]
    body = compress(body_json(args.body_bytes))
    state = Path(tempfile.mkdtemp(prefix="logjam-bench-"))
    server = subprocess.Popen(
        [*SERVER_COMMAND, "--serve", str(state)] + (["--curve"] if security == "curve" else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=harness.tree_env(args.server_tree),
        preexec_fn=(
            (lambda: os.sched_setaffinity(0, {server_core})) if server_core is not None else None
        ),
    )  # fmt: skip
    assert server.stdout is not None
    assert server.stdin is not None
    hello = json.loads(server.stdout.readline())
    context = zmq.Context()
    per_sender = args.messages // args.senders
    total = per_sender * args.senders

    def sender(index: int) -> None:
        sock = context.socket(zmq.PUSH)
        sock.set(zmq.SNDHWM, 1000)
        sock.set(zmq.LINGER, -1)
        if hello["server_key"]:
            public, secret = hello["client_keys"]
            sock.set(zmq.CURVE_SERVERKEY, hello["server_key"].encode())
            sock.set(zmq.CURVE_PUBLICKEY, public.encode())
            sock.set(zmq.CURVE_SECRETKEY, secret.encode())
        sock.connect(f"tcp://127.0.0.1:{hello['pull']}")
        base = index * per_sender
        for seq in range(base + 1, base + per_sender + 1):
            meta = pack_meta(compression=method, created_ms=int(time.time() * 1000), sequence=seq)
            sock.send_multipart([b"bench-production", b"logs.bench.production", body, meta])
        sock.close()

    cpu_before = harness.proc_cpu_seconds(server.pid)
    started = time.time()
    threads = [threading.Thread(target=sender, args=(i,)) for i in range(args.senders)]
    for thread in threads:
        thread.start()
    last_commit = started
    deadline = time.monotonic() + CASE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            break
        report = json.loads(line)
        if report.get("rows", 0) >= total:
            last_commit = report["t"]
            break
    for thread in threads:
        thread.join()
    cpu = harness.proc_cpu_seconds(server.pid) - cpu_before
    rss = harness.vm_hwm_mb(server.pid, missing=0.0)
    server.stdin.close()
    done = None
    for line in server.stdout:
        report = json.loads(line)
        done = report.get("done", done)
    code = server.wait(timeout=120)
    context.term()
    rows = harness.table_counts(state / "lake" / "events")[0]
    elapsed = max(last_commit - started, 1e-9)
    return {
        "case": case,
        "messages": total,
        "body_bytes": len(body),
        "seconds": round(elapsed, 2),
        "messages_per_s": round(total / elapsed),
        "wire_mb_per_s": round(total * len(body) / elapsed / 1e6, 1),
        "server_cpu_s": round(cpu, 1),
        "events_per_server_cpu_second": total / cpu if cpu > 0 else float("nan"),
        "server_peak_rss_mb": round(rss),
        "rows_in_table": rows,
        "ok": rows == total and done == total and code == 0,
    }


def ceilings(args: argparse.Namespace) -> list[dict[str, Any]]:
    from appliance.protocols.logjam import LogjamReceiver, pack_meta
    from appliance.rows.logjam import message_block

    receiver = LogjamReceiver()
    results = []
    for name, (method, compress) in compressors().items():
        body = compress(body_json(args.body_bytes))
        frames = [
            b"bench-production",
            b"logs.bench.production",
            body,
            pack_meta(compression=method),
        ]
        count = 2000
        start = time.perf_counter()
        for _ in range(count):
            receiver.receive_pull(frames)
        codec = count / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(count):
            message_block(receiver.receive_pull(frames), source="s", peer="p", received_at_ns=1)
        rows = count / (time.perf_counter() - start)
        results.append(
            {"compression": name, "body_bytes": len(body), "codec_per_s": round(codec),
             "codec_and_row_per_s": round(rows)}
        )  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve", metavar="STATE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--curve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--body-bytes", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--server-tree",
        type=Path,
        default=harness.ROOT,
        help="run the server of this source tree (a checkout of another commit) with this"
        " tree's senders: a same-run A/B of two commits (default: this tree)",
    )
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve), args.curve)
        return 0
    (server_core, _), pinning, usable = harness.pin_cores(no_pin=False)
    info = harness.machine_info(usable, ("pyzmq", "cramjam", "trio", "deltalake", "pyarrow"))
    harness.print_header("logjam bench", info, pinning, server_core)
    print(
        f"settings: {args.messages} messages of ~{args.body_bytes} B JSON, "
        f"{args.senders} PUSH senders"
    )
    if args.server_tree != harness.ROOT:
        print(f"server tree: {args.server_tree} ({harness.git_commit(args.server_tree)})")
    results = []
    for case in args.cases.split(","):
        result = run_case(case, args, server_core)
        results.append(result)
        print(json.dumps(result), flush=True)
    with harness.pinned(server_core):
        limits = ceilings(args)
    for row in limits:
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": info, "cases": results, "ceilings": limits}, indent=2)
        )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
