"""Writes the seed corpora of the fuzz targets: ``python fuzz/make_corpus.py``.

Each seed is a valid (or a known-hostile) exchange of its protocol, in the
input layout of fuzz/harness.py: a flags byte, two cut points, the payload.
The hostile ones (``hostile-*``) are the inputs a review of the codecs found
(a tag that is not UTF-8, a lone surrogate, a non-ASCII digit or Go's zero
time in ``@timestamp``, a 9-19 byte Courier HELO, a PING followed by too
much, ...), so the fuzzer
starts next to the places that once crashed. Output is deterministic (gzip
with a zero mtime), so regenerating changes nothing unless this file does.

Seeds go to ``fuzz/corpus/<target>/<name>``; old seeds are removed first.
Snappy and LZ4 Logjam seeds need cramjam (the ``test`` extra).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import struct
import sys
import zlib
from collections.abc import Iterable
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Final

import msgpack

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.blocks.block import RowBlock
from appliance.blocks.identity import dedupe_key
from appliance.protocols.proxy import V2_SIGNATURE, Endpoint, encode_v1, encode_v2
from appliance.wal.blocks import encode_block
from appliance.wal.frame import KIND_ROW_BLOCK, encode_key, frame_header
from fuzz.fuzz_forward import (
    ACCEPT_ANY_PING,
    ALLOW_ANONYMOUS_USER,
    PASSWORD,
    SECURITY,
    SHARED_KEY,
    UNKNOWN_NETWORK,
    USERNAME,
    USERS,
)
from fuzz.fuzz_logjam import CURVE, MEMORYVIEW, ROUTER
from fuzz.fuzz_wal import RECOVER
from fuzz.fuzz_websocket import BINARY, HANDSHAKE
from fuzz.harness import BYTEARRAY, BYTEWISE, FRAME_SEPARATOR, RECEIVED_AT_NS, SMALL_LIMITS

CORPUS: Final = Path(__file__).resolve().parent / "corpus"

Seed = tuple[str, bytes]


def seed(name: str, payload: bytes, flags: int = 0, cut_a: int = 0, cut_b: int = 0) -> Seed:
    """A named input: the harness header, then ``payload``."""
    header = bytes([flags]) + cut_a.to_bytes(2, "big") + cut_b.to_bytes(2, "big")
    return name, header + payload


def split_variants(name: str, payload: bytes, flags: int = 0) -> list[Seed]:
    """``payload`` in one read, in three reads, and a byte per read (if short)."""
    n = len(payload)
    seeds = [seed(name, payload, flags), seed(f"{name}.split", payload, flags, n // 3, 2 * n // 3)]
    if n <= 512:
        seeds.append(seed(f"{name}.bytewise", payload, flags | BYTEWISE))
    return seeds


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def os_random_like(n: int) -> bytes:
    """``n`` bytes that zlib cannot shrink, the same on every run."""
    out = b""
    block = b"seed"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return out[:n]


# -- forward ---------------------------------------------------------------------

_T: Final = 1_732_270_000


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _event_time(seconds: int, nanoseconds: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, nanoseconds))


def _str_header(n: int) -> bytes:
    return bytes([0xA0 | n]) if n < 32 else b"\xd9" + bytes([n])


def _raw_str(raw: bytes) -> bytes:
    """A msgpack str holding ``raw`` as is (not necessarily UTF-8)."""
    return _str_header(len(raw)) + raw


def _sha512_hex(*parts: bytes) -> bytes:
    return hashlib.sha512(b"".join(parts)).hexdigest().encode()


def _ping(hostname: str = "client.fuzz", username: str = "", users: bool = False) -> bytes:
    """A PING the fuzz target's handshake accepts (nonce and auth salt are zero bytes)."""
    salt = b"salt-0123456789a"
    nonce = b"\0" * 16
    digest = _sha512_hex(salt, hostname.encode(), nonce, SHARED_KEY)
    password = b""
    if users and username:
        password = _sha512_hex(b"\0" * 16, username.encode(), PASSWORD)
    return _pack(["PING", hostname, salt, digest, username, password])


def forward_seeds() -> Iterable[Seed]:
    record = {"message": "hello", "level": "info", "n": 1}
    entries = [[_event_time(_T, 5), record], [_T + 1, {"message": "two"}]]
    stream = b"".join(_pack(e) for e in entries)
    requests = {
        "heartbeat": b"\xc0",
        "message-int-time": _pack(["app.web", _T, record]),
        "message-eventtime": _pack(["app.web", _event_time(_T, 123), record, {"chunk": "c1"}]),
        "message-float-time": _pack(["app.web", _T + 0.25, record]),
        "message-nil-time": _pack(["app.web", None, record]),
        "forward": _pack(["app.web", entries, {"chunk": "Y2h1bmstMQ=="}]),
        "forward-fluentbit-metadata": _pack(
            ["app.web", [[[_event_time(_T), {"m": 1}], record]], {"chunk": "fb"}]
        ),
        "packed-bin": _pack(["app.web", stream, {"chunk": "p1", "size": 2}]),
        "packed-str": b"\x93\xa7app.web"
        + b"\xdb"
        + struct.pack(">I", len(stream))
        + stream
        + _pack({"chunk": "p2"}),
        "compressed": _pack(["app.web", gz(stream), {"compressed": "gzip", "chunk": "z1"}]),
        "compressed-multi-member": _pack(
            ["app.web", gz(stream) + gz(stream) + gz(b""), {"compressed": "gzip", "chunk": "z2"}]
        ),
        "compressed-text": _pack(["app.web", stream, {"compressed": "text"}]),
        "chunk-binary": _pack(["app.web", _T, record, {"chunk": b"\xff\x00\x01"}]),
        "two-requests": _pack(["a", _T, record]) + _pack(["b", [[_T, record]]]),
        "dropped-entries": _pack(["app.web", [[_T, "not a map"], [2**40, {}], "x", [1.5, {}]]]),
        # Hostile: a msgpack str tag that is not UTF-8; a 1 KiB+ tag; an empty chunk.
        "hostile-tag-not-utf8": b"\x93" + _raw_str(b"a\xffb") + _pack(_T) + _pack(record),
        "hostile-tag-long": _pack(["t" * 1100, _T, record]),
        "hostile-chunk-empty": _pack(["app.web", _T, record, {"chunk": ""}]),
        "hostile-gzip-unlabelled": _pack(["app.web", gz(stream), {"chunk": "u"}]),
        "hostile-entries-truncated": _pack(["app.web", stream[:-1], {"chunk": "t1"}]),
        "hostile-entries-invalid-byte": _pack(
            ["app.web", _pack(entries[0]) + b"\xc1" + _pack(entries[1]), {"chunk": "t2"}]
        ),
        "time-out-of-range": _pack(["app.web", 2**62, record]),
        "time-float-huge": _pack(["app.web", 1e300, record]),
    }
    for name, payload in requests.items():
        yield from split_variants(name, payload)
    json_requests = {
        "json-message": b'["app.web", 1732270000, {"message": "hi"}, {"chunk": "j1"}]',
        "json-forward": b'["app.web", [[1732270000, {"a": 1}], [0, {"b": [1, 2]}]]]\n'
        b'["x", 1.5, {"c": null}]',
        # Hostile: lone surrogates in a JSON tag and chunk.
        "hostile-json-tag-surrogate": b'["\\ud800", 1732270000, {"a": 1}]',
        "hostile-json-chunk-surrogate": b'["t", 1732270000, {"a": 1}, {"chunk": "\\udfff"}]',
        "json-escapes": b'["t\\"[{", 1, {"k\\\\": "]}\\u00e9"}]',
    }
    for name, payload in json_requests.items():
        yield from split_variants(name, payload)
    yield from split_variants("small-limits-forward", requests["forward"], SMALL_LIMITS)
    yield from split_variants("bytearray-forward", requests["compressed"], BYTEARRAY)
    after = requests["forward"] + requests["message-eventtime"]
    yield from split_variants("handshake-shared-key", _ping() + after, SECURITY)
    yield from split_variants(
        "handshake-users", _ping(username=USERNAME, users=True) + after, SECURITY | USERS
    )
    yield from split_variants(
        "handshake-users-anonymous", _ping(users=True) + after, USERS | ALLOW_ANONYMOUS_USER
    )
    bad_digest = _pack(["PING", "client.fuzz", b"salt", b"0" * 128, "", ""])
    yield from split_variants("handshake-bad-digest", bad_digest + after, SECURITY)
    yield from split_variants(
        "handshake-unknown-network", _ping() + after, SECURITY | UNKNOWN_NETWORK
    )
    yield from split_variants(
        "handshake-accept-any", _ping("host\u00e9.fuzz", "someone") + after,
        SECURITY | USERS | ACCEPT_ANY_PING,
    )  # fmt: skip
    yield from _zstd_seeds(stream)
    yield from split_variants("handshake-request-first", after, SECURITY)
    yield seed("handshake-store-unavailable", _ping() + after,
               SECURITY | UNKNOWN_NETWORK | ALLOW_ANONYMOUS_USER)  # fmt: skip
    yield seed("handshake-throttled", _ping() + after, SECURITY | UNKNOWN_NETWORK | ACCEPT_ANY_PING)
    # Limits: decompressed size, events per request, chunk sizes.
    zeros = _pack(["app.web", gz(_pack([[_T, {"z": "0" * 2_000_000}]])), {"compressed": "gzip"}])
    yield seed("limit-decompressed", zeros)
    yield seed("limit-decompressed-small", zeros, SMALL_LIMITS)
    many = [[_T + i, {"i": i}] for i in range(12)]
    yield seed("limit-events-small", _pack(["app.web", many]), SMALL_LIMITS)
    packed_many = b"".join(_pack(e) for e in many)
    yield seed("limit-events-packed-small", _pack(["app.web", packed_many]), SMALL_LIMITS)
    yield seed("limit-chunk-long", _pack(["app.web", _T, record, {"chunk": "c" * 300}]))
    yield seed("limit-chunk-binary-long", _pack(["app.web", _T, record, {"chunk": b"\xff" * 200}]))
    yield seed("limit-request-small", _pack(["app.web", _T, {"m": "x" * 400}]), SMALL_LIMITS)
    yield seed("limit-json-small", b'["app.web", 1, {"m": "' + b"x" * 400 + b'"}]', SMALL_LIMITS)
    # Hostile: a PING followed, in the same read, by more than a PING may hold.
    yield seed("hostile-ping-then-flood", _ping() + _pack(["t", _T, {"x": "y" * 8000}]), SECURITY)
    yield seed(
        "hostile-ping-host-not-utf8",
        _pack(["PING", b"h\xff", b"s", b"d", "", ""]),
        SECURITY | ACCEPT_ANY_PING,
    )


def _zstd_seeds(stream: bytes) -> Iterable[Seed]:
    """CompressedPackedForward with ``compressed: "zstd"`` (Fluentd >= 1.19); needs zstandard."""
    try:
        import zstandard
    except ImportError:  # optional: a dependency of the appliance since zstd support
        return
    zstd = zstandard.ZstdCompressor().compress(stream)
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"skip"
    requests = {
        "zstd": _pack(["app.web", zstd, {"compressed": "zstd", "chunk": "zs1"}]),
        "zstd-multi-frame": _pack(
            ["app.web", zstd + skippable + zstd, {"compressed": "zstd", "chunk": "zs2"}]
        ),
        "zstd-unlabelled": _pack(["app.web", zstd, {"chunk": "zs3"}]),
        "zstd-truncated": _pack(["app.web", zstd[:-2], {"compressed": "zstd"}]),
    }
    for name, payload in requests.items():
        yield from split_variants(name, payload)
    big = zstandard.ZstdCompressor().compress(_pack([_T, {"z": "0" * 2_000_000}]))
    yield seed("limit-zstd-expansion", _pack(["app.web", big, {"compressed": "zstd"}]))
    yield seed("limit-zstd-small", _pack(["app.web", zstd, {"compressed": "zstd"}]), SMALL_LIMITS)


# -- lumberjack --------------------------------------------------------------------


def _lj_window(count: int, version: bytes = b"2") -> bytes:
    return version + b"W" + struct.pack(">I", count)


def _lj_json(seq: int, event: Any) -> bytes:
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    return b"2J" + struct.pack(">II", seq, len(body)) + body


def _lj_data_v1(seq: int, pairs: dict[bytes, bytes]) -> bytes:
    out = b"1D" + struct.pack(">II", seq, len(pairs))
    for key, value in pairs.items():
        out += struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value
    return out


def _lj_compressed(frames: bytes, version: bytes = b"2") -> bytes:
    body = zlib.compress(frames)
    return version + b"C" + struct.pack(">I", len(body)) + body


def lumberjack_seeds() -> Iterable[Seed]:
    beat = {
        "@timestamp": "2024-11-22T10:00:00.123456789Z",
        "@metadata": {"beat": "filebeat", "version": "8.15.0"},
        "host": {"name": "web-1"},
        "message": "GET / 200",
    }
    events = [
        beat,
        {"@timestamp": "2024-11-22T10:00:01+02:00", "type": "syslog", "beat": {"hostname": "b"}},
        {"message": "no time", "host": "plain-host"},
    ]
    v2 = _lj_window(3) + b"".join(_lj_json(i + 1, e) for i, e in enumerate(events))
    v1 = _lj_window(2, b"1") + _lj_data_v1(1, {b"line": b"hello", b"host": b"h1"})
    v1 += _lj_data_v1(2, {b"line": b"caf\xe9 latin-1", b"file": b"/var/log/x", b"\xffkey": b"v"})
    payloads = {
        "v2-window": v2,
        "v2-compressed": _lj_window(3) + _lj_compressed(v2[6:]),
        "v2-compressed-with-window": _lj_compressed(v2),
        "v2-nested-compressed": _lj_window(1) + _lj_compressed(_lj_compressed(_lj_json(1, beat))),
        "v2-two-windows": v2 + _lj_window(1) + _lj_json(9, {"message": "next"}),
        "v2-empty-windows": _lj_window(0) * 3 + _lj_window(1) + _lj_json(1, {}),
        "v1-window": v1,
        "v1-compressed": _lj_compressed(v1, b"1"),
        "v1-window-reused": v1 + _lj_data_v1(3, {b"line": b"after"}),
        # Hostile: non-ASCII digits, Go's zero time, lone surrogates in tag and host.
        "hostile-timestamp-superscript": _lj_window(1)
        + _lj_json(1, b'{"@timestamp": "2024-11-22T10:00:00.\xc2\xb2Z"}'),
        "hostile-timestamp-go-zero": _lj_window(1)
        + _lj_json(1, {"@timestamp": "0001-01-01T00:00:00Z"}),
        "hostile-host-surrogate": _lj_window(1)
        + _lj_json(1, b'{"host": {"name": "\\ud800"}, "type": "\\udc00x"}'),
        "hostile-tag-long": _lj_window(1) + _lj_json(1, {"type": "t" * 1100, "host": "h" * 300}),
        "hostile-w0-in-c": _lj_window(1) + _lj_compressed(_lj_window(0) * 200 + _lj_json(1, {})),
        "hostile-empty-nested-c": _lj_window(1)
        + _lj_compressed(_lj_compressed(b"") * 20 + _lj_json(1, {})),
        "bad-json": _lj_window(1) + _lj_json(1, b'{"a": '),
        "version-mix": _lj_window(1) + _lj_data_v1(1, {b"a": b"b"}),
        "data-outside-window": _lj_json(1, {}),
    }
    for name, payload in payloads.items():
        yield from split_variants(name, payload)
    yield from split_variants("small-limits-v2", v2, SMALL_LIMITS)
    # Limits: nesting depth, decompressed size, frame size, a frame cut short in a C frame.
    nested = _lj_json(1, {})
    for _ in range(6):
        nested = _lj_compressed(nested)
    yield seed("limit-nesting", _lj_window(1) + nested)
    big = _lj_window(1) + _lj_compressed(_lj_json(1, {"m": "0" * 1_200_000}))
    yield seed("limit-decompressed", big)
    yield seed("limit-decompressed-small", big, SMALL_LIMITS)
    yield seed("limit-frame-small", _lj_window(1) + _lj_json(1, {"m": "x" * 600}), SMALL_LIMITS)
    yield seed("limit-window-small", _lj_window(9) + _lj_json(1, {}), SMALL_LIMITS)
    yield seed("c-frame-cut-short", _lj_window(1) + _lj_compressed(_lj_json(1, {"a": 1})[:-3]))
    yield from split_variants("bytearray-v1", v1, BYTEARRAY)


# -- courier -----------------------------------------------------------------------


def _courier(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(body)) + body


def _courier_events(events: list[bytes]) -> bytes:
    return zlib.compress(b"".join(struct.pack(">I", len(e)) + e for e in events))


def courier_seeds() -> Iterable[Seed]:
    nonce = bytes(range(16))
    events = [
        json.dumps(
            {"@timestamp": "2024-11-22T10:00:00.5Z", "message": "hi", "type": "app",
             "host": {"name": "web-1"}}
        ).encode(),
        json.dumps({"message": "x", "beat": {"hostname": "b"}, "host": "h"}).encode(),
        b"not json at all",
        b"\xff\xfe raw bytes",
    ]  # fmt: skip
    hello = b"\x01\x00\x02\x07\x00LCOR" + b"\0" * 20
    payloads = {
        "hello-ping": _courier(b"HELO", hello) + _courier(b"PING"),
        "jdat": _courier(b"JDAT", nonce + _courier_events(events)),
        "evnt": _courier(b"HELO", hello)
        + b"EVNT\xff\xff\xff\xff"
        + nonce
        + _courier_events(events)
        + _courier(b"PING"),
        "two-jdat": _courier(b"JDAT", nonce + _courier_events(events[:1]))
        + _courier(b"JDAT", bytes(16) + _courier_events(events[1:])),
        "unknown-type": _courier(b"ABCD", b"xyz") + _courier(b"PING"),
        "hello-compact": _courier(b"HELO", b"\x01\x02\x07\x00RUBY"),
        "hello-empty": _courier(b"HELO"),
        "hello-20": _courier(b"HELO", hello[:20]),
        # Hostile: HELO bodies of 9-19 bytes; lone surrogates in type and host;
        # odd digits and Go's zero time in @timestamp.
        "hostile-hello-9": _courier(b"HELO", hello[:9]),
        "hostile-hello-19": _courier(b"HELO", hello[:19]),
        "hostile-type-host-surrogate": _courier(
            b"JDAT", nonce + _courier_events([b'{"type": "\\ud800", "host": "\\udfff"}'])
        ),
        "hostile-timestamp-odd": _courier(
            b"JDAT",
            nonce
            + _courier_events(
                [
                    '{"@timestamp": "2024-11-22T10:00:00.\u00b2Z"}'.encode(),
                    b'{"@timestamp": "0001-01-01T00:00:00Z"}',
                    '{"@timestamp": "\u0662024-11-22T10:00:00Z"}'.encode(),
                ]
            ),
        ),
        "truncated-zlib": _courier(b"JDAT", nonce + _courier_events(events)[:-4]),
        "server-message": _courier(b"ACKN", nonce + b"\0\0\0\1"),
    }
    for name, payload in payloads.items():
        yield from split_variants(name, payload)
    yield from split_variants("small-limits-jdat", payloads["jdat"], SMALL_LIMITS)
    # Limits: decompressed size, rows' memory, an event cut short, EVNT size, event count.
    big = [json.dumps({"m": "0" * 1_100_000}).encode()]
    yield seed("limit-decompressed", _courier(b"JDAT", nonce + _courier_events(big)))
    yield seed("limit-decompressed-small", _courier(b"JDAT", nonce + _courier_events(big)),
               SMALL_LIMITS)  # fmt: skip
    empties = [b"{}"] * 3000
    yield seed("limit-memory-small", _courier(b"JDAT", nonce + _courier_events(empties)),
               SMALL_LIMITS)  # fmt: skip
    cut = zlib.compress(struct.pack(">I", 50) + b'{"a": 1}')
    yield seed("event-cut-short", _courier(b"JDAT", nonce + cut))
    yield seed("limit-evnt-small", b"EVNT\xff\xff\xff\xff" + nonce + os_random_like(600),
               SMALL_LIMITS)  # fmt: skip
    yield from split_variants("bytearray-evnt", payloads["evnt"], BYTEARRAY)


# -- logjam ------------------------------------------------------------------------


def _meta(compression: int = 0, little_endian: bool = False, sequence: int = 7) -> bytes:
    layout = "<HBBIQQ" if little_endian else ">HBBIQQ"
    return struct.pack(layout, 0xCABD, compression, 1, 3, 1_732_270_000_123, sequence)


def _frames(*frames: bytes) -> bytes:
    return FRAME_SEPARATOR.join(frames)


def logjam_seeds() -> Iterable[Seed]:
    body = json.dumps(
        {"action": "Home#index", "started_ms": 1_732_270_000_000, "host": "web-1",
         "total_time": 12.5, "lines": [[1, "2024-11-22T10:00:00", "hello"]]}
    ).encode()  # fmt: skip
    data = [b"myapp-production", b"logs.myapp.web", body]
    router_id = b"\x00\x80\x00\x00\x29"
    seeds = {
        "pull": (_frames(*data, _meta()), 0),
        "pull-memoryview": (_frames(*data, _meta()), MEMORYVIEW),
        "router-request": (_frames(router_id, b"", *data, _meta()), ROUTER),
        "router-request-curve": (_frames(router_id, b"", *data, _meta()), ROUTER | CURVE),
        "router-async": (_frames(router_id, *data, _meta()), ROUTER),
        "router-ping": (_frames(router_id, b"", b"ping", b"myapp-production", b"{}", _meta()),
                        ROUTER),
        "zlib": (_frames(data[0], data[1], zlib.compress(body), _meta(1)), 0),
        "gzip": (_frames(data[0], data[1], gz(body), _meta(1)), 0),
        "little-endian-meta": (_frames(*data, _meta(little_endian=True)), 0),
        "javascript-topic": (_frames(b"app-prod", b"javascript", b'{"host": 5}', _meta()), 0),
        "too-many-frames": (_frames(router_id, b"", *data, _meta(), b"x", b"y"), ROUTER),
        # Hostile: a lone surrogate host (stored as null) and a long one.
        "hostile-host-surrogate": (_frames(data[0], data[1], b'{"host": "\\ud800"}', _meta()), 0),
        "hostile-host-long": (
            _frames(data[0], data[1], json.dumps({"host": "h" * 300}).encode(), _meta()), 0
        ),
        "hostile-app-env-not-utf8": (_frames(b"my\xffapp-prod", data[1], body, _meta()), 0),
        "started-ms-huge": (_frames(data[0], data[1], b'{"started_ms": 99999999999999999}',
                                    _meta()), 0),
        "not-json": (_frames(*data[:2], b"{not json", _meta()), 0),
    }  # fmt: skip
    try:
        import cramjam
    except ImportError:  # optional: the test extra
        pass
    else:
        snappy = bytes(cramjam.snappy.compress_raw(body))
        lz4 = struct.pack(">I", len(body)) + bytes(
            cramjam.lz4.compress_block(body, store_size=False)
        )
        seeds["snappy"] = (_frames(*data[:2], snappy, _meta(2)), 0)
        seeds["lz4"] = (_frames(*data[:2], lz4, _meta(3)), 0)
    for name, (payload, flags) in seeds.items():
        yield seed(name, payload, flags)
    yield seed("small-limits-zlib", seeds["zlib"][0], SMALL_LIMITS)
    # Limits and shapes: a body over the limits, a body that is not an object.
    yield seed("limit-body-small", _frames(*data, _meta()), SMALL_LIMITS)
    huge = zlib.compress(json.dumps({"m": "0" * 1_100_000}).encode())
    yield seed("limit-decompressed", _frames(*data[:2], huge, _meta(1)))
    yield seed("body-array", _frames(*data[:2], b"[1, 2]", _meta()))
    yield seed("limit-containers-small", _frames(*data[:2], b'{"a": [[[[[[[[[]]]]]]]]]}', _meta()),
               SMALL_LIMITS)  # fmt: skip


# -- websocket ---------------------------------------------------------------------


def websocket_seeds() -> Iterable[Seed]:
    good = {
        "id": "b-1", "tag": "web.app",
        "events": [{"time": 1732270000.5, "record": {"msg": "hi", "n": [1, 2]}},
                   {"time": "2024-11-22T10:00:00.123456789+01:00", "record": {}},
                   {"record": {"nested": {"a": None}}}],
    }  # fmt: skip
    messages = {
        "ingest": json.dumps(good).encode(),
        "ingest-int-id": json.dumps({"id": 42, "tag": "t", "events": [{"time": None,
                                                                        "record": {}}]}).encode(),
        "two-messages": _frames(json.dumps(good).encode(), b'{"id": 2, "tag": "t", "events": []}'),
        # Hostile: the shared RFC 3339 parser (odd digits, Go's zero time), lone surrogates.
        "hostile-time-superscript": '{"id": "a", "tag": "t", "events": [{"time": '
        '"2024-11-22T10:00:00.\u00b2Z", "record": {}}]}'.encode(),
        "hostile-time-go-zero": b'{"id": "a", "tag": "t", "events": [{"time": '
        b'"0001-01-01T00:00:00Z", "record": {}}]}',
        "hostile-surrogates": b'{"id": "\\ud800", "tag": "\\udfff", "events": [{"record": '
        b'{"\\ud800": "\\udc00"}}]}',
        "time-huge": b'{"id": "a", "tag": "t", "events": [{"time": 1e300, "record": {}}]}',
        "not-json": b'{"id": ',
        "not-utf8": b'{"id": "\xff", "tag": "t", "events": []}',
    }  # fmt: skip
    for name, payload in messages.items():
        yield seed(name, payload)
    yield seed("ingest-binary", messages["ingest"], BINARY)
    yield seed("small-limits-ingest", messages["ingest"], SMALL_LIMITS)
    yield seed(
        "handshake",
        b"/ingest?tag=web.&protocol=forward\r\nOrigin: https://app.example\r\n"
        b"Authorization: Bearer abc.def\r\nSec-WebSocket-Protocol: appliance.v1, bearer.tok",
        HANDSHAKE,
    )
    yield seed("handshake-long-filter", b"/tail?tag=" + b"a" * 1100, HANDSHAKE)


def _wal_record(lsn: int, body: bytes, key: tuple[str, str, str] | None, rows: int) -> bytes:
    section = encode_key(key)
    return frame_header(lsn, KIND_ROW_BLOCK, section, rows, body) + section + body


def _wal_blocks() -> list[RowBlock]:
    records = ['{"message":"GET / 200"}', '{"n":1,"s":"\u00fc"}', "{}"]
    forward = RowBlock(
        protocol="forward", source="fuzz", peer="192.0.2.7:40000",
        received_at_ns=RECEIVED_AT_NS, batch_id="Y2h1bmstMQ==", tag="app.access",
        host="client.fuzz", times_ns=[RECEIVED_AT_NS, None, RECEIVED_AT_NS + 1],
        records=records,
    )  # fmt: skip
    lumberjack = RowBlock(
        protocol="lumberjack", source="anonymous", peer="192.0.2.7:40001",
        received_at_ns=RECEIVED_AT_NS, batch_id=None, tag=["beat", "lumberjack"],
        host=["web-1", None], times_ns=[None, None], records=records[:2],
    )  # fmt: skip
    empty = RowBlock(
        protocol="websocket", source="token", peer="[2001:db8::1]:443",
        received_at_ns=RECEIVED_AT_NS, batch_id="m-7", tag="browser", host=None,
        times_ns=[], records=[],
    )  # fmt: skip
    return [forward, lumberjack, empty]


def _wal_segment(bodies: list[tuple[bytes, tuple[str, str, str] | None, int]]) -> bytes:
    out = b""
    for body, key, rows in bodies:
        out += _wal_record(len(out), body, key, rows)
    return out


def wal_seeds() -> Iterable[Seed]:
    blocks = _wal_blocks()
    entries = [(encode_block(b), dedupe_key(b), b.rows) for b in blocks]
    log = _wal_segment(entries)
    first = len(_wal_record(0, *entries[0]))
    second = first + len(_wal_record(first, *entries[1]))
    yield from split_variants("segment", log)
    yield seed("segment-recover", log, RECOVER)
    yield seed("empty", b"")
    # Torn tails: a cut header, a cut body, zeros where the next record would be.
    yield seed("torn-header.recover", log[: second + 20], RECOVER)
    yield seed("torn-body.recover", log[: second + 50], RECOVER)
    yield seed("zero-tail.recover", log + bytes(64), RECOVER)
    # A flipped bit in a body (skipped, the rest kept) and in a header (the scan stops).
    flipped = bytearray(log)
    flipped[first + 40] ^= 0x04
    yield seed("body-flip.recover", bytes(flipped), RECOVER)
    flipped = bytearray(log)
    flipped[first + 9] ^= 0x01
    yield seed("header-flip", bytes(flipped))
    # Headers that verify but must not be trusted: another version, a wrong
    # position, a length past the format's limit.
    raw = _wal_record(0, b"\x93\x01\x02\x03", None, 1)
    for name, index, value in (("version-2", 4, 2), ("kind-7", 5, 7)):
        changed = bytearray(raw[:28])
        changed[index] = value
        head = bytes(changed)
        yield seed(name, head + zlib.crc32(head).to_bytes(4, "big") + raw[32:])
    yield seed("wrong-position", _wal_record(4096, entries[0][0], None, 3))
    huge = bytearray(raw[:28])
    huge[16:20] = (0x7FFFFFFF).to_bytes(4, "big")
    yield seed("huge-length.recover", bytes(huge) + zlib.crc32(huge).to_bytes(4, "big"), RECOVER)
    # Bodies under a valid CRC that are not blocks: the codec refuses them.
    fields: list[Any] = [1, "forward", "s", "p", 1, None, "t", None, [None], ["{}"], 0]

    def varied(index: int, value: Any) -> bytes:
        packed: bytes = msgpack.packb([*fields[:index], value, *fields[index + 1 :]])
        return packed

    not_blocks = [
        (b"", None, 0),
        (b"\xc1", None, 1),
        (varied(9, [b"x"]), None, 1),  # a record that is bin, not str
        (varied(8, [True]), None, 1),  # a bool for a time
        (varied(4, 2**63), None, 1),  # a receive time no int64 holds
        (varied(6, ["a", "b"]), None, 1),  # two tags for one row
        (msgpack.packb([*fields[:8], [None] * 500, ["{}"] * 500, 0]), None, 9),
        (entries[0][0], ("forward", "fuzz", "Y2h1bmstMQ=="), 3),  # a real block
    ]
    yield from split_variants("not-blocks", _wal_segment(not_blocks))
    key_section = b"\x00\x01\xff\x00\x00\x00\x00"
    bad_key = frame_header(0, KIND_ROW_BLOCK, key_section, 1, b"{}") + key_section + b"{}"
    yield seed("bad-key.recover", bad_key + _wal_record(len(bad_key), b"x", None, 0), RECOVER)


# -- proxy -------------------------------------------------------------------------


def _pp2(ver_cmd: int, fam: int, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return V2_SIGNATURE + bytes([ver_cmd, fam]) + struct.pack(">H", size) + body


def _tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack(">H", len(value)) + value


def proxy_seeds() -> Iterable[Seed]:
    """Every header form doc/proxy-protocol.txt shows, then what follows; and hostile ones."""
    four = (Endpoint(ip_address("192.168.0.1"), 56324), Endpoint(ip_address("192.168.0.11"), 443))
    six = (
        Endpoint(ip_address("2001:db8::1"), 40000),
        Endpoint(ip_address("::ffff:1.2.3.4"), 24224),
    )
    ipv4_block = bytes([192, 168, 0, 1, 192, 168, 0, 11]) + struct.pack(">HH", 56324, 443)
    unix_block = b"/run/a.sock".ljust(108, b"\0") + b"/run/b.sock".ljust(108, b"\0")
    ssl = _tlv(0x20, b"\x07\0\0\0\0" + _tlv(0x21, b"TLSv1.3") + _tlv(0x22, b"client.example"))
    after = b"\x16\x03\x01\x00\x05hello"  # the start of a TLS record
    valid = {
        "v1-spec-example": b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET / HTTP/1.1\r\n",
        "v1-tcp4-longest": b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n" + after,
        "v1-tcp6": encode_v1(*six) + after,
        "v1-tcp6-longest": b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n" + after,
        "v1-unknown": b"PROXY UNKNOWN\r\n" + after,
        "v1-unknown-worst-case": b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n" + after,
        "v2-tcp4": encode_v2(*four) + after,
        "v2-tcp6": encode_v2(*six) + after,
        "v2-local": encode_v2(None, None) + after,
        "v2-local-addresses": _pp2(0x20, 0x11, ipv4_block) + after,
        "v2-udp4": _pp2(0x21, 0x12, ipv4_block) + after,
        "v2-unix": _pp2(0x21, 0x31, unix_block) + after,
        "v2-unspec": _pp2(0x21, 0x00, b"") + after,
        "v2-tlvs": encode_v2(
            *four, tlvs=((0x01, b"h2"), (0x02, b"logs.example"), (0x04, b""), (0x05, bytes(16)),
                         (ssl[0], ssl[3:]), (0xE0, b"custom"))
        ) + after,
        "v2-crc32c": encode_v2(*six, tlvs=((0x04, b"pad"),), checksum=True) + after,
    }  # fmt: skip
    for name, payload in valid.items():
        yield from split_variants(name, payload)
    yield seed("small-limits-v2-tlvs", valid["v2-tlvs"], SMALL_LIMITS)
    yield seed("small-limits-v2-tcp6", valid["v2-tcp6"], SMALL_LIMITS)
    hostile = {
        "tls-first": after,
        "v1-leading-zero-port": b"PROXY TCP4 1.2.3.4 5.6.7.8 080 443\r\n",
        "v1-leading-zero-octet": b"PROXY TCP4 192.168.01.1 5.6.7.8 1 2\r\n",
        "v1-port-over": b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        "v1-family-mismatch": b"PROXY TCP4 ::1 ::1 1 2\r\n",
        "v1-bare-lf": b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        "v1-bare-cr": b"PROXY UNKNOWN a\rb\r\n",
        "v1-no-crlf": b"PROXY UNKNOWN " + b"x" * 200,
        "v1-zone-index": b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
        "v2-version-1": V2_SIGNATURE + b"\x11\x11\x00\x0c" + ipv4_block,
        "v2-command-2": V2_SIGNATURE + b"\x22\x11\x00\x0c" + ipv4_block,
        "v2-family-0x13": V2_SIGNATURE + b"\x21\x13\x00\x0c" + ipv4_block,
        "v2-huge-length": _pp2(0x21, 0x11, ipv4_block, length=0xFFFF),
        "v2-short-addresses": _pp2(0x21, 0x21, ipv4_block),
        "v2-tlv-past-end": _pp2(0x21, 0x11, ipv4_block + b"\x04\x00\x09abc"),
        "v2-tlv-leftover": _pp2(0x21, 0x11, ipv4_block + b"\x04\x00"),
        "v2-crc32c-wrong": _pp2(0x21, 0x11, ipv4_block + _tlv(0x03, b"\xde\xad\xbe\xef")),
    }
    for name, payload in hostile.items():
        yield seed(name, payload)
    yield seed("v2-truncated", valid["v2-tcp6"][:30], BYTEWISE)


# -- forward_fast -------------------------------------------------------------------


def forward_fast_seeds() -> Iterable[Seed]:
    """Plain streams the fast path takes, and each shape it leaves to the general path."""
    from fuzz.fuzz_forward_fast import COUNT_VALUES, GZIP

    def entries(*pairs: tuple[Any, Any]) -> bytes:
        return b"".join(msgpack.packb([t, r], use_bin_type=True, datetime=False) for t, r in pairs)

    now = 1_700_000_000
    plain = entries(*((_event_time(now, i), {"seq": i, "msg": f"line {i}"}) for i in range(20)))
    streams = {
        "plain": plain,
        "nested": entries((_event_time(now), {"a": [1, {"b": None}], "f": 1.5, "t": True})),
        "unicode": entries((_event_time(now), {"msg": "ünïcødé ✓"})),
        "int-seconds": entries((now, {"a": 1})),
        "nanoseconds-out-of-range": entries((_event_time(now, 10**9), {"a": 1})),
        "record-not-map": entries((_event_time(now), [1, 2])),
        "bytes-value": entries((_event_time(now), {"a": b"\xff"})),
        "int-key": entries((_event_time(now), {1: "a"})),
        "timestamp-value": entries((_event_time(now), {"t": msgpack.Timestamp(1, 2)})),
        "timestamp-key": entries((_event_time(now), {msgpack.Timestamp(1, 2): 1})),
        "ext-value": entries((_event_time(now), {"x": msgpack.ExtType(5, b"ab")})),
        "not-utf8": b"\x92\xd7\x00" + bytes(8) + b"\x81\xa1a\xa2\xff\xfe",
        "array-key": b"\x92\xd7\x00" + bytes(8) + b"\x81\x91\x01\x02",
        "truncated": plain[:-3],
        "deep": b"\x92\xd7\x00" + bytes(8) + b"\x81\xa1a" * 400 + b"\xc0",
    }
    for name, stream in streams.items():
        yield seed(name, stream, cut_a=COUNT_VALUES)
    yield seed("plain-gzip", plain, GZIP, cut_a=COUNT_VALUES)
    yield seed("plain-small-limits", plain, SMALL_LIMITS, cut_a=COUNT_VALUES)
    yield seed("size-too-small", plain, cut_a=19)
    yield seed("size-too-large", plain, cut_a=21)


TARGETS: Final = {
    "forward": forward_seeds,
    "lumberjack": lumberjack_seeds,
    "courier": courier_seeds,
    "logjam": logjam_seeds,
    "websocket": websocket_seeds,
    "wal": wal_seeds,
    "proxy": proxy_seeds,
    "forward_fast": forward_fast_seeds,
}


def main() -> None:
    for target, make in TARGETS.items():
        directory = CORPUS / target
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        count = 0
        for name, data in make():
            (directory / name).write_bytes(data)
            count += 1
        print(f"{target}: {count} seeds in {directory}")


if __name__ == "__main__":
    main()
