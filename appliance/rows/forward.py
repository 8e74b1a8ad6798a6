"""Fluentd forward's mapping: one request's events (``EventsReceived``) become one RowBlock.

Columns (docs/table.md):

* ``tag``: the request's tag, one for every row;
* ``host``: the client's hostname from the PING of a secured connection
  (``security`` on), else null;
* ``batch_id``: the request's ``chunk`` option, so a chunk resent after a
  reconnect is acked again without a second write; none without a chunk;
* event time: the entry's EventTime or integer seconds (the codec's
  ``times_ns``), None meaning the receive time;
* ``record``: the entry's record as JSON text (:mod:`appliance.blocks.records`;
  the codec's fast path may have rendered it already, ``EventsReceived.texts``).

The codec (:mod:`appliance.protocols.forward`) has checked the tag, the chunk
and the PING's hostname against appliance/blocks/text.py.
"""

from __future__ import annotations

from appliance.blocks.block import RowBlock
from appliance.blocks.records import records_json
from appliance.protocols.forward import EventsReceived

__all__ = ["forward_block"]


def forward_block(
    event: EventsReceived,
    *,
    source: str,
    peer: str,
    received_at_ns: int,
    host: str | None = None,
) -> RowBlock:
    """The rows of one forward request; ``host`` is the PING's hostname, if any."""
    return RowBlock(
        protocol="forward",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=event.chunk.text() if event.chunk is not None else None,
        tag=event.tag,
        host=host,
        times_ns=event.times_ns,
        records=event.texts if event.texts is not None else records_json(event.records),
    )
