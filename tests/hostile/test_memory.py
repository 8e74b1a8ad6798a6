"""Memory bounded by the service: requests that once took it to 5 GiB, against ``appliance serve``.

Found on the loopback default (TLS, default limits): one CompressedPackedForward
request of 58 KB (gzip of a record holding 60 million empty maps) raised the
service's RSS from 1.0 to 5.1 GiB before it was refused; four concurrent
uncompressed 15 MB requests of the same shape raised it by 2.2 GiB and were
acked, each storing a 45 MB record. The packaged unit's ``MemoryMax=4G``
would have killed the service for one of them.

Here a real service with two forward listeners at their default limits gets
those requests, on their own loopback addresses, while a well-behaved forward
client (tests/hostile/case.py, ``GoodTraffic``) sends batches and waits for
each ack: the gzip bodies (the record's maps in one array, and in arrays of a
thousand, which no per-array limit stops), then four 15 MB requests at once,
two on each listener, half of them with ``size`` (the fast path's way in).

It holds that every hostile connection is closed with a logged reason and
nothing of it is acked or stored (appliance/protocols/forward/connection.py: a record's
values are counted while it is decoded; appliance/server/decode_budget.py:
every decode's worst case is taken from one budget first), that the good
client is acked before, while and after, and that the service's peak RSS
(``VmHWM``) stays under the unit's ``MemoryHigh`` of 3 GiB. The peak is printed.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.hostile.case import GoodTraffic
from tests.hostile.clients import (
    ForwardGood,
    peer_name,
    read_until_closed,
    send_ignoring_close,
    tls_connect,
)
from tests.hostile.limits import MIB, WAIT_SECONDS, next_address
from tests.hostile.service import BUG_EVENTS, parse_logfmt, peak_rss, reset_peak_rss, rows_from
from tests.support.service import ApplianceProcess, start_appliance

#: The packaged unit's MemoryHigh (packaging/appliance.service).
MEMORY_HIGH_BYTES = 3 * 1024 * MIB
#: Empty maps in the record of the gzip request, and of each uncompressed one.
GZIP_MAPS = 60_000_000
PLAIN_MAPS = 15_000_000
#: Two forward listeners with every limit at its default; no admin listener
#: (its fixed port may be taken on a shared machine).
LISTENERS = {
    "forward_a": 'protocol = "forward"\nudp_heartbeat = false\n',
    "forward_b": 'protocol = "forward"\nudp_heartbeat = false\n',
}


class _Site:
    """What ForwardGood and tls_connect need of a service: its ports and its CA."""

    def __init__(self, app: ApplianceProcess) -> None:
        self.app = app

    def port(self, listener: str) -> int:
        return self.app.ports[listener]

    @property
    def ca_file(self) -> Path:
        return self.app.ca_file


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApplianceProcess]:
    # The default ack mode (the write-ahead log); rows reach the table by the graceful stop.
    running = start_appliance(
        tmp_path_factory.mktemp("memory"), LISTENERS, extra="[admin]\nenabled = false",
        lake='ack = "wal"',
    )  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


def entry(record: bytes) -> bytes:
    """``[EventTime(now), record]`` with the record's msgpack as given."""
    return b"\x92\xd7\x00" + struct.pack(">II", int(time.time()), 0) + record


def flat_maps(n: int) -> bytes:
    """``{"k": [{}, {}, ...]}``: ``n`` empty maps in one array."""
    return b"\x81\xa1k\xdd" + struct.pack(">I", n) + b"\x80" * n


def nested_maps(n: int, per: int = 1000) -> bytes:
    """``{"k": [[{}, ...], ...]}``: ``n`` empty maps in arrays of ``per``."""
    inner = b"\xdc" + struct.pack(">H", per) + b"\x80" * per
    return b"\x81\xa1k\xdd" + struct.pack(">I", n // per) + inner * (n // per)


def request(stream: bytes, chunk: str, **option: Any) -> bytes:
    data: bytes = msgpack.packb(["hostile", stream, {"chunk": chunk, **option}])
    return data


def gzipped(stream: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip member
    return compressor.compress(stream) + compressor.flush()


@dataclass
class Sent:
    """One hostile request on its own connection, and what became of it."""

    listener: str
    data: bytes
    address: str = ""
    peer: str = ""
    received: bytes = b""
    closed: bool = False

    def run(self, site: _Site) -> None:
        self.address = next_address()
        sock = tls_connect(site, self.listener, self.address)  # type: ignore[arg-type]
        self.peer = peer_name(sock)
        try:
            send_ignoring_close(sock, self.data)
            self.received, self.closed = read_until_closed(sock, WAIT_SECONDS)
        finally:
            sock.close()


def send_at_once(site: _Site, requests: list[Sent]) -> None:
    threads = [threading.Thread(target=r.run, args=(site,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS * 2)
    assert not any(thread.is_alive() for thread in threads), "a hostile client hung"


def log_lines(app: ApplianceProcess) -> list[dict[str, str]]:
    return [parse_logfmt(line) for line in app.log().splitlines() if "event=" in line]


def test_requests_that_once_took_gigabytes_stay_under_memory_high(
    app: ApplianceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _Site(app)
    pid = app.process.pid
    flat = entry(flat_maps(GZIP_MAPS))
    gzip_flat = gzipped(flat)
    gzip_nested = gzipped(entry(nested_maps(GZIP_MAPS)))
    del flat
    assert len(gzip_flat) < 64 * 1024  # the 58 KB of the finding
    plain = entry(nested_maps(PLAIN_MAPS))
    assert 14 * MIB < len(plain) < 16 * MIB
    rss_before = reset_peak_rss(pid)
    good = GoodTraffic(lambda: ForwardGood(site, "forward_a"))  # type: ignore[arg-type]
    with good:
        compressed = [
            Sent("forward_a", request(gzip_flat, "gzip-flat", compressed="gzip")),
            Sent("forward_b", request(gzip_nested, "gzip-nested", compressed="gzip", size=1)),
        ]
        send_at_once(site, compressed)
        acked_between = len(good.acked)
        large = [
            Sent(listener, request(plain, f"plain-{i}", **({"size": 1} if i % 2 else {})))
            for i, listener in enumerate(["forward_a", "forward_b"] * 2)
        ]
        send_at_once(site, large)
        acked_during = len(good.acked)
    peak = peak_rss(pid)
    with capsys.disabled():
        print(
            f"\nservice RSS before {rss_before / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB "
            f"(MemoryHigh {MEMORY_HIGH_BYTES / MIB:.0f} MiB); good client acked "
            f"{acked_between} before the 15 MB requests, {acked_during} by their end, "
            f"{len(good.acked)} in all"
        )
    assert app.process.poll() is None, "the service exited"
    assert peak < MEMORY_HIGH_BYTES, f"peak RSS {peak / MIB:.0f} MiB"
    lines = log_lines(app)
    assert not [f for f in lines if f.get("event") in BUG_EVENTS]
    for sent in compressed + large:
        assert sent.closed, f"{sent.peer}: not closed"
        assert b"ack" not in sent.received, f"{sent.peer} was acked: {sent.received!r}"
        reasons = [
            f.get("reason", "")
            for f in lines
            if f.get("event") == "protocol.error" and f.get("peer") == sent.peer
        ]
        assert reasons, f"{sent.peer}: no reason logged"
        assert "record" in reasons[0] or "decode budget" in reasons[0], reasons
    app.stop()  # commits what the log holds
    rows = app.rows()
    good.assert_stored(rows)  # type: ignore[arg-type]
    for sent in compressed + large:
        assert rows_from(rows, sent.address) == []  # type: ignore[arg-type]
