"""The Lumberjack connection's states and the moves between them, as data."""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["LumberjackState"]


class LumberjackState(enum.Enum):
    """Where a connection is."""

    #: Nothing yet: the first frame's version byte fixes v1 or v2.
    IDLE = "idle"
    #: Between windows: the next frame must be ``W``.
    AWAITING_WINDOW = "awaiting-window"
    #: Inside a window: data frames until the announced count.
    IN_WINDOW = "in-window"
    CLOSED = "closed"


_TRANSITIONS: Final[dict[LumberjackState, frozenset[LumberjackState]]] = {
    LumberjackState.IDLE: frozenset({LumberjackState.IN_WINDOW, LumberjackState.AWAITING_WINDOW,
                                     LumberjackState.CLOSED}),
    LumberjackState.AWAITING_WINDOW: frozenset({LumberjackState.IN_WINDOW,
                                                LumberjackState.AWAITING_WINDOW,
                                                LumberjackState.CLOSED}),
    LumberjackState.IN_WINDOW: frozenset({LumberjackState.AWAITING_WINDOW,
                                          LumberjackState.CLOSED}),
    LumberjackState.CLOSED: frozenset(),
}  # fmt: skip
