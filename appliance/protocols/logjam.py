"""The Logjam producer protocol, server side, as a sans-IO codec.

The seed spec is ``shared/specs/logjam-producer-protocol.md``; what the real
device and agents do, where this module follows them, and the sources cited
for each rule are in ``docs/logjam.md``. Messages arrive as lists of ZeroMQ
frames; the driver owns the sockets and hands every message to
:meth:`LogjamReceiver.receive_router` or :meth:`LogjamReceiver.receive_pull`.

Frames (after the ROUTER's routing-id frame)::

    async data   [app-env][topic][body][meta]
    request      [""][app-env][topic][body][meta]      -> 202 Accepted | 400 Bad Request
    ping         [""]["ping"][app-env][body][meta]      -> 200 OK + fqdn | 400 Bad Request

Replies, as logjam-tools' device builds them (``src/logjam-device.c``
``read_router_message_and_forward``): the routing id, the empty delimiter,
then the status (and the fqdn for a ping). A DEALER therefore reads
``["", "202 Accepted"]``, which is what the Ruby, Elixir and Go agents check.

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
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from appliance.protocols import compression
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "ACCEPTED",
    "BAD_REQUEST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "MAX_APP_ENV_BYTES",
    "MAX_TOPIC_BYTES",
    "META_BYTES",
    "META_TAG",
    "META_VERSION",
    "PING",
    "PONG",
    "Compression",
    "DataMessage",
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

#: Largest body frame accepted, as sent (compressed), in bytes.
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
#: Largest body after decompression, in bytes (logjam-tools gives up at 32 MiB:
#: ``max_buffer_size`` in src/logjam-util.c).
DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 32 * 1024 * 1024
#: Longest app-env frame, in bytes.
MAX_APP_ENV_BYTES: Final = 255
#: Longest topic frame, in bytes.
MAX_TOPIC_BYTES: Final = 255
#: Size of the meta frame.
META_BYTES: Final = 24
META_TAG: Final = 0xCABD
#: The tag as a little-endian writer packs it.
_META_TAG_SWAPPED: Final = 0xBDCA
META_VERSION: Final = 1

_META_BE: Final = struct.Struct(">HBBIQQ")
_META_LE: Final = struct.Struct("<HBBIQQ")
assert _META_BE.size == META_BYTES

#: Reply status frames (logjam-tools' device; the spec's ABNF for the pong).
ACCEPTED: Final = b"202 Accepted"
BAD_REQUEST: Final = b"400 Bad Request"
PONG: Final = b"200 OK"
#: The app-env frame of a ping.
PING: Final = b"ping"
_DELIMITER: Final = b""
#: Frames of a data message (app-env, topic, body, meta).
_DATA_FRAMES: Final = 4

#: app-env: an application, "-", an environment (spec ABNF; digits accepted
#: because real application names carry them).
_APP_ENV: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]*-[A-Za-z][A-Za-z0-9_]*")
#: Topics the spec lists; segments may carry digits (real app names do).
_TOPIC: Final = re.compile(
    r"(?:logs|javascript|events)(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)*"
    r"|frontend\.page|frontend\.ajax|mobile"
)


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

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES

    def __post_init__(self) -> None:
        require_at_least_one(self, "max_body_bytes", "max_decompressed_bytes")


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
    """Where a ROUTER message came from, and whether it wants a reply."""

    #: The ROUTER's routing id of the peer.
    identity: bytes
    #: The peer marked the message with an empty frame (request or ping).
    reply: bool


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
    return [route.identity, _DELIMITER, *frames]


def accepted_frames(route: Route) -> list[bytes]:
    """``[id][""]["202 Accepted"]``: the request is committed."""
    return _routed(route, ACCEPTED)


def bad_request_frames(route: Route) -> list[bytes]:
    """``[id][""]["400 Bad Request"]``: the request or ping is refused."""
    return _routed(route, BAD_REQUEST)


def pong_frames(route: Route, fqdn: str) -> list[bytes]:
    """``[id][""]["200 OK"][fqdn]``: the answer to a ping."""
    return _routed(route, PONG, fqdn.encode("utf-8"))


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


def _text(frame: bytes, what: str, limit: int, route: Route | None) -> str:
    if len(frame) > limit:
        raise MalformedMessage(f"{what} frame longer than {limit} bytes", route)
    try:
        return frame.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedMessage(f"{what} frame is not ASCII", route) from None


def _batch_id(app_env: str, topic: str, body: bytes, meta: Meta) -> str:
    """``app-env:device:sequence:created_ms:digest`` of one message.

    Sequence numbers are per agent process (every process numbers from 1 and
    starts again at 1 when it restarts; the Elixir agent even reuses a number),
    so app-env + sequence alone would drop other processes' messages as
    duplicates. A message resent by a client is byte for byte the same, so the
    digest of its topic and body, with its created_ms, tells a resend from a
    different message with the same number.
    """
    digest = hashlib.blake2b(topic.encode("ascii") + b"\0" + body, digest_size=8).hexdigest()
    return f"{app_env}:{meta.device}:{meta.sequence}:{meta.created_ms}:{digest}"


class LogjamReceiver:
    """Decodes the messages of one listener's sockets (no I/O, no state between messages)."""

    def __init__(self, limits: LogjamLimits | None = None) -> None:
        self.limits = limits or LogjamLimits()

    def receive_router(self, frames: Sequence[bytes]) -> DataMessage | Ping:
        """A message read from the ROUTER socket, routing id first.

        Raises:
            MalformedMessage: with the 400 to send when the message asked for a reply.
        """
        if len(frames) < 2:
            raise MalformedMessage(f"{len(frames)} frames: no routing id and message", None)
        identity = bytes(frames[0])
        if len(frames[1]) != 0:
            return self._data(frames[1:], Route(identity, reply=False))
        route = Route(identity, reply=True)
        rest = frames[2:]
        if rest and bytes(rest[0]) == PING:
            return self._ping(rest, route)
        return self._data(rest, route)

    def receive_pull(self, frames: Sequence[bytes]) -> DataMessage:
        """A message read from the PULL socket (async data only).

        Raises:
            MalformedMessage: with no reply (PULL has no way back).
        """
        return self._data(frames, None)

    def _meta(self, frame: bytes, route: Route | None) -> Meta:
        try:
            return parse_meta(bytes(frame))
        except ValueError as exc:
            raise MalformedMessage(f"bad meta: {exc}", route) from None

    def _ping(self, frames: Sequence[bytes], route: Route) -> Ping:
        # logjam-tools answers a ping from its frame count and meta frame only.
        if len(frames) != _DATA_FRAMES:
            raise MalformedMessage(f"ping has {len(frames)} frames, not {_DATA_FRAMES}", route)
        meta = self._meta(frames[3], route)
        app_env = bytes(frames[1]).decode("ascii", "replace")[:MAX_APP_ENV_BYTES]
        return Ping(app_env, meta, route)

    def _data(self, frames: Sequence[bytes], route: Route | None) -> DataMessage:
        if len(frames) != _DATA_FRAMES:
            raise MalformedMessage(
                f"data message has {len(frames)} frames, not {_DATA_FRAMES}", route
            )
        if bytes(frames[0]) == PING:
            raise MalformedMessage("ping without the empty request frame: nothing to answer", route)
        meta = self._meta(frames[3], route)
        app_env = _text(bytes(frames[0]), "app-env", MAX_APP_ENV_BYTES, route)
        if not _APP_ENV.fullmatch(app_env):
            raise MalformedMessage(f"bad app-env {app_env!r}", route)
        topic = _text(bytes(frames[1]), "topic", MAX_TOPIC_BYTES, route)
        if not _TOPIC.fullmatch(topic):
            raise MalformedMessage(f"bad topic {topic!r}", route)
        body = bytes(frames[2])
        record = self._record(body, meta, route)
        batch_id = _batch_id(app_env, topic, body, meta)
        return DataMessage(app_env, topic, record, meta, batch_id, route)

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
        try:
            record = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            # ValueError covers JSONDecodeError and UnicodeDecodeError.
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise MalformedMessage(f"body is not JSON: {reason}", route) from None
        if not isinstance(record, dict):
            raise MalformedMessage(f"body is a JSON {type(record).__name__}, not an object", route)
        return record
