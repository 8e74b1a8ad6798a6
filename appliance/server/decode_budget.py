"""The decode budget: one per process, bounding the memory every decode in progress may take.

A request's decoding can build far more memory than the bytes it came in:
the forward codec's worst case is about 160 bytes of Python objects and
text per msgpack byte, and a 58 KB gzip body inflates to 60 MB of msgpack.
The codec therefore reports, before it builds anything for a request, that
request's worst-case cost, a pure function of its sizes
(:func:`appliance.defaults.forward_request_cost`), to a gate
(:mod:`appliance.protocols.decode_gate`). The gates of every connection of
every listener draw on one :class:`DecodeBudget` of ``decode_budget_bytes``
(docs/limits.md):

* a cost that fits what is free is taken at once (:meth:`DecodeBudget.try_take`,
  from the worker thread that decodes, so the thread never waits);
* a cost that does not is put off: the codec keeps the request as bytes, the
  answering loop (appliance/server/connection.py) waits for room on the
  event loop, first come first served (:meth:`DecodeBudget.acquire`), at most
  ``DECODE_BUDGET_WAIT_SECONDS``, then resumes the codec in a worker thread
  with that much already taken (a :class:`DecodeGrant` made with ``prepaid``);
  a connection that waited too long is closed with the reason;
* a cost larger than the whole budget can never fit: the codec refuses the
  request with the reason, before decoding it, and only its connection closes.

A decode holds what it took until its session has turned the events into
rows; then the loop releases it all (:meth:`DecodeGrant.release`). A waiting
connection holds nothing: what it decoded before the wait was released, so
waits never hold memory others wait for (no deadlock).

Decodes on the event loop itself (reads of a few hundred bytes, and what a
forward handshake's verdict releases) take nothing from the budget: at most
:data:`LOOP_DECODE_MAX_COST_BYTES` each, one at a time; a request that would
cost more is put off, and decoded in a worker thread under the budget.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import trio

from appliance import defaults
from appliance.protocols.decode_gate import Admission, Admit

__all__ = ["LOOP_DECODE_MAX_COST_BYTES", "DecodeBudget", "DecodeGrant"]

#: Cost a decode on the event loop may take without the budget, in bytes.
#: Reads decoded there are at most 512 bytes (``INLINE_DECODE_MAX_BYTES``):
#: uncompressed, at most 166 bytes of memory a byte, about 85 KiB; a PING's
#: worth held during the handshake (4,096 bytes) about 680 KiB. Compressed
#: bodies (1,032 times more, at worst) are put off and go to a worker thread.
LOOP_DECODE_MAX_COST_BYTES: Final = 1024 * 1024


#: Bytes a decode in a worker thread takes of the budget at least, when free,
#: so that small requests share one take; given back with the rest.
_GRANT_STEP_BYTES: Final = 1024 * 1024


@dataclass(slots=True)
class _Waiter:
    cost: int
    event: trio.Event = field(default_factory=trio.Event)
    granted: bool = False


class DecodeBudget:
    """Bytes of decoding memory, shared by every connection of the process.

    Taken and released from the event loop; :meth:`try_take` may also be
    called from a worker thread (a lock guards the count).

    Args:
        capacity: the bytes all decodes together may claim (``decode_budget_bytes``).
        wait_seconds: longest a connection waits for room (:meth:`acquire`).
    """

    def __init__(
        self,
        capacity: int = defaults.DECODE_BUDGET_BYTES,
        wait_seconds: float = defaults.DECODE_BUDGET_WAIT_SECONDS,
    ) -> None:
        if capacity < 1:
            raise ValueError("decode budget capacity must be at least 1")
        self.capacity = capacity
        self.wait_seconds = wait_seconds
        self._lock = threading.Lock()
        self._used = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def used(self) -> int:
        """Bytes taken now."""
        return self._used

    @property
    def waiting(self) -> int:
        """Connections waiting for room."""
        return len(self._waiters)

    def too_large(self, cost: int) -> str | None:
        """Why ``cost`` can never be granted (larger than the whole budget), or None."""
        if cost <= self.capacity:
            return None
        return (
            f"decoding this request may take {cost} bytes of memory, more than the whole "
            f"decode budget of {self.capacity} (decode_budget_bytes)"
        )

    def try_take(self, cost: int) -> bool:
        """Take ``cost`` if it fits now and nobody waits before it (any thread)."""
        with self._lock:
            if self._waiters or self._used + cost > self.capacity:
                return False
            self._used += cost
            return True

    async def acquire(self, cost: int) -> str | None:
        """Wait for ``cost``, first come first served; None once taken, else why not.

        Gives up after ``wait_seconds`` (the reason says so), and at once
        for a cost over the capacity. Cancellation (the connection ends)
        takes nothing.
        """
        refusal = self.too_large(cost)
        if refusal is not None:
            await trio.lowlevel.checkpoint()
            return refusal
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.try_take(cost):
            # Taken: no cancellation may come between this and the caller's release.
            await trio.lowlevel.cancel_shielded_checkpoint()
            return None
        waiter = _Waiter(cost)
        with self._lock:
            self._waiters.append(waiter)
        settled = False
        try:
            with trio.move_on_after(self.wait_seconds):
                await waiter.event.wait()
            settled = True
        finally:
            if not settled:
                self._withdraw(waiter)  # cancelled: the connection ends, keeps nothing
        if waiter.granted:
            return None
        self._withdraw(waiter)
        return (
            f"decode budget busy: waited {self.wait_seconds:g}s for {cost} bytes of the "
            f"{self.capacity} (decode_budget_bytes)"
        )

    def _withdraw(self, waiter: _Waiter) -> None:
        """``waiter`` gives up: out of the queue, or what it was granted given back."""
        with self._lock:
            if waiter.granted:
                self._used -= waiter.cost
            else:
                self._waiters.remove(waiter)
        self._grant_waiters()  # those behind it may fit now

    def release(self, cost: int) -> None:
        """Give back ``cost`` (on the event loop) and admit whoever waits and fits now."""
        if cost <= 0:
            return
        with self._lock:
            self._used -= cost
            assert self._used >= 0, "decode budget released more than it took"
        self._grant_waiters()

    def _grant_waiters(self) -> None:
        woken: list[_Waiter] = []
        with self._lock:
            while self._waiters and self._used + self._waiters[0].cost <= self.capacity:
                waiter = self._waiters.popleft()
                self._used += waiter.cost
                waiter.granted = True
                woken.append(waiter)
        for waiter in woken:
            waiter.event.set()


class DecodeGrant:
    """One decode's share of the budget: the gate its codec asks (:data:`DecodeGate`).

    Made by the answering loop for each decode, handed to the session with
    the unit (``Arrival.grant``), released by the loop once the session
    returned. Costs are taken from ``prepaid`` first (what the loop waited
    for), then from the budget if it has room now; otherwise the request is
    put off (:attr:`Admit.LATER`): the codec keeps its cost, which the loop
    waits for (``Session.deferred_cost``).

    Args:
        budget: the process's budget, or None: nothing is counted (every cost goes).
        prepaid: bytes already taken for this decode.
        on_loop: the decode runs on the event loop: costs up to
            :data:`LOOP_DECODE_MAX_COST_BYTES` in all go without the budget,
            larger ones are put off.
    """

    __slots__ = ("_budget", "_free", "_held", "_on_loop", "_used")

    def __init__(
        self, budget: DecodeBudget | None, *, prepaid: int = 0, on_loop: bool = False
    ) -> None:
        self._budget = budget
        self._held = prepaid
        self._used = 0
        self._on_loop = on_loop
        self._free = LOOP_DECODE_MAX_COST_BYTES if on_loop else 0

    def __call__(self, cost: int) -> Admission:
        """The gate: may the codec decode a request of worst-case ``cost`` now?"""
        budget = self._budget
        if budget is None:
            return Admit.GO
        refusal = budget.too_large(cost)
        if refusal is not None:
            return refusal
        if self._used + cost <= self._held + self._free:
            self._used += cost
            return Admit.GO
        if not self._on_loop:
            need = self._used + cost - self._held - self._free
            # A step at a time when it is free: a read of many small requests
            # (Message mode) then takes the budget's lock once, not per request.
            for take in (max(need, _GRANT_STEP_BYTES), need):
                if budget.try_take(take):
                    self._held += take
                    self._used += cost
                    return Admit.GO
        return Admit.LATER

    def release(self) -> None:
        """Give back everything this decode took (on the event loop)."""
        if self._budget is not None:
            self._budget.release(self._held)
        self._held = self._used = 0
