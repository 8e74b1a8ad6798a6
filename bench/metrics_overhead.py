"""What the metrics cost per event: one forward connection in-process, metrics on vs off.

``python -m bench.forward_bench --no-metrics`` compares whole servers, but on a machine
shared with other work its run-to-run spread (tens of percent) hides a cost
of a few percent. This bench isolates what the metrics touch: the real
forward handler (``StreamHandler`` + ``ForwardSession``: reads, codec, rows,
queued acks) over an in-memory stream, with a writer that commits at once,
run with the listener's metrics on (a ``Metrics`` registry) and off (the
no-op ``NULL_LISTENER``), alternately, and measured in CPU time of this
process (``time.process_time``), which other processes disturb far less than
wall time.

TLS, the kernel's socket work and the Delta commit are not in it, so the
per-event CPU here is a fraction of a whole server's, and the percentage is
an upper bound of the metrics' share of a real server's CPU per event.
Reports, never asserts.

    .venv/bin/python -m bench.metrics_overhead [--batches 1,100] [--events 50000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import msgpack
import trio
import trio.testing

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.config import ForwardListenerConfig
from appliance.lake.writer import CommitTicket
from appliance.metrics import NULL_LISTENER, ListenerMetrics, Metrics
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.forward import forward_handler
from bench import harness


class InstantWriter:
    """Checks each block as the real writer does and commits it at once."""

    async def submit(self, block: RowBlock) -> CommitTicket:
        check_block(block)
        ticket = CommitTicket()
        ticket._resolve()
        return ticket


def requests(batch: int, count: int) -> list[bytes]:
    now = int(time.time())
    entries = [
        [now, {"host": "web-01", "level": "info", "seq": i, "msg": "x" * 60}] for i in range(batch)
    ]
    return [harness.packed_forward("bench.tag", entries, f"c{n:08d}") for n in range(count)]


async def one_run(payloads: list[bytes], metrics: ListenerMetrics) -> float:
    """CPU seconds of serving ``payloads`` on one connection (client included, same both ways)."""
    context = ServiceContext(InstantWriter(), Lifecycle())  # type: ignore[arg-type]
    handler = forward_handler(ForwardListenerConfig(max_pending_acks=64), context)
    info = ConnectionInfo("bench", "192.0.2.1", 5000, True, metrics=metrics)
    client, server = trio.testing.memory_stream_pair()
    started = time.process_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, server, info)

        async def send() -> None:
            for payload in payloads:
                await client.send_all(payload)

        nursery.start_soon(send)
        unpacker = msgpack.Unpacker()
        acks = 0
        while acks < len(payloads):
            unpacker.feed(await client.receive_some(65536))
            acks += sum(1 for _ in unpacker)
        await client.aclose()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,100", help="events per request (1,100)")
    parser.add_argument(
        "--events", type=int, default=50_000, help="events per run (at least 2000 requests)"
    )
    parser.add_argument("--rounds", type=int, default=9, help="on/off pairs per batch")
    parser.add_argument(
        "--only",
        choices=("on", "off"),
        help="one run of one side and exit, for an instruction count that other processes "
        "cannot disturb: valgrind --tool=callgrind python -m bench.metrics_overhead --only on",
    )
    args = parser.parse_args()
    if args.only is not None:
        batch = int(args.batches.split(",")[0])
        payloads = requests(batch, max(1, args.events // batch))
        trio.run(one_run, payloads[:10], NULL_LISTENER)  # warm-up: first-call costs
        listener = Metrics(process=False).listener("bench", "forward")
        trio.run(one_run, payloads, listener if args.only == "on" else NULL_LISTENER)
        return 0
    print("metrics on vs off, CPU per event of the forward driver in-process (median of rounds)")
    for batch in (int(b) for b in args.batches.split(",")):
        count = max(2000, args.events // batch)
        payloads = requests(batch, count)
        on: list[float] = []
        off: list[float] = []
        trio.run(one_run, payloads[:100], NULL_LISTENER)  # warm-up
        for round_ in range(args.rounds):
            listener = Metrics(process=False).listener("bench", "forward")
            # Alternate which goes first, and start each from a collected heap,
            # so neither side inherits the other's garbage or warm caches.
            for side in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                gc.collect()
                seconds = trio.run(one_run, payloads, listener if side == "on" else NULL_LISTENER)
                (on if side == "on" else off).append(seconds / (count * batch))
        m_on, m_off = statistics.median(on), statistics.median(off)
        pairs = sorted(a / b - 1 for a, b in zip(on, off, strict=True))
        print(
            f"  batch {batch:>4}: {count} requests x {args.rounds} rounds; "
            f"on {m_on * 1e6:.2f} us/event, off {m_off * 1e6:.2f} us/event, "
            f"cost {100 * (m_on / m_off - 1):+.2f}% "
            f"(pairwise: median {100 * statistics.median(pairs):+.2f}%, "
            f"range {100 * pairs[0]:+.2f}% .. {100 * pairs[-1]:+.2f}%)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
