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
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from deltalake import DeltaTable

from appliance.lake import maintenance
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.errors import CommitError
from appliance.lake.table import EventsTable
from appliance.lake.writer import LakeWriter, WriterSettings
from tests.interop.test_forward_node import node_send
from tests.s3server import SECRET_ACCESS_KEY, S3Server
from tests.spark.helpers import block
from tests.support.service import start_appliance

#: Blocks each of the racing writers commits, one group each (a commit per block).
RACING_BLOCKS = 12
#: Commits each appending node makes while compaction runs.
APPENDS = 15
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


@pytest.mark.parametrize(
    ("ack", "credentials"),
    [("commit", "config"), ("wal", "config"), ("wal", "environment")],
)
def test_the_service_writes_to_s3_and_never_logs_its_credentials(
    s3_server: S3Server, tmp_path: Path, ack: str, credentials: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Credentials from ``[lake] storage_options``, or from the standard AWS variables."""
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    lake = f'path = "{uri}"\nack = "{ack}"\ncommit_interval_seconds = 0.5\n'
    if credentials == "config":
        lake += s3_server.toml_options()
    else:
        for key, value in options.items():  # the service process inherits them
            monkeypatch.setenv(key if key.startswith("AWS_") else f"AWS_{key.upper()}", value)
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


def test_compaction_while_two_nodes_append_keeps_every_row(s3_server: S3Server) -> None:
    """Compaction (a rewrite with dataChange = false) races two appending nodes: nothing lost."""
    uri = f"s3://{s3_server.bucket()}/events"
    options = s3_server.storage_options()
    EventsTable(uri, options).open_or_create()
    for version in range(1, 11):  # small files for compaction to rewrite
        table = EventsTable(uri, options)
        table.open_or_create()
        table.commit(
            blocks_to_arrow([block(tag="seed", records=[{"i": version}])]), "seed", version
        )

    def append(node: str) -> None:
        table = EventsTable(uri, options)
        table.open_or_create()
        for version in range(1, APPENDS + 1):
            rows = blocks_to_arrow([block(tag=node, records=[{"i": version}])])
            while True:
                try:
                    table.commit(rows, node, version)
                    break
                except CommitError:
                    continue  # a lost race: retried, and the app transaction keeps it once

    threads = [threading.Thread(target=append, args=(f"node-{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    compacted = maintenance.compact(uri, options)
    for thread in threads:
        thread.join(120)
    got = sorted((r["tag"], json.loads(r["record"])["i"]) for r in _rows(uri, options))
    want = [("node-0", i) for i in range(1, APPENDS + 1)]
    want += [("node-1", i) for i in range(1, APPENDS + 1)]
    want += [("seed", i) for i in range(1, 11)]
    assert got == sorted(want), compacted


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
