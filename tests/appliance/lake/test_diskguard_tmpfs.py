"""The disk guard end to end: a small tmpfs fills up under real clients, and empties again.

The whole service runs in-process with the ``events`` table on a 48 MiB
tmpfs (mounted here: the test needs root, and is skipped without it). A
forward client over TLS sends incompressible batches, waiting for each ack,
until the filesystem is below the watermark; then:

* the batch that crossed it gets no ack and its connection closes (forward
  has no way to say why); a WebSocket client gets an error answer naming
  the reason ("disk nearly full");
* every batch acknowledged before is in the table;
* once space is freed the same batches are accepted again, and each is in
  the table exactly once.
"""

from __future__ import annotations

import base64
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
import trio
from deltalake import DeltaTable
from trio_websocket import open_websocket

from appliance import service
from appliance.config import (
    AdminConfig,
    Config,
    ForwardListenerConfig,
    LakeConfig,
    WebSocketListenerConfig,
)
from appliance.lake import diskguard
from auth.database import open_database
from tests.appliance.lake.logcapture import logged
from tests.faults import small_tmpfs

MIB = 1024**2
#: The filesystem, the watermark and the room left above it when ingest starts.
TMPFS_BYTES = 48 * MIB
WATERMARK_BYTES = 16 * MIB
HEADROOM_BYTES = 4 * MIB
#: Bytes of one batch's record (random, so Parquet cannot compress it much).
RECORD_BYTES = 384 * 1024
#: Batches sent at most before the guard must have refused one.
MAX_BATCHES = 60
ORIGIN = "https://app.example"
WAIT_SECONDS = 30


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mountpoint:
        yield mountpoint


def forward_batch(chunk: str) -> bytes:
    """A PackedForward request of one event carrying RECORD_BYTES of random text."""
    now = int(time.time())
    payload = base64.b64encode(os.urandom(RECORD_BYTES * 3 // 4)).decode()
    entry = msgpack.packb([now, {"chunk": chunk, "data": payload}])
    packed: bytes = msgpack.packb(["disk.test", entry, {"chunk": chunk, "size": 1}])
    return packed


async def forward_send(running: service.Running, data: bytes) -> object | None:
    """Send one request on a new TLS connection; the ack, or None when it closes without one."""
    assert running.ca_file is not None
    context = ssl.create_default_context(cafile=str(running.ca_file))
    sock = await trio.open_tcp_stream("127.0.0.1", running.ports["forward"])
    stream = trio.SSLStream(sock, context, server_hostname="localhost")
    try:
        await stream.do_handshake()
        await stream.send_all(data)
        unpacker = msgpack.Unpacker()
        with trio.move_on_after(WAIT_SECONDS):
            while True:
                try:
                    received = await stream.receive_some(4096)
                except (trio.BrokenResourceError, ssl.SSLError):
                    return None
                if not received:
                    return None
                unpacker.feed(received)
                for obj in unpacker:
                    answer: object = obj
                    return answer
        return None
    finally:
        with trio.move_on_after(1):
            await stream.aclose()


async def websocket_send(running: service.Running, token: str, msg_id: str) -> dict[str, Any]:
    assert running.ca_file is not None
    context = ssl.create_default_context(cafile=str(running.ca_file))
    headers = [(b"authorization", f"Bearer {token}".encode()), (b"origin", ORIGIN.encode())]
    async with open_websocket(
        "localhost",
        running.ports["websocket"],
        "/ingest",
        use_ssl=context,
        extra_headers=headers,
        connect_timeout=WAIT_SECONDS,
        disconnect_timeout=WAIT_SECONDS,
    ) as ws:
        message = {"id": msg_id, "tag": "web.disk", "events": [{"record": {"msg": msg_id}}]}
        await ws.send_message(orjson.dumps(message).decode())
        with trio.fail_after(WAIT_SECONDS):
            answer: dict[str, Any] = orjson.loads(await ws.get_message())
        return answer


@pytest.mark.trio
async def test_a_full_disk_refuses_new_batches_loses_nothing_acked_and_recovers(
    tmp_path: Path, small_disk: Path, info_log: pytest.LogCaptureFixture
) -> None:
    table_uri = str(small_disk / "events")
    config = Config(
        state_dir=tmp_path / "state",
        admin=AdminConfig(bind="127.0.0.1:0"),  # not the machine-wide default port
        lake=LakeConfig(
            ack="commit",  # the disk guard is the table's: rows are there once acked
            path=table_uri,
            commit_max_delay_seconds=0.05,
            retry_initial_seconds=0.05,
            retry_max_seconds=0.2,
            min_free_bytes=WATERMARK_BYTES,
            min_free_percent=1.0,
        ),
        listeners=[
            ForwardListenerConfig(bind="127.0.0.1:0"),
            WebSocketListenerConfig(bind="127.0.0.1:0", allowed_origins=[ORIGIN]),
        ],
        shutdown_timeout_seconds=20,
    )
    config.state_dir.mkdir()

    def add_token() -> str:
        with open_database(config.auth_settings) as database:
            return database.tokens.add("sender", "ingest", ["web."], actor="test")[1]

    token = await trio.to_thread.run_sync(add_token)

    acked: list[str] = []
    refused_chunk: str | None = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        running: service.Running = await nursery.start(
            lambda task_status: service.serve(config, stop=stop, task_status=task_status)
        )
        try:
            assert await forward_send(running, forward_batch("warm-up")) == {"ack": "warm-up"}
            acked.append("warm-up")
            assert (await websocket_send(running, token, "ws-1")) == {"ack": "ws-1"}

            # Something else fills the disk until only HEADROOM is left above the watermark.
            space = diskguard.disk_space(table_uri)
            watermark = space.watermark(WATERMARK_BYTES, 1.0)
            filler = small_disk / "filler"
            with filler.open("wb") as out:
                out.truncate(0)
                out.write(b"\0" * (space.free - watermark - HEADROOM_BYTES))
            # Ingest then fills the rest.
            for n in range(MAX_BATCHES):
                chunk = f"chunk-{n}"
                answer = await forward_send(running, forward_batch(chunk))
                if answer is None:
                    refused_chunk = chunk
                    break
                assert answer == {"ack": chunk}
                acked.append(chunk)
            assert refused_chunk is not None, "the guard never refused a batch"
            assert len(acked) > 2, "the disk filled before any batch was ingested"
            free_now = diskguard.disk_space(table_uri).free
            assert free_now < watermark, "refused while above the watermark"
            assert free_now > 0, "the disk filled up completely: the guard came too late"

            # A WebSocket client is told why.
            refusal = await websocket_send(running, token, "ws-2")
            assert refusal["id"] == "ws-2"
            assert refusal["error"].startswith("not stored: disk nearly full:")
            assert "watermark" in refusal["error"]

            # Everything acknowledged is in the table; the refused batches are not.
            rows = await trio.to_thread.run_sync(
                lambda: DeltaTable(table_uri).to_pyarrow_table().to_pylist()
            )
            batches = [r["batch_id"] for r in rows]
            assert set(acked) <= set(batches)
            assert refused_chunk not in batches
            assert "ws-2" not in batches
            refusing = logged(info_log, "disk_guard.refusing")
            assert len(refusing) == 1
            assert refusing[0]["watermark_bytes"] == watermark

            # Space is freed: ingest resumes by itself, and the resends are accepted.
            filler.unlink()
            await trio.sleep(diskguard.CHECK_INTERVAL_SECONDS * 2)
            assert await forward_send(running, forward_batch(refused_chunk)) == {
                "ack": refused_chunk
            }
            assert (await websocket_send(running, token, "ws-2")) == {"ack": "ws-2"}
            assert len(logged(info_log, "disk_guard.resumed")) == 1
        finally:
            stop.set()
    rows = DeltaTable(table_uri).to_pyarrow_table().to_pylist()
    batches = [r["batch_id"] for r in rows]
    for chunk in [*acked, refused_chunk]:
        assert batches.count(chunk) == 1, chunk
    assert batches.count("ws-1") == batches.count("ws-2") == 1
