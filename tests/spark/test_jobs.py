"""The derived-table jobs over Spark Connect (Sail): correct, incremental, idempotent."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from appliance.lake import maintenance
from appliance.spark.jobs import (
    EVENTS_PER_MINUTE,
    LOGJAM_REQUESTS,
    job_status,
    plan_run,
    progress,
    run_job,
)
from tests.spark.helpers import CLI_TIMEOUT_SECONDS, EventsWriter, block, write_config
from tests.support.cli import run_cli

MINUTE_NS = 60 * 1_000_000_000
#: 2026-03-01T10:00:00Z
BASE_NS = int(dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC).timestamp()) * 1_000_000_000


def minute_of(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns // MINUTE_NS * 60, dt.UTC)


def forward_blocks(round_: int) -> list[Any]:
    """Forward events over three minutes, two tags and two sources."""
    blocks = []
    for i in range(6):
        times = [BASE_NS + (i % 3) * MINUTE_NS + round_ * 1_000 + k for k in range(i + 1)]
        blocks.append(
            block(
                tag=f"app.{'web' if i % 2 else 'db'}",
                source=f"client-{i % 2}",
                records=[{"round": round_, "i": i, "k": k} for k in range(i + 1)],
                times_ns=times,
                received_at_ns=BASE_NS + 5 * MINUTE_NS,
            )
        )
    return blocks


def logjam_body(n: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "action": f"Orders#show{n % 2}",
        "code": 200 if n % 3 else 500,
        "total_time": 10.5 + n,
        "db_time": 1.25,
        "view_time": 2.5,
        "db_calls": n,
        "request_id": f"req-{n}",
        "started_at": "2026-03-01T11:00:00+01:00",
        "host": "web-1",
        "ip": "10.0.0.1",
        "severity": 1,
        "app_env": "shop-api-production",
    }
    body.update(extra)
    return body


def logjam_block(start: int, count: int, *, tag: str = "logs.shop.production") -> Any:
    return block(
        protocol="logjam",
        tag=tag,
        source="shop-key",
        records=[logjam_body(n) for n in range(start, start + count)],
        received_at_ns=BASE_NS,
    )


def table_rows(uri: str) -> list[dict[str, Any]]:
    return DeltaTable(uri).to_pyarrow_table().to_pylist()


def minute_counts(uri: str) -> dict[tuple[Any, ...], int]:
    return {
        (r["minute"], r["protocol"], r["tag"], r["source"]): r["events"] for r in table_rows(uri)
    }


def expected_minute_counts(events_uri: str) -> dict[tuple[Any, ...], int]:
    counts: Counter[tuple[Any, ...]] = Counter()
    for r in DeltaTable(events_uri).to_pyarrow_table().to_pylist():
        counts[(minute_of(r["event_time_ns"]), r["protocol"], r["tag"], r["source"])] += 1
    return dict(counts)


@pytest.fixture
def lake(tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "lake"
    return {
        "events": str(root / "events"),
        "events_per_minute": str(root / "events_per_minute"),
        "logjam_requests": str(root / "logjam_requests"),
    }


def test_events_per_minute_incremental_idempotent_and_compaction_safe(
    spark: Any, lake: dict[str, str]
) -> None:
    events = EventsWriter(lake["events"])
    for round_ in range(3):
        events.commit(forward_blocks(round_))
    target = lake["events_per_minute"]

    first = run_job(spark, EVENTS_PER_MINUTE, lake["events"], target)
    assert first.mode == "rebuild"
    assert first.reason == "first run"
    assert minute_counts(target) == expected_minute_counts(lake["events"])
    assert progress(EVENTS_PER_MINUTE, target) == DeltaTable(lake["events"]).version()

    # Derived tables stay readable by every Spark: reader 1 / writer 2, UTC timestamps.
    table = DeltaTable(target)
    assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == (1, 2)
    assert pa.schema(table.schema()).field("minute").type == pa.timestamp("us", tz="UTC")

    # A second run on the same input changes nothing: no commit at all.
    version_before = DeltaTable(target).version()
    rows_before = minute_counts(target)
    again = run_job(spark, EVENTS_PER_MINUTE, lake["events"], target)
    assert again.mode == "up-to-date"
    assert DeltaTable(target).version() == version_before
    assert minute_counts(target) == rows_before

    # New commits, a compaction (which rewrites the new files together with
    # the old ones), more commits: the next run counts every new row once.
    events.commit(forward_blocks(3))
    events.commit(forward_blocks(4))
    compacted = maintenance.compact(lake["events"])
    assert compacted.after.files < compacted.before.files
    events.commit(forward_blocks(5))
    third = run_job(spark, EVENTS_PER_MINUTE, lake["events"], target)
    assert third.mode == "incremental"
    assert third.files_read == 3, "the compaction's files are not new data"
    assert minute_counts(target) == expected_minute_counts(lake["events"])

    # The merge added to existing minutes: it matches a rebuild from scratch.
    rebuilt = run_job(spark, EVENTS_PER_MINUTE, lake["events"], target, rebuild=True)
    assert rebuilt.mode == "rebuild"
    assert minute_counts(target) == expected_minute_counts(lake["events"])


def test_logjam_requests_parsed_from_bodies(spark: Any, lake: dict[str, str]) -> None:
    events = EventsWriter(lake["events"])
    events.commit([logjam_block(0, 4), forward_blocks(0)[0]])
    # Not requests: another topic, and a body without an action.
    events.commit(
        [
            logjam_block(100, 2, tag="events.shop"),
            block(protocol="logjam", tag="logs.shop", records=[{"message": "no action"}]),
        ]
    )
    target = lake["logjam_requests"]
    result = run_job(spark, LOGJAM_REQUESTS, lake["events"], target)
    assert result.rows_written == 4
    rows = sorted(table_rows(target), key=lambda r: r["request_id"])
    first = rows[0]
    assert first["app"] == "shop-api"
    assert first["env"] == "production"
    assert first["action"] == "Orders#show0"
    assert first["status"] == 500
    assert first["total_time"] == 10.5
    assert first["db_time"] == 1.25
    assert first["db_calls"] == 0
    assert first["started_at"] == dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC)
    assert first["topic"] == "logs.shop.production"
    assert first["source"] == "shop-key"
    assert first["host"] == "web-1"
    assert first["event_date"] == dt.date(2026, 3, 1)
    assert [r["status"] for r in rows] == [500, 200, 200, 500]

    # Incremental: only the new request is appended, and a rerun adds nothing.
    events.commit([logjam_block(4, 1)])
    assert run_job(spark, LOGJAM_REQUESTS, lake["events"], target).rows_written == 1
    version = DeltaTable(target).version()
    assert run_job(spark, LOGJAM_REQUESTS, lake["events"], target).mode == "up-to-date"
    assert DeltaTable(target).version() == version
    assert sorted(r["request_id"] for r in table_rows(target)) == [f"req-{n}" for n in range(5)]


def test_logjam_fields_fall_back_and_dates_follow_the_events_rule(
    spark: Any, lake: dict[str, str]
) -> None:
    events = EventsWriter(lake["events"])
    received = BASE_NS
    bodies = [
        # app/env given directly, time only as started_ms, status instead of code.
        {
            "action": "A#b",
            "app": "billing",
            "env": "staging",
            "started_ms": BASE_NS // 1_000_000 + 123,
            "status": "404",
            "total_time": "7",
        },
        # Nothing parseable: the event time stands in for started_at.
        {"action": "A#c", "started_at": "not a time", "total_time": "fast"},
    ]
    absurd = 10 * 1_000_000_000  # 1970: the event's partition is the receive date
    events.commit(
        [
            block(
                protocol="logjam",
                tag="logs",
                records=bodies,
                times_ns=[received, absurd],
                received_at_ns=received,
            )
        ]
    )
    run_job(spark, LOGJAM_REQUESTS, lake["events"], lake["logjam_requests"])
    rows = {r["action"]: r for r in table_rows(lake["logjam_requests"])}
    assert rows["A#b"]["app"] == "billing"
    assert rows["A#b"]["env"] == "staging"
    assert rows["A#b"]["status"] == 404
    assert rows["A#b"]["total_time"] == 7.0
    assert rows["A#b"]["started_at"] == dt.datetime(2026, 3, 1, 10, 0, 0, 123000, tzinfo=dt.UTC)
    assert rows["A#c"]["app"] is None
    assert rows["A#c"]["total_time"] is None
    assert rows["A#c"]["started_at"] == dt.datetime.fromtimestamp(10, dt.UTC)
    event_dates = {
        json.loads(r["record"])["action"]: r["event_date"]
        for r in DeltaTable(lake["events"]).to_pyarrow_table().to_pylist()
    }
    assert {a: r["event_date"] for a, r in rows.items()} == event_dates
    assert event_dates["A#c"] == dt.date(2026, 3, 1)


def test_a_cleaned_up_log_entry_makes_the_run_rebuild(spark: Any, lake: dict[str, str]) -> None:
    events = EventsWriter(lake["events"])
    events.commit(forward_blocks(0))
    run_job(spark, EVENTS_PER_MINUTE, lake["events"], lake["events_per_minute"])
    done = DeltaTable(lake["events"]).version()
    events.commit(forward_blocks(1))
    events.commit(forward_blocks(2))
    # As log cleanup would after the retention: a checkpoint covers the
    # versions, and the first unconsumed commit's JSON is gone.
    DeltaTable(lake["events"]).create_checkpoint()
    (Path(lake["events"]) / "_delta_log" / f"{done + 1:020d}.json").unlink()
    plan = plan_run(lake["events"], done)
    assert plan.mode == "rebuild"
    assert "log cleanup" in plan.reason
    result = run_job(spark, EVENTS_PER_MINUTE, lake["events"], lake["events_per_minute"])
    assert result.mode == "rebuild"
    assert minute_counts(lake["events_per_minute"]) == expected_minute_counts(lake["events"])


def test_a_vacuumed_file_makes_the_run_rebuild(lake: dict[str, str]) -> None:
    events = EventsWriter(lake["events"])
    events.commit(forward_blocks(0))
    done = DeltaTable(lake["events"]).version()
    events.commit(forward_blocks(1))
    maintenance.compact(lake["events"])
    # The compaction replaced the file of the unconsumed commit; a vacuum
    # past the retention deletes it.
    maintenance.vacuum(lake["events"], retention_hours=0, allow_short_retention=True)
    plan = plan_run(lake["events"], done)
    assert plan.mode == "rebuild"
    assert "vacuum" in plan.reason


def test_spark_run_and_status_commands(sail_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    state = tmp_path / "state"
    events = EventsWriter(str(state / "lake" / "events"))
    events.commit([*forward_blocks(0), logjam_block(0, 3)])

    run = run_cli(
        "spark",
        "run",
        "all",
        "--remote",
        sail_url,
        "--json",
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert run.returncode == 0, run.stderr
    results = {r["job"]: r for r in json.loads(run.stdout)}
    assert results["events_per_minute"]["mode"] == "rebuild"
    assert results["logjam_requests"]["rows_written"] == 3
    derived = str(state / "lake" / "events_per_minute")
    assert minute_counts(derived) == expected_minute_counts(events.table.uri)

    again = run_cli(
        "spark",
        "run",
        "events_per_minute",
        "--remote",
        sail_url,
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout

    status = run_cli("spark", "status", "--json", config=config, timeout=CLI_TIMEOUT_SECONDS)
    assert status.returncode == 0, status.stderr
    behind = {s["job"]: s["commits_behind"] for s in json.loads(status.stdout)}
    assert behind == {"events_per_minute": 0, "logjam_requests": 0}

    # The derived tables are registered by name for appliance sql.
    sql = run_cli(
        "sql",
        "SELECT sum(events) AS n FROM events_per_minute",
        "--remote",
        sail_url,
        "--format",
        "json",
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout) == [{"n": events.table.row_count()}]


def test_job_status_before_any_run(tmp_path: Path) -> None:
    events = EventsWriter(str(tmp_path / "events"))
    events.commit(forward_blocks(0))
    [status] = job_status(events.table.uri, {"events_per_minute": str(tmp_path / "none")})
    assert status.consumed_version is None
    assert status.behind == DeltaTable(events.table.uri).version() + 1
