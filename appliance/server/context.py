"""What every connection handler shares within one running service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio

from appliance.metrics import NULL_METRICS, Metrics
from appliance.server.decode_budget import DecodeBudget
from appliance.server.lifecycle import Lifecycle
from appliance.server.revocation import OpenConnections
from auth.policy import CredentialStore
from auth.ratelimit import CountStore, FailureLimiter, MemoryCounts

if TYPE_CHECKING:
    # A type only: the listener registry imports this module, and the
    # supervisor the registry; the lake loads in the service alone
    # (docs/performance.md#idle-memory).
    from appliance.lake.writer import LakeWriter
    from appliance.server.spread import WorkerShare

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
    #: The forward handshakes' failure counts (address, pair, user): every
    #: forward listener of the process shares them, and the service puts them
    #: in the node's shared table so that every worker does (auth/failure_table.py).
    guess_counts: CountStore = field(default_factory=MemoryCounts)
    auth_threads: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(AUTH_THREADS)
    )
    #: The service's metrics (none counted by default: tests, tools).
    metrics: Metrics = NULL_METRICS
    #: Every listener's open connections and their credentials, checked again
    #: every ``RECHECK_INTERVAL_SECONDS`` and at once on a reload (revocation.py).
    connections: OpenConnections = field(default_factory=OpenConnections)
    #: The memory every decode in progress may claim together, one for the
    #: process (``decode_budget_bytes``; appliance/server/decode_budget.py).
    decode_budget: DecodeBudget = field(default_factory=DecodeBudget)
    #: A worker's listening sockets and connection counts, handed by its
    #: supervisor (appliance/server/spread.py); None in a single process.
    share: WorkerShare | None = None
