"""Fluentd forward's mapping (appliance/rows/forward.py): one request, one block."""

from __future__ import annotations

import json

from appliance.blocks.block import ROW_OVERHEAD_BYTES
from appliance.blocks.checks import check_block
from appliance.protocols.forward import Chunk, EventsReceived
from appliance.rows.forward import forward_block

SOURCE = "anonymous"
PEER = "192.0.2.1:5000"


def test_a_request_is_one_block() -> None:
    event = EventsReceived("app.web", "forward", [5, None], [{"a": 1}, {"b": b"x"}], Chunk(b"c1"))
    block = forward_block(event, source=SOURCE, peer=PEER, received_at_ns=9)
    assert (block.protocol, block.source, block.peer, block.received_at_ns) == (
        "forward", SOURCE, PEER, 9
    )  # fmt: skip
    assert (block.tag, block.host, block.batch_id) == ("app.web", None, "c1")
    assert block.times_ns == [5, None]
    assert [json.loads(r) for r in block.records] == [{"a": 1}, {"b": "x"}]


def test_no_chunk_no_batch_id_and_the_ping_hostname_is_the_host() -> None:
    event = EventsReceived("t", "message", [None], [{}], None)
    block = forward_block(event, source=SOURCE, peer=PEER, received_at_ns=1, host="web1")
    assert (block.batch_id, block.host) == (None, "web1")


def test_block_counts_the_tag_host_and_chunk_once_per_row() -> None:
    event = EventsReceived(
        "t" * 1000, "forward", [None, None], [{"a": 1}, {"a": 2}], Chunk(b"c" * 200, "str")
    )
    block = forward_block(event, source=SOURCE, peer=PEER, received_at_ns=1, host="h" * 100)
    strings = len("forward") + len(SOURCE) + len(PEER) + 1000 + 100 + 200
    assert block.nbytes == 2 * len('{"a":1}') + 2 * (ROW_OVERHEAD_BYTES + strings)
    # What the writer's byte limits count for it.
    assert block.nbytes == check_block(block)
