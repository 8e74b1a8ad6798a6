"""Backoff of failed handshakes per source address."""

from __future__ import annotations

from auth.ratelimit import FailureLimiter, LimiterSettings


def test_free_failures_then_doubling_backoff_capped() -> None:
    limiter = FailureLimiter(LimiterSettings(free_failures=2, base_backoff_seconds=1,
                                             max_backoff_seconds=5))  # fmt: skip
    assert [limiter.failure("10.0.0.1", 0.0) for _ in range(6)] == [0, 0, 1, 2, 4, 5]
    assert limiter.retry_after("10.0.0.1", 0.0) == 5
    assert limiter.retry_after("10.0.0.1", 6.0) == 0
    assert limiter.retry_after("10.0.0.2", 0.0) == 0


def test_success_clears_and_window_expires() -> None:
    limiter = FailureLimiter(LimiterSettings(free_failures=1, window_seconds=10))
    limiter.failure("a", 0.0)
    assert limiter.failure("a", 1.0) > 0
    limiter.success("a")
    assert limiter.retry_after("a", 1.0) == 0
    limiter.failure("b", 0.0)
    assert limiter.failure("b", 11.0) == 0  # the first failure left the window


def test_memory_is_bounded() -> None:
    limiter = FailureLimiter(LimiterSettings(max_addresses=3))
    for i in range(10):
        limiter.failure(f"10.0.0.{i}", 0.0)
    assert len(limiter._records) == 3
