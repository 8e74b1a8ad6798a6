"""The Logjam codec against hostile input: strict strings, bounded work.

Each test is a hostile input once found, or one of its relatives: a host that
cannot be stored, app-env and topic frames that are not UTF-8 or too long, a
batch id past its limit, more frames than a message has, and the bound on
decoding work the driver uses to choose between the event loop and a thread.
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

from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_HOST_BYTES, is_utf8_text
from appliance.protocols.logjam import (
    DEFLATE_MAX_RATIO,
    MAX_APP_ENV_BYTES,
    MAX_MESSAGE_FRAMES,
    Compression,
    DataMessage,
    LogjamLimits,
    LogjamReceiver,
    MalformedMessage,
    Ping,
    Route,
    pack_meta,
)

ID = b"\x00\x80\x00\x00\x29"
APP_ENV = b"shop-production"
TOPIC = b"logs.shop.production"
R = LogjamReceiver()


def meta(**fields: Any) -> bytes:
    fields.setdefault("created_ms", 1795341600456)
    fields.setdefault("sequence", 7)
    return pack_meta(**fields)


def data(
    body: bytes = b"{}", *, app_env: bytes = APP_ENV, topic: bytes = TOPIC, **meta_fields: Any
) -> list[bytes]:
    return [app_env, topic, body, meta(**meta_fields)]


def refused(frames: list[Any], receiver: LogjamReceiver = R) -> MalformedMessage:
    with pytest.raises(MalformedMessage) as raised:
        receiver.receive_router(frames)
    return raised.value


def snappy(payload: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(payload))


def lz4(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + bytes(
        cramjam.lz4.compress_block(payload, store_size=False)
    )


COMPRESSORS: dict[str, tuple[int, Any]] = {
    "none": (Compression.NONE, lambda payload: payload),
    "zlib": (Compression.ZLIB, zlib.compress),
    "gzip": (Compression.ZLIB, gzip.compress),
    "snappy": (Compression.SNAPPY, snappy),
    "lz4": (Compression.LZ4, lz4),
}


# -- host: a null host and a reason, never a string that cannot be stored ----------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"host": "\\ud800"}', "host is not valid UTF-8"),
        (b'{"host": "web1\\udfff.example"}', "host is not valid UTF-8"),
        (json.dumps({"host": "h" * (MAX_HOST_BYTES + 1)}).encode(), "over the limit of 255"),
        # 128 two-byte characters: 128 code points, 256 bytes.
        (json.dumps({"host": "\u00e9" * 128}).encode(), "256 bytes, over the limit of 255"),
    ],
    ids=["lone high surrogate", "lone low surrogate", "too long", "too long in bytes"],
)
def test_a_host_that_cannot_be_stored_is_dropped_with_a_reason(body: bytes, reason: str) -> None:
    event = R.receive_router([ID, b"", *data(body)])
    assert isinstance(event, DataMessage)
    assert event.host is None
    assert event.host_dropped is not None
    assert reason in event.host_dropped
    assert "host" in event.record  # the record itself is kept


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("web1.example", "web1.example"),
        ("w\u00e9b1", "w\u00e9b1"),
        ("h" * MAX_HOST_BYTES, "h" * MAX_HOST_BYTES),
        ("", None),
        (7, None),
        (None, None),
        (["web1"], None),
    ],
)
def test_a_host_is_kept_when_it_is_a_storable_string(host: Any, expected: str | None) -> None:
    event = R.receive_pull(data(json.dumps({"host": host}).encode()))
    assert (event.host, event.host_dropped) == (expected, None)


def test_a_body_without_a_host_has_none() -> None:
    event = R.receive_pull(data(b'{"n": 1}'))
    assert (event.host, event.host_dropped) == (None, None)


# -- app-env and topic: frames of the message, a 400 ----------------------------------------


@pytest.mark.parametrize(
    ("frame", "what"),
    [(b"shop-\xff", "app-env"), (b"\xed\xa0\x80-prod", "app-env"),
     (b"x" * (10 << 20), "app-env")],
    ids=["invalid UTF-8", "encoded surrogate", "10 MiB"],
)  # fmt: skip
def test_app_env_that_is_not_utf8_or_too_long_gets_400(frame: bytes, what: str) -> None:
    error = refused([ID, b"", *data(app_env=frame)])
    assert what in error.reason
    assert error.reply_frames is not None
    # The reply echoes the app-env frame only up to MAX_APP_ENV_BYTES: a 10 MiB
    # frame is not copied into the reply queue.
    echoed = frame if len(frame) <= MAX_APP_ENV_BYTES else b"unknown-unknown"
    assert error.reply_frames == [ID, echoed, b"400 Bad Request"]


@pytest.mark.parametrize("topic", [b"logs.\xff", b"logs.\xed\xa0\x80", b"logs." + b"a" * 300])
def test_topic_that_is_not_utf8_or_too_long_gets_400(topic: bytes) -> None:
    error = refused([ID, b"", *data(topic=topic)])
    assert "topic" in error.reason


def test_ping_app_env_is_cut_before_it_is_copied() -> None:
    event = R.receive_router([ID, b"", b"ping", b"\xff" * (1 << 20), b"{}", meta()])
    assert isinstance(event, Ping)
    assert len(event.app_env) == MAX_APP_ENV_BYTES
    assert is_utf8_text(event.app_env)


# -- batch id ---------------------------------------------------------------------------------


def test_batch_id_of_the_longest_app_env_is_within_the_limit_and_distinct() -> None:
    stem = b"a" * (MAX_APP_ENV_BYTES - len(b"-production"))
    first = R.receive_pull(
        data(app_env=stem + b"-production", device=2**32 - 1, sequence=2**64 - 1,
             created_ms=2**64 - 1)
    )  # fmt: skip
    second = R.receive_pull(
        data(app_env=stem + b"-preproduct", device=2**32 - 1, sequence=2**64 - 1,
             created_ms=2**64 - 1)
    )  # fmt: skip
    assert len(first.app_env) == MAX_APP_ENV_BYTES
    for event in (first, second):
        assert len(event.batch_id.encode()) <= MAX_BATCH_ID_BYTES
        assert "~" in event.batch_id
    # Same prefix, same device, sequence, time and body: still two ids.
    assert first.batch_id != second.batch_id
    # The app-env itself is kept whole in the message (and in the record).
    assert first.app_env == (stem + b"-production").decode()


def test_batch_id_keeps_an_app_env_that_fits() -> None:
    app_env = b"a" * 175 + b"-production"
    event = R.receive_pull(data(app_env=app_env, device=2**32 - 1, sequence=2**64 - 1,
                                created_ms=2**64 - 1))  # fmt: skip
    assert event.batch_id.startswith(app_env.decode() + ":")
    assert len(event.batch_id) == MAX_BATCH_ID_BYTES


def test_batch_id_of_an_app_env_with_a_tilde_cannot_pose_as_a_shortened_one() -> None:
    """The device's rule allows "~" (and ":") in an app-env; ids stay unambiguous."""
    fields: dict[str, Any] = {"device": 2**32 - 1, "sequence": 2**64 - 1, "created_ms": 2**64 - 1}
    long_app_env = b"shop-" + b"a" * 200 + b"-production"
    shortened = R.receive_pull(data(app_env=long_app_env, **fields))
    name = shortened.batch_id.split(":", 1)[0]
    assert "~" in name
    # An app-env spelled like that shortened name is written with its own digest.
    impostor = R.receive_pull(data(app_env=name.encode(), **fields))
    assert impostor.app_env == name
    assert impostor.batch_id != shortened.batch_id
    assert len(impostor.batch_id.encode()) <= MAX_BATCH_ID_BYTES
    # A short app-env with "~" keeps its characters, then "~" and the digest.
    tilde = R.receive_pull(data(app_env=b"shop~1-production", device=2, sequence=5,
                                created_ms=1000))  # fmt: skip
    assert tilde.batch_id.startswith("shop~1-production~")
    # ":" in an app-env: the last four fields still read from the right.
    colon = R.receive_pull(data(app_env=b"shop:1-production", device=2, sequence=5,
                                created_ms=1000))  # fmt: skip
    app_env, device, sequence, created, digest = colon.batch_id.rsplit(":", 4)
    assert (app_env, device, sequence, created, len(digest)) == (
        "shop:1-production",
        "2",
        "5",
        "1000",
        16,
    )


# -- frames -------------------------------------------------------------------------------------


def test_more_frames_than_a_message_has_gets_400_from_the_count_alone() -> None:
    frames = [ID, b"", *data(), b""]
    assert len(frames) == MAX_MESSAGE_FRAMES + 1
    error = refused(frames)
    assert f"more than {MAX_MESSAGE_FRAMES} frames" in error.reason
    assert error.reply_frames == [ID, APP_ENV, b"400 Bad Request"]
    # Without the delimiter: no reply, and a PULL message too.
    assert refused([ID, *data(), b"", b""]).reply_frames is None
    with pytest.raises(MalformedMessage, match="more than 6 frames"):
        R.receive_pull([*data(), b"", b"", b""])


def test_frames_may_be_views_of_zeromq_buffers() -> None:
    body = json.dumps({"host": "web1", "n": 1}).encode()
    frames = [ID, b"", *data(body)]
    from_bytes = R.receive_router(frames)
    from_views = R.receive_router([memoryview(frame) for frame in frames])
    assert from_views == from_bytes
    ping = [memoryview(f) for f in [ID, b"", b"ping", APP_ENV, b"{}", meta()]]
    assert isinstance(R.receive_router(ping), Ping)


# -- the bound on decoding work -----------------------------------------------------------------


def frames_size(frames: list[bytes]) -> int:
    return sum(map(len, frames))


def test_decode_size_bound_counts_the_body_as_decompressed() -> None:
    payload = b'{"a":"' + b"x" * 100_000 + b'"}'
    plain = [ID, b"", *data(payload)]
    assert R.decode_size_bound(plain, router=True) == frames_size(plain)
    deflated = [ID, b"", *data(zlib.compress(payload), compression=Compression.ZLIB)]
    assert R.decode_size_bound(deflated, router=True) == frames_size(deflated) + (
        len(deflated[4]) * DEFLATE_MAX_RATIO
    )
    for method, compress in ((Compression.SNAPPY, snappy), (Compression.LZ4, lz4)):
        pulled = data(compress(payload), compression=method)
        assert R.decode_size_bound(pulled, router=False) == frames_size(pulled) + len(payload)


def test_decode_size_bound_of_a_deflate_bomb_is_the_decompressed_limit() -> None:
    # Once, 33 KB inflating to 32 MiB was decoded on the event loop.
    bomb = zlib.compress(b" " * (32 << 20), 9)
    assert len(bomb) < 40_000
    frames = data(bomb, compression=Compression.ZLIB)
    assert R.decode_size_bound(frames, router=False) == frames_size(frames) + (32 << 20)
    small = LogjamReceiver(LogjamLimits(max_decompressed_bytes=1000))
    assert small.decode_size_bound(frames, router=False) == frames_size(frames) + 1000


@pytest.mark.parametrize(
    "frames",
    [
        [ID, b"", b"ping", APP_ENV, zlib.compress(b"{}"), meta(compression=1)],
        [ID, b"", *data(zlib.compress(b"{}"), compression=1), b"extra"],
        [ID, b"", *data(b"\xff" * 64, compression=9)],
        [ID, b"", APP_ENV, TOPIC, zlib.compress(b"{}"), b"short meta"],
        [ID, b"", *data(struct.pack(">I", 2**32 - 1) + b"\0", compression=3)],
        [ID, b"", *data(b"\xff\xff\xff\xff\xff\xff", compression=2)],
        [ID],
    ],
    ids=["ping", "too many frames", "unknown method", "bad meta", "lz4 over the limit",
         "snappy bad preamble", "routing id only"],
)  # fmt: skip
def test_decode_size_bound_of_what_is_refused_before_decompressing(frames: list[bytes]) -> None:
    assert R.decode_size_bound(frames, router=True) == frames_size(frames)


def test_decode_size_bound_of_a_body_over_max_body_bytes() -> None:
    small = LogjamReceiver(LogjamLimits(max_body_bytes=10))
    frames = data(zlib.compress(b"{}" + b" " * 100), compression=Compression.ZLIB)
    assert small.decode_size_bound(frames, router=False) == frames_size(frames)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(COMPRESSORS)),
    st.binary(max_size=2000),
    st.integers(min_value=1, max_value=2000),
)
def test_decode_size_bound_is_never_below_what_decoding_produces(
    name: str, chunk: bytes, repeat: int
) -> None:
    method, compress = COMPRESSORS[name]
    payload = b'{"a":"' + chunk.hex().encode() * repeat + b'"}'
    frames = [ID, b"", *data(compress(payload), compression=method)]
    decompressed = R.decompress(frames[4], method)
    assert decompressed == payload
    assert R.decode_size_bound(frames, router=True) >= frames_size(frames) + (
        0 if method == Compression.NONE else len(decompressed)
    )


# -- JSON containers ------------------------------------------------------------------------------


def test_a_body_of_more_json_containers_than_the_limit_gets_400() -> None:
    limits = LogjamLimits(max_json_containers=1001)
    receiver = LogjamReceiver(limits)
    at_limit = b'{"a":[' + b"{}," * 998 + b"{}]}"
    assert len(receiver.receive_pull(data(at_limit)).record["a"]) == 999
    over = b'{"a":[' + b"[]," * 1000 + b"[]]}"
    error = refused([ID, b"", *data(zlib.compress(over), compression=1)], receiver)
    assert "max_json_containers=1001" in error.reason
    assert error.reply_frames is not None


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_json_containers"):
        LogjamLimits(max_json_containers=0)


def test_route_of_a_refused_message_survives() -> None:
    error = refused([ID, b"", *data(b"[]")])
    assert error.route == Route(ID, reply=True, app_env=APP_ENV)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=MAX_MESSAGE_FRAMES + 1),
    st.integers(min_value=0, max_value=5),
    st.booleans(),
)
def test_any_frames_as_views_bound_and_decode_or_raise_malformed(
    frames: list[bytes], method: int, router: bool
) -> None:
    candidates = [frames, [ID, b"", APP_ENV, TOPIC, *frames[:1], meta(compression=method)]]
    for candidate in candidates:
        views = [memoryview(frame) for frame in candidate]
        assert R.decode_size_bound(views, router=router) >= frames_size(candidate)
        receive = R.receive_router if router else R.receive_pull
        errors: list[MalformedMessage] = []
        try:
            receive(views)
        except MalformedMessage as error:
            errors.append(error)
        assert all(error.reason for error in errors)
