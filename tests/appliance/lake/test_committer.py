"""The committer's commits stay live while others use the table around them.

A node's commit checks the table (``changes_since``) and then puts the
next version. Its table maintenance (compaction, checkpoints, vacuum, each
after a lease claim that is itself a commit) and its lease renewals take
the same one-token limiter. Were the check and the put two turns of that
limiter, a maintenance step queued meanwhile would run between them and
move the table, and the put would lose its race; on a busy node whose
maintenance ran back to back that was every put, for minutes, with not a
line in the log (tests/fleet/test_faulty_store.py caught it). Here that
interleaving is forced: the check's worker thread returns only once every
task waits, so a maintenance step is queued on the limiter at that moment,
every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import trio
import trio.testing

from appliance.lake.commit_info import commit_metadata
from appliance.lake.errors import CommitConflict
from appliance.lake.exactly_once import FREE_CONFLICTS
from appliance.lake.lease import MaintenanceLease
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.lake.table import EventsTable, TableChanges
from tests.appliance.lake.logcapture import logged
from tests.appliance.lake.test_exactly_once import opened, stored, the_batch

#: Maintenance steps the rival runs at most (without the one turn, the
#: commit gets through only once they are spent).
MAINTENANCE_ROUNDS = 6


class QueuedAfterCheck(EventsTable):
    """An events table whose check returns only once every task waits (on the limiter)."""

    def changes_since(self, checked: int, app_id: str) -> TableChanges:
        changes = super().changes_since(checked, app_id)
        trio.from_thread.run(trio.testing.wait_all_tasks_blocked)
        return changes


@pytest.mark.trio
async def test_maintenance_queued_at_every_check_does_not_come_between_check_and_put(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "events")
    committer = await opened(QueuedAfterCheck(uri), "node-a")
    lease = MaintenanceLease(EventsTable(uri), lease_seconds=30)
    rounds = 0
    committed = trio.Event()

    async def maintenance() -> None:
        # As the schedule runs it (appliance/lake/schedule.py): each step,
        # with its lease claim (a commit), through the committer's limiter.
        nonlocal rounds
        while not committed.is_set() and rounds < MAINTENANCE_ROUNDS:
            assert await committer.run_exclusive(lease.acquire) is None
            rounds += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(maintenance)
        await trio.testing.wait_all_tasks_blocked()
        outcome = await committer.commit_group([the_batch()])
        committed.set()

    assert outcome.committed
    assert stored(uri, None) == ["chunk-x", "chunk-x"]
    assert rounds > 0  # maintenance ran beside the commit
    # The check and the put were one turn of the limiter: nothing came between.
    assert committer.lost_races == 0


def commit_as_node_b(table: EventsTable, sequence: int) -> None:
    table.commit(
        EVENTS_SCHEMA.empty_table(), "node-b", sequence,
        metadata=commit_metadata([], "node-b", sequence),
    )  # fmt: skip


class LandsDuringRead(EventsTable):
    """An events table on which another writer commits between the refresh and the history read."""

    def __init__(self, uri: str, other: EventsTable) -> None:
        super().__init__(uri)
        self.other = other
        self.armed = False

    def changes_since(self, checked: int, app_id: str) -> TableChanges:
        if self.armed:
            self.armed = False
            real = self._dt
            other = self.other

            class _Hooked:
                def update_incremental(self) -> None:
                    real.update_incremental()
                    self.update_incremental = real.update_incremental  # type: ignore[method-assign]
                    commit_as_node_b(other, 2)

                def __getattr__(self, name: str) -> Any:
                    return getattr(real, name)

            self._table = _Hooked()  # type: ignore[assignment]
            try:
                return super().changes_since(checked, app_id)
            finally:
                self._table = real
        return super().changes_since(checked, app_id)


@pytest.mark.trio
async def test_a_commit_that_lands_during_the_check_costs_no_lost_race(tmp_path: Path) -> None:
    """The check reads a commit its refresh had not seen: the put goes after it, first time."""
    uri = str(tmp_path / "events")
    other = EventsTable(uri)
    table = LandsDuringRead(uri, other)
    committer = await opened(table, "node-a")
    await trio.to_thread.run_sync(other.open_or_create)
    # One commit to read since the committer's last check, and one more
    # that lands while it reads.
    await trio.to_thread.run_sync(commit_as_node_b, other, 1)
    table.armed = True
    outcome = await committer.commit_group([the_batch()])
    assert outcome.committed
    assert not table.armed  # the commit landed during the check
    assert committer.lost_races == 0
    assert stored(uri, None) == ["chunk-x", "chunk-x"]


class Contended(EventsTable):
    """An events table whose next ``races`` puts each lose to another writer."""

    def __init__(self, uri: str, races: int) -> None:
        super().__init__(uri)
        self.races = races

    def commit(self, data: pa.Table, *args: Any, **kwargs: Any) -> bool:
        if kwargs.get("read_version") is not None and self.races:
            self.races -= 1
            raise CommitConflict("version taken by another writer")
        return super().commit(data, *args, **kwargs)


@pytest.mark.trio
async def test_a_commit_that_keeps_losing_races_says_so(
    tmp_path: Path, info_log: pytest.LogCaptureFixture
) -> None:
    races = FREE_CONFLICTS + 3
    committer = await opened(Contended(str(tmp_path / "events"), races), "node-a")
    outcome = await committer.commit_group([the_batch()])
    assert outcome.committed
    assert committer.lost_races == races
    lines = logged(info_log, "commit.conflict")
    # The races lost in a row past the free ones, each with its wait and why.
    assert [line["lost_races"] for line in lines] == list(range(FREE_CONFLICTS + 1, races + 1))
    assert all(line["commit"] == 1 for line in lines)
    assert all(line["reason"] == "version taken by another writer" for line in lines)
    assert all(0 <= line["retry_in_seconds"] <= 1 for line in lines)
    [through] = logged(info_log, "commit.ok_after_conflicts")
    assert through["lost_races"] == races
    assert through["commit"] == 1
