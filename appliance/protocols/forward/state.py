"""The forward connection's states and the moves between them, as data."""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["ForwardState"]


class ForwardState(enum.Enum):
    """Where a connection is. Transitions: ``_TRANSITIONS`` below."""

    #: Nothing received yet: the first byte picks msgpack or JSON.
    IDLE = "idle"
    #: HELO sent (security on): the first request must be a PING.
    AWAITING_PING = "awaiting-ping"
    #: PING received: bytes are held until the verdict.
    AUTHENTICATING = "authenticating"
    TRANSPORT_MSGPACK = "transport-msgpack"
    TRANSPORT_JSON = "transport-json"
    CLOSED = "closed"


#: The state machine as data: the states each state may move to.
_TRANSITIONS: Final[dict[ForwardState, frozenset[ForwardState]]] = {
    ForwardState.IDLE: frozenset(
        {ForwardState.TRANSPORT_MSGPACK, ForwardState.TRANSPORT_JSON, ForwardState.CLOSED}
    ),
    ForwardState.AWAITING_PING: frozenset({ForwardState.AUTHENTICATING, ForwardState.CLOSED}),
    ForwardState.AUTHENTICATING: frozenset({ForwardState.TRANSPORT_MSGPACK, ForwardState.CLOSED}),
    ForwardState.TRANSPORT_MSGPACK: frozenset({ForwardState.CLOSED}),
    ForwardState.TRANSPORT_JSON: frozenset({ForwardState.CLOSED}),
    ForwardState.CLOSED: frozenset(),
}
#: The states before the PONG, where :data:`MAX_PING_BYTES` is the limit.
_BEFORE_PONG: Final = frozenset({ForwardState.AWAITING_PING, ForwardState.AUTHENTICATING})
