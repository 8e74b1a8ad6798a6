"""The ``events`` table: its Arrow schema, partitioning and table properties (docs/table.md).

The table must stay readable by every Spark with delta-spark, so it keeps Delta
protocol reader 1 / writer 2 with no table features: every timestamp carries
``tz="UTC"`` (a naive one would be ``timestamp_ntz``, a reader-3 feature), and
there is no column mapping, generated column or nanosecond timestamp
(docs/decisions.md#utc-timestamps-delta-reader-1-and-writer-2).
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = [
    "EVENTS_SCHEMA",
    "PARTITION_COLUMNS",
    "READER_VERSION",
    "TABLE_CONFIGURATION",
    "WRITER_VERSION",
]

_UTC_MICROS: Final = pa.timestamp("us", tz="UTC")

EVENTS_SCHEMA: Final = pa.schema(
    [
        pa.field("event_date", pa.date32(), nullable=False),
        pa.field("event_time", _UTC_MICROS, nullable=False),
        pa.field("event_time_ns", pa.int64(), nullable=False),
        pa.field("received_at", _UTC_MICROS, nullable=False),
        pa.field("protocol", pa.string(), nullable=False),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("peer", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=True),
        pa.field("record", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=True),
    ]
)

PARTITION_COLUMNS: Final = ["event_date"]

READER_VERSION: Final = 1
WRITER_VERSION: Final = 2

#: Table properties set at creation. Stats are kept for the columns queries
#: filter on, not for ``record``: delta-rs stores full-length string min/max.
#: ``delta.appendOnly`` is true until the first expire or erase with rows to
#: remove sets it to false (appliance/lake/retention.py, docs/decisions.md 22):
#: a property change only, the protocol stays reader 1 / writer 2.
TABLE_CONFIGURATION: Final[dict[str, str | None]] = {
    "delta.appendOnly": "true",
    "delta.dataSkippingStatsColumns": (
        "event_date,event_time,event_time_ns,received_at,protocol,tag,source,host"
    ),
    "delta.checkpointInterval": "50",
}
