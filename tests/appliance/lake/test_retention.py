"""Retention by age and erasure on real Delta tables (appliance/lake/retention.py).

Also what ``table stats`` shows (usage.py) and the hand-off of deletes to the
running service (table_requests.py).

Real tables on disk, the real writer and trio's real clock. Nothing asserts a
duration: waits are bounded only to fail a hung test.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import trio
from deltalake import DeltaTable

from appliance.blocks.block import RowBlock
from appliance.commands.progress import ProgressReporter
from appliance.config import (
    Config,
    ConfigError,
    MaintenanceConfig,
    RetentionConfig,
    RetentionRule,
    parse_config,
)
from appliance.lake import operations, retention, schedule, table_requests
from appliance.lake import usage as lake_usage
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.errors import LakeError
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from appliance.state_lock import StateLock
from tests.appliance.lake.logcapture import logged
from tests.support.cli import run_cli

FAST = WriterSettings(
    commit_max_delay_seconds=0.01, retry_initial_seconds=0.05, retry_max_seconds=0.2
)
#: Bound on waits for something the test expects to happen.
PATIENCE_SECONDS = 60
DAY_NS = 86_400 * 10**9
#: Ages (days) of the seeded events: today, recent days, and old ones.
AGES = (0, 1, 2, 3, 6, 8, 10, 40, 41)
#: (protocol, tag, source) of the seeded events, one block of each per age.
KINDS = (
    ("forward", "app.web", "alice"),
    ("forward", "debug.trace", "alice"),
    ("logjam", "app.api", "it's bob"),
)
ROWS_PER_BLOCK = 4


@dataclass(frozen=True)
class Rule:
    max_age_days: int
    tag_prefix: str | None = None
    protocol: str | None = None


def make_block(
    n: int,
    age_days: float,
    protocol: str = "forward",
    tag: str = "app.web",
    source: str = "alice",
    now_ns: int | None = None,
    rows: int = ROWS_PER_BLOCK,
) -> RowBlock:
    now = now_ns if now_ns is not None else time.time_ns()
    at = now - int(age_days * DAY_NS)
    return RowBlock(
        protocol=protocol,
        source=source,
        peer="127.0.0.1:1",
        received_at_ns=now,
        batch_id=f"b-{n}",
        tag=tag,
        host=None,
        times_ns=[at + i for i in range(rows)],
        records=[f'{{"n":{n},"i":{i}}}' for i in range(rows)],
    )


@dataclass
class Seeded:
    uri: str
    today: dt.date
    now_ns: int


def seed(path: Path) -> Seeded:
    """An events table with a block of every kind at every age, one commit each."""
    table = EventsTable(str(path))
    table.open_or_create()
    now = time.time_ns()
    version = 0
    for age in AGES:
        for protocol, tag, source in KINDS:
            version += 1
            block = make_block(version, age, protocol, tag, source, now_ns=now)
            assert table.commit(blocks_to_arrow([block]), "seed", version)
    today = dt.datetime.fromtimestamp(now / 1e9, dt.UTC).date()
    return Seeded(table.uri, today, now)


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return seed(tmp_path / "events")


def rows(uri: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return found


def kept_by_model(
    all_rows: list[dict[str, Any]], today: dt.date, days: int | None, rules: list[Rule]
) -> list[dict[str, Any]]:
    """What a policy keeps, computed row by row in Python (first matching rule wins)."""
    kept = []
    for row in all_rows:
        limit = days
        for rule in rules:
            if (rule.tag_prefix is None or row["tag"].startswith(rule.tag_prefix)) and (
                rule.protocol is None or row["protocol"] == rule.protocol
            ):
                limit = rule.max_age_days
                break
        if limit is None or row["event_date"] >= today - dt.timedelta(days=limit):
            kept.append(row)
    return kept


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["batch_id"], row["record"])


def last_commit_actions(uri: str) -> list[dict[str, Any]]:
    table = DeltaTable(uri)
    entry = Path(uri) / "_delta_log" / f"{table.version():020d}.json"
    return [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]


def protocol_of(uri: str) -> tuple[int, int, Any, Any]:
    p = DeltaTable(uri).protocol()
    return p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features


# -- expire -------------------------------------------------------------------------


def test_expire_removes_exactly_the_old_partitions_with_remove_actions_only(
    seeded: Seeded,
) -> None:
    before = rows(seeded.uri)
    policy = retention.RetentionPolicy(max_age_days=7)
    result = retention.expire(seeded.uri, policy=policy, today=seeded.today)

    cutoff = seeded.today - dt.timedelta(days=7)
    assert result.details["cutoff"] == cutoff.isoformat()
    old_dates = sorted({r["event_date"] for r in before if r["event_date"] < cutoff})
    assert len(old_dates) == 4  # ages 8, 10, 40, 41
    assert result.details["partitions_removed"] == [d.isoformat() for d in old_dates]
    after = rows(seeded.uri)
    assert sorted(map(key, after)) == sorted(key(r) for r in before if r["event_date"] >= cutoff)
    assert result.after.rows == len(after)

    # One commit: delete by partition, only remove actions, nothing rewritten.
    assert result.after.version == result.before.version + 2  # appendOnly=false, then the delete
    history = DeltaTable(seeded.uri).history(2)
    assert history[0]["operation"] == "DELETE"
    assert history[1]["operation"] == "SET TBLPROPERTIES"
    metrics = history[0]["operationMetrics"]
    assert metrics["num_added_files"] == 0
    assert metrics["num_copied_rows"] == 0
    assert metrics["num_removed_files"] == 4 * len(KINDS)
    actions = last_commit_actions(seeded.uri)
    assert not [a for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert len(removes) == 4 * len(KINDS)
    assert {r["partitionValues"]["event_date"] for r in removes} == {
        d.isoformat() for d in old_dates
    }
    assert result.details["files_awaiting_vacuum"] == len(removes)
    assert "vacuum" in result.details["vacuum"]

    # Still readable by every Spark with delta-spark: reader 1 / writer 2, no features.
    assert protocol_of(seeded.uri) == (1, 2, None, None)
    assert DeltaTable(seeded.uri).metadata().configuration["delta.appendOnly"] == "false"


def test_a_second_expire_with_nothing_to_do_writes_no_commit(seeded: Seeded) -> None:
    policy = retention.RetentionPolicy(max_age_days=7, rules=(Rule(2, tag_prefix="debug."),))
    retention.expire(seeded.uri, policy=policy, today=seeded.today)
    version = DeltaTable(seeded.uri).version()
    again = retention.expire(seeded.uri, policy=policy, today=seeded.today)
    assert DeltaTable(seeded.uri).version() == version
    assert again.after.version == version
    assert again.details["partitions_removed"] == []
    assert (
        "rule_delete" not in again.details or again.details["rule_delete"]["num_removed_files"] == 0
    )
    assert again.details["files_awaiting_vacuum"] == 0
    assert protocol_of(seeded.uri) == (1, 2, None, None)


def test_nothing_to_expire_leaves_the_table_append_only(seeded: Seeded) -> None:
    version = DeltaTable(seeded.uri).version()
    result = retention.expire(
        seeded.uri, policy=retention.RetentionPolicy(max_age_days=365), today=seeded.today
    )
    assert result.details["partitions_removed"] == []
    assert DeltaTable(seeded.uri).version() == version
    assert DeltaTable(seeded.uri).metadata().configuration["delta.appendOnly"] == "true"


def test_a_dry_run_says_what_and_changes_nothing(seeded: Seeded) -> None:
    version = DeltaTable(seeded.uri).version()
    policy = retention.RetentionPolicy(max_age_days=7, rules=(Rule(1, tag_prefix="debug."),))
    result = retention.expire(seeded.uri, policy=policy, today=seeded.today, dry_run=True)
    assert DeltaTable(seeded.uri).version() == version
    assert len(result.details["partitions_to_remove"]) == 4
    assert result.details["partition_rows"] == 4 * len(KINDS) * ROWS_PER_BLOCK
    # debug rows of ages 2, 3, 6 are past 1 day but younger than the 7-day horizon.
    assert result.details["rule_rows_to_remove"] == 3 * ROWS_PER_BLOCK
    assert result.before == result.after


@pytest.mark.parametrize(
    ("days", "rules"),
    [
        (7, [Rule(2, tag_prefix="debug.")]),
        # A longer rule: logjam kept 40 days, so old days lose only their other rows.
        (5, [Rule(2, tag_prefix="debug."), Rule(40, protocol="logjam")]),
        # First match wins: debug. forward rows go at 1 day, other forward at 3.
        (None, [Rule(1, tag_prefix="debug.", protocol="forward"), Rule(3, protocol="forward")]),
    ],
)
def test_rules_per_tag_prefix_and_protocol_match_a_row_by_row_model(
    seeded: Seeded, days: int | None, rules: list[Rule]
) -> None:
    before = rows(seeded.uri)
    expected = kept_by_model(before, seeded.today, days, rules)
    assert 0 < len(expected) < len(before)
    policy = retention.RetentionPolicy(days, tuple(rules))
    result = retention.expire(seeded.uri, policy=policy, today=seeded.today)
    assert sorted(map(key, rows(seeded.uri))) == sorted(map(key, expected))
    if result.details.get("partition_delete"):
        assert result.details["partition_delete"]["num_added_files"] == 0
    assert protocol_of(seeded.uri) == (1, 2, None, None)
    version = DeltaTable(seeded.uri).version()
    retention.expire(seeded.uri, policy=policy, today=seeded.today)
    assert DeltaTable(seeded.uri).version() == version, "a second expire committed"


def test_plan_quotes_rule_values_in_its_predicates() -> None:
    rule = Rule(1, tag_prefix="it's")
    actions = {
        "partition.event_date": [dt.date(2026, 1, 1), dt.date(2026, 1, 10)],
        "size_bytes": [10, 10],
        "num_records": [1, 1],
    }
    plan = retention.plan_expire(
        pa.table(actions), retention.RetentionPolicy(30, (rule,)), dt.date(2026, 1, 12)
    )
    assert plan.partition_predicate is None  # nothing older than 30 days
    assert plan.row_predicate is not None
    assert "starts_with(tag, 'it''s')" in plan.row_predicate
    assert "event_date < '2026-01-11'" in plan.row_predicate


def test_retention_config() -> None:
    config = parse_config(
        "[retention]\nmax_age_days = 30\ninterval_seconds = 600\n"
        '[[retention.rules]]\ntag_prefix = "debug."\nmax_age_days = 3\n'
        '[[retention.rules]]\nprotocol = "logjam"\nmax_age_days = 90\n'
    )
    assert config.retention.max_age_days == 30
    assert config.retention.interval_seconds == 600
    assert config.retention.rules == [
        RetentionRule(3, tag_prefix="debug."),
        RetentionRule(90, protocol="logjam"),
    ]
    assert Config().retention == RetentionConfig()
    assert not Config().retention.enabled
    with pytest.raises(ConfigError, match=r"retention.rules\[0\]: a retention rule needs max_age"):
        parse_config('[[retention.rules]]\ntag_prefix = "x"\n')
    with pytest.raises(ConfigError, match="needs a tag_prefix or a protocol"):
        parse_config("[[retention.rules]]\nmax_age_days = 3\n")
    with pytest.raises(ConfigError, match="protocol must be one of"):
        parse_config('[[retention.rules]]\nmax_age_days = 3\nprotocol = "http"\n')
    with pytest.raises(ConfigError, match="must be greater than 0"):
        parse_config("[retention]\nmax_age_days = 0\n")


# -- erase --------------------------------------------------------------------------


def test_erase_removes_exactly_the_matching_rows_and_rewrites_only_their_files(
    seeded: Seeded,
) -> None:
    before = rows(seeded.uri)
    files_before = set(DeltaTable(seeded.uri).file_uris())
    predicate = retention.erase_predicate(source="it's bob")
    assert predicate == "source = 'it''s bob'"
    result = retention.erase(seeded.uri, predicate=predicate)
    after = rows(seeded.uri)
    assert sorted(map(key, after)) == sorted(key(r) for r in before if r["source"] != "it's bob")
    assert result.details["rows_deleted"] == len(before) - len(after)
    # Files of other sources were not touched (one block per file here).
    files_after = set(DeltaTable(seeded.uri).file_uris())
    assert files_after <= files_before
    assert len(files_before - files_after) == len(AGES)
    assert result.details["files_awaiting_vacuum"] == len(AGES)
    assert "vacuum" in result.details["vacuum"]
    assert protocol_of(seeded.uri) == (1, 2, None, None)
    # Nothing matches any more: no commit.
    version = DeltaTable(seeded.uri).version()
    again = retention.erase(seeded.uri, predicate=predicate)
    assert again.details["rows_matched"] == 0
    assert DeltaTable(seeded.uri).version() == version


def test_erase_rewrites_a_shared_file_keeping_the_other_rows(tmp_path: Path) -> None:
    table = EventsTable(str(tmp_path / "events"))
    table.open_or_create()
    mixed = [
        make_block(1, 0, source="alice"),
        make_block(2, 0, source="mallory"),
        make_block(3, 0, source="alice"),
    ]
    assert table.commit(blocks_to_arrow(mixed), "seed", 1)
    result = retention.erase(table.uri, predicate=retention.erase_predicate(source="mallory"))
    assert result.details["rows_deleted"] == ROWS_PER_BLOCK
    assert result.details["files_added"] == 1
    assert result.details["rows_copied"] == 2 * ROWS_PER_BLOCK
    assert {r["source"] for r in rows(table.uri)} == {"alice"}
    assert len(rows(table.uri)) == 2 * ROWS_PER_BLOCK


def test_erase_by_time_range_and_tag(seeded: Seeded) -> None:
    before = rows(seeded.uri)
    now = dt.datetime.fromtimestamp(seeded.now_ns / 1e9, dt.UTC)
    since = now - dt.timedelta(days=10, hours=12)
    until = now - dt.timedelta(days=2, hours=12)
    predicate = retention.erase_predicate(tag_prefix="app.", since=since, until=until)
    retention.erase(seeded.uri, predicate=predicate)

    def erased(row: dict[str, Any]) -> bool:
        return bool(row["tag"].startswith("app.") and since <= row["event_time"] < until)

    assert sum(map(erased, before)) == 4 * 2 * ROWS_PER_BLOCK  # ages 3, 6, 8, 10; two app. tags
    assert sorted(map(key, rows(seeded.uri))) == sorted(key(r) for r in before if not erased(r))


def test_erase_predicates_are_built_from_quoted_values() -> None:
    assert retention.sql_string("a'b\\c") == "'a''b\\c'"
    hostile = "x' OR '1'='1"
    assert retention.erase_predicate(source=hostile) == "source = 'x'' OR ''1''=''1'"
    assert retention.erase_predicate(tag="t", protocol="forward") == (
        "tag = 't' AND protocol = 'forward'"
    )
    since = dt.datetime(2026, 1, 1)  # naive: UTC
    assert retention.erase_predicate(since=since) == "event_time_ns >= 1767225600000000000"
    with pytest.raises(ValueError, match="name what to erase"):
        retention.erase_predicate()
    with pytest.raises(ValueError, match="before --until"):
        retention.erase_predicate(since=since, until=since)
    with pytest.raises(ValueError, match="NUL"):
        retention.erase_predicate(source="a\x00b")
    with pytest.raises(ValueError, match="empty tag prefix"):
        retention.erase_predicate(tag_prefix="")


def test_a_hostile_value_matches_only_itself(seeded: Seeded) -> None:
    version = DeltaTable(seeded.uri).version()
    result = retention.erase(seeded.uri, predicate=retention.erase_predicate(source="x' OR '1'='1"))
    assert result.details["rows_matched"] == 0
    assert DeltaTable(seeded.uri).version() == version


def test_an_invalid_where_changes_nothing(seeded: Seeded) -> None:
    version = DeltaTable(seeded.uri).version()
    with pytest.raises(LakeError, match="cannot evaluate the predicate"):
        retention.erase(seeded.uri, predicate="source = ")
    with pytest.raises(LakeError, match="cannot evaluate the predicate"):
        retention.erase(seeded.uri, predicate="1=1; DROP TABLE events")
    assert DeltaTable(seeded.uri).version() == version
    assert DeltaTable(seeded.uri).metadata().configuration["delta.appendOnly"] == "true"


# -- while the writer commits ------------------------------------------------------------


async def _writer(nursery: trio.Nursery, uri: str) -> LakeWriter:
    writer = LakeWriter(EventsTable(uri), "node-a", FAST)
    await writer.open()
    nursery.start_soon(writer.run)
    return writer


@pytest.mark.trio
async def test_erase_through_the_writer_while_ingest_continues(tmp_path: Path) -> None:
    """The service's way: the erase runs through run_exclusive, between commits."""
    uri = str(tmp_path / "events")
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        tickets = []
        for n in range(10):
            source = "gone" if n % 2 else "kept"
            tickets.append(await writer.submit(make_block(n, 0, source=source)))
        with trio.fail_after(PATIENCE_SECONDS):
            for ticket in tickets:
                await ticket.wait()
        erased: list[operations.MaintenanceResult] = []
        predicate = retention.erase_predicate(source="gone")

        async def erase() -> None:
            erased.append(await writer.run_exclusive(
                lambda: retention.erase(uri, predicate=predicate)
            ))  # fmt: skip

        nursery.start_soon(erase)
        for n in range(10, 60):
            tickets.append(await writer.submit(make_block(n, 0, source="kept")))
        with trio.fail_after(PATIENCE_SECONDS):
            for ticket in tickets:
                await ticket.wait()
            while not erased:
                await trio.sleep(0.01)
        await writer.close_input()
    assert erased[0].details["rows_deleted"] == 5 * ROWS_PER_BLOCK
    table_rows = rows(uri)
    assert {r["source"] for r in table_rows} == {"kept"}
    assert len({r["batch_id"] for r in table_rows}) == 5 + 50
    assert len(table_rows) == (5 + 50) * ROWS_PER_BLOCK
    assert protocol_of(uri) == (1, 2, None, None)


@pytest.mark.trio
async def test_erase_handed_to_the_service_while_ingest_continues(tmp_path: Path) -> None:
    """The CLI's way while the service runs: a request file, run through run_exclusive."""
    state = tmp_path / "state"
    state.mkdir()
    uri = str(tmp_path / "events")
    config = replace(Config(state_dir=state), lake=replace(Config().lake, path=uri))
    service_lock = StateLock(state)  # this test process plays the running service
    try:
        async with trio.open_nursery() as nursery:
            writer = await _writer(nursery, uri)
            nursery.start_soon(schedule.run_maintenance, writer, config)
            with trio.fail_after(PATIENCE_SECONDS):
                while table_requests.serving_pid(state) is None:
                    await trio.sleep(0.01)
            tickets = []
            for n in range(10):
                source = "gone" if n % 2 else "kept"
                tickets.append(await writer.submit(make_block(n, 0, source=source)))
            with trio.fail_after(PATIENCE_SECONDS):
                for ticket in tickets:
                    await ticket.wait()
            steps: list[str] = []
            results: list[operations.MaintenanceResult] = []

            def cli_side() -> None:
                pid = table_requests.serving_pid(state)
                assert pid == os.getpid()
                request = {"operation": "erase", "predicate": "source = 'gone'"}
                results.append(
                    table_requests.hand_off(
                        state, request, pid, lambda i, n, what: steps.append(what)
                    )
                )

            async with trio.open_nursery() as inner:
                inner.start_soon(trio.to_thread.run_sync, cli_side)
                n = 10
                while not results:
                    tickets.append(await writer.submit(make_block(n, 0, source="kept")))
                    n += 1
                    await trio.sleep(0.01)
            with trio.fail_after(PATIENCE_SECONDS):
                for ticket in tickets:
                    await ticket.wait()
            nursery.cancel_scope.cancel()
    finally:
        service_lock.release()
    assert results[0].operation == "erase"
    assert results[0].details["rows_deleted"] == 5 * ROWS_PER_BLOCK
    assert results[0].details["attempts"] == 1, "the delete raced a commit"
    assert any("running in the service" in s for s in steps)
    table_rows = rows(uri)
    assert {r["source"] for r in table_rows} == {"kept"}
    assert len(table_rows) == (n - 5) * ROWS_PER_BLOCK
    assert not list((state / table_requests.REQUESTS_DIR).glob("*.json"))


@pytest.mark.trio
async def test_a_request_the_service_does_not_take_is_withdrawn(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / table_requests.REQUESTS_DIR).mkdir(parents=True)
    request = {"operation": "erase", "predicate": "source = 'x'"}
    with pytest.raises(table_requests.RequestError, match="stopped before it took the request"):
        await trio.to_thread.run_sync(lambda: table_requests.hand_off(state, request, os.getpid()))
    service_lock = StateLock(state)  # a service that runs but never looks
    try:
        with pytest.raises(table_requests.RequestError, match="did not take the request within"):
            await trio.to_thread.run_sync(
                lambda: table_requests.hand_off(state, request, os.getpid(), pickup_timeout=0.3)
            )
    finally:
        service_lock.release()
    assert not list((state / table_requests.REQUESTS_DIR).iterdir())


@pytest.mark.trio
async def test_erase_beside_the_writer_without_hand_off_loses_no_row(tmp_path: Path) -> None:
    """No service to hand to (or one that takes no requests): Delta's concurrency decides.

    A delete that read a snapshot before a commit that added matching rows
    is run again on a fresh one (and may give up); an append that raced the
    delete fails and the writer retries it. Every acknowledged row that does
    not match is in the table either way.
    """
    uri = str(tmp_path / "events")
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        stop = threading.Event()
        results: list[operations.MaintenanceResult] = []

        def erase_repeatedly() -> None:
            predicate = retention.erase_predicate(source="gone")
            while not stop.is_set():
                # A delete that lost its race DELETE_ATTEMPTS times is tried again.
                with contextlib.suppress(LakeError):
                    results.append(retention.erase(uri, predicate=predicate))

        tickets = []
        async with trio.open_nursery() as inner:
            inner.start_soon(trio.to_thread.run_sync, erase_repeatedly)
            for n in range(120):
                source = "gone" if n % 3 == 0 else "kept"
                tickets.append(await writer.submit(make_block(n, 0, source=source)))
                await trio.sleep(0.005)
            with trio.fail_after(PATIENCE_SECONDS):
                for ticket in tickets:
                    await ticket.wait()
            stop.set()
        await writer.close_input()
    kept = {f"b-{n}" for n in range(120) if n % 3}
    table_rows = rows(uri)
    assert kept <= {r["batch_id"] for r in table_rows}
    assert sum(1 for r in table_rows if r["source"] == "kept") == len(kept) * ROWS_PER_BLOCK
    final = retention.erase(uri, predicate=retention.erase_predicate(source="gone"))
    assert {r["source"] for r in rows(uri)} == {"kept"}
    assert final.after.rows == len(kept) * ROWS_PER_BLOCK


def test_a_delete_that_loses_a_race_runs_again(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit adding matching rows lands between the delete's snapshot and its commit."""
    writer = EventsTable(seeded.uri)
    writer.open_or_create()
    raced: list[int] = []

    class Racing(DeltaTable):
        def delete(self, predicate: str | None = None, *args: Any, **kwargs: Any) -> Any:
            if not raced:
                block = make_block(10_000, 0, source="it's bob")
                raced.append(int(writer.commit(blocks_to_arrow([block]), "racer", 1)))
            return super().delete(predicate, *args, **kwargs)

    monkeypatch.setattr(retention, "DeltaTable", Racing)
    result = retention.erase(seeded.uri, predicate=retention.erase_predicate(source="it's bob"))
    assert raced == [1]
    assert result.details["attempts"] == 2
    assert {r["source"] for r in rows(seeded.uri)} == {"alice"}


# -- the service's schedule and the CLI ------------------------------------------------


@pytest.mark.trio
async def test_the_service_expires_on_its_schedule(
    tmp_path: Path, info_log: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "events")
    config = Config(
        state_dir=tmp_path,
        maintenance=MaintenanceConfig(
            compact_interval_seconds=3600,
            checkpoint_interval_seconds=3600,
            vacuum_interval_seconds=3600,
        ),
        retention=RetentionConfig(max_age_days=7, interval_seconds=0.05),
    )
    config = replace(config, lake=replace(config.lake, path=uri))
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        tickets = [await writer.submit(make_block(n, age)) for n, age in enumerate((0, 1, 9, 30))]
        with trio.fail_after(PATIENCE_SECONDS):
            for ticket in tickets:
                await ticket.wait()
        nursery.start_soon(schedule.run_maintenance, writer, config)
        with trio.fail_after(PATIENCE_SECONDS):
            while not logged(info_log, "maintenance.done"):
                await trio.sleep(0.01)
            # Ingest goes on after it.
            ticket = await writer.submit(make_block(99, 0))
            await ticket.wait()
        nursery.cancel_scope.cancel()
    done = logged(info_log, "maintenance.done")[0]
    assert done["operation"] == "expire"
    assert done["partitions_removed"] == 2
    assert done["rows_removed"] == 2 * ROWS_PER_BLOCK
    assert {r["batch_id"] for r in rows(uri)} == {"b-0", "b-1", "b-99"}
    assert not logged(info_log, "maintenance.failed")


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("table", *args, config=config)


def test_cli_expire_and_erase(tmp_path: Path) -> None:
    state = tmp_path / "state"
    uri = str(state / "lake" / "events")
    data = seed(Path(uri))
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{state}"\n')

    off = cli(config, "expire")
    assert off.returncode == 1
    assert "retention is off" in off.stderr

    version = DeltaTable(uri).version()
    dry = cli(config, "expire", "--max-age-days", "7", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert len(report["details"]["partitions_to_remove"]) == 4
    assert DeltaTable(uri).version() == version

    before_expire = len(rows(uri))
    done = cli(config, "expire", "--max-age-days", "7")
    assert done.returncode == 0, done.stderr
    removed = before_expire - len(rows(uri))
    assert removed > 0
    assert "partitions_removed" in done.stdout
    assert "expire: [4/4] done" in done.stderr  # plain progress lines off a terminal
    assert min(r["event_date"] for r in rows(uri)) >= data.today - dt.timedelta(days=7)

    version = DeltaTable(uri).version()
    again = cli(config, "expire", "--max-age-days", "7")
    assert again.returncode == 0, again.stderr
    assert DeltaTable(uri).version() == version

    nothing = cli(config, "erase")
    assert nothing.returncode == 1
    assert "name what to erase" in nothing.stderr
    mixed = cli(config, "erase", "--where", "true", "--source", "x")
    assert mixed.returncode == 1
    assert "cannot be combined" in mixed.stderr

    with operations.MaintenanceLock(operations.lock_path(state)):
        busy = cli(config, "erase", "--source", "it's bob")
    assert busy.returncode == 1
    assert "maintenance already running" in busy.stderr
    assert any(r["source"] == "it's bob" for r in rows(uri))

    erase = cli(config, "erase", "--source", "it's bob")
    assert erase.returncode == 0, erase.stderr
    assert "rows_deleted" in erase.stdout
    assert "vacuum" in erase.stdout
    assert {r["source"] for r in rows(uri)} == {"alice"}

    where = cli(config, "erase", "--where", "tag = 'debug.trace'", "--json")
    assert where.returncode == 0, where.stderr
    assert json.loads(where.stdout)["details"]["rows_deleted"] > 0
    assert {r["tag"] for r in rows(uri)} == {"app.web"}

    from auth.database import open_database
    from auth.settings import AuthSettings

    with open_database(AuthSettings.under(state)) as database:
        every = database.audit.audit_entries()
    entries = [e for e in every if e.action == "table.erase"]
    details = [e.detail for e in entries]
    # Expiry from the CLI is audited too (twice: the second removed nothing); a dry run is not.
    expired = [e.detail for e in every if e.action == "table.expire"]
    assert len(expired) == 2, expired
    # Newest first. The entry counts what the expiry removed (whole partitions
    # count by their files' statistics); the second removed nothing.
    assert expired[-1].startswith(f"rows={removed} files_replaced=")
    assert not expired[-1].startswith(f"rows={removed} files_replaced=0 ")
    assert expired[0].startswith("rows=0 files_replaced=0 ")
    assert "max_age_days=7" in expired[-1]
    assert any("predicate=source = 'it''s bob'" in d and "rows=" in d for d in details)
    assert any("predicate=tag = 'debug.trace'" in d for d in details)
    assert any(d.startswith("failed: maintenance already running") for d in details)
    assert all((e.actor or "").startswith("cli:") for e in entries)
    assert protocol_of(uri) == (1, 2, None, None)


# -- usage (appliance table stats) ---------------------------------------------------


def test_usage_per_day_and_protocol_and_the_projection(seeded: Seeded) -> None:
    usage = lake_usage.usage(seeded.uri, min_free_bytes=0, today=seeded.today)
    assert [d.event_date for d in usage.days] == sorted(
        seeded.today - dt.timedelta(days=age) for age in AGES
    )
    assert usage.oldest == seeded.today - dt.timedelta(days=max(AGES))
    assert usage.newest == seeded.today
    for day in usage.days:
        assert day.files == len(KINDS)
        assert day.rows == len(KINDS) * ROWS_PER_BLOCK
    by_protocol = {(p.event_date, p.protocol): p.rows for p in usage.protocols}
    assert by_protocol[(seeded.today, "forward")] == 2 * ROWS_PER_BLOCK
    assert by_protocol[(seeded.today, "logjam")] == ROWS_PER_BLOCK
    assert sum(p.approx_bytes for p in usage.protocols) <= sum(d.bytes for d in usage.days)
    # The last 7 complete days hold the days of ages 1, 2, 3 and 6.
    recent = [d for d in usage.days if 1 <= (seeded.today - d.event_date).days <= 7]
    assert usage.bytes_per_day == sum(d.bytes for d in recent) // lake_usage.RATE_DAYS
    assert usage.free_bytes is not None
    assert usage.days_until_watermark is not None
    assert usage.days_until_watermark == pytest.approx(
        usage.free_bytes / usage.bytes_per_day, rel=0.01
    )
    full = lake_usage.usage(seeded.uri, min_free_bytes=2**62, today=seeded.today)
    assert full.days_until_watermark == 0
    quick = lake_usage.usage(seeded.uri, by_protocol=False, today=seeded.today)
    assert quick.protocols == []


def test_cli_stats_shows_days_protocols_and_the_projection(seeded: Seeded, tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n[lake]\npath = "{seeded.uri}"\n')
    shown = cli(config, "stats", "--days", "3")
    assert shown.returncode == 0, shown.stderr
    assert f"oldest {seeded.today - dt.timedelta(days=max(AGES))}" in shown.stdout
    assert "(the last 3 shown; --days 0 for all)" in shown.stdout
    assert "forward 8, logjam 4" in shown.stdout
    assert "days until the watermark:" in shown.stdout
    as_json = cli(config, "stats", "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["files"] == len(AGES) * len(KINDS)
    assert len(report["usage"]["days"]) == len(AGES)
    assert report["usage"]["oldest_partition"] == str(seeded.today - dt.timedelta(days=max(AGES)))


# -- progress of long table commands -------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise() -> None:
    plain = io.StringIO()
    with ProgressReporter("erase", plain) as progress:
        progress(1, 3, "counting the matching rows")
        progress(3, 3, "done")
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("erase: [1/3] counting the matching rows (")
    assert lines[1].startswith("erase: [3/3] done (")

    terminal = _Terminal()
    with ProgressReporter("expire", terminal) as progress:
        progress(2, 4, "removing 3 whole partition(s)")
        time.sleep(0.3)  # a redraw of the elapsed time
        progress(4, 4, "done")
    text = terminal.getvalue()
    assert text.startswith("\rexpire [" + "#" * 12 + "-" * 12 + "] 2/4 removing 3 whole")
    assert "\rexpire [" + "#" * 24 + "] 4/4 done" in text
    assert text.endswith("\n")
    assert "\n" not in text[:-1]

    silent = io.StringIO()
    with ProgressReporter("vacuum", silent, enabled=False) as progress:
        progress(1, 1, "done")
    assert silent.getvalue() == ""
