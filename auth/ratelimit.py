"""Brute-force protection: failed authentications back off per address, per pair and per user.

The forward handshake's :class:`GuessLimiter` keeps three counts of every
attempt, each with its own rule (:class:`GuessRules`, from the listener's
settings):

* the **pair** (address group, username): the listener's free failures, then
  a wait of ``base_backoff_seconds`` doubling up to ``max_backoff_seconds``.
  A success clears this pair, and only it: a client that holds one valid
  credential cannot wipe its guesses at another user's password by logging
  in between them;
* the **address group**, whatever username it names: the same backoff after
  :data:`ADDRESS_FREE_FAILURES_FACTOR` times the pair's free failures (one
  NAT address carries many honest clients); a success never clears it, it
  only gives back the attempt it had counted;
* the **username**, from every address: the same after
  :data:`USER_FREE_FAILURES_FACTOR` times the free failures, but the wait is
  bounded by :data:`USER_MAX_BACKOFF_SECONDS`, and an address group from
  which that user logged in within :data:`KNOWN_ADDRESS_SECONDS` is exempt.
  Guesses spread over many addresses are slowed down without anyone being
  able to lock a user's own clients out (docs/security.md).

An address group is an IPv4 address, or the /64 of an IPv6 address
(:func:`address_group`): one IPv6 host commonly holds a whole /64, so
rotating addresses within it gains nothing.

An attempt counts as a failure from the moment it starts (``begin``), before
the credential look-up, so attempts made in parallel cannot slip past the
limit while their look-ups run; a success then clears or gives back what it
counted, and an attempt that could not be judged (the database was down) is
given back with ``release``. A count lasts ``window_seconds`` after the later
of its last failure and the end of its wait: a client that waits out every
backoff keeps its count, and its next failure doubles the wait again.

The counts live in a :class:`CountStore`: :class:`MemoryCounts` (this
process, bounded), or :class:`auth.failure_table.SharedCounts`, a small file
every worker process of a node shares. One clock serves every caller: a
limiter reads its own (``time.monotonic``, which every process of the
machine shares, unless a test passes another).

:class:`FailureLimiter` is the plain per-address limiter of credentials that
carry no username (WebSocket bearer tokens, CURVE keys): random 256-bit
secrets, where a success clears the address.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

__all__ = [
    "ADDRESS_FREE_FAILURES_FACTOR",
    "IPV6_GROUP_PREFIX",
    "KNOWN_ADDRESS_SECONDS",
    "USER_FREE_FAILURES_FACTOR",
    "USER_MAX_BACKOFF_SECONDS",
    "BackoffRule",
    "CountStore",
    "FailureLimiter",
    "GuessLimiter",
    "GuessRules",
    "LimiterSettings",
    "MemoryCounts",
    "Record",
    "address_group",
]

#: Failures of one count before it must wait (a forward listener's free_failed_handshakes).
DEFAULT_FREE_FAILURES: Final = 3
#: Seconds a count lasts after the later of its last failure and the end of its wait.
DEFAULT_WINDOW_SECONDS: Final = 300.0
#: First wait, in seconds; doubles with each further failure.
DEFAULT_BASE_BACKOFF_SECONDS: Final = 2.0
#: Longest wait, in seconds.
DEFAULT_MAX_BACKOFF_SECONDS: Final = 600.0
#: Records a process keeps in memory (the stalest dropped first): bounds the
#: memory an attacker who varies addresses and usernames can make it hold.
DEFAULT_MAX_ADDRESSES: Final = 100_000

#: An address group's free failures over all usernames, as a multiple of a
#: pair's: one NAT address carries many clients whose honest mistakes add up,
#: while trying username after username from one address must still wait.
ADDRESS_FREE_FAILURES_FACTOR: Final = 4
#: A username's free failures from all addresses together, as a multiple of a pair's.
USER_FREE_FAILURES_FACTOR: Final = 4
#: Longest wait a username's own count imposes, in seconds: the most an
#: attacker failing as that user from elsewhere can make the user's clients
#: wait (at an address not known for the user), for each of its failures.
USER_MAX_BACKOFF_SECONDS: Final = 60.0
#: Seconds an address group stays known for a user after a successful login:
#: from there, the username's own count does not hold the user back.
KNOWN_ADDRESS_SECONDS: Final = 30 * 86_400.0
#: Prefix length that groups IPv6 addresses: one host or LAN commonly holds a /64.
IPV6_GROUP_PREFIX: Final = 64
#: Largest doubling exponent computed (2**64 waits exceed every maximum anyway).
_MAX_DOUBLINGS: Final = 64
#: Largest failure count kept (fits the shared table's 32-bit field).
MAX_FAILURES: Final = 2**32 - 1

_T = TypeVar("_T")


def address_group(address: str) -> str:
    """Whose failures ``address`` shares: the IPv4 address, or the IPv6 address's /64.

    An IPv4-mapped IPv6 address (``::ffff:10.1.2.3``) counts as its IPv4
    address; brackets and a zone (``%eth0``) are ignored. A text that is not
    an IP address is its own group.
    """
    text = address.strip().strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_GROUP_PREFIX), strict=False))
    return str(ip)


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    """How many failures are free, and how the backoff grows (a listener's settings)."""

    free_failures: int = DEFAULT_FREE_FAILURES
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    base_backoff_seconds: float = DEFAULT_BASE_BACKOFF_SECONDS
    max_backoff_seconds: float = DEFAULT_MAX_BACKOFF_SECONDS
    max_addresses: int = DEFAULT_MAX_ADDRESSES


@dataclass(frozen=True, slots=True)
class BackoffRule:
    """One count's rule: free failures, then a wait doubling from base to max."""

    free_failures: int
    base_backoff_seconds: float
    max_backoff_seconds: float
    window_seconds: float

    def backoff(self, failures: int) -> float:
        """The wait ``failures`` failures earn (0 while they are free)."""
        excess = failures - self.free_failures
        if excess <= 0:
            return 0.0
        doubled = self.base_backoff_seconds * 2.0 ** min(excess - 1, _MAX_DOUBLINGS)
        return min(doubled, self.max_backoff_seconds)


@dataclass(frozen=True, slots=True)
class GuessRules:
    """The rules of the three counts of a forward handshake."""

    pair: BackoffRule
    address: BackoffRule
    user: BackoffRule

    @classmethod
    def of(cls, settings: LimiterSettings) -> GuessRules:
        """The rules derived from a listener's settings (the pair's are the settings)."""
        pair = BackoffRule(
            settings.free_failures,
            settings.base_backoff_seconds,
            settings.max_backoff_seconds,
            settings.window_seconds,
        )
        address = BackoffRule(
            settings.free_failures * ADDRESS_FREE_FAILURES_FACTOR,
            settings.base_backoff_seconds,
            settings.max_backoff_seconds,
            settings.window_seconds,
        )
        user = BackoffRule(
            settings.free_failures * USER_FREE_FAILURES_FACTOR,
            min(settings.base_backoff_seconds, USER_MAX_BACKOFF_SECONDS),
            min(settings.max_backoff_seconds, USER_MAX_BACKOFF_SECONDS),
            settings.window_seconds,
        )
        return cls(pair, address, user)


@dataclass(slots=True)
class Record:
    """One count: failures, the wait they earned, and the last success (pairs only)."""

    failures: int = 0
    last_failure: float = 0.0
    blocked_until: float = 0.0
    last_success: float = 0.0
    #: When it was last written: which record a full store drops first.
    touched: float = 0.0
    #: A success was seen (at ``last_success``): the pair's address is known for its user.
    known: bool = False

    def is_empty(self) -> bool:
        """Nothing worth keeping: a store may forget it."""
        return self.failures == 0 and self.blocked_until == 0.0 and not self.known

    def settle(self, now: float, rule: BackoffRule) -> None:
        """Forget what has expired by ``now``, and anything no clock of this boot wrote.

        A record from before a reboot (monotonic times ahead of ``now``), a
        wait longer than the rule allows, or a value that is not a number
        (a damaged shared file) resets it: a stored count can never lock
        anyone out for longer than its rule says.
        """
        times = (self.last_failure, self.blocked_until, self.last_success, self.touched)
        if (
            not all(math.isfinite(t) for t in times)
            or not 0 <= self.failures <= MAX_FAILURES
            or self.last_failure > now
            or (self.known and self.last_success > now)
            or self.touched > now
            or self.blocked_until > now + rule.max_backoff_seconds
        ):
            self.failures, self.last_failure, self.blocked_until = 0, 0.0, 0.0
            self.last_success = self.touched = 0.0
            self.known = False
            return
        ended = max(self.last_failure, self.blocked_until) + rule.window_seconds
        if (self.failures or self.blocked_until) and now > ended:
            self.failures, self.blocked_until = 0, 0.0
        if self.known and now - self.last_success > KNOWN_ADDRESS_SECONDS:
            self.known, self.last_success = False, 0.0

    def wait(self, now: float) -> float:
        """Seconds before this count lets an attempt through (0: now)."""
        return max(0.0, self.blocked_until - now)

    def count(self, now: float, rule: BackoffRule) -> float:
        """Count one failure; the wait it earned (0 while failures are free)."""
        self.failures = min(self.failures + 1, MAX_FAILURES)
        self.last_failure = now
        backoff = rule.backoff(self.failures)
        if backoff > 0:
            self.blocked_until = max(self.blocked_until, now + backoff)
        return backoff

    def give_back(self, rule: BackoffRule) -> None:
        """Uncount one failure counted by ``begin``; lift a wait no longer earned."""
        self.failures = max(0, self.failures - 1)
        if self.failures <= rule.free_failures:
            self.blocked_until = 0.0


class CountStore(Protocol):
    """Where counts live: one process's memory, or a table all processes of a node share."""

    def transact(self, keys: Sequence[str], change: Callable[[list[Record]], _T], now: float) -> _T:
        """Run ``change`` on the records of ``keys`` (empty ones for new keys), atomically.

        The records ``change`` leaves are stored (empty ones forgotten) before
        any other transaction sees them; its result is returned.
        """
        ...


class MemoryCounts:
    """Counts in this process's memory, at most ``max_records`` (the stalest dropped first)."""

    def __init__(self, max_records: int = DEFAULT_MAX_ADDRESSES) -> None:
        self.max_records = max_records
        self._records: OrderedDict[str, Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def transact(self, keys: Sequence[str], change: Callable[[list[Record]], _T], now: float) -> _T:
        records = [self._records.get(key) or Record() for key in keys]
        result = change(records)
        for key, record in zip(keys, records, strict=True):
            if record.is_empty():
                self._records.pop(key, None)
                continue
            record.touched = now
            self._records[key] = record
            self._records.move_to_end(key)
        while len(self._records) > self.max_records:
            self._records.popitem(last=False)
        return result


#: What a limiter does under a store's transaction: the records, their rules, the time.
_Change = Callable[[list[Record], list[BackoffRule], float], _T]


def _key(kind: str, *parts: str) -> str:
    # Lengths make the key unambiguous whatever a username holds.
    return "\0".join([kind, *(f"{len(part)}:{part}" for part in parts)])


class GuessLimiter:
    """The three counts of the forward handshake (see the module docstring), on one clock.

    Args:
        rules: the counts' rules (:meth:`GuessRules.of` a listener's settings).
        counts: where the counts live; default: this process's memory.
        clock: seconds from a monotonic clock all processes sharing ``counts``
            read alike; tests pass a fake one.
    """

    def __init__(
        self,
        rules: GuessRules | None = None,
        counts: CountStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rules = rules or GuessRules.of(LimiterSettings())
        self.counts: CountStore = counts if counts is not None else MemoryCounts()
        self._clock = clock

    def _keys(self, address: str, username: str) -> list[str]:
        group = address_group(address)
        keys = [_key("address", group), _key("pair", group, username)]
        if username:
            keys.append(_key("user", username))
        return keys

    def _rules(self, username: str) -> list[BackoffRule]:
        rules = [self.rules.address, self.rules.pair]
        if username:
            rules.append(self.rules.user)
        return rules

    def _run(self, address: str, username: str, change: _Change[_T]) -> _T:
        now = self._clock()
        rules = self._rules(username)

        def settled(records: list[Record]) -> _T:
            for record, rule in zip(records, rules, strict=True):
                record.settle(now, rule)
            return change(records, rules, now)

        return self.counts.transact(self._keys(address, username), settled, now)

    @staticmethod
    def _wait(records: list[Record], now: float) -> float:
        waits = [records[0].wait(now), records[1].wait(now)]
        # A user's own address is not held back by guesses made elsewhere.
        if len(records) > 2 and not records[1].known:
            waits.append(records[2].wait(now))
        return max(waits)

    def retry_after(self, address: str, username: str) -> float:
        """Seconds before ``username`` may be tried from ``address`` again; 0 when it may now."""

        def look(records: list[Record], rules: list[BackoffRule], now: float) -> float:
            return self._wait(records, now)

        return self._run(address, username, look)

    def begin(self, address: str, username: str) -> float:
        """Start an attempt: 0 and the attempt counted, or the seconds it must wait.

        The attempt counts as a failure of all three counts until
        :meth:`success` or :meth:`release`; a refused attempt (non-zero
        answer) counts nothing.
        """

        def start(records: list[Record], rules: list[BackoffRule], now: float) -> float:
            wait = self._wait(records, now)
            if wait > 0:
                return wait
            for record, rule in zip(records, rules, strict=True):
                record.count(now, rule)
            return 0.0

        return self._run(address, username, start)

    def failure(self, address: str, username: str) -> float:
        """The wait an attempt begun with :meth:`begin` has earned (already counted)."""
        return self.retry_after(address, username)

    def record_failure(self, address: str, username: str) -> float:
        """Count a failure that had no :meth:`begin`; returns the wait now imposed."""

        def fail(records: list[Record], rules: list[BackoffRule], now: float) -> float:
            for record, rule in zip(records, rules, strict=True):
                record.count(now, rule)
            return self._wait(records, now)

        return self._run(address, username, fail)

    def release(self, address: str, username: str) -> None:
        """Give back an attempt begun with :meth:`begin` that could not be judged."""

        def give_back(records: list[Record], rules: list[BackoffRule], now: float) -> None:
            for record, rule in zip(records, rules, strict=True):
                record.give_back(rule)

        self._run(address, username, give_back)

    def success(self, address: str, username: str) -> None:
        """A begun attempt succeeded: clear its pair, give back its address and user counts.

        The pair remembers the success: the address group is known for the
        user (:data:`KNOWN_ADDRESS_SECONDS`).
        """

        def succeed(records: list[Record], rules: list[BackoffRule], now: float) -> None:
            address_record, pair = records[0], records[1]
            address_record.give_back(rules[0])
            pair.failures, pair.blocked_until = 0, 0.0
            pair.known, pair.last_success = True, now
            if len(records) > 2:
                records[2].give_back(rules[2])

        self._run(address, username, succeed)


class FailureLimiter:
    """Per-address-group failure counts and backoff, on one clock; a success clears the group.

    For credentials without a username (WebSocket tokens, CURVE keys), in
    this process's memory.

    Args:
        settings: the limits.
        clock: seconds from a monotonic clock; tests pass a fake one.
    """

    def __init__(
        self, settings: LimiterSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or LimiterSettings()
        self._rule = GuessRules.of(self.settings).pair
        self._clock = clock
        self._records = MemoryCounts(self.settings.max_addresses)

    def _run(self, address: str, change: Callable[[Record, float], _T]) -> _T:
        now = self._clock()
        rule = self._rule

        def settled(records: list[Record]) -> _T:
            records[0].settle(now, rule)
            return change(records[0], now)

        return self._records.transact([address_group(address)], settled, now)

    def retry_after(self, address: str) -> float:
        """Seconds before ``address`` may try again; 0 when it may now."""
        return self._run(address, lambda record, now: record.wait(now))

    def begin(self, address: str) -> float:
        """Start an attempt: 0 and the attempt counted, or the seconds ``address`` must wait.

        The attempt counts as a failure until :meth:`success` clears it or
        :meth:`release` gives it back; a refused attempt (non-zero answer)
        counts nothing.
        """

        def start(record: Record, now: float) -> float:
            wait = record.wait(now)
            if wait > 0:
                return wait
            record.count(now, self._rule)
            return 0.0

        return self._run(address, start)

    def failure(self, address: str) -> float:
        """The backoff an attempt begun with :meth:`begin` has earned (already counted)."""
        return self.retry_after(address)

    def record_failure(self, address: str) -> float:
        """Count a failure that had no :meth:`begin`; returns the backoff now imposed."""
        return self._run(address, lambda record, now: record.count(now, self._rule))

    def release(self, address: str) -> None:
        """Give back an attempt begun with :meth:`begin` that could not be judged."""
        self._run(address, lambda record, now: record.give_back(self._rule))

    def success(self, address: str) -> None:
        """Forget the failures of ``address``'s group."""

        def clear(record: Record, now: float) -> None:
            record.failures, record.blocked_until = 0, 0.0

        self._run(address, clear)
