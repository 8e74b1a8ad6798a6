"""One maintainer at a time on a shared S3 table (appliance/lake/lease.py), with takeover.

On moto's S3 server (tests/s3server.py). The first tests drive the lease of
two nodes directly with their own clocks; the last runs two appliance
processes on one S3 table with a short maintenance schedule, SIGKILLs the
one that maintains, and sees the other take over once the lease ran out.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

from appliance.lake.lease import MaintenanceLease, lease_applies
from appliance.lake.table import EventsTable
from tests.s3server import S3Server
from tests.support.service import start_appliance

#: The lease of the process test, in seconds: short, so the takeover comes soon.
LEASE_SECONDS = 4
#: Seconds the process test waits for a log line.
WAIT_SECONDS = 90


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _table(s3_server: S3Server) -> tuple[str, dict[str, str]]:
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    EventsTable(uri, options).open_or_create()
    return uri, options


def test_one_holder_until_its_lease_runs_out(s3_server: S3Server) -> None:
    uri, options = _table(s3_server)
    clock_a, clock_b = Clock(), Clock()
    a = MaintenanceLease(EventsTable(uri, options), 60, clock=clock_a)
    b = MaintenanceLease(EventsTable(uri, options), 60, clock=clock_b)
    assert a.acquire() is None
    refusal = b.acquire()
    assert refusal is not None
    assert "another node holds the maintenance lease" in refusal
    clock_a.now += 30
    assert a.acquire() is None  # the holder renews
    clock_b.now += 60  # only 30 s after the renewal: still A's
    assert b.acquire() is not None
    clock_b.now += 31  # 61 s after A's last claim: A is presumed dead
    assert b.acquire() is None
    assert a.acquire() is not None  # and A, back, waits its turn


def _claim(
    lease: MaintenanceLease, outcomes: list[str | None], index: int, start: threading.Barrier
) -> None:
    start.wait()
    outcomes[index] = lease.acquire()


def test_claims_at_the_same_moment_leave_one_holder(s3_server: S3Server) -> None:
    """Both nodes see the lease free and claim at once: Delta's conflict check keeps one."""
    for _ in range(5):
        uri, options = _table(s3_server)
        nodes = [MaintenanceLease(EventsTable(uri, options), 60) for _ in range(2)]
        outcomes: list[str | None] = [None, None]
        threads = [
            threading.Thread(target=_claim, args=(nodes[i], outcomes, i, start))
            for i, start in enumerate([threading.Barrier(2)] * 2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        holders = [i for i, refusal in enumerate(outcomes) if refusal is None]
        assert len(holders) == 1, outcomes
        lease = EventsTable(uri, options)
        lease.open_or_create()
        assert lease.lease("maintenance").token == nodes[holders[0]].token


def test_the_lease_applies_to_object_storage_by_default() -> None:
    assert lease_applies("auto", "s3://bucket/events")
    assert not lease_applies("auto", "/var/lib/appliance/lake/events")
    assert not lease_applies("auto", "file:///var/lib/appliance/lake/events")
    assert lease_applies("on", "/srv/shared-nfs/events")
    assert not lease_applies("off", "s3://bucket/events")


def _wait_for(path: Path, pattern: str, after: int = 0) -> str:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        text = path.read_text()[after:]
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return found.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in {path} within {WAIT_SECONDS}s:\n{text[-3000:]}")


def test_another_node_takes_over_when_the_holder_is_killed(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    lake = f'path = "{uri}"\n{s3_server.toml_options()}'
    schedule = (
        "[maintenance]\ncompact_interval_seconds = 1\ncheckpoint_interval_seconds = 3600\n"
        f"vacuum_interval_seconds = 86400\nlease_seconds = {LEASE_SECONDS}\n"
    )
    first = start_appliance(tmp_path, {"forward": ""}, schedule, index=0, lake=lake)
    second = None
    try:
        _wait_for(first.log_path, r"event=maintenance\.done operation=compact")
        second = start_appliance(tmp_path, {"forward": ""}, schedule, index=1, lake=lake)
        # While the first holds the lease, the second skips every turn.
        _wait_for(second.log_path, r"event=maintenance\.skipped .*maintenance lease")
        assert "event=maintenance.done" not in second.log_path.read_text()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(30)
        mark = len(second.log_path.read_text())
        _wait_for(second.log_path, r"event=maintenance\.done operation=compact", after=mark)
    finally:
        if first.process.poll() is None:
            first.stop()
        if second is not None:
            second.stop()
