"""Two writers, one table, one batch id: stored once in every interleaving.

The commit-and-check protocol (appliance/lake/exactly_once.py) against a
real table, on the local disk and on S3 (moto's server on loopback). Each
interleaving is forced with gates in the table's worker-thread calls, so
the order is the test's, not the scheduler's:

* the second writer checks before the first commits;
* both check, then both put the same table version at once (one loses);
* both writers' final drains at shutdown, each holding the batch in its log.

Each fails if the check is taken out (a writer that commits without reading
the commits it lost to stores the batch twice).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import trio
from deltalake import DeltaTable

from appliance.blocks.block import RowBlock
from appliance.blocks.identity import batch_digest, dedupe_key
from appliance.lake.commit_info import COMMIT_INFO_KEY, commit_metadata, read_commit_info
from appliance.lake.committer import TableCommitter
from appliance.lake.errors import CommitError
from appliance.lake.schema import EVENTS_SCHEMA
from appliance.lake.settings import WriterSettings
from appliance.lake.table import EventsTable, TableChanges
from appliance.lake.writer import LakeWriter
from appliance.wal.log import WriteAheadLog
from appliance.wal.settings import WalSettings
from tests.s3server import S3Server
from tests.spark.helpers import block

#: Seconds a gated worker thread waits for the test to open its gate.
GATE_SECONDS = 60.0
SETTINGS = WriterSettings(retry_initial_seconds=0.01, retry_max_seconds=0.05)


class Gate:
    """A one-shot hook for a worker thread: say it arrived, then wait to be let through."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.open = threading.Event()
        self._used = False

    def __call__(self) -> None:
        if self._used:
            return
        self._used = True
        self.arrived.set()
        if not self.open.wait(GATE_SECONDS):
            raise AssertionError("the test never opened the gate")

    async def reached(self) -> None:
        if not await trio.to_thread.run_sync(self.arrived.wait, GATE_SECONDS):
            raise AssertionError("the writer never reached the gate")


class GatedTable(EventsTable):
    """An events table whose check and commit can be held at the test's will."""

    def __init__(
        self,
        uri: str,
        options: dict[str, str] | None,
        *,
        after_check: Callable[[], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(uri, options)
        self.after_check = after_check
        self.before_commit = before_commit

    def changes_since(self, checked: int, app_id: str) -> TableChanges:
        changes = super().changes_since(checked, app_id)
        if self.after_check is not None:
            self.after_check()
        return changes

    def commit(self, data: pa.Table, *args: Any, **kwargs: Any) -> bool:
        if kwargs.get("read_version") is not None and self.before_commit is not None:
            self.before_commit()
        return super().commit(data, *args, **kwargs)


@pytest.fixture(params=["local", "s3"])
def table_at(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str] | None]]:
    """Where the shared table lives: a local directory, or an S3 bucket on moto."""
    if request.param == "local":
        yield str(tmp_path / "events"), None
        return
    s3: S3Server = request.getfixturevalue("s3_server")
    yield f"s3://{s3.bucket()}/events", s3.storage_options()


def the_batch() -> RowBlock:
    """The chunk a client sent to one writer, then resent to the other."""
    return block(source="client-1", batch_id="chunk-x", records=[{"n": 1}, {"n": 2}])


def stored(uri: str, options: Mapping[str, str] | None) -> list[str | None]:
    table = DeltaTable(uri, storage_options=dict(options) if options else None)
    return list(table.to_pyarrow_table(columns=["batch_id"]).column("batch_id").to_pylist())


async def opened(table: EventsTable, app_id: str) -> TableCommitter:
    committer = TableCommitter(table, app_id, SETTINGS, token=hash(app_id) & 0xFFFF_FFFF)
    await committer.open()
    return committer


@pytest.mark.trio
async def test_the_second_writer_checks_before_the_first_commits(
    table_at: tuple[str, dict[str, str] | None],
) -> None:
    uri, options = table_at
    gate = Gate()
    first = await opened(EventsTable(uri, options), "node-a")
    second = await opened(GatedTable(uri, options, before_commit=gate), "node-b")
    outcomes: list[Any] = []

    async with trio.open_nursery() as nursery:

        async def second_writer() -> None:
            outcomes.append(await second.commit_group([the_batch()]))

        nursery.start_soon(second_writer)
        await gate.reached()  # the second has checked: the batch was nowhere
        await first.commit_group([the_batch()])
        gate.open.set()

    assert stored(uri, options) == ["chunk-x", "chunk-x"]  # the chunk's two rows, once
    assert outcomes[0].stored_elsewhere == frozenset({0})
    assert second.lost_races == 1
    assert second.stored_elsewhere == 1


@pytest.mark.trio
async def test_both_writers_put_the_same_version_and_one_loses(
    table_at: tuple[str, dict[str, str] | None],
) -> None:
    uri, options = table_at
    checked = threading.Barrier(2, timeout=GATE_SECONDS)
    writers = [
        await opened(GatedTable(uri, options, before_commit=_once(checked.wait)), app_id)
        for app_id in ("node-a", "node-b")
    ]

    async with trio.open_nursery() as nursery:
        for writer in writers:
            nursery.start_soon(writer.commit_group, [the_batch()])

    assert stored(uri, options) == ["chunk-x", "chunk-x"]
    assert sorted(w.lost_races for w in writers) == [0, 1]
    assert sorted(w.stored_elsewhere for w in writers) == [0, 1]


@pytest.mark.trio
async def test_both_writers_drain_their_logs_at_once(
    table_at: tuple[str, dict[str, str] | None], tmp_path: Path
) -> None:
    """Each writer acked the chunk from its log; they stop together: stored once."""
    uri, options = table_at
    checked = threading.Barrier(2, timeout=GATE_SECONDS)
    slow = WriterSettings(
        commit_interval_seconds=3600, retry_initial_seconds=0.01, retry_max_seconds=0.05
    )
    writers = []
    for app_id in ("node-a", "node-b"):
        table = GatedTable(uri, options)
        wal = WriteAheadLog(tmp_path / app_id / "wal", WalSettings())
        writers.append((LakeWriter(table, app_id, slow, wal=wal), table))

    async with trio.open_nursery() as nursery:
        for writer, _ in writers:
            await writer.open()
            nursery.start_soon(writer.run)
        for writer, _ in writers:
            ticket = await writer.submit(the_batch())
            await ticket.wait()  # acked from the log
        for _, table in writers:
            # From now on each writer's check waits for the other's: both check
            # before either commits.
            table.after_check = _once(checked.wait)
        for writer, _ in writers:
            nursery.start_soon(writer.close_input)

    assert stored(uri, options) == ["chunk-x", "chunk-x"]
    assert sorted(w.skipped_duplicates for w, _ in writers) == [0, 1]
    assert sum(w.lost_races for w, _ in writers) == 1


def test_every_data_commit_names_its_batches(tmp_path: Path) -> None:
    """The digests a commit writes are the ones another writer reads back."""
    uri = str(tmp_path / "events")
    batch = the_batch()

    async def main() -> None:
        committer = await opened(EventsTable(uri), "node-a")
        await committer.commit_group([batch, block(batch_id=None)])

    trio.run(main)
    history = DeltaTable(uri).history(1)
    assert COMMIT_INFO_KEY in history[0]
    named = read_commit_info(int(history[0]["version"]), history[0])
    key = dedupe_key(batch)
    assert key is not None
    assert named.digests == (batch_digest(key),)
    assert named.app_id == "node-a"
    assert named.sequence == 1


def _once(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` on the first call only (a retry after a lost race must not wait again)."""
    done: list[bool] = []

    def call() -> None:
        if not done:
            done.append(True)
            fn()

    return call


class _AfterRefresh:
    """A DeltaTable whose next refresh lets other commits land right after it."""

    def __init__(self, inner: Any, hook: Callable[[], None]) -> None:
        self._inner = inner
        self._hook: Callable[[], None] | None = hook

    def update_incremental(self) -> None:
        self._inner.update_incremental()
        if self._hook is not None:
            hook, self._hook = self._hook, None
            hook()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_commits_landing_during_the_read_are_numbered_right(tmp_path: Path) -> None:
    """Two commits land between the refresh and the history read: none is skipped."""
    uri = str(tmp_path / "events")
    reader = EventsTable(uri)
    reader.open_or_create()
    other = EventsTable(uri)
    other.open_or_create()

    def commit_named(sequence: int, key: tuple[str, str, str]) -> None:
        other.commit(
            EVENTS_SCHEMA.empty_table(), "node-b", sequence,
            metadata=commit_metadata([batch_digest(key)], "node-b", sequence),
        )  # fmt: skip

    commit_named(1, ("forward", "c", "before"))
    checked = 0
    reader._table = _AfterRefresh(  # type: ignore[assignment]
        reader._dt,
        lambda: (commit_named(2, ("forward", "c", "x")), commit_named(3, ("forward", "c", "y"))),
    )
    changes = reader.changes_since(checked, "node-a")
    assert [c.version for c in changes.commits] == [1, 2, 3]
    assert [c.sequence for c in changes.commits] == [1, 2, 3]
    assert changes.version == 3
    assert changes.commits[1].digests == (batch_digest(("forward", "c", "x")),)


class _LatePut(EventsTable):
    """A writer whose next put fails with an unknown outcome, and lands during its next check.

    The put is held back (an S3 PUT still in flight after the client gave
    up) and lands between the next check's refresh and its history read, as
    another writer's commit landed just before that check.
    """

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.fail_next_put = False
        self.held: tuple[Any, ...] | None = None
        self.other = EventsTable(uri)
        self.returned: list[bool] = []

    def commit(  # type: ignore[override]
        self, data: pa.Table, app_id: str, version: int, token: int | None = None,
        now_ms: int | None = None, also: Any = (), *, read_version: int | None = None,
        metadata: Any = None,
    ) -> bool:  # fmt: skip
        if read_version is not None and self.fail_next_put:
            self.fail_next_put = False
            self.held = (data, app_id, version, token, now_ms, also, metadata)
            raise CommitError("no answer to the put (it is still in flight)")
        done = super().commit(
            data, app_id, version, token, now_ms, also, read_version=read_version,
            metadata=metadata,
        )  # fmt: skip
        self.returned.append(done)
        return done

    def changes_since(self, checked: int, app_id: str) -> TableChanges:
        if self.held is None:
            return super().changes_since(checked, app_id)
        data, app, version, token, now_ms, also, metadata = self.held
        self.held = None
        real, other = self._dt, self.other
        other.commit(EVENTS_SCHEMA.empty_table(), "node-c", 1,
                     metadata=commit_metadata([], "node-c", 1))  # fmt: skip

        class LandsAfterTheRefresh:
            first = True

            def update_incremental(self) -> None:
                real.update_incremental()
                if self.first:
                    self.first = False
                    other.commit(data, app, version, token, now_ms, also, metadata=metadata)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        self._table = LandsAfterTheRefresh()  # type: ignore[assignment]
        try:
            return super().changes_since(checked, app_id)
        finally:
            self._table = real


@pytest.mark.trio
async def test_a_put_that_lands_late_during_a_check_is_settled_not_skipped_past(
    tmp_path: Path,
) -> None:
    """An earlier attempt's put lands while the retry checks: the check must say so (the
    commit is done), not put after it; else the writer's next check starts a version too
    late, never reads the commit there, and stores its batch again."""
    uri = str(tmp_path / "events")
    late = _LatePut(uri)
    a = await opened(late, "node-a")
    b = await opened(EventsTable(uri), "node-b")
    await trio.to_thread.run_sync(late.other.open_or_create)
    late.fail_next_put = True
    await a.commit_group([the_batch()])
    assert False not in late.returned  # never a put taken for one that was not written
    # Another writer stores a chunk whose ack is lost; its client resends it to A.
    resent = block(source="client-2", batch_id="chunk-y", records=[{"n": 1}])
    await b.commit_group([resent])
    await a.commit_group([block(source="client-2", batch_id="chunk-y", records=[{"n": 1}])])
    ids = stored(uri, None)
    assert ids.count("chunk-x") == 2  # its two rows, once
    assert ids.count("chunk-y") == 1
