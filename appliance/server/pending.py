"""The bound on one connection's waiting answers: by the bytes they hold, and a count as a guard.

A connection stops reading while its waiting answers (acks not yet durable,
replies not yet sent) are over budget, so the peer is slowed by TCP's window
or ZeroMQ's queue (docs/decisions.md#every-queue-has-a-limit). The budget is in
bytes because that is what the answers hold: a bound by request count stalls
a client that pipelines many small requests (npm ``@fluent-org/logger`` in
Message mode sends one request per event, thousands at once, and times an
ack out after 20 s) while it lets a few huge requests hold a lot of memory.

Each answer is charged its block's bytes (:attr:`RowBlock.nbytes`, which
already counts a per-row overhead) plus :data:`ENTRY_BYTES` for the queue
entry, ticket and answer themselves; a reply with no block is charged
:data:`ENTRY_BYTES` alone. The count bound (``max_pending_acks``) stays as a
guard against floods of requests far smaller than their bookkeeping.

One request larger than the whole budget is still taken when nothing else
waits: refusing it would stall the connection for ever (its size is bounded
by the codec's own limits, ``max_request_bytes`` and friends).
"""

from __future__ import annotations

from typing import Final

import trio

__all__ = ["ENTRY_BYTES", "PendingBudget"]

#: Bytes charged for one waiting answer besides its block: the queue entry,
#: its durability ticket and the answer (measured with tracemalloc at about
#: 400 bytes for a forward ack; rounded up).
ENTRY_BYTES: Final = 512


class PendingBudget:
    """Bytes and answers one connection may have waiting; :meth:`acquire` waits when full.

    Only the connection's reader acquires and only its answerers release, so
    the waiters are one task at most; the bound is exact.

    Args:
        max_bytes: bytes the waiting answers may hold together.
        max_answers: answers that may wait, whatever their size.
    """

    def __init__(self, max_bytes: int, max_answers: int) -> None:
        if max_bytes < 1 or max_answers < 1:
            raise ValueError("a pending budget needs at least one byte and one answer")
        self.max_bytes = max_bytes
        self.max_answers = max_answers
        self.bytes = 0
        self.answers = 0
        self._lot = trio.lowlevel.ParkingLot()

    def _fits(self, nbytes: int) -> bool:
        if self.answers == 0:
            return True  # one answer always fits: an oversized request must not stall for ever
        return self.answers < self.max_answers and self.bytes + nbytes <= self.max_bytes

    async def acquire(self, nbytes: int) -> None:
        """Wait until an answer holding ``nbytes`` (plus :data:`ENTRY_BYTES`) fits, then take it."""
        charge = nbytes + ENTRY_BYTES
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while not self._fits(charge):
            waited = True
            await self._lot.park()
        self.bytes += charge
        self.answers += 1
        if not waited:
            # A checkpoint that cannot be cancelled, as trio.Semaphore.acquire does:
            # the reader yields to the answerers but keeps what it took.
            await trio.lowlevel.cancel_shielded_checkpoint()

    def release(self, nbytes: int) -> None:
        """Give back an answer taken with ``nbytes``."""
        self.bytes -= nbytes + ENTRY_BYTES
        self.answers -= 1
        self._lot.unpark_all()
