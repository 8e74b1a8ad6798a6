"""Helpers of the Spark tests: events like the service writes them, a Sail server elsewhere.

The real CLI: tests.support.cli.run_cli, with :data:`CLI_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from appliance.blocks.block import RowBlock
from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.table import EventsTable

#: Seconds one CLI call may take (a Spark session, a query, a job).
CLI_TIMEOUT_SECONDS = 180


class EventsWriter:
    """Commits blocks to an ``events`` table the way the service's writer does."""

    def __init__(self, uri: str, app_id: str = "test-node") -> None:
        self.table = EventsTable(uri)
        self.table.open_or_create()
        self.app_id = app_id
        self.version = self.table.committed_version(app_id) or 0

    def commit(self, blocks: Sequence[RowBlock]) -> None:
        self.version += 1
        assert self.table.commit(blocks_to_arrow(blocks), self.app_id, self.version)


def block(
    *,
    protocol: str = "forward",
    tag: str = "app.web",
    source: str = "anonymous",
    records: Sequence[dict[str, Any]] = ({"message": "hello"},),
    times_ns: Sequence[int | None] | None = None,
    received_at_ns: int | None = None,
    host: str | None = None,
    batch_id: str | None = None,
) -> RowBlock:
    """A block of events with the given fields."""
    received = received_at_ns if received_at_ns is not None else time.time_ns()
    texts = [json.dumps(r, separators=(",", ":")) for r in records]
    return RowBlock(
        protocol=protocol,
        source=source,
        peer="127.0.0.1:5000",
        received_at_ns=received,
        batch_id=batch_id,
        tag=tag,
        host=host,
        times_ns=list(times_ns) if times_ns is not None else [received] * len(texts),
        records=texts,
    )


def write_config(directory: Path, body: str = "") -> Path:
    """A config file whose state directory is ``directory/state``."""
    path = directory / "appliance.toml"
    path.write_text(f'state_dir = "{directory / "state"}"\n{body}\n')
    return path


#: A Sail server that prints its URL, then runs until its stdin closes.
_SAIL_PROCESS = """
import sys
from pysail.spark import SparkConnectServer
server = SparkConnectServer("127.0.0.1", 0)
server.start(background=True)
print("sc://%s:%d" % server.listening_address, flush=True)
sys.stdin.read()
server.stop()
"""


@contextmanager
def sail_elsewhere(cwd: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A Sail server in a process of its own, in ``cwd`` with ``env`` added; its ``sc://`` URL.

    Not the session's in-process server: its working directory and
    environment are the test's to choose.
    """
    server = subprocess.Popen(
        [sys.executable, "-c", _SAIL_PROCESS], cwd=cwd, env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("sc://"), url
        yield url
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
