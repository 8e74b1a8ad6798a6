"""The Logjam producer protocol, server side, as a sans-IO codec.

The spec is ``specs/producer_protocol.md`` in
https://github.com/skaes/logjam-tools; what the real device and agents do,
where this module follows them, and the sources cited for each rule are in
``docs/logjam.md``. Messages arrive as lists of ZeroMQ frames; the driver owns
the sockets and hands every message to :meth:`LogjamReceiver.receive_router`
or :meth:`LogjamReceiver.receive_pull`.

Frames (after the ROUTER's routing-id frame)::

    async data   [app-env][topic][body][meta]        no reply
    request      [""][app-env][topic][body][meta]    [app-env]["202 Accepted"]
                                                     or [app-env]["400 Bad Request"]
    ping         [""]["ping"][app-env][body][meta]   ["ping"]["200 OK"][fqdn]
                                                     or ["ping"]["400 Bad Request"]

Replies are the spec's ``reply-msg`` and ``pong-msg`` as logjam-tools' device
builds them at HEAD (``src/logjam-device.c``,
``read_router_message_and_forward``): the routing id, then the request's
app-env frame as sent (``"ping"`` for a ping; ``"unknown-unknown"`` when the
request has no app-env frame), then the status (and the fqdn for a ping). No
empty delimiter: a DEALER reads ``[app-env, "202 Accepted"]``, which is what
``logjam_agent`` checks (``answer_parts.first == app_env``). An app-env frame
longer than :data:`MAX_APP_ENV_BYTES` is not echoed (its 400 carries
``"unknown-unknown"``), so a reply never copies more than that of a frame.

The meta frame is 24 bytes, big-endian: tag ``0xCABD`` (u16), compression
(u8: 0 none, 1 zlib or gzip, 2 snappy, 3 lz4), version (u8, 1), device (u32),
created_ms (u64), sequence (u64). A frame whose tag reads ``0xBDCA`` was
packed in little-endian host order; its multi-byte fields are read that way.

Invariants:

* The receiver holds no state between messages: every message either decodes
  to one event or raises :class:`MalformedMessage`, whose ``reply_frames``
  are the 400 to send when the peer asked for a reply (``None`` otherwise).
* Nothing is decompressed past ``limits.max_decompressed_bytes``, and a body
  over ``limits.max_body_bytes`` is refused before it is decompressed.
* The codec never acknowledges by itself: the driver asks for
  :func:`accepted_frames` once a message is committed.

Strict strings (docs/decisions.md#strict-strings; the limits are
``appliance.blocks.text``'s):

* app-env and topic (the row's ``tag``) are frames of the message itself,
  checked by the device's rules at logjam-tools HEAD (``src/logjam-util.c``):
  an app-env is printable ASCII (every byte 0x20 to 0x7F) with at least one
  ``-`` (``well_formed_stream_name``); a topic begins with ``logs``,
  ``javascript``, ``events``, ``frontend.page``, ``frontend.ajax`` or
  ``mobile`` (``well_formed_topic``, a prefix test: ``logs.x.worker:1`` and
  ``frontend.page.shop`` pass). On top of the device's rules both are at
  most :data:`MAX_APP_ENV_BYTES` and :data:`MAX_TOPIC_BYTES` (below
  ``MAX_TAG_BYTES``), and the topic, which the device takes as any bytes,
  must be strict UTF-8 (it becomes the row's tag, verbatim). A violation is
  a 400 for the message (nothing of it is stored). Where an application and
  an environment are wanted, the app-env splits at its *last* ``-`` (the
  device's ``extract_app_env``; ``appliance/spark/jobs.py`` does the same):
  ``my.app-production`` is ``my.app`` and ``production``.
* ``host`` comes from inside the JSON body, where Logjam keeps no per-field
  errors and the record is still good: a ``host`` that is not valid UTF-8
  (a JSON ``"\\ud800"`` escape) or is longer than ``MAX_HOST_BYTES`` falls
  back to a null host, the message is stored, and
  :attr:`DataMessage.host_dropped` says why, so the driver counts and logs
  it. The record keeps the original value (``records.record_json`` renders a
  lone surrogate as ``{"$binary": ...}``).
* The batch id is built here and is at most ``MAX_BATCH_ID_BYTES``: an
  app-env too long to fit, or one holding ``~``, is written as a prefix plus
  a digest of the whole app-env (see :func:`_batch_id`).

Bounded work (docs/decisions.md#every-queue-has-a-limit):

* A message has at most :data:`MAX_MESSAGE_FRAMES` frames; the driver reads
  at most one more, so a message of a million empty frames is refused
  without a million copies.
* :meth:`LogjamReceiver.decode_size_bound` tells the driver, before any
  decoding, how many bytes decoding a message can read and produce (the body
  as decompressed: the declared size of Snappy and LZ4, 1032 times the body
  for deflate, which is its largest ratio), so only messages that are small
  *after decompression* are decoded on the event loop.
* Python objects cost more memory than the JSON text they come from: up to
  about 16 times for strings and numbers (measured: 2-byte strings, with one
  character that makes the decoded text 4 bytes per character), and 21 to
  24 times for ``[]`` and ``{}``. The body is refused before it is parsed
  when it holds more than ``limits.max_json_containers`` of ``{`` and ``[``
  (counted as bytes, those inside strings too, so the limit errs on the
  safe side). A message being decoded therefore holds at most about
  16 times ``max_decompressed_bytes`` plus some 200 bytes per container
  (with the defaults, about 560 MiB for the worst body of 32 MiB); the
  driver decodes one message at a time per listener, and each of its two
  readers holds at most one decoded message.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from appliance import defaults
from appliance.blocks.errors import InvalidText
from appliance.blocks.text import (
    MAX_BATCH_ID_BYTES,
    MAX_HOST_BYTES,
    MAX_TAG_BYTES,
    check_text,
    decode_text,
)
from appliance.protocols import compression
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "ACCEPTED",
    "BAD_REQUEST",
    "DEFLATE_MAX_RATIO",
    "MAX_APP_ENV_BYTES",
    "MAX_MESSAGE_FRAMES",
    "MAX_TOPIC_BYTES",
    "META_BYTES",
    "META_TAG",
    "META_VERSION",
    "PING",
    "PONG",
    "TOPIC_PREFIXES",
    "UNKNOWN_APP_ENV",
    "Compression",
    "DataMessage",
    "FrameData",
    "LogjamLimits",
    "LogjamReceiver",
    "MalformedMessage",
    "Meta",
    "Ping",
    "Route",
    "accepted_frames",
    "bad_request_frames",
    "pack_meta",
    "parse_meta",
    "pong_frames",
]

#: Longest app-env frame, in bytes.
MAX_APP_ENV_BYTES: Final = 255
#: Longest topic frame, in bytes (it becomes the row's tag).
MAX_TOPIC_BYTES: Final = 255
assert MAX_TOPIC_BYTES <= MAX_TAG_BYTES
#: Most frames of one message as the ROUTER delivers it, a count: routing id,
#: empty delimiter and four data frames (a request or a ping). An async
#: message has five, a PULL message four.
MAX_MESSAGE_FRAMES: Final = 6
#: Largest ratio of deflate output to input (a ratio: 258-byte matches coded in
#: about 2 bits, zlib's "technical details"): the bound on a zlib or gzip body.
DEFLATE_MAX_RATIO: Final = 1032
#: Size of the meta frame.
META_BYTES: Final = 24
META_TAG: Final = 0xCABD
#: The tag as a little-endian writer packs it.
_META_TAG_SWAPPED: Final = 0xBDCA
META_VERSION: Final = 1

_META_BE: Final = struct.Struct(">HBBIQQ")
_META_LE: Final = struct.Struct("<HBBIQQ")
assert _META_BE.size == META_BYTES

#: Reply status frames (the spec's ABNF; logjam-tools' device and importer at HEAD).
ACCEPTED: Final = b"202 Accepted"
BAD_REQUEST: Final = b"400 Bad Request"
PONG: Final = b"200 OK"
#: The app-env frame of a ping (and so the first frame of its reply).
PING: Final = b"ping"
#: The first reply frame when a request has no app-env frame to echo (the
#: device's stand-in), or one too long to echo.
UNKNOWN_APP_ENV: Final = b"unknown-unknown"
#: Frames of a data message (app-env, topic, body, meta).
_DATA_FRAMES: Final = 4
#: Offset of the compression byte in the meta frame (the same in either byte order).
_META_COMPRESSION_OFFSET: Final = 2
#: Snappy's length preamble is a varint of at most 5 bytes (32 bits).
_SNAPPY_MAX_VARINT_BYTES: Final = 5
#: The u32 size prefix of an LZ4 body (method 3).
_LZ4_PREFIX: Final = struct.Struct(">I")
#: The batch id without its app-env: ":" u32 ":" u64 ":" u64 ":" 16 hex digits.
_BATCH_ID_FIXED_BYTES: Final = 1 + 10 + 1 + 20 + 1 + 20 + 1 + 16
#: A shortened app-env in a batch id ends with "~" and 16 hex digits of its digest.
_APP_ENV_DIGEST_BYTES: Final = 8

#: One frame as the codec reads it: bytes, or a view of a ZeroMQ frame (not copied).
FrameData: TypeAlias = bytes | bytearray | memoryview

#: app-env, as logjam-tools' ``well_formed_stream_name``: every byte 0x20 to
#: 0x7F (a signed ``char`` below 32 is refused, which covers bytes over 0x7F),
#: and at least one "-" (checked apart).
_APP_ENV_BYTES: Final = re.compile(rb"[\x20-\x7f]+")
#: Topic prefixes, as logjam-tools' ``well_formed_topic`` (a prefix test, so
#: ``logs``, ``logs.x.worker:1`` and ``frontend.page.shop`` all pass).
TOPIC_PREFIXES: Final = ("logs", "javascript", "events", "frontend.page", "frontend.ajax", "mobile")
#: The batch id's marker of a shortened app-env (see :func:`_batch_id`).
_SHORTENED: Final = "~"


class Compression(enum.IntEnum):
    """The meta frame's compression method."""

    NONE = 0
    #: zlib per the spec and logjam-tools; gzip from the Ruby agent (detected).
    ZLIB = 1
    SNAPPY = 2
    #: A big-endian u32 uncompressed size, then one LZ4 block.
    LZ4 = 3


@dataclass(frozen=True, slots=True)
class LogjamLimits:
    """Limits on one message (configurable per listener)."""

    max_body_bytes: int = defaults.LOGJAM_MAX_BODY_BYTES
    max_decompressed_bytes: int = defaults.LOGJAM_MAX_DECOMPRESSED_BYTES
    max_json_containers: int = defaults.LOGJAM_MAX_JSON_CONTAINERS

    def __post_init__(self) -> None:
        require_at_least_one(
            self, "max_body_bytes", "max_decompressed_bytes", "max_json_containers"
        )


@dataclass(frozen=True, slots=True)
class Meta:
    """The decoded meta frame."""

    compression: int
    version: int
    device: int
    created_ms: int
    sequence: int
    #: The frame was packed little-endian (tag ``BD CA`` on the wire).
    swapped: bool = False


@dataclass(frozen=True, slots=True)
class Route:
    """Where a ROUTER message came from, whether it wants a reply, and the reply's first frame."""

    #: The ROUTER's routing id of the peer.
    identity: bytes
    #: The peer marked the message with an empty frame (request or ping).
    reply: bool
    #: The frame every reply begins with after the routing id: the request's
    #: app-env frame as sent (``"ping"`` for a ping), or :data:`UNKNOWN_APP_ENV`.
    app_env: bytes = UNKNOWN_APP_ENV


@dataclass(frozen=True, slots=True)
class DataMessage:
    """One decoded data message: one row."""

    app_env: str
    topic: str
    record: dict[str, Any]
    meta: Meta
    #: Identifies the message for dedupe and audit (see :func:`_batch_id`).
    batch_id: str
    #: The ROUTER route, or None for a message from the PULL socket.
    route: Route | None
    #: The body's ``host`` when it is a non-empty string, valid UTF-8, at most
    #: ``MAX_HOST_BYTES``; None otherwise.
    host: str | None = None
    #: Why a string ``host`` was not kept (not UTF-8, too long), else None.
    host_dropped: str | None = None


@dataclass(frozen=True, slots=True)
class Ping:
    """A ping (``[""]["ping"][app-env][body][meta]``): answered at once, never stored."""

    app_env: str
    meta: Meta
    route: Route


class MalformedMessage(RemoteProtocolError):
    """A message the appliance refuses; nothing of it is written.

    ``reply_frames`` is the 400 to send when the peer asked for a reply.
    """

    def __init__(self, reason: str, route: Route | None) -> None:
        super().__init__(reason)
        self.route = route
        self.reply_frames: list[bytes] | None = (
            bad_request_frames(route) if route is not None and route.reply else None
        )


# -- replies ---------------------------------------------------------------------


def _routed(route: Route, *frames: bytes) -> list[bytes]:
    return [route.identity, route.app_env, *frames]


def accepted_frames(route: Route) -> list[bytes]:
    """``[id][app-env]["202 Accepted"]``: the request is committed."""
    return _routed(route, ACCEPTED)


def bad_request_frames(route: Route) -> list[bytes]:
    """``[id][app-env]["400 Bad Request"]``: the request (or the ping) is refused."""
    return _routed(route, BAD_REQUEST)


def pong_frames(route: Route, fqdn: str) -> list[bytes]:
    """``[id]["ping"]["200 OK"][fqdn]``: the answer to a ping."""
    return _routed(route, PONG, fqdn.encode("utf-8"))


def _reply_app_env(frames: Sequence[FrameData]) -> bytes:
    """The first frame of a request's replies: its app-env frame (copied, at most 255 bytes)."""
    if len(frames) < 3 or len(frames[2]) > MAX_APP_ENV_BYTES:
        return UNKNOWN_APP_ENV
    return bytes(frames[2])


# -- meta ------------------------------------------------------------------------


def pack_meta(
    *,
    compression: int = Compression.NONE,
    created_ms: int = 0,
    sequence: int = 0,
    device: int = 0,
    version: int = META_VERSION,
    tag: int = META_TAG,
    little_endian: bool = False,
) -> bytes:
    """A meta frame (what a client sends); ``little_endian`` packs it the broken way."""
    layout = _META_LE if little_endian else _META_BE
    return layout.pack(tag, compression, version, device, created_ms, sequence)


def parse_meta(frame: bytes) -> Meta:
    """Decode a meta frame.

    Raises:
        ValueError: not 24 bytes, a wrong tag, an unknown version.
    """
    if len(frame) != META_BYTES:
        raise ValueError(f"meta frame has {len(frame)} bytes, not {META_BYTES}")
    (tag,) = struct.unpack_from(">H", frame)
    if tag == META_TAG:
        swapped = False
        _, method, version, device, created_ms, sequence = _META_BE.unpack(frame)
    elif tag == _META_TAG_SWAPPED:
        swapped = True
        _, method, version, device, created_ms, sequence = _META_LE.unpack(frame)
    else:
        raise ValueError(f"meta frame tag is {tag:#06x}, not {META_TAG:#06x}")
    if version != META_VERSION:
        raise ValueError(f"meta frame version is {version}, not {META_VERSION}")
    return Meta(method, version, device, created_ms, sequence, swapped)


# -- receiving -------------------------------------------------------------------


def _frame_count(count: int) -> str:
    """How many frames a message has, as a reason says it (the driver reads one past the limit)."""
    return f"more than {MAX_MESSAGE_FRAMES}" if count > MAX_MESSAGE_FRAMES else str(count)


def _text(frame: FrameData, what: str, limit: int, route: Route | None) -> str:
    """A frame as strict UTF-8 of at most ``limit`` bytes (checked before it is copied)."""
    try:
        return decode_text(frame, what, limit)
    except InvalidText as exc:
        raise MalformedMessage(f"{what} frame: {exc.reason}", route) from None


def _app_env(frame: FrameData, route: Route | None) -> str:
    """The app-env frame by the device's rule (module docstring), at most ``MAX_APP_ENV_BYTES``."""
    if len(frame) > MAX_APP_ENV_BYTES:
        raise MalformedMessage(
            f"app-env frame: app-env is {len(frame)} bytes, over the limit of {MAX_APP_ENV_BYTES}",
            route,
        )
    raw = bytes(frame)
    if not _APP_ENV_BYTES.fullmatch(raw) or b"-" not in raw:
        raise MalformedMessage(
            f"bad app-env {raw!r}: not printable ASCII with a '-' (logjam-tools' rule)", route
        )
    return raw.decode("ascii")


def _host(record: dict[str, Any]) -> tuple[str | None, str | None]:
    """The row's host from the body, and why a string host was dropped (module docstring)."""
    host = record.get("host")
    if not isinstance(host, str) or not host:
        return None, None
    try:
        return check_text(host, "host", MAX_HOST_BYTES), None
    except InvalidText as exc:
        return None, exc.reason


def _batch_id(app_env: str, topic: str, body: bytes, meta: Meta) -> str:
    """``app-env:device:sequence:created_ms:digest`` of one message.

    Sequence numbers are per agent process (every process numbers from 1 and
    starts again at 1 when it restarts; the Elixir agent even reuses a number),
    so app-env + sequence alone would drop other processes' messages as
    duplicates. A message resent by a client is byte for byte the same, so the
    digest of its topic and body, with its created_ms, tells a resend from a
    different message with the same number.

    The id is at most ``MAX_BATCH_ID_BYTES``: an app-env longer than the room
    left by the other fields is written as its first characters, ``~`` and a
    digest of the whole app-env. The device's rule lets an app-env hold ``~``
    itself, so one that does is written the same way (its characters, ``~``,
    digest): no app-env kept as it is has a ``~``, and two written with a
    digest differ in it. Real app-envs are a few dozen bytes without ``~``
    and are kept. An app-env may hold ``:`` too; the four fields after it
    have fixed forms, so the id still reads unambiguously from the right.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(topic.encode("utf-8"))
    digest.update(b"\0")
    digest.update(body)
    room = MAX_BATCH_ID_BYTES - _BATCH_ID_FIXED_BYTES
    name = app_env
    if len(name) > room or _SHORTENED in name:
        whole = hashlib.blake2b(app_env.encode("ascii"), digest_size=_APP_ENV_DIGEST_BYTES)
        keep = app_env[: room - 1 - 2 * _APP_ENV_DIGEST_BYTES]
        name = f"{keep}{_SHORTENED}{whole.hexdigest()}"
    return f"{name}:{meta.device}:{meta.sequence}:{meta.created_ms}:{digest.hexdigest()}"


def _snappy_declared(body: FrameData) -> int | None:
    """The output size a Snappy body declares in its varint preamble, or None if malformed."""
    length = 0
    for i in range(min(len(body), _SNAPPY_MAX_VARINT_BYTES)):
        byte = body[i]
        length |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return length
    return None


class LogjamReceiver:
    """Decodes the messages of one listener's sockets (no I/O, no state between messages).

    Frames may be ``bytes`` or views of ZeroMQ frames: a frame is copied only
    once its size has been checked.
    """

    def __init__(self, limits: LogjamLimits | None = None) -> None:
        self.limits = limits or LogjamLimits()

    def receive_router(self, frames: Sequence[FrameData]) -> DataMessage | Ping:
        """A message read from the ROUTER socket, routing id first.

        Raises:
            MalformedMessage: with the 400 to send when the message asked for a reply.
        """
        if len(frames) < 2:
            raise MalformedMessage(f"{len(frames)} frames: no routing id and message", None)
        # A routing id is at most 255 bytes (libzmq refuses longer ones).
        identity = bytes(frames[0])
        if len(frames[1]) == 0:
            route = Route(identity, reply=True, app_env=_reply_app_env(frames))
        else:
            route = Route(identity, reply=False)
        if len(frames) > MAX_MESSAGE_FRAMES:
            raise MalformedMessage(f"message has more than {MAX_MESSAGE_FRAMES} frames", route)
        if not route.reply:
            return self._data(frames[1:], route)
        rest = frames[2:]
        if rest and rest[0] == PING:
            return self._ping(rest, route)
        return self._data(rest, route)

    def receive_pull(self, frames: Sequence[FrameData]) -> DataMessage:
        """A message read from the PULL socket (async data only).

        Raises:
            MalformedMessage: with no reply (PULL has no way back).
        """
        return self._data(frames, None)

    def decode_size_bound(self, frames: Sequence[FrameData], *, router: bool) -> int:
        """At most how many bytes decoding this message reads and produces (nothing is decoded).

        That is the size of its frames plus, for a compressed body, the most
        it can decompress to: the declared size of a Snappy or LZ4 body,
        :data:`DEFLATE_MAX_RATIO` times a zlib or gzip body, never more than
        ``max_decompressed_bytes``. A message the decoder refuses before it
        decompresses (wrong frame count, a ping, a body over
        ``max_body_bytes``, an unknown method) counts its frames only. The
        driver decodes on the event loop only below a small bound.
        """
        total = sum(len(frame) for frame in frames)
        rest = frames
        if router:
            if len(frames) < 2 or len(frames) > MAX_MESSAGE_FRAMES:
                return total
            rest = frames[2:] if len(frames[1]) == 0 else frames[1:]
        if len(rest) != _DATA_FRAMES or rest[0] == PING:
            return total
        body, meta = rest[2], rest[3]
        if len(meta) != META_BYTES or len(body) > self.limits.max_body_bytes:
            return total
        return total + self._decompressed_bound(body, meta[_META_COMPRESSION_OFFSET])

    def _decompressed_bound(self, body: FrameData, method: int) -> int:
        """The most a body of ``method`` decompresses to before the decoder stops (none: 0)."""
        limit = self.limits.max_decompressed_bytes
        if method == Compression.ZLIB:
            return min(len(body) * DEFLATE_MAX_RATIO, limit)
        declared: int | None = None
        if method == Compression.SNAPPY:
            declared = _snappy_declared(body)
        elif method == Compression.LZ4 and len(body) >= _LZ4_PREFIX.size:
            (declared,) = _LZ4_PREFIX.unpack_from(body)
        # Both decoders refuse a declared size over the limit before they start.
        return declared if declared is not None and declared <= limit else 0

    def _meta(self, frame: FrameData, route: Route | None) -> Meta:
        if len(frame) != META_BYTES:
            raise MalformedMessage(
                f"bad meta: meta frame has {len(frame)} bytes, not {META_BYTES}", route
            )
        try:
            return parse_meta(bytes(frame))
        except ValueError as exc:
            raise MalformedMessage(f"bad meta: {exc}", route) from None

    def _ping(self, frames: Sequence[FrameData], route: Route) -> Ping:
        # logjam-tools answers a ping from its frame count and meta frame only.
        if len(frames) != _DATA_FRAMES:
            raise MalformedMessage(f"ping has {len(frames)} frames, not {_DATA_FRAMES}", route)
        meta = self._meta(frames[3], route)
        # Only logged, never stored: cut before it is copied, any bytes allowed.
        app_env = bytes(frames[1][:MAX_APP_ENV_BYTES]).decode("ascii", "replace")
        return Ping(app_env, meta, route)

    def _data(self, frames: Sequence[FrameData], route: Route | None) -> DataMessage:
        if len(frames) != _DATA_FRAMES:
            raise MalformedMessage(
                f"data message has {_frame_count(len(frames))} frames, not {_DATA_FRAMES}", route
            )
        if frames[0] == PING:
            raise MalformedMessage("ping without the empty request frame: nothing to answer", route)
        meta = self._meta(frames[3], route)
        app_env = _app_env(frames[0], route)
        topic = _text(frames[1], "topic", MAX_TOPIC_BYTES, route)
        if not topic.startswith(TOPIC_PREFIXES):
            raise MalformedMessage(
                f"bad topic {topic!r}: does not begin with one of {', '.join(TOPIC_PREFIXES)}",
                route,
            )
        body = self._body(frames[2], route)
        record = self._record(body, meta, route)
        host, host_dropped = _host(record)
        batch_id = _batch_id(app_env, topic, body, meta)
        try:
            check_text(batch_id, "batch id", MAX_BATCH_ID_BYTES)  # true by construction
        except InvalidText as exc:
            raise MalformedMessage(exc.reason, route) from None
        return DataMessage(app_env, topic, record, meta, batch_id, route, host, host_dropped)

    def _body(self, frame: FrameData, route: Route | None) -> bytes:
        """The body frame as bytes, refused before it is copied when over ``max_body_bytes``."""
        if len(frame) > self.limits.max_body_bytes:
            raise MalformedMessage(
                f"body of {len(frame)} bytes exceeds max_body_bytes={self.limits.max_body_bytes}",
                route,
            )
        return bytes(frame)

    def decompress(self, body: bytes, method: int, route: Route | None = None) -> bytes:
        """The body as JSON bytes, decompressed under the limits.

        Raises:
            MalformedMessage: an unknown method, or data that does not decompress.
        """
        if len(body) > self.limits.max_body_bytes:
            raise MalformedMessage(
                f"body of {len(body)} bytes exceeds max_body_bytes={self.limits.max_body_bytes}",
                route,
            )
        limit = self.limits.max_decompressed_bytes
        try:
            if method == Compression.NONE:
                if len(body) > limit:
                    raise compression.CompressionError(f"body exceeds {limit} bytes")
                return body
            if method == Compression.ZLIB:
                return compression.inflate(body, limit)
            if method == Compression.SNAPPY:
                return compression.snappy_decompress(body, limit)
            if method == Compression.LZ4:
                return compression.lz4_prefixed_decompress(body, limit)
        except compression.CompressionError as exc:
            name = Compression(method).name.lower()
            raise MalformedMessage(f"{name} body: {exc}", route) from None
        raise MalformedMessage(f"unknown compression method {method}", route)

    def _record(self, body: bytes, meta: Meta, route: Route | None) -> dict[str, Any]:
        data = self.decompress(body, meta.compression, route)
        # Counted at C speed before any object is built (module docstring).
        containers = data.count(b"{") + data.count(b"[")
        if containers > self.limits.max_json_containers:
            raise MalformedMessage(
                f"body holds {containers} JSON objects and arrays, over "
                f"max_json_containers={self.limits.max_json_containers}",
                route,
            )
        try:
            record = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            # ValueError covers JSONDecodeError and UnicodeDecodeError.
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise MalformedMessage(f"body is not JSON: {reason}", route) from None
        if not isinstance(record, dict):
            raise MalformedMessage(f"body is a JSON {type(record).__name__}, not an object", route)
        return record
