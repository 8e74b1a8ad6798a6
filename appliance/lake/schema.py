"""The ``events`` table: its Arrow schema, partitioning and table properties (docs/table.md).

The table must stay readable by every Spark with delta-spark, so it keeps Delta
protocol reader 1 / writer 2 with no table features: every timestamp carries
``tz="UTC"`` (a naive one would be ``timestamp_ntz``, a reader-3 feature), and
there is no column mapping, generated column or nanosecond timestamp
(docs/decisions.md#utc-timestamps-delta-reader-1-and-writer-2).

The schema is written once, in arro3-core's types (the Arrow library that
deltalake itself depends on), so that a service creates, checks and claims
the table without loading pyarrow; :func:`events_schema` is the same schema
in pyarrow's types, for the code that converts and reads data
(docs/performance.md#idle-memory).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final

from arro3.core import DataType, Field, Schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "EVENTS_ARRO3_SCHEMA",
    "PARTITION_COLUMNS",
    "READER_VERSION",
    "TABLE_CONFIGURATION",
    "WRITER_VERSION",
    "events_schema",
    "unindexed_columns",
]

_UTC_MICROS: Final = DataType.timestamp("us", tz="UTC")

#: The ``events`` columns, in arro3-core's types.
EVENTS_ARRO3_SCHEMA: Final = Schema(
    [
        Field("event_date", DataType.date32(), nullable=False),
        Field("event_time", _UTC_MICROS, nullable=False),
        Field("event_time_ns", DataType.int64(), nullable=False),
        Field("received_at", _UTC_MICROS, nullable=False),
        Field("protocol", DataType.string(), nullable=False),
        Field("tag", DataType.string(), nullable=False),
        Field("source", DataType.string(), nullable=False),
        Field("peer", DataType.string(), nullable=False),
        Field("host", DataType.string(), nullable=True),
        Field("record", DataType.string(), nullable=False),
        Field("batch_id", DataType.string(), nullable=True),
    ]
)


@functools.cache
def events_schema() -> pa.Schema:
    """:data:`EVENTS_ARRO3_SCHEMA` as a pyarrow schema (pyarrow loads at the first call)."""
    import pyarrow as pa

    return pa.schema(EVENTS_ARRO3_SCHEMA)


def __getattr__(name: str) -> pa.Schema:
    """``EVENTS_SCHEMA``: :func:`events_schema`, made at its first use, not at import.

    A module attribute by PEP 562 (https://peps.python.org/pep-0562/), so not
    in ``__all__``.
    """
    if name == "EVENTS_SCHEMA":
        return events_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PARTITION_COLUMNS: Final = ["event_date"]

READER_VERSION: Final = 1
WRITER_VERSION: Final = 2

#: The columns with Delta statistics (``delta.dataSkippingStatsColumns``).
_INDEXED_COLUMNS: Final = (
    "event_date", "event_time", "event_time_ns", "received_at", "protocol", "tag", "source", "host",
)  # fmt: skip

#: Table properties set at creation. Stats are kept for the columns queries
#: filter on, not for ``record``: delta-rs stores full-length string min/max.
#: ``delta.appendOnly`` is true until the first expire or erase with rows to
#: remove sets it to false (appliance/lake/retention.py, docs/decisions.md 22):
#: a property change only, the protocol stays reader 1 / writer 2.
TABLE_CONFIGURATION: Final[dict[str, str | None]] = {
    "delta.appendOnly": "true",
    "delta.dataSkippingStatsColumns": ",".join(_INDEXED_COLUMNS),
    "delta.checkpointInterval": "50",
}


def unindexed_columns() -> list[str]:
    """The columns ``delta.dataSkippingStatsColumns`` leaves out: they get no statistics."""
    return [name for name in EVENTS_ARRO3_SCHEMA.names if name not in _INDEXED_COLUMNS]
