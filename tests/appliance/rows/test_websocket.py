"""WebSocket's mapping (appliance/rows/websocket.py): ingest to rows, rows to tail messages."""

from __future__ import annotations

import json

from appliance.blocks.block import RowBlock
from appliance.protocols.websocket_messages import MessageLimits, parse_ingest
from appliance.rows.websocket import ingest_block, tail_events_json

MESSAGE = json.dumps(
    {
        "id": "m1",
        "tag": "web.app",
        "events": [{"time": 1.5, "record": {"a": 1}}, {"record": {"b": "x"}}],
    }
)


def test_a_message_is_one_block_without_host() -> None:
    message = parse_ingest(MESSAGE, MessageLimits())
    block = ingest_block(message, source="token:t", peer="1.2.3.4:5", received_at_ns=7)
    assert (block.protocol, block.batch_id, block.rows, block.host) == ("websocket", "m1", 2, None)
    assert (block.source, block.peer, block.received_at_ns) == ("token:t", "1.2.3.4:5", 7)
    assert (block.tag, block.times_ns) == ("web.app", (1_500_000_000, None))
    assert block.records == ('{"a":1}', '{"b":"x"}')


def test_an_integer_id_is_its_text() -> None:
    message = parse_ingest(MESSAGE.replace('"m1"', "42"), MessageLimits())
    block = ingest_block(message, source="s", peer="p", received_at_ns=1)
    assert block.batch_id == "42"


def tail_block(tag: str | list[str], host: str | list[str | None] | None = None) -> RowBlock:
    n = 1 if isinstance(tag, str) else len(tag)
    return RowBlock("forward", "src", "peer", 1_000_000_000, "b", tag, host,
                    [None] * n, ['{"k":1}'] * n)  # fmt: skip


def test_tail_event_json() -> None:
    (text,) = tail_events_json(tail_block(["a", "web.x"]), [1])
    document = json.loads(text)
    assert document["tag"] == "web.x"
    assert document["record"] == {"k": 1}
    assert document["time"] == "1970-01-01T00:00:01.000000000Z"
    assert document["time_ns"] == 1_000_000_000
    assert (document["protocol"], document["source"], document["peer"]) == (
        "forward",
        "src",
        "peer",
    )
    assert (document["host"], document["batch_id"]) == (None, "b")


def test_tail_event_json_takes_the_row_s_own_time_and_host() -> None:
    block = RowBlock("lumberjack", "s", "p", 1, None, ["a", "b"], ["h1", None],
                     [5_000_000_000, None], ["{}", "[]"])  # fmt: skip
    first, second = (json.loads(text) for text in tail_events_json(block, [0, 1]))
    assert (first["time_ns"], first["host"], first["record"]) == (5_000_000_000, "h1", {})
    assert (second["time_ns"], second["host"], second["record"]) == (1, None, [])
    assert second["time"] == "1970-01-01T00:00:00.000000001Z"
