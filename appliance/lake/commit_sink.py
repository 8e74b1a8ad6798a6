"""``ack = "commit"``: a block is acknowledged once its rows are in a Delta commit.

Tasks and bounds::

    submit() --(bounded channel: queue_blocks)--> collector
        collector: dedupe, open group (<= commit_max_rows / commit_max_bytes /
                   MAX_COMMIT_BATCH_IDS, sealed after commit_max_delay_seconds)
        --(channel of 1 sealed group)--> committer
        committer: TableCommitter.store (Arrow and deltalake in worker
                   threads), retried with capped backoff until it succeeds

At most one group commits, one waits sealed and one is open, so memory is
bounded and a slow disk fills the channel, which stops connections reading
(TCP backpressure), never grows memory.

Deduplication: a batch with a globally unique id (Fluentd chunk, Courier
nonce, ...) that is known as stored (:class:`~appliance.lake.dedupe.StoredBatches`:
this node's commits, and other writers' commits the protocol has read) is
acked again without a second write; one that is still pending is attached
to the pending commit; one that another writer stored while it waited is
left out of the commit and acked as a duplicate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import BlockRefused
from appliance.blocks.identity import BatchDigest
from appliance.lake.commit_info import MAX_COMMIT_BATCH_IDS
from appliance.lake.committer import TableCommitter, block_digest
from appliance.lake.settings import WriterSettings
from appliance.lake.sink import CommitListener
from appliance.logs import get_logger
from appliance.metrics import Metrics

__all__ = ["CommitSink", "CommitTicket"]

log = get_logger("lake")


class CommitTicket:
    """Resolves when a block's rows are committed; refused when they cannot be stored."""

    __slots__ = ("_done", "duplicate", "refused")

    def __init__(self) -> None:
        self._done = trio.Event()
        #: True when the batch had been committed before and was not written again.
        self.duplicate = False
        #: Why the block cannot be stored, once the writer refused it.
        self.refused: BlockRefused | None = None

    def _resolve(self, *, duplicate: bool = False) -> None:
        self.duplicate = duplicate
        self._done.set()

    def _refuse(self, error: BlockRefused) -> None:
        self.refused = error
        self._done.set()

    @property
    def done(self) -> bool:
        """Whether the ticket has resolved (committed or refused)."""
        return self._done.is_set()

    async def wait(self) -> None:
        """Wait until the block is committed: then, and only then, acknowledge it.

        Raises:
            BlockRefused: the block cannot be stored; do not acknowledge it.
        """
        await self._done.wait()
        if self.refused is not None:
            raise self.refused


@dataclass(slots=True)
class _Group:
    blocks: list[RowBlock] = field(default_factory=list)
    #: Per block: its ticket, or None when its digest holds the tickets.
    tickets: list[CommitTicket | None] = field(default_factory=list)
    digests: list[BatchDigest | None] = field(default_factory=list)
    ids: int = 0
    rows: int = 0
    nbytes: int = 0
    deadline: float = math.inf


class CommitSink:
    """Group commit with an ack after the commit (``ack = "commit"``)."""

    def __init__(
        self,
        committer: TableCommitter,
        settings: WriterSettings,
        metrics: Metrics,
        listeners: list[CommitListener],
    ) -> None:
        self._committer = committer
        self.settings = settings
        self._lake = metrics.lake
        self._listeners = listeners
        self._send, self._receive = trio.open_memory_channel[tuple[RowBlock, int, CommitTicket]](
            settings.queue_blocks
        )
        self._sealed_send, self._sealed_receive = trio.open_memory_channel[_Group](1)
        self._pending: dict[BatchDigest, list[CommitTicket]] = {}
        self.duplicates = 0
        self.refused_blocks = 0
        self._lake.queue_capacity.set(settings.queue_blocks)
        self._lake.queue_blocks.set_function(lambda: self._send.statistics().current_buffer_used)

    async def submit(self, block: RowBlock, nbytes: int) -> CommitTicket:
        """Queue a checked block; waits while the queue is full (backpressure)."""
        ticket = CommitTicket()
        if block.rows == 0:
            ticket._resolve()
            return ticket
        await self._send.send((block, nbytes, ticket))
        return ticket

    async def close_input(self) -> None:
        """Accept no more blocks; :meth:`run` commits what is queued and returns."""
        await self._send.aclose()

    async def run(self) -> None:
        """Collect and commit until :meth:`close_input` and every queued block is done."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._collect)
            nursery.start_soon(self._commit_loop)

    # -- collector -----------------------------------------------------------

    def _admit(self, group: _Group, block: RowBlock, nbytes: int, ticket: CommitTicket) -> None:
        now = trio.current_time()
        digest = block_digest(block)
        if digest is not None:
            if self._committer.stored.contains(digest, now):
                self._duplicate(block, "committed", self._lake.dedupe_committed.inc)
                ticket._resolve(duplicate=True)
                return
            waiting = self._pending.get(digest)
            if waiting is not None:
                self._duplicate(block, "pending", self._lake.dedupe_pending.inc)
                waiting.append(ticket)
                return
            self._pending[digest] = [ticket]
            group.digests.append(digest)
            group.tickets.append(None)
            group.ids += 1
        else:
            group.digests.append(None)
            group.tickets.append(ticket)
        if not group.blocks:
            group.deadline = now + self.settings.commit_max_delay_seconds
        group.blocks.append(block)
        group.rows += block.rows
        group.nbytes += nbytes

    def _duplicate(self, block: RowBlock, state: str, count: Callable[[], None] | None) -> None:
        """Count and log a batch acked again without a second write."""
        self.duplicates += 1
        if count is not None:
            count()
        log.info("batch.duplicate", protocol=block.protocol, batch_id=block.batch_id, state=state)

    def _full(self, group: _Group) -> bool:
        return (
            group.rows >= self.settings.commit_max_rows
            or group.nbytes >= self.settings.commit_max_bytes
            or group.ids >= MAX_COMMIT_BATCH_IDS
        )

    async def _collect(self) -> None:
        group = _Group()
        async with self._sealed_send:
            while True:
                item: tuple[RowBlock, int, CommitTicket] | None = None
                # Only the receive runs under the group's deadline, so a
                # timeout can never cancel a hand-over half done.
                with trio.move_on_at(group.deadline):
                    try:
                        item = await self._receive.receive()
                    except trio.EndOfChannel:
                        break
                if item is not None:
                    self._admit(group, *item)
                    if not self._full(group):
                        continue
                if group.blocks:
                    await self._sealed_send.send(group)
                    group = _Group()
            if group.blocks:
                await self._sealed_send.send(group)

    # -- committer -----------------------------------------------------------

    async def _commit_loop(self) -> None:
        async for group in self._sealed_receive:
            await self._commit(group)

    async def _commit(self, group: _Group) -> None:
        stored = await self._committer.store(group.blocks)
        for i, error in stored.refused.items():
            self._refuse(group, i, error)
        committed: list[RowBlock] = []
        for i in range(len(group.blocks)):
            if i in stored.refused:
                continue
            elsewhere = i in stored.elsewhere
            if not elsewhere:
                committed.append(group.blocks[i])
            ticket, digest = group.tickets[i], group.digests[i]
            if ticket is not None:
                ticket._resolve(duplicate=elsewhere)
            if digest is not None:
                for waiting in self._pending.pop(digest, []):
                    waiting._resolve(duplicate=elsewhere)
            if elsewhere:
                self._duplicate(group.blocks[i], "stored elsewhere", None)
        for listener in self._listeners:
            listener(committed)

    def _refuse(self, group: _Group, index: int, error: BlockRefused) -> None:
        block = group.blocks[index]
        self.refused_blocks += 1
        self._lake.blocks_refused.inc()
        log.warning(
            "block.refused", protocol=block.protocol, peer=block.peer, rows=block.rows,
            reason=error.reason,
        )  # fmt: skip
        ticket, digest = group.tickets[index], group.digests[index]
        if ticket is not None:
            ticket._refuse(error)
        if digest is not None:
            for waiting in self._pending.pop(digest, []):
                waiting._refuse(error)
