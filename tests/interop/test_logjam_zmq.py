"""Real ZeroMQ producers against the Logjam listener, with and without CURVE, into the table.

Clients: pyzmq DEALER and PUSH sockets (the way logjam agents use libzmq),
and the npm ``zeromq`` package (v6, its bundled prebuilt libzmq) through
tests/interop/node/logjam_send.mjs. The listener runs in-process with the
real lake writer (``logjam_service`` from the driver tests) until the service
wiring lands; every test reads the Delta table after a graceful stop.
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import cramjam
import pytest
import trio
import zmq

from appliance.protocols.logjam import Compression, pack_meta
from auth.curve import generate_keypair
from tests.appliance.server.test_logjam_listener import (
    APP_ENV,
    TOPIC,
    Harness,
    client,
    in_thread,
    logjam_service,
    monitored,
    quiet,
    request,
    send,
)

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).parent / "node"
#: 2026-11-22T10:00:00.456Z
CREATED_MS = 1795341600456

COMPRESSORS: dict[str, tuple[int, Any]] = {
    "none": (Compression.NONE, lambda data: data),
    "zlib": (Compression.ZLIB, zlib.compress),
    "gzip": (Compression.ZLIB, gzip.compress),
    "snappy": (Compression.SNAPPY, lambda data: bytes(cramjam.snappy.compress_raw(data))),
    "lz4": (
        Compression.LZ4,
        lambda data: (
            struct.pack(">I", len(data)) + bytes(cramjam.lz4.compress_block(data, store_size=False))
        ),
    ),
}


def frames(seq: int, *, run: str, method: str = "none", **extra: Any) -> list[bytes]:
    number, compress = COMPRESSORS[method]
    record = {"host": "web1.example", "run": run, "seq": seq, "method": method, **extra}
    body = compress(json.dumps(record).encode())
    return [
        APP_ENV,
        TOPIC,
        body,
        pack_meta(compression=number, created_ms=CREATED_MS, sequence=seq),
    ]


def records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((json.loads(row["record"]) for row in rows), key=lambda r: r["seq"])


async def connect(service: Harness, kind: int, name: str | None) -> zmq.Socket[bytes]:
    """A client of ``kind``; with CURVE, under a new key called ``name``."""
    endpoint = service.router if kind == zmq.DEALER else service.pull
    if service.ports.server_public_key is None:
        return client(kind, endpoint)
    assert name is not None
    keypair = await service.add_key(name)
    return client(kind, endpoint, server_key=service.ports.server_public_key, keypair=keypair)


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
async def test_dealer_request_gets_202_and_its_row(tmp_path: Path, curve: bool) -> None:
    async with logjam_service(tmp_path, curve=curve) as service:
        dealer = await connect(service, zmq.DEALER, "dealer-key")
        for seq in (1, 2, 3):
            assert await request(dealer, frames(seq, run="dealer")) == [APP_ENV, b"202 Accepted"]
        dealer.close()
    rows = service.rows()
    assert [r["seq"] for r in records(rows)] == [1, 2, 3]
    row = rows[0]
    assert (row["protocol"], row["tag"], row["host"]) == ("logjam", TOPIC.decode(), "web1.example")
    assert row["source"] == ("dealer-key" if curve else "anonymous")
    assert row["peer"] == "127.0.0.1"
    assert row["event_time_ns"] == CREATED_MS * 1_000_000
    assert json.loads(row["record"])["_logjam"]["app_env"] == APP_ENV.decode()


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
async def test_push_messages_become_rows(tmp_path: Path, curve: bool) -> None:
    async with logjam_service(tmp_path, curve=curve) as service:
        push = await connect(service, zmq.PUSH, "push-key")
        for seq in range(1, 21):
            await in_thread(send, push, frames(seq, run="push"))
        # A DEALER request after them on another socket: once it is answered,
        # the PUSH messages have been read too (they were sent first and the
        # listener reads both sockets), or they are still queued and drained
        # at the graceful stop below.
        dealer = await connect(service, zmq.DEALER, "probe")
        assert await request(dealer, frames(100, run="probe")) == [APP_ENV, b"202 Accepted"]
        push.close()
        dealer.close()
        await wait_rows(service, 21)
    assert [r["seq"] for r in records(service.rows())] == [*range(1, 21), 100]


async def wait_rows(service: Harness, count: int) -> None:
    """Wait until ``count`` rows are committed (bounded by the test's own timeout)."""
    with trio.fail_after(60):
        while service.writer.rows_committed < count:
            await trio.sleep(0.05)


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
async def test_ping_gets_its_reply(tmp_path: Path, curve: bool) -> None:
    async with logjam_service(tmp_path, curve=curve) as service:
        dealer = await connect(service, zmq.DEALER, "pinger")
        ping = [b"ping", APP_ENV, b"{}", pack_meta(created_ms=CREATED_MS)]
        assert await request(dealer, ping) == [b"ping", b"200 OK", b"logjam.test.example"]
        bad = [b"ping", APP_ENV, b"{}", b"\xca\xbd" + b"\0" * 22]  # version 0
        assert await request(dealer, bad) == [b"ping", b"400 Bad Request"]
        dealer.close()
    assert service.rows() == []


BAD_MESSAGES = {
    "bad meta": lambda: [APP_ENV, TOPIC, b"{}", b"\x12\x34" + pack_meta()[2:]],
    "short meta": lambda: [APP_ENV, TOPIC, b"{}", pack_meta()[:20]],
    "bad topic": lambda: [APP_ENV, b"metrics.shop", b"{}", pack_meta()],
    "three frames": lambda: [APP_ENV, TOPIC, b"{}"],
    "five frames": lambda: [APP_ENV, TOPIC, b"{}", pack_meta(), b"extra"],
    "bad json": lambda: [APP_ENV, TOPIC, b"{oops", pack_meta()],
    "bad zlib": lambda: [APP_ENV, TOPIC, b"\x78\x9cnope", pack_meta(compression=1)],
}


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
async def test_malformed_messages_get_400_or_are_dropped_and_write_nothing(
    tmp_path: Path, curve: bool
) -> None:
    async with logjam_service(tmp_path, curve=curve) as service:
        dealer = await connect(service, zmq.DEALER, "dealer")
        push = await connect(service, zmq.PUSH, "push")
        for name, make in BAD_MESSAGES.items():
            assert await request(dealer, make()) == [APP_ENV, b"400 Bad Request"], name
            await in_thread(send, push, make())
            await in_thread(send, dealer, make())  # async on the ROUTER: no reply
        assert await in_thread(quiet, dealer)
        dealer.close()
        push.close()
    assert service.rows() == []


@pytest.mark.trio
async def test_unknown_curve_key_is_refused(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, curve=True) as service:
        server_key = service.ports.server_public_key
        stranger = tuple(k.encode() for k in generate_keypair())
        for kind, endpoint in ((zmq.DEALER, service.router), (zmq.PUSH, service.pull)):
            sock, outcome = await in_thread(
                lambda k=kind, e=endpoint: monitored(k, e, server_key=server_key, keypair=stranger)
            )
            assert outcome == "refused"
            sock.close()
    assert service.rows() == []


@pytest.mark.trio
@pytest.mark.parametrize("method", sorted(COMPRESSORS))
async def test_every_compression_method(tmp_path: Path, method: str) -> None:
    async with logjam_service(tmp_path, curve=True) as service:
        dealer = await connect(service, zmq.DEALER, "compressor")
        push = await connect(service, zmq.PUSH, "compressor-push")
        lines = [[1, "2026-11-22T10:00:00.000001", f"line {i} " * 30] for i in range(40)]
        message = frames(1, run=method, method=method, lines=lines)
        assert await request(dealer, message) == [APP_ENV, b"202 Accepted"]
        await in_thread(send, push, frames(2, run=method, method=method, lines=lines))
        dealer.close()
        push.close()
        await wait_rows(service, 2)
    got = records(service.rows())
    assert [r["seq"] for r in got] == [1, 2]
    assert all(r["lines"] == lines and r["method"] == method for r in got)


@pytest.mark.trio
async def test_a_resent_request_is_acknowledged_again_and_stored_once(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, curve=False) as service:
        dealer = await connect(service, zmq.DEALER, None)
        message = frames(1, run="resend")
        assert await request(dealer, message) == [APP_ENV, b"202 Accepted"]
        assert await request(dealer, message) == [APP_ENV, b"202 Accepted"]
        # Another process of the same app numbers from 1 too: not a duplicate.
        other = frames(1, run="resend", process_id=2)
        assert await request(dealer, other) == [APP_ENV, b"202 Accepted"]
        dealer.close()
    assert len(service.rows()) == 2
    assert service.writer.duplicates == 1


@pytest.mark.trio
async def test_edge_byte_swapped_meta_is_accepted_end_to_end(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, curve=False) as service:
        dealer = await connect(service, zmq.DEALER, None)
        body = json.dumps({"seq": 1, "host": "le.example"}).encode()
        swapped = pack_meta(created_ms=CREATED_MS, sequence=1, little_endian=True)
        assert await request(dealer, [APP_ENV, TOPIC, body, swapped]) == [APP_ENV, b"202 Accepted"]
        dealer.close()
    (row,) = service.rows()
    assert row["event_time_ns"] == CREATED_MS * 1_000_000


# -- npm zeromq ---------------------------------------------------------------------------


def node_available() -> None:
    if shutil.which("node") is None:
        reason = "node is not installed: the npm zeromq client cannot run"
        print(reason)
        pytest.skip(reason)
    assert (NODE_DIR / "node_modules" / "zeromq").is_dir(), (
        "tests/interop/node/node_modules/zeromq missing: run 'make node-deps'"
    )


async def node_send(service: Harness, socket: str, *args: str, keys: bool = True) -> Any:
    endpoint = service.router if socket == "dealer" else service.pull
    command = ["node", str(NODE_DIR / "logjam_send.mjs"), "--socket", socket,
               "--endpoint", endpoint, *args]  # fmt: skip
    if service.ports.server_public_key is not None and keys:
        public, secret = await service.add_key(f"node-{socket}")
        # "--opt=value": a Z85 key may begin with "-", which parseArgs would
        # take for an option.
        command += [
            f"--server-key={service.ports.server_public_key}",
            f"--public-key={public.decode()}",
            f"--secret-key={secret.decode()}",
        ]
    return await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
@pytest.mark.parametrize("compression", ["none", "zlib", "gzip"])
async def test_npm_zeromq_dealer_and_push(tmp_path: Path, curve: bool, compression: str) -> None:
    node_available()
    async with logjam_service(tmp_path, curve=curve) as service:
        dealer = await node_send(service, "dealer", "--count", "3", "--ping", "--run", "dealer",
                                 "--compression", compression)  # fmt: skip
        assert dealer.returncode == 0, dealer.stderr.decode()
        replies = [json.loads(line) for line in dealer.stdout.decode().splitlines()]
        assert [r["reply"] for r in replies] == [["shop-production", "202 Accepted"]] * 3 + [
            ["ping", "200 OK", "logjam.test.example"]
        ]
        push = await node_send(service, "push", "--count", "4", "--run", "push",
                               "--compression", compression)  # fmt: skip
        assert push.returncode == 0, push.stderr.decode()
        await wait_rows(service, 7)
    rows = service.rows()
    by_run = sorted((json.loads(r["record"])["run"], json.loads(r["record"])["seq"]) for r in rows)
    assert by_run == [("dealer", 1), ("dealer", 2), ("dealer", 3)] + [
        ("push", i) for i in (1, 2, 3, 4)
    ]
    expected = {"node-dealer", "node-push"} if curve else {"anonymous"}
    assert {r["source"] for r in rows} == expected
    assert all(r["host"] == "node.interop.invalid" for r in rows)


@pytest.mark.trio
async def test_npm_zeromq_with_an_unknown_key_gets_nothing_through(tmp_path: Path) -> None:
    node_available()
    async with logjam_service(tmp_path, curve=True) as service:
        public, secret = generate_keypair()
        command = ["node", str(NODE_DIR / "logjam_send.mjs"), "--socket", "dealer",
                   "--endpoint", service.router, "--count", "1", "--timeout-ms", "1500",
                   f"--server-key={service.ports.server_public_key}",
                   f"--public-key={public}", f"--secret-key={secret}"]  # fmt: skip
        result = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                        check=False)  # fmt: skip
        assert result.returncode == 1
        assert result.stdout == b""
    assert service.rows() == []
