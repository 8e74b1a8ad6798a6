"""``appliance table erase`` and ``expire`` while the service runs and a client keeps sending.

The service runs in-process (real TLS, a real table); the CLI runs as a
subprocess and hands the delete to the service, which runs it between two of
its own commits (``LakeWriter.run_exclusive``): no commit of the service
fails, every acknowledged batch of the other tag is kept, and the request is
in the audit log.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from deltalake import DeltaTable

from appliance import service
from appliance.config import AdminConfig, Config, ForwardListenerConfig, LakeConfig
from appliance.lake import table_requests
from tests.support.cli import run_cli

WAIT_SECONDS = 30
DAY_S = 86_400


def request(chunk: str, tag: str, age_days: int = 0, n: int = 3) -> bytes:
    at = int(time.time()) - age_days * DAY_S
    entries = b"".join(msgpack.packb([at, {"chunk": chunk, "i": i}]) for i in range(n))
    packed: bytes = msgpack.packb([tag, entries, {"chunk": chunk, "size": n}])
    return packed


async def read_ack(stream: trio.abc.ReceiveStream) -> object | None:
    unpacker = msgpack.Unpacker()
    with trio.move_on_after(WAIT_SECONDS):
        while True:
            data = await stream.receive_some(4096)
            if not data:
                return None
            unpacker.feed(data)
            for obj in unpacker:
                answer: object = obj
                return answer
    return None


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("table", *args, config=config)


@pytest.mark.trio
async def test_cli_deletes_run_in_the_service_while_a_client_sends(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config_file = tmp_path / "appliance.toml"
    config_file.write_text(f'state_dir = "{state}"\n')
    config = Config(
        state_dir=state,
        admin=AdminConfig(bind="127.0.0.1:0"),  # not the machine-wide default port
        lake=LakeConfig(
            ack="commit",  # the erase must see every acked row in the table
            commit_max_delay_seconds=0.02,
            retry_initial_seconds=0.05,
            retry_max_seconds=0.2,
        ),
        listeners=[ForwardListenerConfig(bind="127.0.0.1:0")],
        shutdown_timeout_seconds=20,
    )
    stop = trio.Event()
    acked: list[str] = []
    async with trio.open_nursery() as nursery:
        running: service.Running = await nursery.start(
            lambda task_status: service.serve(config, stop=stop, task_status=task_status)
        )
        try:
            assert running.ca_file is not None
            context = ssl.create_default_context(cafile=str(running.ca_file))
            sock = await trio.open_tcp_stream("127.0.0.1", running.ports["forward"])
            stream = trio.SSLStream(sock, context, server_hostname="localhost")
            await stream.do_handshake()
            # Seed: "gone" batches today, and "old" ones ten days ago.
            for n in range(6):
                for chunk, tag, age in ((f"gone-{n}", "gone", 0), (f"old-{n}", "keep", 10)):
                    await stream.send_all(request(chunk, tag, age))
                    assert await read_ack(stream) == {"ack": chunk}
            with trio.fail_after(WAIT_SECONDS):
                while table_requests.serving_pid(state) != os.getpid():
                    await trio.sleep(0.05)

            done = trio.Event()

            async def keep_sending() -> None:
                n = 0
                while not done.is_set():
                    chunk = f"keep-{n}"
                    await stream.send_all(request(chunk, "keep"))
                    assert await read_ack(stream) == {"ack": chunk}
                    acked.append(chunk)
                    n += 1

            async def run_commands() -> tuple[
                subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]
            ]:
                try:
                    while len(acked) < 5:
                        await trio.sleep(0.01)
                    erase = await trio.to_thread.run_sync(
                        cli, config_file, "erase", "--tag", "gone"
                    )
                    expire = await trio.to_thread.run_sync(
                        cli, config_file, "expire", "--max-age-days", "7"
                    )
                    n = len(acked)
                    while len(acked) < n + 5:  # ingest goes on after them
                        await trio.sleep(0.01)
                    return erase, expire
                finally:
                    done.set()

            outcome: list[tuple[Any, Any]] = []

            async def cli_task() -> None:
                outcome.append(await run_commands())

            async with trio.open_nursery() as inner:
                inner.start_soon(keep_sending)
                inner.start_soon(cli_task)
            await stream.aclose()
            erase, expire = outcome[0]
            assert erase.returncode == 0, erase.stderr
            assert f"running in the service (pid {os.getpid()})" in erase.stderr
            assert "rows_deleted: 18" in erase.stdout
            assert "vacuum" in erase.stdout
            assert expire.returncode == 0, expire.stderr
            assert "running in the service" in expire.stderr
            assert running.writer is not None
            assert running.writer.failed_attempts == 0, "a commit of the service raced a delete"
        finally:
            stop.set()
    rows = DeltaTable(config.table_uri).to_pyarrow_table().to_pylist()
    batches = {r["batch_id"] for r in rows}
    assert set(acked) <= batches
    assert {r["tag"] for r in rows} == {"keep"}
    assert not any(b.startswith(("gone-", "old-")) for b in batches)
    assert len(rows) == 3 * len(acked)
    history = DeltaTable(config.table_uri).history()
    deletes = [h for h in history if h["operation"] == "DELETE"]
    assert len(deletes) == 2
    audit = run_cli("audit", "list", config=config_file)
    assert "table.erase" in audit.stdout
    assert "predicate=tag = 'gone'" in audit.stdout
