"""Log Courier's mapping: one complete payload (``PayloadReceived``) becomes one RowBlock.

Mapping into ``events`` (docs/courier.md). The codec
(:mod:`appliance.protocols.courier`) has already turned each event into its
row values as it decoded it (to bound memory) and applied the
strict-string rules (docs/decisions.md#strict-strings); here they become columns:

* the record is the event's JSON object; an event that is not a JSON object
  is kept as ``{"message": <raw text>}``;
* ``tag`` is the event's ``type`` field when it is a non-empty string (Log
  Courier's ``fields: {type: ...}`` convention), else the listener's ``tag``;
  a ``type`` that is not valid UTF-8 (a lone surrogate) or is over
  ``MAX_TAG_BYTES`` also falls back to the listener's tag (the driver counts
  and logs it, ``events.invalid_field``), and the event is stored;
* ``host`` is ``host.name`` (ECS mode), ``beat.hostname`` or a string
  ``host`` field; one that is not valid UTF-8 or is over ``MAX_HOST_BYTES``
  becomes null, counted and logged the same way;
* the event time is ``@timestamp`` (RFC 3339, nanoseconds kept, ASCII digits
  only, within int64 nanoseconds), else the receive time;
* ``batch_id`` is the payload's nonce in lowercase hex (32 ASCII characters),
  ``:``, and a 16-hex digest of the decompressed payload (a restarted old
  client that repeats nonces is not taken for a resend; PayloadReceived.batch_id;
  checked against ``MAX_BATCH_ID_BYTES``), so a payload resent after a
  reconnect is acked again without a second write (the writer dedupes by
  ``(protocol, source, batch_id)``).

A column whose value is the same for every row (no event named a type, or
none a host) is passed once, not once per row.
"""

from __future__ import annotations

from appliance.blocks.block import RowBlock
from appliance.blocks.errors import InvalidText
from appliance.blocks.text import MAX_BATCH_ID_BYTES, check_text
from appliance.protocols.courier import PayloadReceived
from appliance.protocols.errors import RemoteProtocolError

__all__ = ["payload_block"]


def payload_block(
    payload: PayloadReceived, *, tag: str, source: str, peer: str, received_at_ns: int
) -> RowBlock:
    """The rows of one payload; ``tag`` is the listener's, for events that name no type.

    Raises:
        RemoteProtocolError: the batch id breaks the text rule (it cannot:
            a nonce is 16 bytes, 32 hex characters; checked all the same).
    """
    types = payload.types
    tags: str | list[str] = tag
    if any(t is not None for t in types):
        tags = [tag if t is None else t for t in types]
    hosts = payload.hosts if any(h is not None for h in payload.hosts) else None
    try:
        batch_id = check_text(payload.batch_id, "batch id (nonce)", MAX_BATCH_ID_BYTES)
    except InvalidText as exc:
        raise RemoteProtocolError(exc.reason) from None
    return RowBlock(
        protocol="courier",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=batch_id,
        tag=tags,
        host=hosts,
        times_ns=payload.times_ns,
        records=payload.records,
    )
