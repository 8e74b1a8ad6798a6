"""Hostile Logjam producers over real ZeroMQ (CURVE) against the running service.

What the codec and the session document (appliance/protocols/logjam.py,
appliance/server/sessions/logjam.py) and this module holds them to. Logjam has
no connection to close: every message is answered on its own.

* refused (``400 Bad Request`` for a request, nothing for async data; a
  ``message.malformed`` line with the reason; nothing stored): an app-env or
  topic that is not valid UTF-8, too long or outside the spec's grammar, a
  body over ``max_body_bytes``, one that inflates past
  ``max_decompressed_bytes`` (one or many gzip members, a Snappy or LZ4
  length claim), one with more JSON containers than ``max_json_containers``,
  one that is not a JSON object, a meta frame of the wrong size or tag, a
  message of more frames than :data:`MAX_MESSAGE_FRAMES`;
* kept with a fallback (``202 Accepted`` after the commit, stored once): a
  ``host`` that is not storable text (a lone surrogate, too long) is stored
  as null and logged (``message.host_dropped``); a time outside int64
  nanoseconds becomes the receive time.
"""

from __future__ import annotations

import gzip
import json
import socket
import struct
import time
import zlib
from typing import Any

import zmq

from appliance.blocks.text import MAX_HOST_BYTES
from appliance.protocols.logjam import (
    MAX_APP_ENV_BYTES,
    MAX_MESSAGE_FRAMES,
    MAX_TOPIC_BYTES,
    Compression,
    pack_meta,
)
from tests.hostile.case import Case, hostile_case
from tests.hostile.clients import (
    logjam_dealer,
    logjam_meta,
    read_available,
    read_until_closed,
    send_ignoring_close,
)
from tests.hostile.limits import LOGJAM_MAX_BODY_BYTES, LOGJAM_MAX_DECOMPRESSED_BYTES, WAIT_SECONDS
from tests.hostile.service import HostileService, has_receive_time, record

APP_ENV = b"shop-production"
TOPIC = b"logs.shop"
#: The status frame of a reply; a DEALER reads ``[app-env, status]`` (docs/logjam.md).
ACCEPTED = b"202 Accepted"
BAD_REQUEST = b"400 Bad Request"


def body(**fields: Any) -> bytes:
    return json.dumps({"action": "Hostile#index", **fields}).encode()


def request(
    body_frame: bytes,
    *,
    app_env: bytes = APP_ENV,
    topic: bytes = TOPIC,
    meta: bytes | None = None,
    compression: int = Compression.NONE,
) -> list[bytes]:
    return [b"", app_env, topic, body_frame, meta if meta is not None else logjam_meta(compression)]


def answers(case: Case, messages: dict[str, list[bytes]]) -> dict[str, list[bytes]]:
    """Send each message (DEALER from the case's address); the reply of each, in order."""
    dealer = logjam_dealer(case.service, case.address)
    try:
        for frames in messages.values():
            dealer.send_multipart(frames)
        return {name: dealer.recv_multipart() for name in messages}
    finally:
        dealer.close()


def expect_refused(case: Case, messages: dict[str, list[bytes]]) -> None:
    """Each message gets 400 and a ``message.malformed`` line; nothing is stored."""
    replies = answers(case, messages)
    for name, reply in replies.items():
        assert reply[-1:] == [BAD_REQUEST], (name, reply)
    lines = [
        f
        for f in case.service.log_lines(case.mark)
        if f.get("event") == "message.malformed" and f.get("peer") == case.address
    ]
    assert len(lines) >= len(messages), (len(lines), case.service.log_tail(case.mark))
    assert all(f.get("reason") for f in lines), lines
    case.expect_no_rows = True


NOT_UTF8 = {
    "a\\xffb": b"a\xffb",
    "lone continuation": b"\x80",
    "encoded surrogate": b"\xed\xa0\x80",
    "overlong": b"\xc0\xaf",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
}


def test_app_env_and_topic_that_are_not_storable_text_get_400(service: HostileService) -> None:
    messages: dict[str, list[bytes]] = {}
    for name, raw in NOT_UTF8.items():
        messages[f"app-env {name}"] = request(body(), app_env=b"shop-" + raw)
        messages[f"topic {name}"] = request(body(), topic=b"logs." + raw)
    messages["app-env 1 MB"] = request(body(), app_env=b"a" * 1_000_000 + b"-production")
    messages["app-env one over"] = request(body(), app_env=b"a" * MAX_APP_ENV_BYTES + b"-p")
    messages["topic 1 MB"] = request(body(), topic=b"logs." + b"t" * 1_000_000)
    messages["topic one over"] = request(body(), topic=b"logs." + b"t" * MAX_TOPIC_BYTES)
    messages["topic outside the grammar"] = request(body(), topic=b"../../etc")
    messages["empty app-env"] = request(body(), app_env=b"")
    with hostile_case(service, "logjam") as case:
        expect_refused(case, messages)


def test_bodies_that_are_not_json_objects_get_400(service: HostileService) -> None:
    messages = {
        "invalid UTF-8": request(b'{"message":"a\xffb"}'),
        "encoded surrogate": request(b'{"message":"\xed\xa0\x80"}'),
        "not JSON": request(b"{nope"),
        "a list": request(b"[1, 2]"),
        "a string": request(b'"text"'),
        "empty": request(b""),
        "nested past any parser": request(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    }
    with hostile_case(service, "logjam") as case:
        expect_refused(case, messages)


def test_bombs_get_400(service: HostileService) -> None:
    empty_member = gzip.compress(b"")
    big = body(pad="x" * (LOGJAM_MAX_DECOMPRESSED_BYTES + 1024))
    containers = b'{"a":[' + b"[]," * 300_000 + b"[]]}"
    meta = logjam_meta()
    messages = {
        "1 MB of empty gzip members": request(
            empty_member * (LOGJAM_MAX_BODY_BYTES // len(empty_member) - 1),
            compression=Compression.ZLIB,
        ),
        "gzip past max_decompressed_bytes": request(
            gzip.compress(big, 9), compression=Compression.ZLIB
        ),
        "zlib past max_decompressed_bytes": request(
            zlib.compress(big, 9), compression=Compression.ZLIB
        ),
        "zlib of 33 KB inflating to 32 MiB": request(
            zlib.compress(b"[" * (32 * 1024 * 1024), 9), compression=Compression.ZLIB
        ),
        "snappy claiming 4 GiB": request(
            b"\xff\xff\xff\xff\x0f" + b"\x00" * 64, compression=Compression.SNAPPY
        ),
        "lz4 claiming 4 GiB": request(
            struct.pack(">I", 2**32 - 1) + b"\x00" * 64, compression=Compression.LZ4
        ),
        "unknown compression": request(body(), meta=meta[:2] + b"\x07" + meta[3:]),
        "body over max_body_bytes": request(b" " * (LOGJAM_MAX_BODY_BYTES + 1)),
        "300,000 JSON containers": request(containers),
        "containers compressed": request(
            zlib.compress(containers * 2, 9), compression=Compression.ZLIB
        ),
    }
    with hostile_case(service, "logjam") as case:
        expect_refused(case, messages)


def test_bad_meta_frames_get_400(service: HostileService) -> None:
    meta = logjam_meta()
    messages = {
        "meta of 23 bytes": request(body(), meta=meta[:-1]),
        "meta of 25 bytes": request(body(), meta=meta + b"\x00"),
        "meta of 1 MB": request(body(), meta=b"\x00" * 1_000_000),
        "wrong tag": request(body(), meta=b"\x00\x00" + meta[2:]),
        "wrong version": request(body(), meta=meta[:3] + b"\x09" + meta[4:]),
    }
    with hostile_case(service, "logjam") as case:
        expect_refused(case, messages)


def test_message_of_a_hundred_thousand_frames_gets_400(service: HostileService) -> None:
    with hostile_case(service, "logjam") as case:
        frames = request(body()) + [b""] * 100_000
        assert len(frames) > MAX_MESSAGE_FRAMES
        expect_refused(case, {"100,000 frames": frames, "7 frames": [*request(body()), b""]})


def test_unstorable_host_is_stored_as_null(service: HostileService) -> None:
    hosts = {
        "lone high surrogate": b'"\\ud800"',
        "lone low surrogate": b'"\\udfff"',
        "reversed pair": b'"\\udc00\\ud800"',
        "one over": json.dumps("h" * (MAX_HOST_BYTES + 1)).encode(),
        "1 MB": json.dumps("h" * 1_000_000).encode(),
    }
    messages = {
        name: request(b'{"case":"' + name.encode() + b'","host":' + value + b"}")
        for name, value in hosts.items()
    }
    with hostile_case(service, "logjam") as case:
        replies = answers(case, messages)
        assert all(reply == [APP_ENV, ACCEPTED] for reply in replies.values()), replies
        line = case.service.wait_log(
            case.mark,
            lambda f: f.get("event") == "message.host_dropped" and f.get("peer") == case.address,
        )
        assert line is not None
    rows = {record(r)["case"]: r for r in case.hostile_rows()}
    assert sorted(rows) == sorted(hosts)
    assert all(row["host"] is None for row in rows.values())


def test_lone_surrogates_elsewhere_in_the_body_are_stored_as_valid_text(
    service: HostileService,
) -> None:
    raw = b'{"case":"s","message":"a\\ud800b","\\udfff":1,"list":["\\ud800"]}'
    # Python's parser takes NaN and Infinity; records.py writes them as null.
    nan = b'{"case":"n","a":NaN,"b":-Infinity}'
    with hostile_case(service, "logjam") as case:
        replies = answers(case, {"surrogates": request(raw), "nan": request(nan)})
        assert replies == {"surrogates": [APP_ENV, ACCEPTED], "nan": [APP_ENV, ACCEPTED]}
    rows = {record(r)["case"]: r for r in case.hostile_rows()}
    assert sorted(rows) == ["n", "s"]
    rows["s"]["record"].encode("utf-8")  # strict
    assert record(rows["s"])["message"] != "a\ud800b"
    assert record(rows["n"])["a"] is None


def test_times_outside_int64_nanoseconds_become_the_receive_time(service: HostileService) -> None:
    def meta(created_ms: int) -> bytes:
        return pack_meta(compression=Compression.NONE, sequence=1, created_ms=created_ms)

    # created_ms 0 ("none"): a started_ms that is not used falls through to the receive time.
    messages = {
        "started_ms 2**62": request(body(case="a", started_ms=2**62), meta=meta(0)),
        "started_ms -2**62": request(body(case="b", started_ms=-(2**62)), meta=meta(0)),
        "started_ms 2**64": request(body(case="c", started_ms=2**64), meta=meta(0)),
        "started_ms 1e300": request(body(case="d", started_ms=1e300), meta=meta(0)),
        "started_ms string": request(
            body(case="e", started_ms="2024-01-01T00:00:0\u00b2Z"), meta=meta(0)
        ),
        "created_ms 2**64 - 1": request(body(case="f"), meta=meta(2**64 - 1)),
        "created_ms 2**63": request(body(case="g"), meta=meta(2**63)),
    }
    with hostile_case(service, "logjam") as case:
        replies = answers(case, messages)
        assert all(reply == [APP_ENV, ACCEPTED] for reply in replies.values()), replies
    rows = {record(r)["case"]: r for r in case.hostile_rows()}
    assert sorted(rows) == list("abcdefg")
    for name, row in rows.items():
        assert has_receive_time(row), (name, row)


def test_hostile_async_data_is_refused_without_a_reply(service: HostileService) -> None:
    """The same rules on the ROUTER's async form and on the PULL socket (no reply)."""
    with hostile_case(service, "logjam") as case:
        creds = case.service.creds
        push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        push.curve_serverkey = creds.curve_server_key
        push.curve_publickey = creds.curve_public
        push.curve_secretkey = creds.curve_secret
        push.setsockopt(zmq.LINGER, 2000)
        pull = case.service.logjam_pull_port
        push.connect(f"tcp://{case.address}:0;127.0.0.1:{pull}")
        dealer = logjam_dealer(case.service, case.address)
        try:
            for raw in NOT_UTF8.values():
                push.send_multipart([b"shop-" + raw, TOPIC, body(), logjam_meta()])
                dealer.send_multipart([b"shop-" + raw, TOPIC, body(), logjam_meta()])
            push.send_multipart([APP_ENV, TOPIC, b"{nope", logjam_meta()])
            # A request after them: its 202 proves they were read first (in order).
            dealer.send_multipart(request(body(case="after")))
            assert dealer.recv_multipart() == [APP_ENV, ACCEPTED]
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                lines = [
                    f for f in case.service.log_lines(case.mark)
                    if f.get("event") == "message.malformed" and f.get("peer") == case.address
                ]  # fmt: skip
                if len(lines) >= 2 * len(NOT_UTF8) + 1:
                    break
                time.sleep(0.1)
            assert len(lines) >= 2 * len(NOT_UTF8) + 1, case.service.log_tail(case.mark)
            assert {f.get("reply") for f in lines} == {"none"}
        finally:
            push.close()
            dealer.close()
    assert [record(r)["case"] for r in case.hostile_rows()] == ["after"]


def test_zmtp_greeting_trickled_a_byte_at_a_time_is_dropped(service: HostileService) -> None:
    """libzmq, not the service, owns ZMTP: the ZMQ_HANDSHAKE_IVL of the listener
    (``handshake_timeout_seconds``, 5 s here) drops a peer that never finishes
    its greeting; the service and its other peers carry on."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00")
    greeting += b"\x00" + b"\x00" * 31
    with hostile_case(service, "logjam") as case:
        sock = socket.create_connection(
            ("127.0.0.1", case.service.port("logjam")), timeout=30,
            source_address=(case.address, 0),
        )  # fmt: skip
        closed = False
        deadline = time.monotonic() + WAIT_SECONDS  # a liveness bound, not a timing claim
        for byte in greeting[:-1]:  # never the whole greeting
            if not send_ignoring_close(sock, bytes([byte])):
                closed = True
                break
            _, closed = read_available(sock, 0.2)
            if closed or time.monotonic() > deadline:
                break
        if not closed:
            _, closed = read_until_closed(sock, WAIT_SECONDS)
        sock.close()
        assert closed, "libzmq kept a peer that never finished its greeting"
        case.expect_no_rows = True
