"""The commit-and-check protocol on a simulated table: its outcomes, one by one.

The real-table interleavings are in test_exactly_once.py; here a table in
memory makes each storage answer (a lost race, an unknown outcome, a failed
read) happen exactly when the test says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from appliance.blocks.identity import BatchDigest
from appliance.lake.commit_info import CommitBatches
from appliance.lake.dedupe import StoredBatches
from appliance.lake.errors import AppIdInUse, CommitConflict, CommitError, LakeError
from appliance.lake.exactly_once import FREE_CONFLICTS, ExactlyOnce
from appliance.lake.table import TableChanges

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


class SimTable:
    """A table log in memory, and a script of what the next calls do."""

    def __init__(self) -> None:
        self.commits: list[CommitBatches] = []
        self.done: dict[str, int] = {}
        #: Per write call: None (succeed), or "conflict" / "lost" / "landed".
        self.script: list[str | None] = []
        self.read_failures = 0
        self.failures: list[str] = []
        self.writes: list[tuple[list[int], int]] = []
        #: Whether an attempt holds the table (SimStorage.exclusive), and what happened in turn.
        self.held = False
        self.events: list[str] = []

    def other(self, app_id: str, *digests: BatchDigest) -> None:
        self.commits.append(CommitBatches(len(self.commits), digests, app_id, 1))

    def storage(self, app_id: str) -> SimStorage:
        return SimStorage(self, app_id)


class SimStorage:
    def __init__(self, table: SimTable, app_id: str) -> None:
        self.t = table
        self.app_id = app_id

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        assert not self.t.held
        self.t.held = True
        self.t.events.append("hold")
        try:
            yield
        finally:
            self.t.held = False
            self.t.events.append("let go")

    async def changes_since(self, checked: int) -> TableChanges:
        assert self.t.held
        self.t.events.append("check")
        if self.t.read_failures:
            self.t.read_failures -= 1
            raise LakeError("503 SlowDown")
        latest = len(self.t.commits) - 1
        return TableChanges(
            latest, self.t.done.get(self.app_id), [c for c in self.t.commits if c.version > checked]
        )

    async def write(
        self, keep: Sequence[int], read_version: int, sequence: int, digests: list[BatchDigest]
    ) -> None:
        assert self.t.held
        self.t.events.append("put")
        self.t.writes.append((list(keep), read_version))
        step = self.t.script.pop(0) if self.t.script else None
        if step == "conflict":
            self.t.other("node-z")  # someone else took the version
            raise CommitConflict("taken")
        if read_version != len(self.t.commits) - 1:
            raise CommitConflict("moved")
        if step == "lost":
            raise CommitError("timeout, nothing written")
        self.t.commits.append(
            CommitBatches(len(self.t.commits), tuple(digests), self.app_id, sequence)
        )
        self.t.done[self.app_id] = sequence
        if step == "landed":
            raise CommitError("timeout after the put")

    async def failed(self, error: LakeError, attempt: int) -> None:
        assert not self.t.held
        self.t.events.append("wait")
        self.t.failures.append(f"{type(error).__name__}:{attempt}")

    async def conflicted(self, conflicts: int, error: CommitConflict) -> None:
        assert not self.t.held
        self.t.events.append("wait")
        self.t.failures.append(f"conflict:{conflicts}")

    def recovered(self) -> None:
        pass


def protocol(table: SimTable, app_id: str = "node-a") -> ExactlyOnce:
    checked = len(table.commits) - 1
    return ExactlyOnce(app_id, StoredBatches(3600, 1000), checked, 1, trio.current_time)


@pytest.mark.trio
async def test_a_batch_another_writer_committed_since_the_check_is_left_out() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.other("node-b", B)
    outcome = await eo.commit([A, B, None], table.storage("node-a"), must_commit=False)
    assert outcome.stored_elsewhere == frozenset({1})
    assert table.writes == [([0, 2], 1)]
    assert eo.checked == 2
    assert eo.sequence == 2


@pytest.mark.trio
async def test_a_lost_race_is_read_and_checked_again() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.script = ["conflict"]
    outcome = await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert outcome.committed
    assert eo.lost_races == 1
    assert [w[1] for w in table.writes] == [0, 1]  # the retry is for the version after the winner
    assert table.failures == []  # a lone lost race costs no backoff


@pytest.mark.trio
async def test_writers_that_keep_colliding_back_off() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.script = ["conflict"] * (FREE_CONFLICTS + 2)
    await eo.commit([A], table.storage("node-a"), must_commit=False)
    # Lost races back off a little, and never count as storage failures.
    assert table.failures == ["conflict:1", "conflict:2"]


@pytest.mark.trio
async def test_each_attempt_checks_and_puts_in_one_hold_and_waits_outside_it() -> None:
    """Nothing of the writer's comes between a check and its put; a backoff holds nothing."""
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.read_failures = 1
    table.script = ["conflict"] * (FREE_CONFLICTS + 1) + ["lost"]
    await eo.commit([A], table.storage("node-a"), must_commit=False)
    attempt = ["hold", "check", "put", "let go"]
    assert table.events == [
        *["hold", "check", "let go", "wait"],  # the failed read
        *attempt * FREE_CONFLICTS,  # lost races, retried at once
        *attempt, "wait",  # one more: backs off
        *attempt, "wait",  # nothing written: backs off
        *attempt,  # committed
    ]  # fmt: skip


@pytest.mark.trio
async def test_an_attempt_that_landed_unseen_is_not_written_again() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.script = ["landed"]
    outcome = await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert outcome.committed
    assert len(table.writes) == 1  # the unknown outcome was settled by the table
    assert eo.sequence == 2
    assert eo.stored.contains(A, trio.current_time())


@pytest.mark.trio
async def test_an_attempt_that_did_not_land_is_tried_again() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.script = ["lost"]
    await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert len(table.writes) == 2
    assert table.failures == ["CommitError:1"]
    assert [c.app_id for c in table.commits] == ["seed", "node-a"]


@pytest.mark.trio
async def test_a_commit_under_this_app_id_never_attempted_stops_the_writer() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.done["node-a"] = 1  # a clone of this node committed sequence 1
    with pytest.raises(AppIdInUse):
        await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert table.writes == []


@pytest.mark.trio
async def test_a_failed_read_is_retried() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.read_failures = 2
    outcome = await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert outcome.committed
    assert table.failures == ["LakeError:1", "LakeError:2"]


@pytest.mark.trio
async def test_nothing_left_commits_only_when_a_position_must_be_recorded() -> None:
    table = SimTable()
    table.other("seed")
    eo = protocol(table)
    table.other("node-b", A)
    skipped = await eo.commit([A], table.storage("node-a"), must_commit=False)
    assert not skipped.committed
    assert table.writes == []
    table.other("node-b", C)
    recorded = await eo.commit([C], table.storage("node-a"), must_commit=True)
    assert recorded.committed
    assert table.writes == [([], 2)]


@pytest.mark.trio
async def test_a_clone_that_took_the_lease_stops_the_writer_after_a_lost_race() -> None:
    """A stalled writer whose app id a clone claimed never takes the clone's commit as its own."""
    table = SimTable()
    table.other("seed")
    eo = ExactlyOnce("node-a", StoredBatches(3600, 1000), 0, 1, trio.current_time, token=7)
    storage = table.storage("node-a")
    table.script = ["conflict"]

    real_changes = storage.changes_since
    calls: list[int] = []

    async def clone_after_first(checked: int) -> TableChanges:
        changes = await real_changes(checked)
        calls.append(checked)
        if len(calls) == 2:
            # Meanwhile the clone claimed the app id and committed sequence 1.
            table.done["node-a"] = 1
            return TableChanges(changes.version, 1, changes.commits, writer=99)
        return TableChanges(changes.version, changes.done, changes.commits, writer=7)

    storage.changes_since = clone_after_first  # type: ignore[method-assign]
    with pytest.raises(AppIdInUse):
        await eo.commit([A], storage, must_commit=False)
