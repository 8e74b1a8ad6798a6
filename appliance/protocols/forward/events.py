"""The forward codec's values: its limits and the frozen events it returns.

What :class:`~appliance.protocols.forward.connection.ForwardServerConnection`
is configured with (:class:`ForwardLimits`, :class:`DecodeLimits`) and what
it hands the driver (:data:`ForwardEvent`); the rules they keep are the
codec's (appliance/protocols/forward/connection.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from appliance import defaults
from appliance.blocks.text import MAX_BATCH_ID_BYTES
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.forward.handshake import Ping
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "MAX_BINARY_CHUNK_BYTES",
    "Chunk",
    "DecodeLimits",
    "EventTime",
    "EventsReceived",
    "ForwardEvent",
    "ForwardLimits",
    "Heartbeat",
    "PingReceived",
]

#: A chunk that is not valid UTF-8 is stored as ``"hex:" + hex``; this many
#: bytes of it fit ``MAX_BATCH_ID_BYTES``.
_CHUNK_HEX_PREFIX: Final = "hex:"
MAX_BINARY_CHUNK_BYTES: Final = (MAX_BATCH_ID_BYTES - len(_CHUNK_HEX_PREFIX)) // 2

_NS_PER_SECOND: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The fixed limits of decoding one request's records (not configurable: tests shrink them).

    Checked while decoding (appliance/protocols/forward/connection.py, "Records"): a record over
    one of them refuses its request at the first excess.
    """

    #: Values one record may hold (the elements of its maps and arrays).
    max_record_values: int = defaults.RECORD_MAX_VALUES
    #: Bytes of one record: its msgpack, and its JSON text as stored (UTF-8).
    max_record_bytes: int = defaults.RECORD_MAX_BYTES
    #: Entries streams larger than this are decoded a slice at a time...
    slice_bytes: int = defaults.FORWARD_SLICE_BYTES
    #: ...unless decoding them whole takes no more than their reported cost
    #: (:func:`~appliance.protocols.forward.fast.decodes_whole`), up to this
    #: many bytes if given (tests give ``slice_bytes``: always slices).
    max_whole_bytes: int | None = None

    def __post_init__(self) -> None:
        require_at_least_one(self, "max_record_values", "max_record_bytes", "slice_bytes")
        # A stream decoded whole holds at most a value a byte and records no
        # larger than itself: the limits must not be reachable there, or the
        # fast and general paths (which count only sliced streams) could
        # disagree.
        if self.slice_bytes > self.max_record_values:
            raise ValueError("slice_bytes must be at most max_record_values")
        if self.slice_bytes > self.max_record_bytes:
            raise ValueError("slice_bytes must be at most max_record_bytes")


@dataclass(frozen=True, slots=True)
class ForwardLimits:
    """Limits that guard one connection against abuse (all configurable)."""

    max_request_bytes: int = defaults.FORWARD_MAX_REQUEST_BYTES
    max_decompressed_bytes: int = defaults.FORWARD_MAX_DECOMPRESSED_BYTES
    max_events_per_request: int = defaults.FORWARD_MAX_EVENTS_PER_REQUEST

    def __post_init__(self) -> None:
        require_at_least_one(
            self, "max_request_bytes", "max_decompressed_bytes", "max_events_per_request"
        )


class EventTime(int):
    """Fluentd EventTime (ext type 0): an ``int`` of epoch nanoseconds.

    An ``int`` subclass rather than a dataclass because one is built per event
    from the msgpack ext hook, on the hot path; being an ``int`` it also
    serialises inside a record as its nanoseconds (docs/table.md).
    """

    __slots__ = ()

    def __new__(cls, seconds: int, nanoseconds: int = 0) -> EventTime:
        return super().__new__(cls, seconds * _NS_PER_SECOND + nanoseconds)

    @property
    def seconds(self) -> int:
        """Whole seconds since the epoch."""
        return int(self) // _NS_PER_SECOND

    @property
    def nanoseconds(self) -> int:
        """The nanoseconds within the second."""
        return int(self) % _NS_PER_SECOND

    def to_ns(self) -> int:
        """The instant in epoch nanoseconds."""
        return int(self)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The ``chunk`` option exactly as the client sent it.

    The ack must echo the same bytes with the same msgpack type (spec:
    "Response"), so both are kept. The codec only makes chunks of 1 to
    ``MAX_BATCH_ID_BYTES`` bytes whose :meth:`text` fits that limit too.
    """

    raw: bytes
    kind: Literal["str", "bin"] = "str"

    def text(self) -> str:
        """The chunk id as valid UTF-8 text, for the ``batch_id`` column and for logs.

        The chunk decoded as UTF-8, or ``"hex:"`` and its lowercase hex when
        it is not valid UTF-8 (appliance/protocols/forward/connection.py, "Strict strings").
        """
        try:
            return self.raw.decode("utf-8")
        except UnicodeDecodeError:
            return _CHUNK_HEX_PREFIX + self.raw.hex()


@dataclass(frozen=True, slots=True)
class EventsReceived:
    """A request that carried events (any of the four carrier modes).

    ``times_ns[i]`` is the epoch-nanosecond time of ``records[i]``, or
    ``None`` when the client sent no usable time (nil or 0: in_forward then
    uses the time of receipt, and so does the appliance). ``dropped`` counts
    invalid events that were left out, by reason.
    """

    tag: str
    mode: Literal["message", "forward", "packed", "compressed"]
    times_ns: list[int | None]
    records: list[dict[Any, Any]]
    chunk: Chunk | None
    dropped: dict[str, int] = field(default_factory=dict)
    #: True when the request came in the JSON form (the ack must be JSON too).
    json: bool = False
    #: The records' JSON texts, when the PackedForward fast path
    #: (:mod:`appliance.protocols.forward.fast`) rendered them while checking
    #: them: equal to ``records_json(records)``. None: the rows layer renders them.
    texts: list[str] | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A msgpack ``nil`` sent by the client to check the connection."""


@dataclass(frozen=True, slots=True)
class PingReceived:
    """The client's PING (spec "PING"): check it, then :meth:`finish_handshake`."""

    ping: Ping


ForwardEvent = EventsReceived | Heartbeat | PingReceived | ProtocolViolation
