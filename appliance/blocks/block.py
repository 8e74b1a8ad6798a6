"""The rows of one protocol batch (:class:`RowBlock`), counted in bytes for the writer's limits.

A :class:`RowBlock` holds the events of one protocol batch (a Fluentd
request, a Lumberjack window, ...): values shared by the batch once, per-row
values as lists. Its constructor is the only place that counts the bytes a
block holds (:attr:`RowBlock.nbytes`), so every protocol is measured alike.
Whether a block can be stored is :mod:`appliance.blocks.checks`, its
identity :mod:`appliance.blocks.identity`; its Arrow form is the lake's
(:mod:`appliance.lake.arrow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["ROW_OVERHEAD_BYTES", "RowBlock"]

#: Bytes a row costs in the writer beyond its strings (Arrow offsets, the
#: fixed-width columns, list slots); the writer's byte limit
#: (``commit_max_bytes``) counts it. 96 is what the writer's own count
#: (``check_block``, appliance/blocks/checks.py) used, so commit groups keep
#: their size and the limits' tests hold. The per-protocol counts this
#: replaces, which the writer never read, left the strings out (Lumberjack,
#: Logjam, WebSocket: 96 per row), measured Python memory (Courier), or
#: once used 64 (forward, at first).
ROW_OVERHEAD_BYTES: Final = 96


def _column_bytes(values: str | Sequence[str | None] | None, rows: int) -> int:
    """Bytes of a string column given once per block (copied onto each row) or per row."""
    if values is None:
        return 0
    if isinstance(values, str):
        return len(values) * rows
    return sum(map(len, filter(None, values)))


@dataclass(frozen=True, slots=True)
class RowBlock:
    """The rows of one protocol batch.

    ``tag`` and ``host`` are either one value for every row or one value per
    row. ``times_ns`` holds epoch nanoseconds, ``None`` meaning "the client
    sent no time: use ``received_at_ns``". ``records`` are JSON texts.
    :attr:`nbytes` is computed here, not passed in.
    """

    protocol: str
    source: str
    peer: str
    received_at_ns: int
    batch_id: str | None
    tag: str | Sequence[str]
    host: str | Sequence[str | None] | None
    times_ns: Sequence[int | None]
    records: Sequence[str]
    #: Bytes the block holds, for the writer's byte limits: every string as
    #: copied onto each row (a long tag counts once per row, as Arrow stores
    #: it), plus :data:`ROW_OVERHEAD_BYTES` per row. String lengths are in
    #: characters, a cheap stand-in for their UTF-8 bytes.
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        rows = len(self.records)
        shared = (
            ROW_OVERHEAD_BYTES
            + len(self.protocol)
            + len(self.source)
            + len(self.peer)
            + (len(self.batch_id) if self.batch_id is not None else 0)
        )
        nbytes = (
            shared * rows
            + _column_bytes(self.tag, rows)
            + _column_bytes(self.host, rows)
            + sum(map(len, self.records))
        )
        object.__setattr__(self, "nbytes", nbytes)  # frozen: set once, here

    @property
    def rows(self) -> int:
        """How many rows the block holds."""
        return len(self.records)
