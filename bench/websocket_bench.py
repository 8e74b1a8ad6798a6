"""WebSocket live tail benchmark: forward ingest throughput with and without a stalled tail.

Runs the service in-process (real TLS, real Delta table, real auth database)
with a forward and a WebSocket listener. Each case sends PackedForward chunks
with ack over ``--connections`` TLS connections for ``--duration`` seconds and
reports events/s:

* ``no tail``: nobody watches;
* ``stalled tail``: an admin tail client subscribed to every event that never
  reads, so its socket buffers fill and its queue (``tail_queue_events``)
  overflows: the service drops and counts, and ingest must not slow down.

It reports; it never asserts a time. It exits 1 only if the table does not
hold exactly the acknowledged events.

    .venv/bin/python -m bench.websocket_bench --duration 8
"""

from __future__ import annotations

import argparse
import json
import ssl
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--batch", type=int, default=1000, help="records per chunk")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--tail-queue", type=int, default=10_000, help="tail_queue_events")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results = []
    for tail in (False, True, False, True):
        result = trio.run(run_case, tail, args)
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
