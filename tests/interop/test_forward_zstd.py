"""``compressed: "zstd"`` over TLS to a running ``appliance serve``, framed as senders do.

No zstd-capable forward client is installed here, so the requests are built
from the senders' current sources (docs/forward.md, "zstd", cites each line):

* **Fluentd >= 1.19 out_forward** (``send_data_actual``): ``0x93``, the tag,
  ``0xdb`` + u32 length + the chunk's bytes (str32), then ``{"size":
  <events>, "compressed": "zstd", "chunk": Base64.encode64(unique_id)}``,
  each written to the socket separately. The chunk holds one zstd frame per
  buffer append (``ZstdDecompressable#append``: zstd-ruby's StreamWriter,
  ``write`` + ``finish``, no content size). It waits for ``{"ack": chunk}``;
  a chunk whose ack was lost is sent again.
* **Fluent Bit in_forward's own zstd request** (``tests/runtime/in_forward.c``,
  ``create_simple_json_zstd``): ``[tag, bin(ZSTD_compress(entries, 1)),
  {"compressed": "zstd", "size": <uncompressed bytes>}]``, no ack.
* **Fluent Bit out_forward's request layout** (``flush_forward_mode`` and
  ``flb_forward_format_options``) with ``"zstd"`` where it writes ``"gzip"``:
  bin entries, ``{"chunk": base64(sha512(entries)[:16]), "size": <events>,
  "compressed": ..., "fluent_signal": 0}``. Its out_forward sends only gzip
  today; this is the layout it would use.

Every event must arrive exactly once and every chunk be acked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl
import struct
import time
from typing import Any

import msgpack
import pytest
import zstandard

from tests.support.service import ApplianceProcess

pytestmark = pytest.mark.interop

T0 = 1_700_000_000
NS = 1_000_000_000


def event_time(seconds: int, nanoseconds: int) -> msgpack.ExtType:
    """Fluent::EventTime as msgpack ext 0 (what both senders write)."""
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def entries(tag: str, first: int, count: int) -> list[tuple[int, dict[str, Any]]]:
    """(event time in ns, record) with a unique ``seq`` per event."""
    return [
        ((T0 + seq) * NS + seq, {"seq": seq, "tag": tag, "msg": f"zstd event {seq} ünï"})
        for seq in range(first, first + count)
    ]


def pack_entries(events: list[tuple[int, dict[str, Any]]]) -> bytes:
    return b"".join(
        msgpack.packb([event_time(ns // NS, ns % NS), record], use_bin_type=True)
        for ns, record in events
    )


def zstd_ruby_frame(data: bytes) -> bytes:
    """zstd-ruby StreamWriter#write (continue, flush) then #finish (end), level 3."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    return (
        compressor.compress(data)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    )


def fluentd_writes(
    tag: str, appends: list[list[tuple[int, dict[str, Any]]]], unique_id: bytes
) -> tuple[list[bytes], str]:
    """The socket writes of out_forward's send_data_actual, and the chunk id it sends."""
    body = b"".join(zstd_ruby_frame(pack_entries(events)) for events in appends)
    chunk = base64.encodebytes(unique_id).decode()  # Base64.encode64: ends with "\n"
    option = {"size": sum(map(len, appends)), "compressed": "zstd", "chunk": chunk}
    return [
        b"\x93",  # forward_header
        msgpack.packb(tag),
        b"\xdb" + struct.pack(">I", len(body)),  # str32, written with the body
        body,
        msgpack.packb(option),
    ], chunk


def fluent_bit_test_request(tag: str, events: list[tuple[int, dict[str, Any]]]) -> bytes:
    """in_forward.c create_simple_json_zstd, for these events."""
    stream = pack_entries(events)
    body = zstandard.ZstdCompressor(level=1).compress(stream)  # flb_zstd_compress
    return (
        b"\x93"
        + msgpack.packb(tag)
        + msgpack.packb(body, use_bin_type=True)  # msgpack_pack_bin_with_body
        + b"\x82"
        + msgpack.packb("compressed")
        + msgpack.packb("zstd")
        + msgpack.packb("size")
        + msgpack.packb(len(stream))
    )


def fluent_bit_out_forward_writes(
    tag: str, events: list[tuple[int, dict[str, Any]]]
) -> tuple[list[bytes], str]:
    """flush_forward_mode's three writes (header, entries, options), with zstd for gzip."""
    stream = pack_entries(events)
    chunk = base64.b64encode(hashlib.sha512(stream).digest()[:16]).decode()
    body = zstandard.ZstdCompressor(level=1).compress(stream)
    header = b"\x93" + msgpack.packb(tag) + msgpack.packb(body, use_bin_type=True)[: -len(body)]
    options = msgpack.packb(
        {"chunk": chunk, "size": len(events), "compressed": "zstd", "fluent_signal": 0}
    )
    return [header, body, options], chunk


class Connection:
    """One TLS connection to the listener, reading msgpack answers."""

    def __init__(self, app: ApplianceProcess, port: int) -> None:
        context = ssl.create_default_context(cafile=str(app.ca_file))
        self._raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._tls = context.wrap_socket(self._raw, server_hostname="localhost")
        self._answers = msgpack.Unpacker(raw=False)

    def send(self, writes: list[bytes]) -> None:
        for data in writes:
            self._tls.sendall(data)

    def answer(self) -> object:
        while True:
            for message in self._answers:
                return message
            data = self._tls.recv(65536)
            if not data:
                return None
            self._answers.feed(data)

    def close(self) -> None:
        self._tls.close()
        self._raw.close()


def wait_for_rows(app: ApplianceProcess, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 30
    rows = app.rows()
    while len(rows) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        rows = app.rows()
    return rows


def test_zstd_chunks_arrive_exactly_once_and_are_acked(appliance: Any) -> None:
    app: ApplianceProcess = appliance({"forward": ""})
    port = app.ports["forward"]
    sent: dict[
        int, tuple[str, int, dict[str, Any], str | None]
    ] = {}  # seq -> tag, ns, record, chunk

    def remember(tag: str, events: list[tuple[int, dict[str, Any]]], chunk: str | None) -> None:
        for ns, record in events:
            sent[record["seq"]] = (tag, ns, record, chunk)

    # Fluentd: a chunk of one append; then, on one keepalive connection, a
    # chunk of 40 appends (40 frames) and a third chunk; then the first chunk
    # again, as after a lost ack.
    first = [entries("fluentd.one", 0, 10)]
    many = [entries("fluentd.many", 1000 + 25 * i, 25) for i in range(40)]
    third = [entries("fluentd.three", 3000, 300), entries("fluentd.three", 3300, 1)]
    writes_1, chunk_1 = fluentd_writes("fluentd.one", first, b"\x01" * 16)
    writes_2, chunk_2 = fluentd_writes("fluentd.many", many, bytes(range(16)))
    writes_3, chunk_3 = fluentd_writes("fluentd.three", third, b"\xfe" * 16)
    for tag, appends, chunk in [
        ("fluentd.one", first, chunk_1), ("fluentd.many", many, chunk_2),
        ("fluentd.three", third, chunk_3),
    ]:  # fmt: skip
        for events in appends:
            remember(tag, events, chunk)
    connection = Connection(app, port)
    connection.send(writes_1)
    assert connection.answer() == {"ack": chunk_1}
    connection.close()
    connection = Connection(app, port)
    connection.send(writes_2)
    connection.send(writes_3)
    assert connection.answer() == {"ack": chunk_2}
    assert connection.answer() == {"ack": chunk_3}
    connection.close()
    connection = Connection(app, port)
    connection.send(writes_1)  # the resend is acked and not stored twice
    assert connection.answer() == {"ack": chunk_1}
    connection.close()

    # Fluent Bit's in_forward test request: no chunk, so no answer.
    bit_events = entries("fluent-bit.test", 5000, 50)
    remember("fluent-bit.test", bit_events, None)
    connection = Connection(app, port)
    connection.send([fluent_bit_test_request("fluent-bit.test", bit_events)])
    # Fluent Bit's out_forward layout, acked, on the same connection.
    out_events = entries("fluent-bit.out", 6000, 200)
    writes, chunk = fluent_bit_out_forward_writes("fluent-bit.out", out_events)
    remember("fluent-bit.out", out_events, chunk)
    connection.send(writes)
    assert connection.answer() == {"ack": chunk}
    connection.close()

    rows = wait_for_rows(app, len(sent))
    assert app.stop() == 0
    rows = app.rows()
    seen: dict[int, int] = {}
    for row in rows:
        record = json.loads(str(row["record"]))
        seq = record["seq"]
        seen[seq] = seen.get(seq, 0) + 1
        tag, ns, expected, chunk = sent[seq]
        assert record == expected
        assert row["tag"] == tag
        assert row["event_time_ns"] == ns
        assert row["batch_id"] == chunk
        assert row["protocol"] == "forward"
    assert seen == dict.fromkeys(sent, 1)  # every event, exactly once
    assert "protocol.error" not in app.log()


def test_a_zstd_bomb_is_refused_and_not_acked(appliance: Any) -> None:
    app: ApplianceProcess = appliance({"forward": "max_decompressed_bytes = 1048576"})
    compressor = zstandard.ZstdCompressor(level=19).compressobj()
    mebibyte = bytes(1 << 20)
    bomb = b"".join(compressor.compress(mebibyte) for _ in range(256)) + compressor.flush()
    writes = [
        b"\x93",
        msgpack.packb("bomb"),
        b"\xdb" + struct.pack(">I", len(bomb)),
        bomb,
        msgpack.packb({"size": 1, "compressed": "zstd", "chunk": "Ym9tYg==\n"}),
    ]
    connection = Connection(app, app.ports["forward"])
    connection.send(writes)
    assert connection.answer() is None  # closed without an ack
    connection.close()
    # The listener goes on serving.
    ok_writes, chunk = fluentd_writes("after.bomb", [entries("after.bomb", 0, 3)], b"\x07" * 16)
    connection = Connection(app, app.ports["forward"])
    connection.send(ok_writes)
    assert connection.answer() == {"ack": chunk}
    connection.close()
    assert app.stop() == 0
    assert len(app.rows()) == 3
    assert "decompressed entries exceed max_decompressed_bytes=1048576" in app.log()
