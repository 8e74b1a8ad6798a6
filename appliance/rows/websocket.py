"""WebSocket's mapping both ways: an ingest message to a RowBlock, committed rows to tail messages.

Ingest (docs/websocket.md): a valid message (``IngestMessage``, parsed and
checked by :mod:`appliance.protocols.websocket_messages`) is one block:
``tag`` the message's, ``batch_id`` the text of its ``id``, the event times
it gave (None: the receive time), its records as JSON text. The protocol has
no ``host``: the column is always null.

Tail: every committed row a tail connection wants is sent as one JSON
message with its columns and the record embedded as JSON (not as text).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from appliance.blocks.block import RowBlock
from appliance.blocks.timefmt import rfc3339_text
from appliance.protocols.websocket_messages import IngestMessage

__all__ = ["ingest_block", "tail_events_json"]


def ingest_block(
    message: IngestMessage, *, source: str, peer: str, received_at_ns: int
) -> RowBlock:
    """The rows of one ingest message (docs/table.md gives the columns; no host)."""
    return RowBlock(
        protocol="websocket",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=message.batch_id,
        tag=message.tag,
        host=None,
        times_ns=message.times_ns,
        records=message.records,
    )


def tail_events_json(block: RowBlock, rows: Sequence[int]) -> list[str]:
    """One tail message per row index of ``block`` (the record embedded as JSON, not text)."""
    out: list[str] = []
    for i in rows:
        time_ns = block.times_ns[i]
        if time_ns is None:
            time_ns = block.received_at_ns
        tag = block.tag if isinstance(block.tag, str) else block.tag[i]
        host = block.host if block.host is None or isinstance(block.host, str) else block.host[i]
        document = {
            "time": rfc3339_text(time_ns),
            "time_ns": time_ns,
            "protocol": block.protocol,
            "tag": tag,
            "source": block.source,
            "peer": block.peer,
            "host": host,
            "batch_id": block.batch_id,
            "record": orjson.Fragment(block.records[i]),
        }
        out.append(orjson.dumps(document).decode())
    return out
