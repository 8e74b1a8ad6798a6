"""Lumberjack v1 and v2 (Beats), server side, as a sans-IO codec: the package's public names.

Split in modules the way h11 splits its connection: the codec itself
(:mod:`~appliance.protocols.lumberjack.connection`: bytes in, windows out;
its module docstring states the protocol, the invariants and the limits),
its values (:mod:`~appliance.protocols.lumberjack.events`), its states
(:mod:`~appliance.protocols.lumberjack.state`), the frame layout
(:mod:`~appliance.protocols.lumberjack.frames`) and a ``C`` frame's budget
(:mod:`~appliance.protocols.lumberjack.budget`). The names below are those
callers import from ``appliance.protocols.lumberjack``.
"""

from __future__ import annotations

from appliance.protocols.lumberjack.budget import (
    C_FRAME_BASE_ITEMS,
    C_FRAME_ITEMS_PER_BYTE,
    MAX_COMPRESSION_DEPTH,
    MAX_WINDOWS_PER_C_FRAME,
    NESTED_C_FRAME_ITEMS,
)
from appliance.protocols.lumberjack.connection import LumberjackServerConnection
from appliance.protocols.lumberjack.events import (
    EVENT_OVERHEAD_BYTES,
    WINDOW_MEMORY_FACTOR,
    LumberjackEvent,
    LumberjackLimits,
    Window,
)
from appliance.protocols.lumberjack.state import LumberjackState

__all__ = [
    "C_FRAME_BASE_ITEMS",
    "C_FRAME_ITEMS_PER_BYTE",
    "EVENT_OVERHEAD_BYTES",
    "MAX_COMPRESSION_DEPTH",
    "MAX_WINDOWS_PER_C_FRAME",
    "NESTED_C_FRAME_ITEMS",
    "WINDOW_MEMORY_FACTOR",
    "LumberjackEvent",
    "LumberjackLimits",
    "LumberjackServerConnection",
    "LumberjackState",
    "Window",
]
