"""Compaction while ingest continues: fewer files, the same query results (via Spark)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from appliance.lake import maintenance
from appliance.lake.errors import LakeError
from tests.spark.helpers import CLI_TIMEOUT_SECONDS, EventsWriter, block, write_config
from tests.support.cli import run_cli

#: Queries whose results compaction must not change.
QUERIES = {
    "count": "SELECT count(*) AS n FROM {t}",
    "by_tag": "SELECT tag, source, count(*) AS n FROM {t} GROUP BY 1, 2 ORDER BY 1, 2",
    "checksum": "SELECT sum(event_time_ns) AS s, count(DISTINCT record) AS r FROM {t}",
}
#: Commits before the compaction starts.
SEED_COMMITS = 20
#: Bounds on the concurrent ingest and on the compactions tried while it runs.
MAX_CONCURRENT_COMMITS = 2_000
MAX_COMPACTIONS = 50


def query(spark: Any, sql: str, table: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in spark.sql(sql.format(t=table)).collect()]


def file_count(uri: str, version: int) -> int:
    return len(DeltaTable(uri, version=version).file_uris())


def optimizations(uri: str) -> list[dict[str, Any]]:
    return [h for h in DeltaTable(uri).history() if h["operation"] == "OPTIMIZE"]


def interleaved(commit: dict[str, Any]) -> bool:
    """True when appends landed between the compaction's read and its commit."""
    return int(commit["readVersion"]) < int(commit["version"]) - 1


def test_compaction_during_ingest_keeps_every_query_result(
    spark: Any, sail_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path)
    uri = str(tmp_path / "state" / "lake" / "events")
    events = EventsWriter(uri)
    # Sail 0.7 cannot time-travel to a version older than the latest
    # checkpoint; this test compares versions around each compaction, so it
    # keeps the writer from checkpointing (a test-only table property).
    DeltaTable(uri).alter.set_table_properties({"delta.checkpointInterval": "1000000"})
    committed: Counter[tuple[str, str]] = Counter()

    def commit(n: int) -> None:
        tag, source = f"tag-{n % 3}", f"src-{n % 2}"
        events.commit([block(tag=tag, source=source, records=[{"n": n, "k": k} for k in range(4)])])
        committed[(tag, source)] += 4

    for n in range(SEED_COMMITS):
        commit(n)

    # The service's writer, as another process would run it: appends go on
    # while compactions run; Delta's optimistic concurrency lets both land.
    stop = threading.Event()
    failures: list[BaseException] = []

    def ingest() -> None:
        try:
            for n in range(SEED_COMMITS, SEED_COMMITS + MAX_CONCURRENT_COMMITS):
                if stop.is_set():
                    return
                commit(n)
        except (LakeError, AssertionError) as exc:
            failures.append(exc)

    writer = threading.Thread(target=ingest)
    writer.start()
    try:
        result = run_cli("table", "compact", "--json", config=config, timeout=CLI_TIMEOUT_SECONDS)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["after"]["files"] < report["before"]["files"]
        # Until one compaction provably raced an append (bounded tries).
        for _ in range(MAX_COMPACTIONS):
            if any(interleaved(c) for c in optimizations(uri)) or not writer.is_alive():
                break
            maintenance.compact(uri)
    finally:
        stop.set()
        writer.join()
    assert not failures, failures
    commits = optimizations(uri)
    assert any(interleaved(c) for c in commits), "no compaction overlapped an append"

    for commit_info in commits:
        version = int(commit_info["version"])
        assert file_count(uri, version) < file_count(uri, version - 1)
        # Every query answers the same just before and just after the compaction.
        before = f"delta.`{uri}` VERSION AS OF {version - 1}"
        after = f"delta.`{uri}` VERSION AS OF {version}"
        for name, sql in QUERIES.items():
            assert query(spark, sql, before) == query(spark, sql, after), (name, version)

    # The table holds exactly what was committed, each row once.
    spark.read.format("delta").load(uri).createOrReplaceTempView("events_now")
    assert query(spark, QUERIES["by_tag"], "events_now") == [
        {"tag": tag, "source": source, "n": n} for (tag, source), n in sorted(committed.items())
    ]
