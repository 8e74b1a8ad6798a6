"""Log Courier, server side, as a sans-IO codec: the package's public names.

Split in modules the way h11 splits its connection: the codec itself
(:mod:`~appliance.protocols.courier.connection`: bytes in, events out; its
module docstring states the protocol and the invariants), its values
(:mod:`~appliance.protocols.courier.events`), its states
(:mod:`~appliance.protocols.courier.state`), the framing
(:mod:`~appliance.protocols.courier.wire`) and the rows of a payload in
progress (:mod:`~appliance.protocols.courier.payload`). The names below are
those callers import from ``appliance.protocols.courier``.
"""

from __future__ import annotations

from appliance.protocols.courier.connection import CourierServerConnection
from appliance.protocols.courier.events import (
    NONCE_BYTES,
    CourierEvent,
    CourierLimits,
    Hello,
    PayloadReceived,
    Ping,
    UnknownMessage,
    Unsupported,
)
from appliance.protocols.courier.payload import EVENT_OVERHEAD_BYTES
from appliance.protocols.courier.state import CourierState
from appliance.protocols.courier.wire import (
    FLAG_SUPPORTS_EVNT,
    MAX_COMPACT_HELLO_BYTES,
    MAX_HELLO_BYTES,
    SERVER_ID,
    STREAMED_LENGTH,
    encode_message,
)

__all__ = [
    "EVENT_OVERHEAD_BYTES",
    "FLAG_SUPPORTS_EVNT",
    "MAX_COMPACT_HELLO_BYTES",
    "MAX_HELLO_BYTES",
    "NONCE_BYTES",
    "SERVER_ID",
    "STREAMED_LENGTH",
    "CourierEvent",
    "CourierLimits",
    "CourierServerConnection",
    "CourierState",
    "Hello",
    "PayloadReceived",
    "Ping",
    "UnknownMessage",
    "Unsupported",
    "encode_message",
]
