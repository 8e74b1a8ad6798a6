"""The whole service in-process for a test: a config with one listener, start, stop, rows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from deltalake import DeltaTable

from appliance.config import Config, LakeConfig
from appliance.service import Running, serve

#: Commits and retries fast, so a test waits tens of milliseconds for an ack.
#: ``ack = "commit"``: these tests read the table right after an ack (the rows
#: are there once acked); the write-ahead log's own tests use :data:`FAST_WAL_LAKE`.
FAST_LAKE = LakeConfig(
    ack="commit", commit_max_delay_seconds=0.05, retry_initial_seconds=0.05, retry_max_seconds=0.2
)
#: ``ack = "wal"`` (the default): acks from the log, commits every 0.2 s.
FAST_WAL_LAKE = LakeConfig(
    ack="wal", commit_interval_seconds=0.2, retry_initial_seconds=0.05, retry_max_seconds=0.2
)


def service_config(tmp_path: Path, listener_type: Callable[..., Any], **listener: Any) -> Config:
    """A config in ``tmp_path`` with :data:`FAST_LAKE` and one listener on a free port."""
    settings: dict[str, Any] = {"bind": "127.0.0.1:0", **listener}
    return Config(
        state_dir=tmp_path / "state",
        lake=FAST_LAKE,
        listeners=[listener_type(**settings)],
        shutdown_timeout_seconds=20,
    )


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[Running]:
    """:func:`serve` in the background until the block ends, then a graceful stop."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(
            lambda task_status: serve(config, stop=stop, task_status=task_status)
        )
        try:
            yield info
        finally:
            stop.set()


def table_rows(config: Config) -> list[dict[str, Any]]:
    return DeltaTable(config.table_uri).to_pyarrow_table().to_pylist()
