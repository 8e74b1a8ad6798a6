"""The Log Courier codec's values: its limits and the frozen events it returns.

What :class:`~appliance.protocols.courier.connection.CourierServerConnection`
is configured with (:class:`CourierLimits`) and what it hands the driver
(:data:`CourierEvent`); the rules they keep are the codec's
(appliance/protocols/courier/connection.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from appliance import defaults
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "NONCE_BYTES",
    "CourierEvent",
    "CourierLimits",
    "Hello",
    "PayloadReceived",
    "Ping",
    "UnknownMessage",
    "Unsupported",
]

#: Bytes of the nonce that opens a JDAT or EVNT body and every ACKN.
NONCE_BYTES: Final = 16
#: Known client ids, as the Go and Ruby implementations name them.
CLIENT_NAMES: Final = {
    b"LCOR": "Log Courier",
    b"LCVR": "Log Carver",
    b"RYLC": "Ruby Log Courier",
}


@dataclass(frozen=True, slots=True)
class CourierLimits:
    """Limits that guard one connection against abuse (all configurable)."""

    max_payload_bytes: int = defaults.COURIER_MAX_PAYLOAD_BYTES
    max_decompressed_bytes: int = defaults.COURIER_MAX_DECOMPRESSED_BYTES
    max_event_bytes: int = defaults.COURIER_MAX_EVENT_BYTES
    max_events: int = defaults.COURIER_MAX_EVENTS
    max_payload_memory_bytes: int = defaults.COURIER_MAX_PAYLOAD_MEMORY_BYTES

    def __post_init__(self) -> None:
        require_at_least_one(
            self,
            "max_decompressed_bytes",
            "max_event_bytes",
            "max_events",
            "max_payload_memory_bytes",
        )
        if self.max_payload_bytes <= NONCE_BYTES:
            raise ValueError(f"max_payload_bytes must be more than {NONCE_BYTES}")


@dataclass(frozen=True, slots=True)
class Hello:
    """A client's HELO: protocol flags, version and four-byte client id.

    Two layouts exist: the Go one (32 bytes: flags[4], u32 major, minor,
    patch, client[4], reserved; the Ruby client sends its first 20 bytes) and
    the compact one of Ruby v2.7.0/v2.7.1 (8 bytes: flags, major, minor,
    patch as single bytes, client[4]). Short bodies are zero-padded, as the
    Go receiver does.
    """

    flags: bytes
    version: tuple[int, int, int]
    client: bytes

    def __post_init__(self) -> None:
        if len(self.flags) != 4 or len(self.client) != 4:
            raise ValueError("HELO flags and client id are 4 bytes each")

    @property
    def client_name(self) -> str:
        """A readable name for logs ("Log Courier v2.10.0", "Unknown")."""
        if self.client[:1] == b"\x00":
            name = "Unknown"
        else:
            # Any four bytes may come: printable ASCII as is, the rest escaped.
            printable = "".join(chr(b) if 0x20 < b < 0x7F else f"\\x{b:02x}" for b in self.client)
            name = CLIENT_NAMES.get(self.client, printable)
        if self.version == (0, 0, 0):
            return name
        return f"{name} v{'.'.join(map(str, self.version))}"


@dataclass(frozen=True, slots=True)
class Ping:
    """A client's PING: answer with :meth:`CourierServerConnection.pong_bytes`."""


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The client answered ``????``: it did not understand something we sent."""


@dataclass(frozen=True, slots=True)
class UnknownMessage:
    """A message type this server does not know; its body has been skipped.

    Answer with :meth:`CourierServerConnection.unknown_bytes` (``????``).
    """

    kind: bytes
    length: int


@dataclass(frozen=True, slots=True)
class PayloadReceived:
    """A complete JDAT or EVNT payload, already in the shape of rows.

    One entry per event, in order, in four parallel lists: ``records`` is the
    event's JSON record text (valid UTF-8); ``types`` its ``type`` and
    ``hosts`` its host name when they are usable strings (connection.py),
    else None; ``times_ns`` its ``@timestamp`` in epoch nanoseconds within
    int64, else None (the receive time). An event that is not a JSON object
    is kept as ``{"message": <raw>}`` and counted in ``not_json``; a ``type``
    or host string that is not valid UTF-8 or too long is counted in
    ``invalid_types`` / ``invalid_hosts``.
    """

    nonce: bytes
    kind: Literal["JDAT", "EVNT"]
    records: list[str]
    types: list[str | None]
    hosts: list[str | None]
    times_ns: list[int | None]
    not_json: int = 0
    invalid_types: int = 0
    invalid_hosts: int = 0
    #: What the rows hold in memory, in bytes, as the codec counts it.
    memory_bytes: int = field(default=0, compare=False)
    #: A digest of the decompressed payload (empty when not computed).
    content_digest: bytes = field(default=b"", compare=False)

    def __post_init__(self) -> None:
        if len(self.nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes, not {len(self.nonce)}")
        count = len(self.records)
        if not len(self.types) == len(self.hosts) == len(self.times_ns) == count:
            raise ValueError("records, types, hosts and times_ns differ in length")

    @property
    def count(self) -> int:
        """How many events the payload carried: what its final ACKN acknowledges."""
        return len(self.records)

    @property
    def nonce_hex(self) -> str:
        """The nonce as lowercase hex: the name in logs."""
        return self.nonce.hex()

    @property
    def batch_id(self) -> str:
        """The nonce in hex, then ``:`` and the payload's content digest in hex.

        Log Courier's Go client before v2.6.4 repeats its nonce sequence on
        every run: with the nonce alone, a restarted client's new payload
        could be taken for a resend of an old one and acked unwritten. A
        true resend carries the same events (the appliance never
        acknowledges part of a payload), so it has the same digest.
        """
        if not self.content_digest:
            return self.nonce_hex
        return f"{self.nonce_hex}:{self.content_digest.hex()}"


CourierEvent = Hello | Ping | Unsupported | UnknownMessage | PayloadReceived | ProtocolViolation
