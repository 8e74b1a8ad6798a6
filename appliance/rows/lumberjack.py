"""Lumberjack's (Beats') mapping: one complete window (``Window``) becomes one RowBlock.

Mapping into ``events`` (docs/lumberjack.md); the codec
(:mod:`appliance.protocols.lumberjack`) already took each value out of the
record and checked it, this module only fills the defaults:

* the record is a ``J`` frame's JSON text as sent, or a ``D`` frame's pairs
  as a JSON object (a value that is not UTF-8 as ``{"$binary": ...}``);
* ``tag`` is the first of the listener's ``tag_fields`` (dotted paths,
  default ``@metadata.beat`` then ``type``) whose value is a non-empty
  string, else the listener's ``tag``;
* ``host`` is ``host.name`` (Beats ≥ 6.3), ``beat.hostname`` (older Beats)
  or a string ``host`` (logstash-forwarder, v1), else null;
* the event time is ``@timestamp`` (RFC 3339, ASCII digits, within int64
  nanoseconds), else the receive time;
* Lumberjack batches carry no globally unique id, so there is no dedupe:
  ``batch_id`` is empty.

Strict strings (docs/decisions.md#strict-strings): a tag or host string from the record that cannot
be stored (over ``MAX_TAG_BYTES`` / ``MAX_HOST_BYTES``) does not fail the
window: the codec leaves it out, so that event gets the listener's ``tag`` /
a null host. The record itself is valid and is stored whole; refusing the
window would make the client resend it for ever.
"""

from __future__ import annotations

from typing import Any

from appliance.blocks.block import RowBlock
from appliance.protocols.lumberjack import Window

__all__ = ["window_block"]


def window_block(
    window: Window, *, tag: str, source: str, peer: str, received_at_ns: int
) -> RowBlock:
    """The rows of one complete window; ``tag`` is the listener's, for events that name none."""
    return RowBlock(
        protocol="lumberjack",
        source=source,
        peer=peer,
        received_at_ns=received_at_ns,
        batch_id=None,
        tag=_shared_or_each(window.tags, tag),
        host=_shared_or_each(window.hosts, None),
        times_ns=window.times_ns,
        records=window.texts,
    )


def _shared_or_each(values: list[str | None], default: str | None) -> Any:
    """One value for every row when the window's events agree, else one per row.

    ``None`` in ``values`` means ``default``. A block's ``tag`` / ``host`` may
    be either (appliance/blocks/block.py); the rows are the same, but one value
    is checked once and becomes the Arrow column without a Python string per
    row (appliance/lake/arrow.py, ``_per_row``). Beats send one host per
    connection and, with the default tag fields, one tag.
    """
    if values:
        first = values[0]
        # count() runs in C; strings shared by the codec compare by identity first.
        if values.count(first) == len(values):
            return default if first is None else first
    if default is None:
        return values
    return [default if value is None else value for value in values]
