"""Logjam's mapping: one data message (``DataMessage``) becomes a RowBlock of one row.

What each message becomes (docs/logjam.md):

* ``tag``: the topic; ``host``: the body's ``host`` when it is a non-empty
  string that is valid UTF-8 of at most ``MAX_HOST_BYTES``; a string host
  that is not is stored as null (the record keeps it; the driver counts it in
  ``hosts_dropped`` and logs ``message.host_dropped``);
* ``source``: the CURVE key's name (the ZAP user id), ``anonymous`` without CURVE;
* ``peer``: ZeroMQ's ``Peer-Address`` of the message;
* event time: the body's ``started_ms`` (a Logjam request's start, in ms)
  when it is an integer, else the meta frame's ``created_ms``; 0 or an
  out-of-range value means the receive time;
* ``record``: the JSON body, plus ``"_logjam": {"app_env", "device",
  "sequence", "created_ms"}`` so the app-env survives into the table;
* ``batch_id``: app-env, device, sequence, created_ms and a digest of topic
  and body: the writer acknowledges a resent message again without a second row.
"""

from __future__ import annotations

from typing import Final

from appliance.blocks.block import RowBlock
from appliance.blocks.records import record_json
from appliance.blocks.timefmt import ns_in_range
from appliance.protocols.logjam import DataMessage

__all__ = ["message_block"]

_NS_PER_MS: Final = 1_000_000


def _ms_to_ns(ms: object) -> int | None:
    """Epoch ms as ns when positive and within the table's int64 ns, else None."""
    if type(ms) is not int or ms <= 0:
        return None
    ns = ms * _NS_PER_MS
    return ns if ns_in_range(ns) else None


def _event_ns(message: DataMessage) -> int | None:
    started = _ms_to_ns(message.record.get("started_ms"))
    return started if started is not None else _ms_to_ns(message.meta.created_ms)


def message_block(message: DataMessage, *, source: str, peer: str, received_at_ns: int) -> RowBlock:
    """The one row of a data message."""
    record = dict(message.record)
    record["_logjam"] = {
        "app_env": message.app_env,
        "device": message.meta.device,
        "sequence": message.meta.sequence,
        "created_ms": message.meta.created_ms,
    }
    return RowBlock(
        protocol="logjam",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=message.batch_id,
        tag=message.topic,
        host=message.host,
        times_ns=[_event_ns(message)],
        records=[record_json(record)],
    )
