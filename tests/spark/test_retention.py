"""Expire and erase as Spark (Sail) sees them: the counts match before and after.

Small on purpose: nine days of a few events, the real CLI, Sail reading the
table by path and by version.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from tests.spark.helpers import CLI_TIMEOUT_SECONDS, EventsWriter, block, write_config
from tests.support.cli import run_cli

DAY_NS = 86_400 * 10**9
#: Ages (days) of the events: one commit per age and source.
AGES = (0, 1, 3, 6, 8, 9, 30)
SOURCES = ("alice", "token:x")
PER_BLOCK = 3


def counts_by_day(spark: Any, table: str) -> dict[dt.date, int]:
    rows = spark.sql(f"SELECT event_date, count(*) AS n FROM {table} GROUP BY 1").collect()
    return {row["event_date"]: row["n"] for row in rows}


def count(spark: Any, table: str, where: str = "true") -> int:
    return int(spark.sql(f"SELECT count(*) AS n FROM {table} WHERE {where}").collect()[0]["n"])


def test_expire_and_erase_as_spark_sees_them(spark: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    uri = str(tmp_path / "state" / "lake" / "events")
    events = EventsWriter(uri)
    # Sail cannot time-travel past the latest checkpoint: keep the writer from writing one.
    DeltaTable(uri).alter.set_table_properties({"delta.checkpointInterval": "1000000"})
    now = time.time_ns()
    for age in AGES:
        for source in SOURCES:
            at = now - age * DAY_NS
            events.commit(
                [
                    block(
                        source=source,
                        records=[{"age": age, "i": i} for i in range(PER_BLOCK)],
                        times_ns=[at] * PER_BLOCK,
                        received_at_ns=now,
                    )
                ]
            )
    table = f"delta.`{uri}`"
    before = counts_by_day(spark, table)
    assert sum(before.values()) == len(AGES) * len(SOURCES) * PER_BLOCK

    expire = run_cli(
        "table",
        "expire",
        "--max-age-days",
        "7",
        "--json",
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert expire.returncode == 0, expire.stderr
    report = json.loads(expire.stdout)
    cutoff = dt.date.fromisoformat(report["details"]["cutoff"])
    removed = {dt.date.fromisoformat(d) for d in report["details"]["partitions_removed"]}
    assert removed == {d for d in before if d < cutoff}
    assert len(removed) == 3  # ages 8, 9, 30
    assert report["details"]["partition_delete"]["num_added_files"] == 0

    after = counts_by_day(spark, table)
    assert after == {d: n for d, n in before.items() if d not in removed}
    version = int(report["after"]["version"])
    # The version before the expire still reads as it was (until a vacuum).
    assert counts_by_day(spark, f"{table} VERSION AS OF {version - 2}") == before

    erase = run_cli(
        "table",
        "erase",
        "--source",
        "token:x",
        "--json",
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert erase.returncode == 0, erase.stderr
    erased = json.loads(erase.stdout)["details"]
    assert erased["rows_deleted"] == sum(after.values()) // 2
    assert count(spark, table, "source = 'token:x'") == 0
    assert count(spark, table) == sum(after.values()) - erased["rows_deleted"]
    assert count(spark, table, "source = 'alice'") == sum(after.values()) // 2

    protocol = DeltaTable(uri).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert protocol.reader_features is None
    assert protocol.writer_features is None
