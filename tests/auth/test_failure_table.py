"""The failure counts every process of a node shares: one small file, never a denial of service.

Two :class:`FailureTable` objects on one path hold two open file
descriptions, as two worker processes do, so ``flock`` excludes them from
each other; one test also runs real processes. Time is a fake clock.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from auth.failure_table import (
    BUCKET_SLOTS,
    FALLBACK_SECONDS,
    TABLE_SLOTS,
    FailureTable,
    FailureTableError,
    SharedCounts,
    table_path,
)
from auth.ratelimit import GuessLimiter, GuessRules, LimiterSettings, Record

ATTACKER = "198.51.100.66"
RULES = GuessRules.of(LimiterSettings())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def attempt(limiter: GuessLimiter, username: str, *, good: bool) -> bool:
    if limiter.begin(ATTACKER, username) > 0:
        return False
    if good:
        limiter.success(ATTACKER, username)
    else:
        limiter.failure(ATTACKER, username)
    return True


def test_two_workers_share_their_counts(tmp_path: Path) -> None:
    """Guesses at bob land on either worker; a login between them resets nothing."""
    path = table_path(tmp_path)
    clock = Clock()
    workers = [GuessLimiter(RULES, FailureTable.open(path), clock) for _ in range(2)]
    let_through = []
    for n in range(12):
        worker = workers[n % 2]
        let_through.append(attempt(worker, "bob", good=False))
        if n % 3 == 2:
            assert attempt(workers[(n + 1) % 2], "alice", good=True)
    assert let_through[:4] == [True] * 4
    assert not any(let_through[4:])
    assert workers[0].retry_after(ATTACKER, "bob") == workers[1].retry_after(ATTACKER, "bob") > 0


def _count_many(path: str, times: int) -> None:
    """A worker process: count ``times`` failures of one key, one transaction each.

    The others hammer the lock meanwhile: a wait past LOCK_WAIT_SECONDS (a
    loaded machine) is an error the service would answer by counting in
    memory; here the worker simply tries again.
    """
    while True:
        try:
            table = FailureTable.open(Path(path))
            break
        except FailureTableError:
            continue

    def bump(records: list[Record]) -> None:
        records[0].failures += 1

    for _ in range(times):
        while True:
            try:
                table.transact(["one key"], bump, 1.0)
                break
            except FailureTableError:
                continue


def test_processes_never_lose_a_count(tmp_path: Path) -> None:
    path = table_path(tmp_path)
    FailureTable.open(path).close()
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_count_many, args=(str(path), 300)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    seen: list[int] = []
    FailureTable.open(path).transact(["one key"], lambda r: seen.append(r[0].failures), 1.0)
    assert seen == [900]


def test_the_file_is_private_fixed_in_size_and_holds_no_name(tmp_path: Path) -> None:
    path = table_path(tmp_path)
    limiter = GuessLimiter(RULES, FailureTable.open(path), Clock())
    for n in range(200):
        limiter.record_failure(f"2001:db8:{n:x}::1", f"user-{n}")
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_size == 64 + TABLE_SLOTS * 64
    data = path.read_bytes()
    assert b"user-1" not in data
    assert b"2001:db8" not in data


def test_a_full_bucket_gives_up_its_least_recently_written(tmp_path: Path) -> None:
    table = FailureTable.open(table_path(tmp_path), slots=BUCKET_SLOTS)  # one bucket

    def bump(records: list[Record]) -> None:
        records[0].failures += 1

    for n in range(BUCKET_SLOTS + 1):
        table.transact([f"key-{n}"], bump, float(n))
    counts: dict[str, int] = {}
    for n in range(BUCKET_SLOTS + 1):
        counts[f"key-{n}"] = table.transact([f"key-{n}"], lambda r: r[0].failures, 99.0)
    assert counts["key-0"] == 0  # the stalest went
    assert all(counts[f"key-{n}"] == 1 for n in range(1, BUCKET_SLOTS + 1))


def test_a_damaged_table_is_made_anew(tmp_path: Path) -> None:
    path = table_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(b"\xff" * 1000)
    limiter = GuessLimiter(RULES, FailureTable.open(path), Clock())
    assert limiter.retry_after(ATTACKER, "bob") == 0
    assert path.stat().st_size == 64 + TABLE_SLOTS * 64


def test_a_held_lock_makes_a_process_count_in_memory_for_a_while(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process stopped while holding the lock: the others wait boundedly, then count alone."""
    path = table_path(tmp_path)
    clock = Clock()
    counts = SharedCounts(path)
    limiter = GuessLimiter(RULES, counts, clock)
    assert counts.open(clock())
    assert attempt(limiter, "bob", good=False)
    stuck = os.open(path, os.O_RDWR)
    fcntl.flock(stuck, fcntl.LOCK_EX)
    try:
        with caplog.at_level(logging.WARNING, logger="appliance.auth"):
            # Refused or not, every answer comes (LOCK_WAIT_SECONDS each): never stuck.
            let_through = [attempt(limiter, "bob", good=False) for _ in range(6)]
        assert not counts.shared
        # The memory limits alone: four let through, then refused.
        assert let_through == [True] * 4 + [False] * 2
        events = [r for r in caplog.records if r.getMessage() == "auth.failure_table_unavailable"]
        assert len(events) == 1  # once per fallback, not per attempt
        assert "lock" in events[0].fields["reason"]  # type: ignore[attr-defined]
    finally:
        os.close(stuck)
    clock.now += FALLBACK_SECONDS + 1
    assert attempt(limiter, "carol", good=False)
    assert counts.shared


def test_a_table_that_cannot_be_opened_falls_back_to_memory(tmp_path: Path) -> None:
    (tmp_path / "auth").write_text("a file where the directory should be")
    counts = SharedCounts(table_path(tmp_path))
    limiter = GuessLimiter(RULES, counts, Clock())
    assert not counts.open()
    let_through = [attempt(limiter, "bob", good=False) for _ in range(6)]
    assert let_through == [True] * 4 + [False] * 2
    with pytest.raises(FailureTableError, match="cannot open"):
        FailureTable.open(table_path(tmp_path))
