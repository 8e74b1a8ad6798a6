"""The serving process's garbage collection: fewer automatic collections, a young one each second.

Python's cyclic collector runs a young collection whenever 700 more
containers were allocated than freed. Decoding a 1,000-event chunk builds
thousands of containers that live until the chunk becomes rows, so the
default ran young collections within every chunk, and full ones over
everything that survived them. :func:`tune` freezes the start-up objects
(modules, the config: they live as long as the process) out of every
collection and raises the thresholds to
:data:`~appliance.defaults.SERVE_GC_THRESHOLDS`: +15% events per
CPU-second and half the p99 on the forward bench (bench/HISTORY.md,
"2026-11-26, afternoon: third pass on forward throughput").

Garbage without reference cycles is freed at once whatever the
thresholds. Garbage with cycles waits for a collection, and some comes
with every closed connection: trio's ``SSLStream`` refers to itself (its
handshake runner), about 40 KiB a TLS connection with its buffers. Under
the raised thresholds hundreds of closed connections could wait for the
next young collection, so :func:`collect_young` runs one (generations 0
and 1) every :data:`~appliance.defaults.SERVE_GC_YOUNG_INTERVAL_SECONDS`
instead: what a second of connection churn leaves is freed within the
next second, at the cost of one small collection a second.
"""

from __future__ import annotations

import gc

import trio

from appliance import defaults

__all__ = ["collect_young", "tune"]

#: The oldest generation :func:`collect_young` collects (0 and 1: the young ones).
_YOUNG: int = 1


def tune() -> None:
    """Freeze what exists now out of every collection, and raise the thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*defaults.SERVE_GC_THRESHOLDS)


async def collect_young() -> None:
    """Run a young collection every ``SERVE_GC_YOUNG_INTERVAL_SECONDS``, until cancelled."""
    while True:
        await trio.sleep(defaults.SERVE_GC_YOUNG_INTERVAL_SECONDS)
        gc.collect(_YOUNG)
