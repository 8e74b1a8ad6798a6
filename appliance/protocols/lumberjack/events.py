"""The Lumberjack codec's values: its limits and the windows it returns.

What :class:`~appliance.protocols.lumberjack.connection.LumberjackServerConnection`
is configured with (:class:`LumberjackLimits`) and what it hands the driver
(:data:`LumberjackEvent`), with the bounds on a window's memory
(appliance/protocols/lumberjack/connection.py, "Work and memory").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from appliance import defaults
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "EVENT_OVERHEAD_BYTES",
    "WINDOW_MEMORY_FACTOR",
    "LumberjackEvent",
    "LumberjackLimits",
    "Window",
]

#: Bytes an event held in an unfinished window costs beyond its strings' characters,
#: at most: five list slots (40), its sequence and time (two ints, 64), and the
#: headers of its text, tag and host ``str`` (up to 80 each), 64-bit CPython.
EVENT_OVERHEAD_BYTES: Final = 352
#: Bytes of memory per byte of a window's data frames, at most, beyond the
#: per-event overhead: its text at four bytes a character (a ``str`` holding one
#: character past U+FFFF), and the tag and host copied out of it at four more.
WINDOW_MEMORY_FACTOR: Final = 8


@dataclass(frozen=True, slots=True)
class LumberjackLimits:
    """Limits that guard one connection (all configurable per listener)."""

    max_window_size: int = defaults.LUMBERJACK_MAX_WINDOW_SIZE
    max_frame_bytes: int = defaults.LUMBERJACK_MAX_FRAME_BYTES
    max_decompressed_bytes: int = defaults.LUMBERJACK_MAX_DECOMPRESSED_BYTES
    max_window_bytes: int = defaults.LUMBERJACK_MAX_WINDOW_BYTES

    def __post_init__(self) -> None:
        require_at_least_one(
            self, "max_window_size", "max_frame_bytes", "max_decompressed_bytes",
            "max_window_bytes",
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Window:
    """A complete window: its events, in order, and what its ack carries.

    Per event (same index in each list): its sequence, its record's JSON
    text, the tag and host taken from it (None: none, or not storable) and
    its ``@timestamp`` in epoch nanoseconds (None: the receive time).
    """

    version: int
    sequences: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tags: list[str | None] = field(default_factory=list)
    hosts: list[str | None] = field(default_factory=list)
    times_ns: list[int | None] = field(default_factory=list)
    #: Acks the window takes: more than one only for a run of ``W 0`` frames.
    acks: int = 1
    #: Bytes of its data frames as parsed.
    nbytes: int = 0
    #: Events whose tag field held a string that cannot be stored (too long).
    invalid_tags: int = 0
    #: Events whose host field held a string that cannot be stored (too long).
    invalid_hosts: int = 0

    @property
    def highest_sequence(self) -> int | None:
        """The sequence the ack carries: the highest of the window, None when empty."""
        return max(self.sequences) if self.sequences else None

    @property
    def last_sequence(self) -> int | None:
        """The sequence of the window's last data frame, None for an empty window."""
        return self.sequences[-1] if self.sequences else None

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records, parsed again from :attr:`texts` (for tests and tools, not the hot path)."""
        return [orjson.loads(text) for text in self.texts]


#: What :meth:`LumberjackServerConnection.receive_data` returns: windows, and a
#: final violation when the input broke the protocol.
LumberjackEvent = Window | ProtocolViolation
