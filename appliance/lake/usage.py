"""What ``appliance table stats`` shows of ``events``: size, rows and files per day and protocol.

Sizes, rows and files per day come from the log; rows per protocol and day
from a scan. For a local table, the days left until the disk guard's
watermark (:mod:`appliance.lake.diskguard`) at the current rate of growth.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from deltalake import QueryBuilder

from appliance.lake.diskguard import disk_space, local_path
from appliance.lake.operations import (
    SQL_TABLE,
    PartitionInfo,
    add_actions,
    lake_errors,
    open_table,
    partitions,
)

__all__ = ["RATE_DAYS", "ProtocolDay", "Usage", "usage"]

#: Complete days (before today) whose mean size is the growth rate of a projection.
RATE_DAYS: Final = 7


@dataclass(frozen=True, slots=True)
class ProtocolDay:
    """Rows of one protocol on one day; bytes apportioned by rows (files mix protocols)."""

    event_date: dt.date
    protocol: str
    rows: int
    approx_bytes: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "event_date": self.event_date.isoformat(),
            "protocol": self.protocol,
            "rows": self.rows,
            "approx_bytes": self.approx_bytes,
        }


@dataclass(frozen=True, slots=True)
class Usage:
    """The table per day and protocol, and how long its disk lasts at the current rate."""

    days: list[PartitionInfo]
    protocols: list[ProtocolDay]
    #: Mean bytes per complete day over the last RATE_DAYS days (fewer for a younger table).
    bytes_per_day: int | None
    free_bytes: int | None
    watermark_bytes: int | None
    #: Days until the free space reaches the watermark at that rate (None: unknown).
    days_until_watermark: float | None
    #: Why there is no projection, when there is none.
    projection_note: str

    @property
    def oldest(self) -> dt.date | None:
        """The oldest partition."""
        return self.days[0].event_date if self.days else None

    @property
    def newest(self) -> dt.date | None:
        """The newest partition."""
        return self.days[-1].event_date if self.days else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "oldest_partition": None if self.oldest is None else self.oldest.isoformat(),
            "newest_partition": None if self.newest is None else self.newest.isoformat(),
            "bytes_per_day": self.bytes_per_day,
            "free_bytes": self.free_bytes,
            "watermark_bytes": self.watermark_bytes,
            "days_until_watermark": self.days_until_watermark,
            "projection_note": self.projection_note,
            "days": [d.to_json() for d in self.days],
            "protocols": [p.to_json() for p in self.protocols],
        }


def usage(
    uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    min_free_bytes: int = 0,
    min_free_percent: float = 0.0,
    today: dt.date | None = None,
    by_protocol: bool = True,
) -> Usage:
    """Size, rows and files per day (from the log), rows per protocol and day (a scan).

    The projection divides the free space above the disk guard's watermark
    by the mean size of the last :data:`RATE_DAYS` complete days; it is only
    made for a local table.

    Raises:
        LakeError: no table there, or the storage failed.
    """
    table = open_table(uri, storage_options)
    today = today or dt.datetime.now(dt.UTC).date()
    with lake_errors("reading statistics", uri):
        days = partitions(add_actions(table))
        protocols: list[ProtocolDay] = []
        if by_protocol and days:
            query = QueryBuilder().register(SQL_TABLE, table)
            sql = (
                f"SELECT event_date, protocol, count(*) AS n FROM {SQL_TABLE} "  # noqa: S608
                "GROUP BY event_date, protocol ORDER BY event_date, protocol"
            )
            result = pa.table(query.execute(sql).read_all()).to_pylist()
            sizes = {d.event_date: d for d in days}
            for row in result:
                day = sizes[row["event_date"]]
                share = day.bytes * int(row["n"]) // day.rows if day.rows else 0
                protocols.append(
                    ProtocolDay(row["event_date"], row["protocol"], int(row["n"]), share)
                )
    # The complete days (before today) of the last RATE_DAYS, from the first
    # day with data: days without data count as days of no growth.
    start = today - dt.timedelta(days=RATE_DAYS)
    if days:
        start = max(start, days[0].event_date)
    span = (today - start).days
    complete = [d for d in days if start <= d.event_date < today]
    rate = sum(d.bytes for d in complete) // span if span > 0 else None
    path = local_path(uri)
    if path is None:
        return Usage(
            days, protocols, rate, None, None, None, "object storage: no free-space figure"
        )
    space = disk_space(path)
    watermark = space.watermark(min_free_bytes, min_free_percent)
    if not rate:
        note = "no complete day of data yet to measure a rate"
        return Usage(days, protocols, rate, space.free, watermark, None, note)
    left = max(space.free - watermark, 0) / rate
    note = f"at the mean of the last {span} complete day(s)"
    return Usage(days, protocols, rate, space.free, watermark, round(left, 1), note)
