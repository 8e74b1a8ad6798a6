"""Brute-force protection: failed handshakes from one address back off exponentially.

After ``free_failures`` failures within ``window_seconds``, an address is
refused for ``base_backoff_seconds``, doubling with each further failure up
to ``max_backoff_seconds``. A success clears the address. Memory is bounded:
at most ``max_addresses`` addresses are tracked, the stalest dropped first.
The clock is passed in, so the rules are testable without waiting.
"""

from __future__ import annotations

from collections import OrderedDict
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
    """Per-address failure counts and backoff."""

    def __init__(self, settings: LimiterSettings | None = None) -> None:
        self.settings = settings or LimiterSettings()
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, address: str, now: float) -> float:
        """Seconds before ``address`` may try again; 0 when it may now."""
        record = self._records.get(address)
        if record is None:
            return 0.0
        return max(0.0, record.blocked_until - now)

    def failure(self, address: str, now: float) -> float:
        """Count a failure; returns the backoff now imposed (0 while failures are free)."""
        settings = self.settings
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

    def success(self, address: str) -> None:
        """Forget the failures of ``address``."""
        self._records.pop(address, None)
