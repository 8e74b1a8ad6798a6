"""The Log Courier connection's states and the moves between them, and a message's phases."""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["CourierState"]


class CourierState(enum.Enum):
    """Where a connection is. Transitions: ``_TRANSITIONS`` below."""

    #: Nothing known received yet: a HELO, or (a client older than the
    #: handshake) a payload or PING opens the connection.
    IDLE = "idle"
    #: Open: payloads and PINGs. A second HELO is an error.
    OPEN = "open"
    CLOSED = "closed"


#: The state machine as data: the states each state may move to.
_TRANSITIONS: Final[dict[CourierState, frozenset[CourierState]]] = {
    CourierState.IDLE: frozenset({CourierState.OPEN, CourierState.CLOSED}),
    CourierState.OPEN: frozenset({CourierState.CLOSED}),
    CourierState.CLOSED: frozenset(),
}


class _Phase(enum.Enum):
    """What the bytes being received belong to (inside the connection's state)."""

    HEADER = "header"  # type and length, 8 bytes
    HELLO = "hello"  # a HELO body, up to MAX_HELLO_BYTES
    NONCE = "nonce"  # the 16 bytes opening a payload
    INFLATE = "inflate"  # a payload's zlib stream
    TRAILER = "trailer"  # JDAT bytes after its zlib stream ended: skipped
    SKIP = "skip"  # an unknown message's body: skipped
