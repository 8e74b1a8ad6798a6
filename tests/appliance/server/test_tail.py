"""The live tail's hub and subscriptions: bounded queues that drop and count, never wait."""

from __future__ import annotations

import pytest

from appliance.blocks.block import RowBlock
from appliance.protocols.websocket_messages import TailFilter
from appliance.server.tail import TailHub, TailSubscription


def block(rows: int, tag: str = "t") -> RowBlock:
    return RowBlock("forward", "s", "p", 1, None, tag, None, [None] * rows, ["{}"] * rows)


def test_full_tail_queue_drops_and_counts() -> None:
    sub = TailSubscription(TailFilter(), max_events=5)
    sub.offer([block(3), block(3), block(2)])
    assert sub.dropped == 3
    assert sub.dropped_total == 3


@pytest.mark.trio
async def test_subscription_reports_drops_after_the_queued_rows() -> None:
    hub = TailHub()
    with hub.subscribe(TailFilter("t"), 2) as sub:
        hub.publish([block(2), block(5), block(1, tag="x")])
        items, dropped = await sub.next()
        assert [len(rows) for _, rows in items] == [2]
        assert dropped == 5
        hub.publish([block(1)])
        items, dropped = await sub.next()
        assert ([len(rows) for _, rows in items], dropped) == ([1], 0)
    assert hub.subscribers == 0
