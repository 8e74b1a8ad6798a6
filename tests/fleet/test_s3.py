"""The ``events`` table on object storage, for real: moto's S3 server on loopback.

* Two writers (two nodes' ``LakeWriter``s, different ``app_id``) commit to one
  S3 table at once: every commit race (both at the same version, one loses the
  conditional put) is retried, and every row is there exactly once.
* The service writes to ``s3://`` from a real client (npm @fluent-org/logger)
  in both ack modes, and its credentials never reach its log.
* Maintenance (compaction, checkpoint, vacuum) on the S3 table leaves every
  query result unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from deltalake import DeltaTable

from appliance.lake import maintenance
from appliance.lake.blocks import blocks_to_arrow
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from tests.conftest import start_appliance
from tests.interop.test_forward_node import node_send
from tests.s3server import SECRET_ACCESS_KEY, S3Server
from tests.spark.helpers import block

#: Blocks each of the racing writers commits, one group each (a commit per block).
RACING_BLOCKS = 12
#: Seconds a test waits for rows acked from the log to reach the table.
COMMIT_WAIT_SECONDS = 60


def _rows(uri: str, options: dict[str, str]) -> list[dict[str, Any]]:
    return DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()


def test_two_writers_racing_on_one_s3_table_lose_and_duplicate_nothing(s3_server: S3Server) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()

    async def node(app_id: str) -> None:
        table = EventsTable(uri, options)
        writer = LakeWriter(table, app_id, WriterSettings(commit_max_delay_seconds=0.001))
        await writer.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            for i in range(RACING_BLOCKS):
                ticket = await writer.submit(
                    block(tag=app_id, records=[{"i": i}], batch_id=f"{app_id}-{i}")
                )
                await ticket.wait()  # one commit per block: the two nodes race each time
            await writer.close_input()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node, "node-a")
            nursery.start_soon(node, "node-b")

    EventsTable(uri, options).open_or_create()
    trio.run(main)
    rows = _rows(uri, options)
    got = sorted((r["tag"], json.loads(r["record"])["i"]) for r in rows)
    assert got == sorted((n, i) for n in ("node-a", "node-b") for i in range(RACING_BLOCKS))
    history = DeltaTable(uri, storage_options=options).history()
    assert len([h for h in history if h.get("operation") == "WRITE"]) >= 2 * RACING_BLOCKS


@pytest.mark.parametrize("ack", ["commit", "wal"])
def test_the_service_writes_to_s3_and_never_logs_its_credentials(
    s3_server: S3Server, tmp_path: Path, ack: str
) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    lake = (
        f'path = "{uri}"\nack = "{ack}"\ncommit_interval_seconds = 0.5\n{s3_server.toml_options()}'
    )
    app = start_appliance(tmp_path, {"forward": ""}, lake=lake)
    try:
        result = node_send(app, "fluent-org", "packed", count=200, tag="s3.events")
        assert result.returncode == 0, result.stderr
        sent = [json.loads(line) for line in result.stdout.splitlines()]
        deadline = time.monotonic() + COMMIT_WAIT_SECONDS
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = [r for r in _rows(uri, options) if r["tag"] == "s3.events"]
            if len(rows) >= len(sent):
                break
            time.sleep(0.5)  # ack = "wal": committed within commit_interval_seconds
    finally:
        app.stop()
    seqs = sorted(json.loads(r["record"])["seq"] for r in rows)
    assert seqs == sorted(e["record"]["seq"] for e in sent)  # every acked event, once
    log = app.log()
    assert SECRET_ACCESS_KEY not in log


def test_maintenance_on_the_s3_table_keeps_every_query_result(s3_server: S3Server) -> None:
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    table = EventsTable(uri, options)
    table.open_or_create()
    for version, i in enumerate(range(30), start=1):  # a small file per commit: to compact
        assert table.commit(blocks_to_arrow([block(tag=f"t{i % 3}", records=[{"i": i}])]),
                            "node-m", version)  # fmt: skip

    def summary() -> list[tuple[str, int]]:
        return sorted((r["tag"], json.loads(r["record"])["i"]) for r in _rows(uri, options))

    before = summary()
    files_before = maintenance.table_stats(uri, options).files
    compacted = maintenance.compact(uri, options)
    maintenance.checkpoint(uri, options)
    vacuumed = maintenance.vacuum(uri, options, retention_hours=0, allow_short_retention=True)
    assert summary() == before
    files_after = maintenance.table_stats(uri, options).files
    assert files_after < files_before, compacted
    assert vacuumed.details, vacuumed  # the compacted-away files were deleted from the bucket
