"""Brute-force protection: failed authentications from one address back off exponentially.

After ``free_failures`` failures within ``window_seconds``, an address is
refused for ``base_backoff_seconds``, doubling with each further failure up
to ``max_backoff_seconds``. A success clears the address. Memory is bounded:
at most ``max_addresses`` addresses are tracked, the stalest dropped first.

An attempt counts as a failure from the moment it starts (:meth:`begin`),
before the credential look-up, so attempts made in parallel cannot slip past
the limit while their look-ups run; a success then clears the address, and
an attempt that could not be judged (the database was down) is given back
with :meth:`release`. One clock serves every caller: the limiter reads its
own (``time.monotonic`` unless a test passes another), so listeners that
share a limiter can never mix trio's clock with the system's.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["FailureLimiter", "LimiterSettings"]

DEFAULT_FREE_FAILURES: Final = 3
DEFAULT_WINDOW_SECONDS: Final = 300.0
DEFAULT_BASE_BACKOFF_SECONDS: Final = 2.0
DEFAULT_MAX_BACKOFF_SECONDS: Final = 600.0
DEFAULT_MAX_ADDRESSES: Final = 100_000


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    """How many failures are free, and how the backoff grows."""

    free_failures: int = DEFAULT_FREE_FAILURES
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    base_backoff_seconds: float = DEFAULT_BASE_BACKOFF_SECONDS
    max_backoff_seconds: float = DEFAULT_MAX_BACKOFF_SECONDS
    max_addresses: int = DEFAULT_MAX_ADDRESSES


@dataclass(slots=True)
class _Record:
    failures: int
    first_failure: float
    blocked_until: float


class FailureLimiter:
    """Per-address failure counts and backoff, on one clock.

    Args:
        settings: the limits.
        clock: seconds from a monotonic clock; tests pass a fake one.
    """

    def __init__(
        self, settings: LimiterSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or LimiterSettings()
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, address: str) -> float:
        """Seconds before ``address`` may try again; 0 when it may now."""
        record = self._records.get(address)
        if record is None:
            return 0.0
        return max(0.0, record.blocked_until - self._clock())

    def begin(self, address: str) -> float:
        """Start an attempt: 0 and the attempt counted, or the seconds ``address`` must wait.

        The attempt counts as a failure until :meth:`success` clears it or
        :meth:`release` gives it back; a refused attempt (non-zero answer)
        counts nothing.
        """
        wait = self.retry_after(address)
        if wait > 0:
            return wait
        self._count(address)
        return 0.0

    def failure(self, address: str) -> float:
        """The backoff an attempt begun with :meth:`begin` has earned (already counted)."""
        record = self._records.get(address)
        if record is None:
            return 0.0
        return max(0.0, record.blocked_until - self._clock())

    def record_failure(self, address: str) -> float:
        """Count a failure that had no :meth:`begin`; returns the backoff now imposed."""
        return self._count(address)

    def release(self, address: str) -> None:
        """Give back an attempt begun with :meth:`begin` that could not be judged."""
        record = self._records.get(address)
        if record is not None and record.failures > 0:
            record.failures -= 1

    def success(self, address: str) -> None:
        """Forget the failures of ``address``."""
        self._records.pop(address, None)

    def _count(self, address: str) -> float:
        settings = self.settings
        now = self._clock()
        record = self._records.get(address)
        if record is None or now - record.first_failure > settings.window_seconds:
            record = _Record(0, now, 0.0)
        record.failures += 1
        excess = record.failures - settings.free_failures
        backoff = 0.0
        if excess > 0:
            backoff = min(
                settings.base_backoff_seconds * 2 ** (excess - 1), settings.max_backoff_seconds
            )
            record.blocked_until = now + backoff
        self._records[address] = record
        self._records.move_to_end(address)
        while len(self._records) > settings.max_addresses:
            self._records.popitem(last=False)
        return backoff
