"""Backoff of failed authentications per source address, on the limiter's own clock."""

from __future__ import annotations

from auth.ratelimit import FailureLimiter, LimiterSettings


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_free_failures_then_doubling_backoff_capped() -> None:
    clock = _Clock()
    limiter = FailureLimiter(LimiterSettings(free_failures=2, base_backoff_seconds=1,
                                             max_backoff_seconds=5), clock)  # fmt: skip
    assert [limiter.record_failure("10.0.0.1") for _ in range(6)] == [0, 0, 1, 2, 4, 5]
    assert limiter.retry_after("10.0.0.1") == 5
    clock.now = 6.0
    assert limiter.retry_after("10.0.0.1") == 0
    assert limiter.retry_after("10.0.0.2") == 0


def test_success_clears_and_window_expires() -> None:
    clock = _Clock()
    limiter = FailureLimiter(LimiterSettings(free_failures=1, window_seconds=10), clock)
    limiter.record_failure("a")
    clock.now = 1.0
    assert limiter.record_failure("a") > 0
    limiter.success("a")
    assert limiter.retry_after("a") == 0
    clock.now = 0.0
    limiter.record_failure("b")
    clock.now = 11.0
    assert limiter.record_failure("b") == 0  # the first failure left the window


def test_parallel_attempts_are_counted_before_the_lookup() -> None:
    """Attempts begun together cannot all slip through while their look-ups run."""
    limiter = FailureLimiter(LimiterSettings(free_failures=2, base_backoff_seconds=5),
                             _Clock())  # fmt: skip
    started = [limiter.begin("10.0.0.9") for _ in range(5)]
    # Two are free, the third is counted and earns the backoff, the rest wait.
    assert started[:3] == [0, 0, 0]
    assert all(wait > 0 for wait in started[3:])
    assert limiter.failure("10.0.0.9") > 0


def test_success_clears_a_begun_attempt_and_release_gives_it_back() -> None:
    limiter = FailureLimiter(LimiterSettings(free_failures=1), _Clock())
    assert limiter.begin("a") == 0
    limiter.success("a")
    assert limiter.begin("a") == 0
    limiter.release("a")  # the database was down: not the client's failure
    assert limiter.begin("a") == 0
    assert limiter.begin("a") == 0  # the second counted attempt passes the one free failure
    assert limiter.begin("a") > 0


def test_memory_is_bounded() -> None:
    limiter = FailureLimiter(LimiterSettings(max_addresses=3))
    for i in range(10):
        limiter.record_failure(f"10.0.0.{i}")
    assert len(limiter._records) == 3
