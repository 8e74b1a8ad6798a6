"""What every connection handler shares within one running service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from appliance.lake.writer import LakeWriter
from appliance.metrics import NULL_METRICS, Metrics
from appliance.server.lifecycle import Lifecycle
from auth.policy import CredentialStore
from auth.ratelimit import FailureLimiter

__all__ = ["AUTH_THREADS", "ServiceContext"]

#: Worker threads that may query the credential database at once.
AUTH_THREADS: Final = 4


@dataclass(slots=True)
class ServiceContext:
    """The writer, the shutdown state and the credential checks of one service."""

    writer: LakeWriter
    lifecycle: Lifecycle
    #: The auth database, when any listener needs it.
    credentials: CredentialStore | None = None
    #: Bearer-token look-up (WebSocket listeners): token -> grant, or None.
    tokens: Callable[[str], Any] | None = None
    #: Failed authentications per source address, for listeners without a
    #: limiter of their own (each forward listener has its own settings).
    failure_limiter: FailureLimiter = field(default_factory=FailureLimiter)
    auth_threads: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(AUTH_THREADS)
    )
    #: The service's metrics (none counted by default: tests, tools).
    metrics: Metrics = NULL_METRICS
