"""The WebSocket live tail (``/tail``): committed rows fanned out to bounded per-client queues.

The writer calls :meth:`TailHub.publish` with the blocks of each commit;
every tail connection has a queue of at most ``tail_queue_events`` events. A
full queue drops the new events and counts them, so a slow tail client never
slows a commit; once the client has caught up it gets ``{"dropped": n}``.
:func:`serve_tail` pushes one connection's rows until the client leaves, the
service stops, or the client reads nothing for ``send_timeout`` seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from appliance.blocks.block import RowBlock
from appliance.protocols.websocket_messages import TailFilter, dropped_json
from appliance.rows.websocket import tail_events_json
from appliance.server.lifecycle import Lifecycle
from appliance.server.transports.websocket import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    SHUTTING_DOWN,
)

__all__ = ["TailHub", "TailSubscription", "serve_tail"]


class TailSubscription:
    """One tail connection's bounded queue of committed rows.

    Args:
        tail_filter: which rows it wants.
        max_events: rows that may wait; further ones are dropped and counted.
    """

    def __init__(self, tail_filter: TailFilter, max_events: int) -> None:
        self.filter = tail_filter
        self.max_events = max_events
        self._queue: deque[tuple[RowBlock, list[int]]] = deque()
        self._queued = 0
        #: Rows dropped since the client was last told.
        self.dropped = 0
        #: Rows dropped over the connection's life.
        self.dropped_total = 0
        self._wake = trio.Event()

    def offer(self, blocks: Sequence[RowBlock]) -> None:
        """Queue the wanted rows of ``blocks``, dropping what does not fit (never waits)."""
        added = False
        for block in blocks:
            rows = self.filter.rows(block)
            if not rows:
                continue
            if self._queued + len(rows) > self.max_events:
                self.dropped += len(rows)
                self.dropped_total += len(rows)
                added = True
                continue
            self._queue.append((block, rows))
            self._queued += len(rows)
            added = True
        if added:
            self._wake.set()

    async def next(self) -> tuple[list[tuple[RowBlock, list[int]]], int]:
        """Wait for rows or drops; returns the queued rows and the drops since last time."""
        while not self._queue and not self.dropped:
            self._wake = trio.Event()
            await self._wake.wait()
        items = list(self._queue)
        self._queue.clear()
        self._queued = 0
        dropped, self.dropped = self.dropped, 0
        return items, dropped


class TailHub:
    """Fans each commit's blocks out to the tail connections; a writer commit listener."""

    def __init__(self) -> None:
        self._subscriptions: set[TailSubscription] = set()

    def publish(self, blocks: Sequence[RowBlock]) -> None:
        """The writer's :data:`~appliance.lake.writer.CommitListener`: never waits."""
        for subscription in self._subscriptions:
            subscription.offer(blocks)

    @contextmanager
    def subscribe(self, tail_filter: TailFilter, max_events: int) -> Iterator[TailSubscription]:
        """A subscription for the duration of the ``with`` block."""
        subscription = TailSubscription(tail_filter, max_events)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        """Tail connections open now."""
        return len(self._subscriptions)

    @property
    def dropped_events(self) -> int:
        """Events dropped so far by the tail connections open now."""
        return sum(s.dropped_total for s in self._subscriptions)


async def serve_tail(
    ws: WebSocketConnection, sub: TailSubscription, lifecycle: Lifecycle, send_timeout: float
) -> tuple[int, str]:
    """Push ``sub``'s rows to ``ws`` until it ends; the close code and reason."""
    outcome = (CLOSE_NORMAL, "")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, ws, nursery.cancel_scope)
        outcome = await _push(ws, sub, lifecycle, send_timeout)
        nursery.cancel_scope.cancel()
    return outcome


async def _push(
    ws: WebSocketConnection, sub: TailSubscription, lifecycle: Lifecycle, send_timeout: float
) -> tuple[int, str]:
    while True:
        items: list[tuple[RowBlock, list[int]]] = []
        dropped = 0
        with lifecycle.receiving() as stopping:
            items, dropped = await sub.next()
        if stopping.cancelled_caught:
            return CLOSE_GOING_AWAY, SHUTTING_DOWN
        texts = [text for block, rows in items for text in tail_events_json(block, rows)]
        if dropped:
            texts.append(dropped_json(dropped))
        with trio.move_on_after(send_timeout) as stalled:
            try:
                for text in texts:
                    await ws.send_message(text)
            except ConnectionClosed:
                return CLOSE_NORMAL, ""
        if stalled.cancelled_caught:
            return CLOSE_POLICY, f"read nothing for {send_timeout}s"


async def _drain(ws: WebSocketConnection, tail: trio.CancelScope) -> None:
    """Read (and ignore) what a tail client sends, so its close frame is seen."""
    try:
        while True:
            await ws.get_message()
    except ConnectionClosed:
        tail.cancel()
