"""CompressedPackedForward with ``compressed: "zstd"`` in the forward codec.

Requests are built the way the senders build them (docs/forward.md, "zstd"):

* Fluentd >= 1.19 out_forward (``send_data_actual``): ``0x93``, the tag, the
  entries as a msgpack **str32** holding the buffer chunk's bytes, which are
  one zstd frame per buffer append (``ZstdDecompressable#append``, zstd-ruby's
  StreamWriter: no content size), then ``{"size": <events>, "compressed":
  "zstd", "chunk": <base64 + "\\n">}``.
* Fluent Bit's in_forward test request (``create_simple_json_zstd``): the
  entries as msgpack **bin** holding one ``ZSTD_compress`` level-1 frame, then
  ``{"compressed": "zstd", "size": <uncompressed bytes>}``.

Each is also fed split at every byte.
"""

from __future__ import annotations

import base64
import gzip
import struct
from typing import Any

import msgpack
import pytest
import zstandard

from appliance.protocols.errors import LocalProtocolError, ProtocolViolation, RemoteProtocolError
from appliance.protocols.forward import (
    Chunk,
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    unzstd_frames,
)

T0 = 1_700_000_000
NS = 1_000_000_000


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def event_time(seconds: int, nanoseconds: int) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def zstd_ruby_frame(data: bytes) -> bytes:
    """zstd-ruby ``StreamWriter``: ``write`` (continue, then flush), ``finish`` (end)."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    return (
        compressor.compress(data)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    )


def flb_zstd_compress(data: bytes) -> bytes:
    """Fluent Bit's ``flb_zstd_compress``: ``ZSTD_compress(..., 1)``."""
    return zstandard.ZstdCompressor(level=1).compress(data)


def fluentd_request(tag: str, appends: list[list[Any]], unique_id: bytes) -> bytes:
    """out_forward's ``send_data_actual`` for a chunk of ``appends`` (lists of entries)."""
    body = b"".join(zstd_ruby_frame(b"".join(pack(e) for e in entries)) for entries in appends)
    option = {
        "size": sum(len(entries) for entries in appends),
        "compressed": "zstd",
        "chunk": base64.encodebytes(unique_id).decode(),  # Ruby's Base64.encode64
    }
    return (
        b"\x93"
        + msgpack.packb(tag)
        + b"\xdb"
        + struct.pack(">I", len(body))
        + body
        + msgpack.packb(option)
    )


def fluent_bit_request(tag: str, entries: list[Any]) -> bytes:
    """The zstd request of Fluent Bit's in_forward runtime test, for ``entries``."""
    stream = b"".join(pack(entry) for entry in entries)
    return pack([tag, flb_zstd_compress(stream), {"compressed": "zstd", "size": len(stream)}])


def feed(data: bytes, **kwargs: Any) -> list[ForwardEvent]:
    return ForwardServerConnection(**kwargs).receive_data(data)


def only(events: list[ForwardEvent]) -> EventsReceived:
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, EventsReceived)
    return event


def closed_with_error(codec: ForwardServerConnection, data: bytes) -> ProtocolViolation:
    (error,) = codec.receive_data(data)
    assert isinstance(error, ProtocolViolation), error
    assert codec.state is ForwardState.CLOSED
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"")
    return error


UNIQUE_ID = bytes(range(16))
CHUNK_TEXT = base64.encodebytes(UNIQUE_ID).decode()
APPENDS = [
    [[event_time(T0, 1), {"message": "first", "n": 1}], [event_time(T0, 2), {"n": 2}]],
    [[event_time(T0 + 1, 0), {"message": "second append"}]],
    [[T0 + 2, {"message": "integer time"}]],
]
FLUENTD = fluentd_request("app.zstd", APPENDS, UNIQUE_ID)
FLUENT_BIT = fluent_bit_request("fb.zstd", [[T0, {"test": "msg"}], [T0 + 1, {"log": "x" * 500}]])


def fluentd_expected() -> EventsReceived:
    return EventsReceived(
        "app.zstd",
        "compressed",
        [T0 * NS + 1, T0 * NS + 2, (T0 + 1) * NS, (T0 + 2) * NS],
        [{"message": "first", "n": 1}, {"n": 2}, {"message": "second append"},
         {"message": "integer time"}],
        Chunk(CHUNK_TEXT.encode(), "str"),
    )  # fmt: skip


def fluent_bit_expected() -> EventsReceived:
    return EventsReceived(
        "fb.zstd", "compressed", [T0 * NS, (T0 + 1) * NS],
        [{"test": "msg"}, {"log": "x" * 500}], None,
    )  # fmt: skip


def test_the_requests_are_framed_as_the_senders_frame_them() -> None:
    # Fluentd: str32 entries of three frames (one per append), none with a
    # content size; the option map in send_data_actual's order.
    assert FLUENTD[:1] == b"\x93"
    entries_at = 1 + len(msgpack.packb("app.zstd"))
    assert FLUENTD[entries_at] == 0xDB
    (length,) = struct.unpack_from(">I", FLUENTD, entries_at + 1)
    body = FLUENTD[entries_at + 5 : entries_at + 5 + length]
    assert body.count(b"\x28\xb5\x2f\xfd") == len(APPENDS)
    assert zstandard.get_frame_parameters(body).content_size == zstandard.CONTENTSIZE_UNKNOWN
    option = msgpack.unpackb(FLUENTD[entries_at + 5 + length :])
    assert list(option) == ["size", "compressed", "chunk"]
    assert option["size"] == 4
    assert option["chunk"].endswith("\n")
    # Fluent Bit: bin entries, one frame with its content size.
    tag, entries, option = msgpack.unpackb(FLUENT_BIT, raw=False)
    assert (tag, list(option)) == ("fb.zstd", ["compressed", "size"])
    assert isinstance(entries, bytes)
    assert zstandard.get_frame_parameters(entries).content_size == option["size"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [(FLUENTD, fluentd_expected), (FLUENT_BIT, fluent_bit_expected)],
    ids=["fluentd", "fluent-bit"],
)
def test_zstd_requests_split_at_every_byte(data: bytes, expected: Any) -> None:
    want = expected()
    assert only(feed(data)) == want
    for at in range(len(data) + 1):
        codec = ForwardServerConnection()
        events = codec.receive_data(data[:at]) + codec.receive_data(data[at:])
        assert only(events) == want, at
    codec = ForwardServerConnection()
    events = []
    for i in range(len(data)):
        events += codec.receive_data(data[i : i + 1])
    assert only(events) == want


def test_the_ack_echoes_the_fluentd_chunk() -> None:
    codec = ForwardServerConnection()
    event = only(codec.receive_data(FLUENTD))
    assert event.chunk is not None
    assert msgpack.unpackb(codec.ack_bytes(event.chunk)) == {"ack": CHUNK_TEXT}


def test_several_zstd_requests_in_one_read_with_other_modes() -> None:
    gz = pack(["gz", gzip.compress(pack([T0, {"g": 1}])), {"compressed": "gzip"}])
    plain = pack(["p", pack([T0, {"p": 1}])])
    events = feed(FLUENTD + gz + FLUENT_BIT + plain + FLUENTD)
    assert [e.mode for e in events if isinstance(e, EventsReceived)] == [
        "compressed", "compressed", "compressed", "packed", "compressed",
    ]  # fmt: skip
    assert events[0] == events[4] == fluentd_expected()
    assert events[2] == fluent_bit_expected()


def test_an_entry_may_span_two_frames() -> None:
    stream = pack([T0, {"spans": "x" * 100}])
    body = zstd_ruby_frame(stream[:50]) + zstd_ruby_frame(stream[50:])
    event = only(feed(pack(["t", body, {"compressed": "zstd"}])))
    assert event.records == [{"spans": "x" * 100}]


def test_empty_and_skippable_frames_carry_no_events() -> None:
    skippable = struct.pack("<II", 0x184D2A50, 2) + b"hi"
    body = zstd_ruby_frame(b"") + skippable + zstd_ruby_frame(pack([T0, {"a": 1}]))
    event = only(feed(pack(["t", body, {"compressed": "zstd", "chunk": "c"}])))
    assert event.records == [{"a": 1}]
    event = only(feed(pack(["t", zstd_ruby_frame(b""), {"compressed": "zstd", "chunk": "c"}])))
    assert event.records == []  # an empty chunk: nothing stored, still acked


def test_the_decompressed_limit_exact_and_one_over() -> None:
    stream = b"".join(pack([T0, {"i": i}]) for i in range(100))
    request = pack(["t", zstd_ruby_frame(stream), {"compressed": "zstd"}])
    limits = ForwardLimits(max_decompressed_bytes=len(stream))
    assert len(only(feed(request, limits=limits)).records) == 100
    codec = ForwardServerConnection(ForwardLimits(max_decompressed_bytes=len(stream) - 1))
    error = closed_with_error(codec, request)
    assert error.reason == f"decompressed entries exceed max_decompressed_bytes={len(stream) - 1}"


def test_a_zstd_bomb_stops_at_the_limit() -> None:
    compressor = zstandard.ZstdCompressor(level=19).compressobj()
    mebibyte = bytes(1 << 20)
    bomb = b"".join(compressor.compress(mebibyte) for _ in range(256)) + compressor.flush()
    codec = ForwardServerConnection(ForwardLimits(max_decompressed_bytes=1 << 20))
    error = closed_with_error(codec, pack(["t", bomb, {"compressed": "zstd", "chunk": "c"}]))
    assert "max_decompressed_bytes" in error.reason


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_truncated_zstd_entries_close_without_events(cut: int) -> None:
    # Cut inside the last frame: the entries before it decode, but the chunk
    # is refused whole (never acked), as a truncated gzip member is.
    stream = pack([T0, {"a": 1}])
    body = zstd_ruby_frame(stream) + zstandard.ZstdCompressor(write_checksum=True).compress(stream)
    codec = ForwardServerConnection()
    error = closed_with_error(codec, pack(["t", body[:-cut], {"compressed": "zstd", "chunk": "c"}]))
    assert error.reason == "zstd entries are truncated"


@pytest.mark.parametrize(
    "body",
    [gzip.compress(pack([T0, {"a": 1}])), pack([T0, {"a": 1}]), b"\x28\xb5\x2f\xfdgarbage"],
    ids=["gzip", "plain-msgpack", "bad-frame"],
)
def test_entries_that_are_not_zstd_close_the_connection(body: bytes) -> None:
    codec = ForwardServerConnection()
    error = closed_with_error(codec, pack(["t", body, {"compressed": "zstd", "chunk": "c"}]))
    assert error.reason.startswith("zstd entries are invalid: ")


@pytest.mark.parametrize("option", [{"compressed": "text"}, {}], ids=["text", "absent"])
def test_zstd_entries_without_the_label_close_the_connection(option: dict[str, Any]) -> None:
    # 0x28 is a msgpack integer, never an entry: reading the frame as msgpack
    # would drop the chunk as invalid entries and ack it (Fluent Bit guesses
    # from the magic; the appliance refuses, docs/forward.md).
    codec = ForwardServerConnection()
    body = flb_zstd_compress(pack([T0, {"a": 1}]))
    error = closed_with_error(codec, pack(["t", body, {**option, "chunk": "c"}]))
    assert error.reason == f"entries are zstd data but compressed is {option.get('compressed')!r}"


def test_zstd_entries_labelled_gzip_are_invalid_gzip() -> None:
    codec = ForwardServerConnection()
    body = flb_zstd_compress(pack([T0, {"a": 1}]))
    error = closed_with_error(codec, pack(["t", body, {"compressed": "gzip"}]))
    assert error.reason.startswith("gzip entries are invalid")


@pytest.mark.parametrize("value", ["ZSTD", "zstandard", b"zstd", ["zstd"]])
def test_other_spellings_are_unsupported(value: Any) -> None:
    codec = ForwardServerConnection()
    request = pack(["t", flb_zstd_compress(pack([T0, {"a": 1}])), {"compressed": value}])
    error = closed_with_error(codec, request)
    assert error.reason == f"unsupported compression {value!r}"


def test_entries_stream_ending_inside_an_entry_after_unzstd() -> None:
    stream = pack([T0, {"a": 1}]) + pack([T0, {"b": 2}])[:-1]
    codec = ForwardServerConnection()
    error = closed_with_error(
        codec, pack(["t", zstd_ruby_frame(stream), {"compressed": "zstd", "chunk": "c"}])
    )
    assert "ends inside an entry" in error.reason


def test_unzstd_frames_maps_every_failure_to_a_protocol_error() -> None:
    frame = zstd_ruby_frame(b"abc")
    assert unzstd_frames(frame, 3) == b"abc"
    for data, reason in [
        (frame, "decompressed entries exceed max_decompressed_bytes=2"),
        (frame[:-1], "zstd entries are truncated"),
        (b"", "zstd entries are truncated"),
        (b"nope", "zstd entries are invalid: Unknown frame descriptor"),
    ]:
        with pytest.raises(RemoteProtocolError) as info:
            unzstd_frames(data, 2 if data == frame else 10)
        assert info.value.reason == reason


def test_a_zstd_stream_that_expands_past_deflates_ceiling_is_refused() -> None:
    """Small reads are decoded on the event loop: zstd may not expand more than deflate can."""
    import zstandard

    from appliance.protocols.forward import ZSTD_MAX_EXPANSION, ForwardServerConnection

    entries = msgpack.packb([1, {}]) * 250_000
    stream = zstandard.ZstdCompressor(level=19).compress(entries)
    assert len(entries) > ZSTD_MAX_EXPANSION * len(stream)  # a bomb by deflate's measure
    request = msgpack.packb(["t", stream, {"compressed": "zstd", "chunk": "c"}])
    error = closed_with_error(ForwardServerConnection(), request)
    assert "expand more than 1032:1" in error.reason
    # Ordinary log events compress far below the ceiling and are accepted.
    logs = b"".join(
        msgpack.packb([1_700_000_000 + i, {"message": f"GET /item/{i * 7919 % 10007} 200"}])
        for i in range(2000)
    )
    ok = msgpack.packb(["t", zstandard.ZstdCompressor().compress(logs), {"compressed": "zstd"}])
    (event,) = ForwardServerConnection().receive_data(ok)
    assert len(event.records) == 2000  # type: ignore[union-attr]
