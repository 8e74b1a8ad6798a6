"""The appliance's tables by name: ``events`` and every derived table.

:func:`register_tables` makes each table that exists a temporary view of the
session (``spark.read.format("delta").load(uri)``): nothing is written to
a shared metastore, and it works the same on Spark Connect and classic Spark.
For a permanent entry in a cluster's catalog use ``CREATE TABLE ... USING
delta LOCATION ...`` (docs/spark.md).

The CLI's parser lists the table names, so this module imports nothing heavy
at module level: deltalake loads when a table is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from appliance.config import Config

__all__ = [
    "DERIVED_TABLES",
    "EVENTS",
    "TableRef",
    "appliance_tables",
    "find_table",
    "register_tables",
]

#: The bronze table's name.
EVENTS = "events"

#: The derived tables: the names of :data:`appliance.spark.jobs.JOBS`, in its
#: order (each job builds the table of its name), spelled here so that naming
#: them loads no pyarrow (tests/appliance/test_cli_startup.py checks they agree).
DERIVED_TABLES: Final = ("events_per_minute", "logjam_requests")


@dataclass(frozen=True, slots=True)
class TableRef:
    """A table's name and location."""

    name: str
    uri: str

    @property
    def location(self) -> str:
        """``uri`` as an absolute URI, which is what Spark is handed.

        A Spark Connect server resolves a relative path in its own working
        directory, not the appliance's: the default ``var/lake/events`` then
        names nothing there ("No commit files found in _delta_log").
        A local path becomes ``file:///absolute/path``; a URI with a scheme
        (``s3://``, ``file://``, ...) is kept as it is.
        """
        if "://" in self.uri:
            return self.uri
        return Path(self.uri).resolve().as_uri()

    def exists(self, storage_options: dict[str, str] | None = None) -> bool:
        """Whether a Delta table is at ``uri``."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        try:
            return bool(DeltaTable.is_deltatable(self.uri, storage_options=storage_options))
        except (DeltaError, OSError):
            return False


def appliance_tables(config: Config) -> list[TableRef]:
    """``events``, then every derived table, whether it exists yet or not."""
    tables = [TableRef(EVENTS, config.table_uri)]
    tables += [TableRef(name, config.derived_table_uri(name)) for name in DERIVED_TABLES]
    return tables


def find_table(config: Config, name: str) -> TableRef:
    """The table called ``name``.

    Raises:
        KeyError: no such table name.
    """
    for table in appliance_tables(config):
        if table.name == name:
            return table
    raise KeyError(name)


def register_tables(spark: SparkSession, config: Config) -> tuple[list[TableRef], list[TableRef]]:
    """Register every existing table as a temporary view named after it.

    Returns:
        The tables registered, and those that do not exist yet (a derived
        table before its job's first run, ``events`` before the service's
        first start).
    """
    options = config.lake.storage_options or None
    registered: list[TableRef] = []
    missing: list[TableRef] = []
    for table in appliance_tables(config):
        if not table.exists(options):
            missing.append(table)
            continue
        # Spark reaches object storage with its own configuration (docs/spark.md):
        # deltalake's storage_options are not Spark options.
        spark.read.format("delta").load(table.location).createOrReplaceTempView(table.name)
        registered.append(table)
    return registered, missing
