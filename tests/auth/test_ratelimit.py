"""Failed authentications back off per address group, per (address, username) and per username.

Time is trio's MockClock (``clock=trio.current_time``): it moves only when a
test jumps it, so no outcome depends on the machine's speed.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from auth.ratelimit import (
    KNOWN_ADDRESS_SECONDS,
    USER_MAX_BACKOFF_SECONDS,
    FailureLimiter,
    GuessLimiter,
    GuessRules,
    LimiterSettings,
    MemoryCounts,
    Record,
    address_group,
)

ATTACKER = "198.51.100.66"
HOME = "192.0.2.10"


def guesses(**settings: float) -> GuessLimiter:
    """A limiter of the forward handshake on trio's clock (free failures 3 unless given)."""
    rules = GuessRules.of(LimiterSettings(**settings))  # type: ignore[arg-type]
    return GuessLimiter(rules, MemoryCounts(), clock=trio.current_time)


def attempt(limiter: GuessLimiter, address: str, username: str, *, good: bool) -> bool:
    """One handshake as the forward session makes it; whether it was let through."""
    if limiter.begin(address, username) > 0:
        return False
    if good:
        limiter.success(address, username)
    else:
        limiter.failure(address, username)
    return True


@pytest.mark.trio
async def test_a_login_between_guesses_does_not_reset_them(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Three wrong guesses at bob, one good login as alice, over and over: bob's 5th is refused."""
    limiter = guesses()
    let_through: list[bool] = []
    for _ in range(20):
        for _ in range(3):
            let_through.append(attempt(limiter, ATTACKER, "bob", good=False))
        # The attacker's own credential still works: its pair is its own.
        assert attempt(limiter, ATTACKER, "alice", good=True)
    # Three free, the fourth counted (it earns the wait), every later one refused.
    assert let_through[:4] == [True] * 4
    assert not any(let_through[4:])
    assert limiter.retry_after(ATTACKER, "bob") > 0


@pytest.mark.trio
async def test_a_success_clears_only_its_own_pair(mock_clock: trio.testing.MockClock) -> None:
    limiter = guesses()
    for _ in range(3):
        assert attempt(limiter, ATTACKER, "alice", good=False)
        assert attempt(limiter, ATTACKER, "bob", good=False)
    assert attempt(limiter, ATTACKER, "alice", good=True)
    # alice starts afresh; bob's fourth failure earns the wait.
    assert [attempt(limiter, ATTACKER, "alice", good=False) for _ in range(3)] == [True] * 3
    assert limiter.retry_after(ATTACKER, "alice") == 0
    assert attempt(limiter, ATTACKER, "bob", good=False)
    assert limiter.retry_after(ATTACKER, "bob") == 2.0
    assert not attempt(limiter, ATTACKER, "bob", good=False)


@pytest.mark.trio
async def test_the_address_waits_after_guesses_at_many_usernames(
    mock_clock: trio.testing.MockClock,
) -> None:
    limiter = guesses()
    free = limiter.rules.address.free_failures
    assert free == 12
    for n in range(free):
        assert attempt(limiter, ATTACKER, f"user-{n}", good=False)
    assert limiter.retry_after(ATTACKER, "someone-new") == 0
    assert attempt(limiter, ATTACKER, "one-more", good=False)  # counted: earns the wait
    assert limiter.retry_after(ATTACKER, "someone-new") == 2.0
    assert not attempt(limiter, ATTACKER, "someone-new", good=True)
    # Another address is not affected.
    assert attempt(limiter, HOME, "someone-new", good=True)


@pytest.mark.trio
async def test_a_username_backs_off_across_addresses_but_only_so_long(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Guesses at carol from ever new addresses: carol's count waits, never past its bound."""
    limiter = guesses(max_backoff_seconds=600)
    free = limiter.rules.user.free_failures
    addresses = (f"203.0.113.{n}" for n in range(1, 255))
    for _ in range(free):
        assert attempt(limiter, next(addresses), "carol", good=False)
    waits = []
    for _ in range(10):
        address = next(addresses)
        assert attempt(limiter, address, "carol", good=False)
        wait = limiter.retry_after(next(addresses), "carol")
        waits.append(wait)
        await trio.sleep(wait)  # the guesser waits it out, and goes on
    assert waits == [2, 4, 8, 16, 32, 60, 60, 60, 60, 60]
    assert max(waits) == USER_MAX_BACKOFF_SECONDS


@pytest.mark.trio
async def test_a_user_s_known_address_is_not_held_back_by_guesses_elsewhere(
    mock_clock: trio.testing.MockClock,
) -> None:
    limiter = guesses()
    assert attempt(limiter, HOME, "alice", good=True)
    for n in range(limiter.rules.user.free_failures + 1):
        assert attempt(limiter, f"203.0.113.{n + 1}", "alice", good=False)
    # Elsewhere alice waits (the username's count); at home she does not.
    assert 0 < limiter.retry_after("203.0.113.200", "alice") <= USER_MAX_BACKOFF_SECONDS
    assert attempt(limiter, HOME, "alice", good=True)
    # A home stays known for a while, not for ever.
    mock_clock.jump(KNOWN_ADDRESS_SECONDS + 1)
    for n in range(limiter.rules.user.free_failures + 1):
        assert attempt(limiter, f"203.0.113.{n + 1}", "alice", good=False)
    assert limiter.retry_after(HOME, "alice") > 0


@pytest.mark.trio
async def test_ipv6_addresses_of_one_64_count_together(
    mock_clock: trio.testing.MockClock,
) -> None:
    limiter = guesses()
    rotated = [f"2001:db8:1:2::{n:x}" for n in range(1, 10)]
    let_through = [attempt(limiter, address, "bob", good=False) for address in rotated]
    assert let_through[:4] == [True] * 4
    assert not any(let_through[4:])
    assert limiter.retry_after("2001:db8:1:3::1", "bob") == 0  # another /64


def test_address_groups() -> None:
    assert address_group("192.0.2.1") == "192.0.2.1"
    assert address_group("::ffff:192.0.2.1") == "192.0.2.1"
    assert address_group("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert address_group("[2001:db8:1:2::5]") == "2001:db8:1:2::/64"
    assert address_group("fe80::1%eth0") == "fe80::/64"
    assert address_group("not an address") == "not an address"


@pytest.mark.trio
async def test_waiting_out_every_backoff_keeps_the_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A count lasts a window past the end of its wait: the wait keeps doubling."""
    limiter = guesses(window_seconds=300, max_backoff_seconds=3600)
    for _ in range(3):
        assert attempt(limiter, ATTACKER, "bob", good=False)
    waits = []
    for _ in range(10):
        assert attempt(limiter, ATTACKER, "bob", good=False)
        wait = limiter.retry_after(ATTACKER, "bob")
        waits.append(wait)
        await trio.sleep(wait)
    assert waits == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    # Quiet for a window after the wait ended: the count is forgotten.
    assert attempt(limiter, ATTACKER, "bob", good=False)
    await trio.sleep(limiter.retry_after(ATTACKER, "bob") + 301)
    assert [attempt(limiter, ATTACKER, "bob", good=False) for _ in range(4)] == [True] * 4


@pytest.mark.trio
async def test_parallel_attempts_are_counted_before_the_lookup(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Attempts begun together cannot all slip through while their look-ups run."""
    limiter = guesses(free_failures=2, base_backoff_seconds=5)
    started = [limiter.begin(ATTACKER, "bob") for _ in range(5)]
    # Two are free, the third is counted and earns the wait, the rest wait.
    assert started[:3] == [0, 0, 0]
    assert all(wait > 0 for wait in started[3:])
    assert limiter.failure(ATTACKER, "bob") == 5


@pytest.mark.trio
async def test_release_gives_an_attempt_back(mock_clock: trio.testing.MockClock) -> None:
    limiter = guesses(free_failures=1)
    for _ in range(5):
        assert limiter.begin(ATTACKER, "bob") == 0
        limiter.release(ATTACKER, "bob")  # the database was down: not the client's failure
    assert limiter.begin(ATTACKER, "bob") == 0
    assert limiter.begin(ATTACKER, "bob") == 0  # the second counted attempt: past the free one
    assert limiter.begin(ATTACKER, "bob") > 0


@pytest.mark.trio
async def test_without_a_username_only_the_address_and_its_pair_count(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Shared-key handshakes (no user checked) count the address and the empty-name pair."""
    counts = MemoryCounts()
    limiter = GuessLimiter(GuessRules.of(LimiterSettings()), counts, clock=trio.current_time)
    assert attempt(limiter, ATTACKER, "", good=False)
    assert len(counts) == 2


def test_records_no_clock_of_this_boot_wrote_are_dropped() -> None:
    """A record from before a reboot (or a damaged one) never holds anyone back."""
    rule = GuessRules.of(LimiterSettings()).pair
    now = 1000.0
    for record in (
        Record(failures=50, last_failure=now + 1e6, blocked_until=now + 1e6),
        Record(failures=50, last_failure=now, blocked_until=now + 1e9),
        Record(failures=50, last_failure=float("nan"), blocked_until=now + 10),
        Record(failures=-1, last_failure=now, blocked_until=now + 10),
        Record(last_success=now + 5, known=True),
    ):
        record.settle(now, rule)
        assert (record.failures, record.wait(now), record.known) == (0, 0, False), record
        assert record.is_empty()


def test_memory_is_bounded() -> None:
    counts = MemoryCounts(max_records=3)
    limiter = GuessLimiter(GuessRules.of(LimiterSettings()), counts, clock=lambda: 0.0)
    for i in range(10):
        limiter.record_failure(f"10.0.0.{i}", "")
    assert len(counts) == 3


# -- the per-address limiter (WebSocket tokens, CURVE keys) ----------------------------


@pytest.mark.trio
async def test_free_failures_then_doubling_backoff_capped(
    mock_clock: trio.testing.MockClock,
) -> None:
    settings = LimiterSettings(free_failures=2, base_backoff_seconds=1, max_backoff_seconds=5)
    limiter = FailureLimiter(settings, clock=trio.current_time)
    assert [limiter.record_failure("10.0.0.1") for _ in range(6)] == [0, 0, 1, 2, 4, 5]
    assert limiter.retry_after("10.0.0.1") == 5
    mock_clock.jump(6)
    assert limiter.retry_after("10.0.0.1") == 0
    assert limiter.retry_after("10.0.0.2") == 0


@pytest.mark.trio
async def test_success_clears_and_window_expires(mock_clock: trio.testing.MockClock) -> None:
    limiter = FailureLimiter(
        LimiterSettings(free_failures=1, window_seconds=10), clock=trio.current_time
    )
    limiter.record_failure("192.0.2.1")
    mock_clock.jump(1)
    assert limiter.record_failure("192.0.2.1") > 0
    limiter.success("192.0.2.1")
    assert limiter.retry_after("192.0.2.1") == 0
    limiter.record_failure("192.0.2.2")
    mock_clock.jump(11)
    assert limiter.record_failure("192.0.2.2") == 0  # the first failure left the window


@pytest.mark.trio
async def test_per_address_limiter_groups_ipv6_and_counts_before_the_lookup(
    mock_clock: trio.testing.MockClock,
) -> None:
    limiter = FailureLimiter(LimiterSettings(free_failures=2), clock=trio.current_time)
    started = [limiter.begin(f"2001:db8::{n}") for n in range(1, 6)]
    assert started[:3] == [0, 0, 0]
    assert all(wait > 0 for wait in started[3:])
    limiter.release("2001:db8::9")
    limiter.success("2001:db8::1")
    assert limiter.begin("2001:db8::7") == 0
