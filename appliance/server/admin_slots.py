"""The admin listener's admission: which connections it keeps, and who makes room for whom.

The admin listener must answer ``/livez`` while anyone who can reach it opens
connections and sends nothing, or sends a request head one byte at a time.
Every connection is in one of three stages, each bounded on its own
(docs/observability.md, "Admission"):

* **waiting**: nothing of its next request has arrived (a new connection
  before its first byte, a kept-alive one between requests). It costs a
  socket and a sleeping task, nothing else. At most
  :data:`WAITING_CONNECTIONS`, one address at most
  :data:`WAITING_PER_ADDRESS`.
* **reading**: a request has begun (its first byte came) and its head is not
  complete yet; over TLS from the first byte of the handshake on. At most
  :data:`READING_SLOTS`, one address at most :data:`READING_SLOTS_PER_ADDRESS`.
  A head that arrives whole with its first read never takes a reading slot.
* **answering**: a complete, authorised request is being answered.
  ``/livez`` takes no slot (its answer is a few bytes, sent at once); the
  others at most :data:`ANSWERING_SLOTS` at once, of which at most
  :data:`TAIL_SUBSCRIBERS` live tails; more are answered ``503``.

A connection that finds the waiting room or the reading slots full is not
refused: it takes the place of the connection that has been in that stage
longest, of its own address when that address holds its share, else of the
address that holds the most places there. Refusing newcomers would hand
every freed place to whoever re-opens fastest, an attacker's loop rather than
a probe; closing the longest-held place keeps each connection's place for as
long as its own address (or, when every address holds one, every address)
sends no more newcomers than there are places. Answers are never closed to
make room. Such closes are logged as ``admin.connection_closed``, at most one
line a second (:data:`EVICTION_LOG_INTERVAL_SECONDS`) saying how many.

Sans-IO apart from the cancel scopes: a :class:`Seat` is one connection, its
:attr:`Seat.scope` wraps everything the connection does, and closing it to
make room cancels that scope. Single-threaded (the event loop's thread).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

import trio

from appliance.logs import get_logger

__all__ = [
    "ANSWERING_SLOTS",
    "READING_SLOTS",
    "READING_SLOTS_PER_ADDRESS",
    "TAIL_SUBSCRIBERS",
    "WAITING_CONNECTIONS",
    "WAITING_PER_ADDRESS",
    "AdminSlots",
    "Pool",
    "Seat",
]

log = get_logger("admin")

#: Connections whose request head has begun and is not complete (TLS handshake
#: included), at once.
READING_SLOTS: Final = 16
#: Reading slots one client address may hold: a quarter, so that one address
#: can never hold every slot.
READING_SLOTS_PER_ADDRESS: Final = READING_SLOTS // 4
#: Connections that have sent nothing of their next request yet, at once (a
#: socket and a sleeping task each).
WAITING_CONNECTIONS: Final = 64
#: Of those, from one client address: half, so that one address re-opening
#: connections in a loop closes only its own.
WAITING_PER_ADDRESS: Final = WAITING_CONNECTIONS // 2
#: Requests other than ``/livez`` being answered at once (``/metrics``,
#: ``/readyz``, ``/tail``); more are answered 503 at once.
ANSWERING_SLOTS: Final = 16
#: Live tails (``/tail``) at once, among the answering slots.
TAIL_SUBSCRIBERS: Final = 4
#: Seconds between two log lines about connections closed to make room: one
#: line then says how many (a connection loop would otherwise flood the log).
EVICTION_LOG_INTERVAL_SECONDS: Final = 1.0


@dataclass(eq=False)
class Seat:
    """One connection of the admin listener, in at most one pool at a time."""

    address: str
    #: How logs name it (``address:port``).
    peer: str
    #: Wraps everything the connection does: cancelled when it must make room.
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: The pool it is in now (None: answering, or between stages).
    pool: Pool | None = None
    #: Why it was closed to make room (None: it was not).
    evicted: str | None = None
    #: When it joined its pool, in the pool's order.
    joined: int = 0

    @property
    def reading(self) -> bool:
        """Whether it holds a reading slot."""
        return self.pool is not None and self.pool.name == "reading"


class Pool:
    """Seats of one stage: at most ``capacity``, at most ``share`` of one address.

    :meth:`join` always admits the newcomer; when there is no room it closes
    the seat that joined first, of the newcomer's address when that address
    holds its share, else of the address holding the most seats.
    """

    def __init__(self, name: str, capacity: int, share: int) -> None:
        self.name = name
        self.capacity = capacity
        self.share = share
        #: Seats by address, each list in the order they joined.
        self._by_address: dict[str, list[Seat]] = {}
        self._size = 0
        self._joins = 0
        #: Seats closed to make room, since start.
        self.evictions = 0

    def __len__(self) -> int:
        return self._size

    def held_by(self, address: str) -> int:
        """Seats ``address`` holds."""
        return len(self._by_address.get(address, ()))

    def join(self, seat: Seat) -> Seat | None:
        """Add ``seat``; the seat closed to make room for it, if one was."""
        own = self._by_address.get(seat.address, [])
        victim: Seat | None = None
        if len(own) >= self.share:
            victim = own[0]
            victim.evicted = f"{self.name}: {seat.address} holds its share of {self.share}"
        elif self._size >= self.capacity:
            victim = self._heaviest()
            victim.evicted = f"{self.name}: all {self.capacity} places are held"
        if victim is not None:
            self.leave(victim)
            victim.scope.cancel()
            self.evictions += 1
        self._joins += 1
        seat.joined = self._joins
        self._by_address.setdefault(seat.address, []).append(seat)
        self._size += 1
        seat.pool = self
        return victim

    def leave(self, seat: Seat) -> None:
        """Remove ``seat`` (nothing when it is not here)."""
        if seat.pool is not self:
            return
        seats = self._by_address[seat.address]
        seats.remove(seat)
        if not seats:
            del self._by_address[seat.address]
        self._size -= 1
        seat.pool = None

    def _heaviest(self) -> Seat:
        """The first seat of the address that holds the most (the longest-held among equals)."""
        most = max(len(held) for held in self._by_address.values())
        return min(
            (held[0] for held in self._by_address.values() if len(held) == most),
            key=lambda seat: seat.joined,
        )


_current: ContextVar[Seat] = ContextVar("admin_seat")


class AdminSlots:
    """The admin listener's three stages (module docstring); one per listener."""

    def __init__(
        self,
        *,
        waiting: int = WAITING_CONNECTIONS,
        waiting_per_address: int = WAITING_PER_ADDRESS,
        reading: int = READING_SLOTS,
        reading_per_address: int = READING_SLOTS_PER_ADDRESS,
        answering: int = ANSWERING_SLOTS,
        tails: int = TAIL_SUBSCRIBERS,
    ) -> None:
        self.waiting = Pool("waiting", waiting, waiting_per_address)
        self.reading = Pool("reading", reading, reading_per_address)
        self.answering_slots = answering
        self.tail_slots = tails
        #: Requests being answered now (``/livez`` not counted), and live tails among them.
        self.answering = 0
        self.tails = 0
        self._unlogged = 0
        self._logged_at = -math.inf

    @contextmanager
    def connection(self, address: str, peer: str) -> Iterator[Seat]:
        """The seat of the connection this task serves: made and entered here, or the caller's.

        The listener makes it before the TLS handshake; a handler run on its
        own (tests) gets one here. Its scope is entered by whoever makes it.
        """
        seat = _current.get(None)
        if seat is not None:
            yield seat
            return
        seat = Seat(address, peer)
        token = _current.set(seat)
        try:
            with seat.scope:
                yield seat
        finally:
            self.leave(seat)
            _current.reset(token)

    def wait(self, seat: Seat) -> None:
        """``seat`` waits for its next request's first byte."""
        self._move(seat, self.waiting)

    def read(self, seat: Seat) -> None:
        """``seat``'s request has begun: it takes a reading slot (no-op when it holds one)."""
        if not seat.reading:
            self._move(seat, self.reading)

    def leave(self, seat: Seat) -> None:
        """``seat`` leaves the pool it is in (its head is complete, or it closes)."""
        if seat.pool is not None:
            seat.pool.leave(seat)

    def _move(self, seat: Seat, pool: Pool) -> None:
        self.leave(seat)
        victim = pool.join(seat)
        if victim is None:
            return
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at >= EVICTION_LOG_INTERVAL_SECONDS:
            log.warning(
                "admin.connection_closed", peer=victim.peer, stage=pool.name,
                reason=f"made room for a new connection ({victim.evicted})",
                closed=self._unlogged,
            )  # fmt: skip
            self._unlogged, self._logged_at = 0, now

    @contextmanager
    def answer(self, *, tail: bool = False) -> Iterator[bool]:
        """An answering slot (a tail slot too when ``tail``): True, or False when none is free."""
        full = self.answering >= self.answering_slots or (tail and self.tails >= self.tail_slots)
        if full:
            yield False
            return
        self.answering += 1
        self.tails += tail
        try:
            yield True
        finally:
            self.answering -= 1
            self.tails -= tail
