"""Group commit of every connection's batches into the ``events`` table (DESIGN §2).

Connections :meth:`LakeWriter.submit` a :class:`~appliance.lake.rows.RowBlock`
and get a :class:`CommitTicket`; the ticket resolves only once the rows are in
a successful Delta commit, and only then does the connection acknowledge.

Tasks and bounds::

    submit() --(bounded channel: queue_blocks)--> collector
        collector: dedupe, open group (<= commit_max_rows / commit_max_bytes,
                   sealed after commit_max_delay_seconds)
        --(channel of 1 sealed group)--> committer
        committer: Arrow + deltalake in a worker thread (one at a time),
                   retried with capped exponential backoff until it succeeds

At most one group commits, one waits sealed and one is open, so memory is
bounded and a slow disk fills the channel, which stops connections reading
(TCP backpressure), never grows memory.

Deduplication: a batch with a globally unique id (Fluentd chunk, Courier
nonce, ...) that was committed within ``dedupe_window_seconds`` is acked
again without a second write; one that is still pending is attached to the
pending commit.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar, TypeVarTuple, Unpack

import trio

from appliance.lake.errors import CommitError
from appliance.lake.rows import DedupeKey, RowBlock, blocks_to_arrow
from appliance.lake.table import EventsTable
from appliance.logs import get_logger

__all__ = ["CommitListener", "CommitTicket", "LakeWriter", "WriterSettings"]

log = get_logger("lake")

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")

#: Rows in one commit before it is sealed.
DEFAULT_COMMIT_MAX_ROWS: Final = 100_000
#: Approximate bytes of records in one commit before it is sealed.
DEFAULT_COMMIT_MAX_BYTES: Final = 64 * 1024 * 1024
#: Seconds a commit group stays open before it is sealed (the ack latency floor).
DEFAULT_COMMIT_MAX_DELAY_SECONDS: Final = 0.25
#: Blocks that may wait between the connections and the collector.
DEFAULT_QUEUE_BLOCKS: Final = 64
#: First and largest wait between retries of a failed commit, in seconds.
DEFAULT_RETRY_INITIAL_SECONDS: Final = 0.5
DEFAULT_RETRY_MAX_SECONDS: Final = 30.0
#: How long, and how many, committed batch ids are remembered for dedupe.
DEFAULT_DEDUPE_WINDOW_SECONDS: Final = 3600.0
DEFAULT_DEDUPE_MAX_KEYS: Final = 1_000_000


#: Told the blocks of each successful commit (the WebSocket live tail). It runs in
#: the committer task, so it must return at once and never raise: it may only
#: hand the blocks on without waiting (``send_nowait``, dropping when full).
CommitListener = Callable[[Sequence[RowBlock]], None]


@dataclass(frozen=True, slots=True)
class WriterSettings:
    """Thresholds and limits of the group-commit writer (config ``[lake]``)."""

    commit_max_rows: int = DEFAULT_COMMIT_MAX_ROWS
    commit_max_bytes: int = DEFAULT_COMMIT_MAX_BYTES
    commit_max_delay_seconds: float = DEFAULT_COMMIT_MAX_DELAY_SECONDS
    queue_blocks: int = DEFAULT_QUEUE_BLOCKS
    retry_initial_seconds: float = DEFAULT_RETRY_INITIAL_SECONDS
    retry_max_seconds: float = DEFAULT_RETRY_MAX_SECONDS
    dedupe_window_seconds: float = DEFAULT_DEDUPE_WINDOW_SECONDS
    dedupe_max_keys: int = DEFAULT_DEDUPE_MAX_KEYS


class CommitTicket:
    """Resolves when a block's rows are committed, or the writer gives up (shutdown)."""

    __slots__ = ("_done", "committed", "duplicate")

    def __init__(self) -> None:
        self._done = trio.Event()
        #: True once the rows are in a successful commit.
        self.committed = False
        #: True when the batch had been committed before and was not written again.
        self.duplicate = False

    def _resolve(self, committed: bool, *, duplicate: bool = False) -> None:
        self.committed = committed
        self.duplicate = duplicate
        self._done.set()

    @property
    def done(self) -> bool:
        """Whether the ticket has resolved."""
        return self._done.is_set()

    async def wait(self) -> bool:
        """Wait for the outcome; True means committed and safe to acknowledge."""
        await self._done.wait()
        return self.committed


@dataclass(slots=True)
class _Group:
    blocks: list[RowBlock] = field(default_factory=list)
    tickets: list[CommitTicket] = field(default_factory=list)
    keys: list[DedupeKey] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    deadline: float = math.inf


class LakeWriter:
    """The single committer of one appliance node to its ``events`` table.

    Args:
        table: the table, driven only from this writer's worker thread.
        app_id: the node's stable id, used as the Delta app transaction id.
        settings: thresholds and limits.
    """

    def __init__(
        self, table: EventsTable, app_id: str, settings: WriterSettings | None = None
    ) -> None:
        self.table = table
        self.app_id = app_id
        self.settings = settings or WriterSettings()
        self._send, self._receive = trio.open_memory_channel[tuple[RowBlock, CommitTicket]](
            self.settings.queue_blocks
        )
        self._sealed_send, self._sealed_receive = trio.open_memory_channel[_Group](1)
        # One worker thread at a time touches the table (DESIGN §3: one
        # committer per table per appliance).
        self._limiter = trio.CapacityLimiter(1)
        self._next_version = 1
        self._committed: OrderedDict[DedupeKey, float] = OrderedDict()
        self._pending: dict[DedupeKey, list[CommitTicket]] = {}
        #: Counters for logs, tests and benchmarks.
        self.commits = 0
        self.rows_committed = 0
        self.duplicates = 0
        self.failed_attempts = 0
        #: Called after every successful commit with its blocks (see CommitListener).
        self.commit_listeners: list[CommitListener] = []

    async def open(self) -> None:
        """Open or create the table, and recover the commit sequence and dedupe keys."""
        await trio.to_thread.run_sync(self.table.open_or_create, limiter=self._limiter)
        last = await trio.to_thread.run_sync(
            self.table.committed_version, self.app_id, limiter=self._limiter
        )
        self._next_version = (last or 0) + 1
        # received_at is wall-clock time, so the cutoff is too.
        cutoff_ns = time.time_ns() - int(self.settings.dedupe_window_seconds * 1e9)
        keys = await trio.to_thread.run_sync(
            self.table.recent_batch_keys, cutoff_ns, limiter=self._limiter
        )
        now = trio.current_time()
        for key in keys:
            self._remember(key, now)
        log.info(
            "table.open",
            uri=self.table.uri,
            app_id=self.app_id,
            next_commit=self._next_version,
            dedupe_keys=len(keys),
        )

    async def run_exclusive(self, fn: Callable[[Unpack[_Args]], _T], *args: *_Args) -> _T:
        """Run the blocking ``fn(*args)`` in a worker thread, never alongside a commit.

        Table maintenance (compaction, checkpoints, vacuum) goes through here
        so that it is serialized with this writer's commits: both hold the
        same one-token limiter. A commit that is due waits until ``fn``
        returns. Cancellation waits for ``fn`` too: a thread cannot be stopped.
        """
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def submit(self, block: RowBlock) -> CommitTicket:
        """Queue a block for commit; waits while the queue is full (backpressure).

        A block with no rows resolves at once: there is nothing to write, and
        its batch may be acknowledged.

        Raises:
            trio.ClosedResourceError: the writer no longer accepts blocks (shutdown).
        """
        ticket = CommitTicket()
        if block.rows == 0:
            ticket._resolve(True)
            return ticket
        await self._send.send((block, ticket))
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

    def _remember(self, key: DedupeKey, now: float) -> None:
        self._committed[key] = now
        self._committed.move_to_end(key)
        while len(self._committed) > self.settings.dedupe_max_keys:
            self._committed.popitem(last=False)

    def _already_committed(self, key: DedupeKey, now: float) -> bool:
        stamp = self._committed.get(key)
        if stamp is None:
            return False
        if now - stamp > self.settings.dedupe_window_seconds:
            del self._committed[key]
            return False
        return True

    def _admit(self, group: _Group, block: RowBlock, ticket: CommitTicket) -> None:
        now = trio.current_time()
        key = block.dedupe_key
        if key is not None:
            if self._already_committed(key, now):
                self.duplicates += 1
                log.info("batch.duplicate", protocol=key[0], batch_id=key[2], state="committed")
                ticket._resolve(True, duplicate=True)
                return
            waiting = self._pending.get(key)
            if waiting is not None:
                self.duplicates += 1
                log.info("batch.duplicate", protocol=key[0], batch_id=key[2], state="pending")
                waiting.append(ticket)
                return
            self._pending[key] = [ticket]
            group.keys.append(key)
        else:
            group.tickets.append(ticket)
        if not group.blocks:
            group.deadline = now + self.settings.commit_max_delay_seconds
        group.blocks.append(block)
        group.rows += block.rows
        group.nbytes += block.nbytes

    def _full(self, group: _Group) -> bool:
        return (
            group.rows >= self.settings.commit_max_rows
            or group.nbytes >= self.settings.commit_max_bytes
        )

    async def _collect(self) -> None:
        group = _Group()
        async with self._sealed_send:
            while True:
                item: tuple[RowBlock, CommitTicket] | None = None
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
        version = self._next_version
        data = await trio.to_thread.run_sync(blocks_to_arrow, group.blocks, limiter=self._limiter)
        backoff = self.settings.retry_initial_seconds
        while True:
            try:
                wrote = await trio.to_thread.run_sync(
                    self.table.commit, data, self.app_id, version, limiter=self._limiter
                )
            except CommitError as exc:
                # No ack for anything in the group until a retry succeeds;
                # clients that time out resend, and the resend is deduped.
                self.failed_attempts += 1
                log.error(
                    "commit.failed",
                    commit=version,
                    rows=group.rows,
                    retry_in_seconds=round(backoff, 3),
                    reason=str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__,
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_max_seconds)
                continue
            break
        self._next_version = version + 1
        self.commits += 1
        self.rows_committed += group.rows
        log.debug(
            "commit.ok", commit=version, rows=group.rows, blocks=len(group.blocks), wrote=wrote
        )
        now = trio.current_time()
        for ticket in group.tickets:
            ticket._resolve(True)
        for key in group.keys:
            self._remember(key, now)
            for ticket in self._pending.pop(key, []):
                ticket._resolve(True)
        for listener in self.commit_listeners:
            listener(group.blocks)
