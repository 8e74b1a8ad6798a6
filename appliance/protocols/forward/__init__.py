"""Fluentd forward protocol v1, server side, as a sans-IO codec: the package's public names.

Split in modules the way h11 splits its connection: the codec itself
(:mod:`~appliance.protocols.forward.connection`: bytes in, events out; its
module docstring states the invariants), its values
(:mod:`~appliance.protocols.forward.events`), its states
(:mod:`~appliance.protocols.forward.state`), msgpack decoding
(:mod:`~appliance.protocols.forward.decoding`), a request's head
(:mod:`~appliance.protocols.forward.head`), the ``compressed`` decoders
(:mod:`~appliance.protocols.forward.decompress`), the JSON form's framer
(:mod:`~appliance.protocols.forward.json_framer`), the handshake
(:mod:`~appliance.protocols.forward.handshake`) and the PackedForward fast
path (:mod:`~appliance.protocols.forward.fast`). The names below are those
callers import from ``appliance.protocols.forward``.
"""

from __future__ import annotations

from appliance.protocols.forward.connection import (
    FAST_PATH_PAUSE_REQUESTS,
    MAX_PING_BYTES,
    ForwardServerConnection,
)
from appliance.protocols.forward.decoding import DECODE_MEMORY_FACTOR
from appliance.protocols.forward.decoding import _decode_options as _decode_options
from appliance.protocols.forward.decompress import (
    ZSTD_MAX_EXPANSION,
    gunzip_members,
    unzstd_frames,
)
from appliance.protocols.forward.events import (
    MAX_BINARY_CHUNK_BYTES,
    Chunk,
    DecodeLimits,
    EventsReceived,
    EventTime,
    ForwardEvent,
    ForwardLimits,
    Heartbeat,
    PingReceived,
)
from appliance.protocols.forward.head import REQUEST_HEAD_BYTES, packed_request_min_bytes
from appliance.protocols.forward.head import request_kind as request_kind
from appliance.protocols.forward.state import ForwardState

__all__ = [
    "DECODE_MEMORY_FACTOR",
    "FAST_PATH_PAUSE_REQUESTS",
    "MAX_BINARY_CHUNK_BYTES",
    "MAX_PING_BYTES",
    "REQUEST_HEAD_BYTES",
    "ZSTD_MAX_EXPANSION",
    "Chunk",
    "DecodeLimits",
    "EventTime",
    "EventsReceived",
    "ForwardEvent",
    "ForwardLimits",
    "ForwardServerConnection",
    "ForwardState",
    "Heartbeat",
    "PingReceived",
    "gunzip_members",
    "packed_request_min_bytes",
    "unzstd_frames",
]
