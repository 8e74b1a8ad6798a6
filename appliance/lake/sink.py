"""What a batch sink is: where a writer's blocks go, by ``[lake] ack`` mode.

Two sinks, one per ack mode, both committing through
:class:`~appliance.lake.committer.TableCommitter`:

* :class:`~appliance.lake.commit_sink.CommitSink` (``ack = "commit"``): a
  ticket resolves once the block's rows are in a successful Delta commit;
* :class:`~appliance.lake.log_sink.LogSink` (``ack = "wal"``): a ticket
  resolves once the block's record is fdatasynced in the write-ahead log,
  and the log is committed to the table in large groups.

The ticket contract, one for every driver: ``wait()`` returns only once the
block is durable, and raises :class:`~appliance.blocks.errors.BlockRefused`
when it cannot be stored. It has no "not durable" outcome: at shutdown the
sink makes everything it accepted durable, and a driver that is cancelled
first simply sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from appliance.blocks.block import RowBlock

__all__ = ["BatchSink", "CommitListener", "Ticket"]

#: Told the blocks of each successful commit (the WebSocket live tail). It runs in
#: the committer task, so it must return at once and never raise: it may only
#: hand the blocks on without waiting (``send_nowait``, dropping when full).
CommitListener = Callable[[Sequence[RowBlock]], None]


class Ticket(Protocol):
    """A submitted block's promise: ``wait()`` returns once it is durable."""

    #: True when the batch was stored before and was not written again.
    duplicate: bool

    @property
    def done(self) -> bool:
        """Whether the ticket has resolved."""
        ...

    async def wait(self) -> None:
        """Wait until the block is durable (raises BlockRefused when it cannot be stored)."""
        ...


class BatchSink(Protocol):
    """Where checked blocks go until they are durable."""

    async def submit(self, block: RowBlock, nbytes: int) -> Ticket:
        """Queue a checked block of ``nbytes``; waits while the sink is full (backpressure)."""
        ...

    async def close_input(self) -> None:
        """Accept no more blocks; :meth:`run` makes what it holds durable and returns."""
        ...

    async def run(self) -> None:
        """Work until :meth:`close_input` and every accepted block is durable."""
        ...
