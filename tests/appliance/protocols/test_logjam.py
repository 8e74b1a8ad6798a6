"""The Logjam codec and its decompressors: frames in, events or a 400 out.

Real compressed bodies come from cramjam (Rust snappy and LZ4) and the
standard library (zlib, gzip); the decoders under test are the appliance's own
pure-Python ones. Each edge case docs/logjam.md lists has a test named after it.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.protocols import compression
from appliance.protocols.compression import CompressionError
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.logjam import (
    ACCEPTED,
    BAD_REQUEST,
    PONG,
    UNKNOWN_APP_ENV,
    Compression,
    DataMessage,
    LogjamLimits,
    LogjamReceiver,
    MalformedMessage,
    Ping,
    Route,
    accepted_frames,
    bad_request_frames,
    pack_meta,
    parse_meta,
    pong_frames,
)

ID = b"\x00\x80\x00\x00\x29"
APP_ENV = b"shop-production"
TOPIC = b"logs.shop.production"
RECORD = {"action": "Orders#show", "host": "web1.example", "started_ms": 1795341600123}
BODY = json.dumps(RECORD).encode()


def snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def lz4(data: bytes) -> bytes:
    """Logjam method 3: big-endian u32 size, then a raw LZ4 block."""
    return struct.pack(">I", len(data)) + bytes(cramjam.lz4.compress_block(data, store_size=False))


COMPRESSORS: dict[str, tuple[int, Any]] = {
    "none": (Compression.NONE, lambda data: data),
    "zlib": (Compression.ZLIB, zlib.compress),
    "gzip": (Compression.ZLIB, gzip.compress),
    "snappy": (Compression.SNAPPY, snappy),
    "lz4": (Compression.LZ4, lz4),
}


def meta(**fields: Any) -> bytes:
    fields.setdefault("created_ms", 1795341600456)
    fields.setdefault("sequence", 7)
    return pack_meta(**fields)


def request(*frames: bytes) -> list[bytes]:
    return [ID, b"", *frames]


def data(body: bytes = BODY, *, topic: bytes = TOPIC, **meta_fields: Any) -> list[bytes]:
    return [APP_ENV, topic, body, meta(**meta_fields)]


def refused(
    receiver: LogjamReceiver, frames: list[bytes], *, pull: bool = False
) -> MalformedMessage:
    receive = receiver.receive_pull if pull else receiver.receive_router
    with pytest.raises(MalformedMessage) as raised:
        receive(frames)
    return raised.value


R = LogjamReceiver()


# -- the meta frame ---------------------------------------------------------------------


def test_meta_frame_layout_is_24_bytes_big_endian() -> None:
    frame = pack_meta(compression=2, device=3, created_ms=0x0102030405, sequence=0x0A0B)
    assert frame.hex() == "cabd020100000003" + "0000000102030405" + "0000000000000a0b"
    assert parse_meta(frame) == parse_meta(frame)
    decoded = parse_meta(frame)
    assert (decoded.compression, decoded.version, decoded.device) == (2, 1, 3)
    assert (decoded.created_ms, decoded.sequence, decoded.swapped) == (0x0102030405, 0x0A0B, False)


def test_edge_byte_swapped_tag_is_read_little_endian() -> None:
    frame = pack_meta(compression=0, device=9, created_ms=1795341600456, sequence=42,
                      little_endian=True)  # fmt: skip
    assert frame[:2] == b"\xbd\xca"
    decoded = parse_meta(frame)
    assert decoded.swapped
    assert (decoded.device, decoded.created_ms, decoded.sequence) == (9, 1795341600456, 42)
    event = R.receive_router(request(*data(little_endian=True)))
    assert isinstance(event, DataMessage)
    assert event.meta.sequence == 7


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (pack_meta()[:23], "has 23 bytes"),
        (pack_meta() + b"\0", "has 25 bytes"),
        (b"", "has 0 bytes"),
        (pack_meta(tag=0xCAFE), "tag is 0xcafe"),
        (pack_meta(version=2), "version is 2"),
        (pack_meta(version=0), "version is 0"),
    ],
)
def test_bad_meta_gets_400_on_a_request(frame: bytes, reason: str) -> None:
    error = refused(R, request(APP_ENV, TOPIC, BODY, frame))
    assert reason in error.reason
    assert error.reply_frames == [ID, APP_ENV, BAD_REQUEST]
    assert isinstance(error, RemoteProtocolError)


def test_bad_meta_is_dropped_without_reply_on_async_router_and_pull() -> None:
    frames = [APP_ENV, TOPIC, BODY, b"\0" * 24]
    assert refused(R, [ID, *frames]).reply_frames is None
    assert refused(R, frames, pull=True).reply_frames is None


# -- frames ----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 6])
def test_wrong_frame_count_gets_400_on_a_request(count: int) -> None:
    frames = [APP_ENV, TOPIC, BODY, meta(), b"extra", b"more"][:count]
    error = refused(R, request(*frames))
    # Past MAX_MESSAGE_FRAMES (6 with the routing id and delimiter) the driver
    # has not read the rest, so the reason does not claim a count.
    expected = f"{count} frames" if count + 2 <= 6 else "more than 6 frames"
    assert expected in error.reason
    # The first reply frame echoes the app-env frame; without one, the device's stand-in.
    echoed = APP_ENV if count else UNKNOWN_APP_ENV
    assert error.reply_frames == bad_request_frames(Route(ID, reply=True, app_env=echoed))
    assert error.reply_frames == [ID, echoed, BAD_REQUEST]


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_wrong_frame_count_is_dropped_on_pull_and_async_router(count: int) -> None:
    frames = [APP_ENV, TOPIC, BODY, meta(), b"extra"][:count]
    assert refused(R, frames, pull=True).reply_frames is None
    assert refused(R, [ID, *frames]).reply_frames is None


def test_a_lone_routing_id_is_dropped() -> None:
    assert refused(R, [ID]).reply_frames is None


def test_request_decodes_with_its_route() -> None:
    event = R.receive_router(request(*data()))
    assert isinstance(event, DataMessage)
    assert event.route == Route(ID, reply=True, app_env=APP_ENV)
    assert (event.app_env, event.topic, event.record) == ("shop-production", TOPIC.decode(), RECORD)
    assert event.meta.sequence == 7


def test_async_router_and_pull_messages_decode_without_reply() -> None:
    routed = R.receive_router([ID, *data()])
    assert isinstance(routed, DataMessage)
    assert routed.route == Route(ID, reply=False)
    pulled = R.receive_pull(data())
    assert pulled.route is None
    assert pulled.record == routed.record == RECORD


# -- replies ----------------------------------------------------------------------------


def test_edge_reply_frames_are_routing_id_app_env_status() -> None:
    """The spec's reply-msg after the routing id, as the device sends it: no empty delimiter."""
    event = R.receive_router(request(*data()))
    assert isinstance(event, DataMessage)
    assert event.route is not None
    assert accepted_frames(event.route) == [ID, b"shop-production", b"202 Accepted"]
    assert bad_request_frames(event.route) == [ID, b"shop-production", b"400 Bad Request"]
    assert (ACCEPTED, BAD_REQUEST, PONG) == (b"202 Accepted", b"400 Bad Request", b"200 OK")


def test_edge_ping_gets_ping_200_ok_and_the_fqdn() -> None:
    """The spec's pong-msg; its first frame is the ping's "app-env", the string "ping"."""
    event = R.receive_router(request(b"ping", APP_ENV, b"{}", meta()))
    assert isinstance(event, Ping)
    assert event.app_env == "shop-production"
    assert pong_frames(event.route, "logjam.example.com") == [
        ID, b"ping", b"200 OK", b"logjam.example.com"
    ]  # fmt: skip


def test_the_echoed_app_env_is_the_frame_as_sent_even_when_refused() -> None:
    # The device echoes the frame whatever it holds; the appliance too, up to 255 bytes.
    for app_env in (b"shop", b"sh\x00p-x", b"a" * 255):
        error = refused(R, request(app_env, TOPIC, BODY, meta()))
        assert error.reply_frames == [ID, app_env, BAD_REQUEST]
    # Longer frames are not copied into a reply.
    error = refused(R, request(b"a" * 256 + b"-x", TOPIC, BODY, meta()))
    assert error.reply_frames == [ID, UNKNOWN_APP_ENV, BAD_REQUEST]
    assert refused(R, [ID, b""]).reply_frames == [ID, b"unknown-unknown", BAD_REQUEST]


@pytest.mark.parametrize(
    "frames",
    [
        [b"ping", APP_ENV, b"{}", pack_meta(tag=0x1234)],
        [b"ping", APP_ENV, b"{}"],
        [b"ping", APP_ENV, b"{}", meta(), b"x"],
    ],
    ids=["bad meta", "3 frames", "5 frames"],
)
def test_bad_ping_gets_400(frames: list[bytes]) -> None:
    assert refused(R, request(*frames)).reply_frames == [ID, b"ping", BAD_REQUEST]


def test_ping_body_is_not_parsed() -> None:
    # logjam-tools answers from the frame count and meta only.
    assert isinstance(R.receive_router(request(b"ping", b"", b"not json", meta())), Ping)


def test_async_ping_is_dropped() -> None:
    error = refused(R, [ID, b"ping", APP_ENV, b"{}", meta()])
    assert "ping without the empty request frame" in error.reason
    assert error.reply_frames is None


# -- topic, app-env, body ----------------------------------------------------------------


# logjam-tools HEAD, src/logjam-util.c well_formed_topic: a prefix test on
# logs, javascript, events, frontend.page, frontend.ajax, mobile.
@pytest.mark.parametrize(
    "topic",
    [
        "logs", "logs.shop.production", "logs.shop_2.pre-view", "javascript.shop.production",
        "events", "events.shop.production", "frontend.page", "frontend.ajax", "mobile",
        # Accepted by the device, once refused here.
        "logs.x.worker:1", "frontend.page.shop", "frontend.ajax.shop.production", "mobile.x",
        "logs.", "logs..x", "logs shop", "logsx", "logs.my.app.production",
        "logs.3scale.production",
        "events.shop.production.sidekiq", "javascript.shop.production.x-y_z:2",
        # UTF-8 past the prefix is kept (the device takes any bytes there).
        "logs.caf\u00e9",
    ],
)  # fmt: skip
def test_valid_topics(topic: str) -> None:
    event = R.receive_router(request(*data(topic=topic.encode())))
    assert isinstance(event, DataMessage)
    assert event.topic == topic


@pytest.mark.parametrize(
    "topic",
    [b"", b"metrics", b"log", b"frontend", b"frontend.other", b"frontend.pag", b"mobil",
     b"LOGS.shop", b" logs", b".logs", b"x" * 300, b"logs." + b"x" * 251,
     b"logs.\xff", b"logs.\xc3"],
)  # fmt: skip
def test_bad_topic_gets_400(topic: bytes) -> None:
    error = refused(R, request(*data(topic=topic)))
    assert "topic" in error.reason
    assert error.reply_frames == [ID, APP_ENV, BAD_REQUEST]


# logjam-tools HEAD, src/logjam-util.c well_formed_stream_name: every byte
# 0x20..0x7F and at least one "-".
@pytest.mark.parametrize(
    "app_env",
    [
        "my.app-production", "3scale-production", "shop-production", "a-b", "a-b-c", "-",
        "-production", "shop-", "sh op-prod", "shop~1-prod", "shop:1-prod", "App_2-Pre.View",
        "x" * 250 + "-prod", "shop-prod\x7f",
    ],
)  # fmt: skip
def test_valid_app_envs(app_env: str) -> None:
    event = R.receive_router(request(app_env.encode(), TOPIC, BODY, meta()))
    assert isinstance(event, DataMessage)
    assert event.app_env == app_env
    assert event.route is not None
    assert accepted_frames(event.route) == [ID, app_env.encode(), ACCEPTED]


@pytest.mark.parametrize("app_env", [b"", b"shop", b"shopproduction", b"shop-prod\n",
                                     b"\tshop-prod", b"shop-\x00", b"caf\xc3\xa9-prod",
                                     b"shop-\xff", b"a" * 256 + b"-x"])  # fmt: skip
def test_bad_app_env_gets_400(app_env: bytes) -> None:
    error = refused(R, request(app_env, TOPIC, BODY, meta()))
    assert "app-env" in error.reason
    assert error.reply_frames is not None


def test_the_app_env_rule_is_the_devices_for_every_byte() -> None:
    """Each byte, in a one-byte app-env around a "-": accepted exactly when 0x20..0x7F."""
    for byte in range(256):
        app_env = b"a" + bytes([byte]) + b"-b"
        printable = 0x20 <= byte <= 0x7F
        if printable:
            event = R.receive_router([ID, app_env, TOPIC, BODY, meta()])
            assert isinstance(event, DataMessage), byte
        else:
            assert "app-env" in refused(R, [ID, app_env, TOPIC, BODY, meta()]).reason, byte


def test_app_env_splits_at_the_last_hyphen_like_the_device() -> None:
    # src/logjam-util.c extract_app_env (rindex) and appliance/spark/jobs.py
    # (substring_index(app_env, '-', -1)): the environment follows the last "-".
    for app_env, (app, env) in {
        "my.app-production": ("my.app", "production"),
        "3scale-production": ("3scale", "production"),
        "my-app-production": ("my-app", "production"),
    }.items():
        event = R.receive_router(request(app_env.encode(), TOPIC, BODY, meta()))
        assert isinstance(event, DataMessage)
        assert event.app_env.rpartition("-")[::2] == (app, env)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b'{"a": 1} x', "not JSON"),
        (b"\xff{}", "not JSON"),
        (b"[1, 2]", "JSON list"),
        (b'"text"', "JSON str"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    ],
    ids=["empty", "truncated", "trailing", "not utf-8", "array", "string", "deep"],
)
def test_bad_body_gets_400(body: bytes, reason: str) -> None:
    error = refused(R, request(*data(body)))
    assert reason in error.reason


def test_unknown_compression_method_gets_400() -> None:
    error = refused(R, request(*data(compression=4)))
    assert "unknown compression method 4" in error.reason


# -- compression --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_compression_method(name: str) -> None:
    method, compress = COMPRESSORS[name]
    record = {"lines": [[1, "2026-11-22T10:00:00.000123", f"line {i} " * 20] for i in range(50)]}
    body = compress(json.dumps(record).encode())
    event = R.receive_router(request(*data(body, compression=method)))
    assert isinstance(event, DataMessage)
    assert event.record == record


def test_edge_gzip_under_the_zlib_id_is_detected() -> None:
    # The Ruby agent's ZLIB_COMPRESSION is ActiveSupport::Gzip.compress.
    body = gzip.compress(BODY)
    assert body[:2] == b"\x1f\x8b"
    event = R.receive_pull(data(body, compression=Compression.ZLIB))
    assert event.record == RECORD
    # Several members, as gzip allows, are read as one body.
    half = len(BODY) // 2
    two = gzip.compress(BODY[:half]) + gzip.compress(BODY[half:])
    assert R.receive_pull(data(two, compression=Compression.ZLIB)).record == RECORD


def test_edge_lz4_has_a_big_endian_u32_size_prefix() -> None:
    body = lz4(BODY)
    assert body[:4] == struct.pack(">I", len(BODY))
    assert R.receive_pull(data(body, compression=Compression.LZ4)).record == RECORD
    # The same block with a little-endian prefix declares a huge size and is refused.
    swapped = struct.pack("<I", len(BODY)) + body[4:]
    error = refused(R, data(swapped, compression=Compression.LZ4), pull=True)
    assert "lz4" in error.reason


def test_lz4_block_shorter_than_declared_is_accepted_longer_is_not() -> None:
    block = bytes(cramjam.lz4.compress_block(BODY, store_size=False))
    assert compression.lz4_prefixed_decompress(struct.pack(">I", len(BODY) + 10) + block, 1 << 20)
    with pytest.raises(CompressionError, match="exceeds"):
        compression.lz4_prefixed_decompress(struct.pack(">I", len(BODY) - 1) + block, 1 << 20)


@pytest.mark.parametrize("name", ["zlib", "gzip", "snappy", "lz4"])
def test_decompression_is_bounded(name: str) -> None:
    method, compress = COMPRESSORS[name]
    bomb = compress(b'{"a":"' + b"x" * (4 << 20) + b'"}')
    assert len(bomb) < 300_000
    small = LogjamReceiver(LogjamLimits(max_decompressed_bytes=1 << 20))
    error = refused(small, request(*data(bomb, compression=method)))
    assert "1048576" in error.reason
    assert error.reply_frames is not None


def test_uncompressed_body_over_the_limits_gets_400() -> None:
    limited = LogjamReceiver(LogjamLimits(max_body_bytes=100, max_decompressed_bytes=50))
    assert "max_body_bytes=100" in refused(limited, request(*data(b"{}" + b" " * 99))).reason
    assert "50 bytes" in refused(limited, request(*data(b"{}" + b" " * 60))).reason
    assert limited.receive_pull(data(b"{}" + b" " * 48)).record == {}


@pytest.mark.parametrize(
    ("body", "method", "reason"),
    [
        (zlib.compress(BODY)[:-3], Compression.ZLIB, "truncated"),
        (zlib.compress(BODY) + b"junk", Compression.ZLIB, "garbage"),
        (gzip.compress(BODY) + b"junk", Compression.ZLIB, "garbage"),
        (b"\x78\x9c\xff\xff", Compression.ZLIB, "invalid"),
        (snappy(BODY)[:-2], Compression.SNAPPY, "snappy"),
        (b"\xff\xff\xff\xff\xff\xff", Compression.SNAPPY, "preamble"),
        (b"\x05\x09\x00", Compression.SNAPPY, "offset"),
        (lz4(BODY)[:-2], Compression.LZ4, "lz4"),
        (b"\x00\x00", Compression.LZ4, "prefix"),
        (struct.pack(">I", 10) + b"\x1f\x61\x05\x00", Compression.LZ4, "offset"),
    ],
    ids=["zlib truncated", "zlib trailing", "gzip trailing", "zlib invalid", "snappy truncated",
         "snappy preamble", "snappy offset", "lz4 truncated", "lz4 no prefix", "lz4 offset"],
)  # fmt: skip
def test_broken_compressed_bodies_get_400(body: bytes, method: int, reason: str) -> None:
    error = refused(R, request(*data(body, compression=method)))
    assert reason in error.reason


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(min_value=1, max_value=64))
def test_snappy_and_lz4_round_trip_real_compressors(payload: bytes, repeat: int) -> None:
    payload = payload * (1 + repeat % 4)  # repeats make copies, overlapping ones included
    limit = len(payload)
    assert compression.snappy_decompress(snappy(payload), limit) == payload
    assert compression.lz4_prefixed_decompress(lz4(payload), limit) == payload
    assert compression.inflate(zlib.compress(payload), limit) == payload
    assert compression.inflate(gzip.compress(payload), limit) == payload


def test_long_runs_use_extended_lengths() -> None:
    payload = b"a" * 70_000 + bytes(range(256)) * 300 + b"b" * 1000
    assert compression.snappy_decompress(snappy(payload), len(payload)) == payload
    assert compression.lz4_prefixed_decompress(lz4(payload), len(payload)) == payload


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_decoders_raise_only_compression_error(garbage: bytes) -> None:
    for decode in (
        compression.snappy_decompress,
        compression.lz4_prefixed_decompress,
        compression.lz4_block_decompress,
        compression.inflate,
    ):
        try:
            out = decode(garbage, 4096)
        except CompressionError:
            continue
        assert len(out) <= 4096


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=7),
    st.sampled_from([b"", b"x"]),
    st.integers(min_value=0, max_value=5),
)
def test_any_frames_decode_or_raise_malformed(
    frames: list[bytes], second: bytes, method: int
) -> None:
    candidates = [
        frames,
        [ID, second, *frames],
        [ID, b"", APP_ENV, TOPIC, *frames[:1], meta(compression=method)],
    ]
    for candidate in candidates:
        errors: list[MalformedMessage] = []
        for receive in (R.receive_router, R.receive_pull):
            try:
                receive(candidate)
            except MalformedMessage as error:
                errors.append(error)
        assert all(error.reason for error in errors)


# -- dedupe id ----------------------------------------------------------------------------


def test_batch_id_names_app_env_device_sequence_created_and_content() -> None:
    first = R.receive_pull(data(device=2, sequence=5, created_ms=1000))
    assert first.batch_id.startswith("shop-production:2:5:1000:")
    # A resend is the same message byte for byte: the same id.
    assert R.receive_pull(data(device=2, sequence=5, created_ms=1000)).batch_id == first.batch_id
    # Another process of the same app numbers from 1 too: a different body or
    # time makes a different id, so it is not dropped as a duplicate.
    other_body = json.dumps({**RECORD, "process_id": 2}).encode()
    assert R.receive_pull(data(other_body, device=2, sequence=5, created_ms=1000)).batch_id != (
        first.batch_id
    )
    assert R.receive_pull(data(device=2, sequence=5, created_ms=1001)).batch_id != first.batch_id
    assert R.receive_pull(
        data(topic=b"events.shop", device=2, sequence=5, created_ms=1000)
    ).batch_id != (first.batch_id)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        LogjamLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="max_output"):
        compression.snappy_decompress(b"\0", -1)
