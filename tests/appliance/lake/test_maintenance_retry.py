"""The service's maintenance and retention steps through storage failures (appliance/lake/retry.py).

Real tables on disk and a real writer; the failure is injected into the
operation (the first attempts raise what table.py and maintenance.py raise
for object_store's ``503 SlowDown``: a LakeError chained from deltalake's
OSError). The backoff is shortened so the real clock moves quickly; nothing
asserts a duration, waits are bounded only to fail a hung test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from deltalake import DeltaTable

from appliance.config import Config, MaintenanceConfig
from appliance.lake import maintenance, operations, retention, schedule, table_requests
from appliance.lake.errors import LakeError
from appliance.lake.retry import Backoff
from tests.appliance.lake.logcapture import logged
from tests.appliance.lake.test_maintenance import PATIENCE_SECONDS, _writer, block

SLOWDOWN = (
    "Generic S3 error\n  ↳ Error performing PUT http://127.0.0.1:1/lake/events/part-1.parquet"
    "\n  ↳ 503 Service Unavailable\n  ↳ <Error><Code>SlowDown</Code></Error>"
)


def slowdown() -> LakeError:
    try:
        raise OSError(SLOWDOWN)
    except OSError as exc:
        try:
            raise LakeError(f"compaction of s3://lake/events failed: {exc}") from exc
        except LakeError as error:
            return error


class Failing:
    """Wraps an operation: its first ``times`` calls raise ``error()``, then it runs."""

    def __init__(self, fn: Callable[..., Any], times: int, error: Callable[[], Exception]) -> None:
        self.fn, self.times, self.error = fn, times, error
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error()
        return self.fn(*args, **kwargs)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "STEP_BACKOFF", Backoff(0.01, 0.05))


def _config(tmp_path: Path, uri: str, **intervals: Any) -> Config:
    config = Config(state_dir=tmp_path, maintenance=MaintenanceConfig(**intervals))
    return replace(config, lake=replace(config.lake, path=uri))


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(PATIENCE_SECONDS):
        while not condition():
            await trio.sleep(0.01)


def _done(caplog: pytest.LogCaptureFixture, operation: str) -> int:
    return sum(1 for e in logged(caplog, "maintenance.done") if e.get("operation") == operation)


@pytest.mark.trio
async def test_a_step_that_fails_for_a_while_is_retried_and_done(
    tmp_path: Path, info_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "events")
    flaky = Failing(maintenance.compact, 3, slowdown)
    monkeypatch.setattr(maintenance, "compact", flaky)
    config = _config(
        tmp_path, uri, compact_interval_seconds=0.05, checkpoint_interval_seconds=3600,
        vacuum_interval_seconds=3600,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        for n in range(4):
            ticket = await writer.submit(block(n))
            with trio.fail_after(PATIENCE_SECONDS):
                await ticket.wait()
        nursery.start_soon(schedule.run_maintenance, writer, config)
        await _until(lambda: _done(info_log, "compact") >= 1)
        # Ingest goes on between the attempts.
        ticket = await writer.submit(block(99))
        with trio.fail_after(PATIENCE_SECONDS):
            await ticket.wait()
        nursery.cancel_scope.cancel()
    retries = logged(info_log, "table.retry")
    assert [r["attempt"] for r in retries[:3]] == [1, 2, 3]
    assert {r["op"] for r in retries} == {"maintenance compact"}
    assert retries[0]["reason"] == "Generic S3 error: 503 Service Unavailable (SlowDown)"
    recovered = logged(info_log, "table.recovered")
    assert recovered[0]["op"] == "maintenance compact"
    assert recovered[0]["attempts"] == 4
    assert not logged(info_log, "maintenance.failed")
    compacted = [e for e in logged(info_log, "maintenance.done") if e["operation"] == "compact"]
    assert compacted[0]["files_before"] == 4
    assert compacted[0]["files_after"] == 1
    assert DeltaTable(uri).count() == 5 * 3


@pytest.mark.trio
async def test_a_step_that_keeps_failing_is_skipped_and_the_schedule_goes_on(
    tmp_path: Path, info_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "events")
    monkeypatch.setattr(schedule, "STEP_RETRY_SECONDS", 0.2)
    broken = Failing(maintenance.compact, 10**9, slowdown)
    monkeypatch.setattr(maintenance, "compact", broken)
    config = _config(
        tmp_path, uri, compact_interval_seconds=0.05, checkpoint_interval_seconds=0.08,
        vacuum_interval_seconds=3600,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        ticket = await writer.submit(block(1))
        with trio.fail_after(PATIENCE_SECONDS):
            await ticket.wait()
        nursery.start_soon(schedule.run_maintenance, writer, config)

        def failed_compactions() -> list[dict[str, Any]]:
            failures = logged(info_log, "maintenance.failed")
            return [f for f in failures if f.get("operation") == "compact"]

        # Two rounds of compaction given up, and checkpoints done between them.
        await _until(lambda: len(failed_compactions()) >= 2 and _done(info_log, "checkpoint") >= 1)
        nursery.cancel_scope.cancel()
    first = failed_compactions()[0]
    assert first["attempts"] >= 2
    assert first["reason"] == "Generic S3 error: 503 Service Unavailable (SlowDown)"
    assert first["next_in_seconds"] == 0.05
    assert broken.calls >= 4


@pytest.mark.trio
async def test_a_permanent_error_is_not_retried(
    tmp_path: Path, info_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "events")
    broken = Failing(maintenance.checkpoint, 10**9, lambda: LakeError("no Delta table at x"))
    monkeypatch.setattr(maintenance, "checkpoint", broken)
    config = _config(
        tmp_path, uri, compact_interval_seconds=3600, checkpoint_interval_seconds=0.05,
        vacuum_interval_seconds=3600,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        nursery.start_soon(schedule.run_maintenance, writer, config)
        await _until(lambda: len(logged(info_log, "maintenance.failed")) >= 2)
        nursery.cancel_scope.cancel()
    assert not logged(info_log, "table.retry")
    assert logged(info_log, "maintenance.failed")[0]["reason"] == "no Delta table at x"


@pytest.mark.trio
async def test_a_handed_over_erase_is_retried_through_a_transient_failure(
    tmp_path: Path, info_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "events")
    flaky = Failing(retention.erase, 2, slowdown)
    monkeypatch.setattr(retention, "erase", flaky)
    requests = tmp_path / table_requests.REQUESTS_DIR
    requests.mkdir()
    path = requests / "1-abc.request.json"
    path.write_text(json.dumps({"operation": "erase", "predicate": "tag = 't1'"}))
    async with trio.open_nursery() as nursery:
        writer = await _writer(nursery, uri)
        for n in range(6):
            ticket = await writer.submit(block(n))
            with trio.fail_after(PATIENCE_SECONDS):
                await ticket.wait()
        with trio.fail_after(PATIENCE_SECONDS):
            await table_requests._serve_one(writer, path, uri, None, operations.lock_path(tmp_path))
        nursery.cancel_scope.cancel()
    answer = json.loads((requests / "1-abc.result.json").read_text())
    assert answer["ok"], answer
    assert answer["result"]["details"]["rows_deleted"] == 2 * 3  # blocks 1 and 4 have tag t1
    assert flaky.calls == 3
    assert [r["op"] for r in logged(info_log, "table.retry")] == ["table request erase"] * 2
    assert DeltaTable(uri).count() == 4 * 3
