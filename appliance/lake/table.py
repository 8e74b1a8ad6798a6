"""Blocking operations on the ``events`` Delta table, called from a worker thread.

A thin typed layer over ``deltalake``: create or open the table, commit an
Arrow table idempotently, and read what the dedupe cache needs at start-up.
Every deltalake or OS failure leaves this module as a
:class:`~appliance.lake.errors.LakeError`.

Idempotent commits (DESIGN §2 step 5): every commit carries a Delta app
transaction ``(app_id, version)``, ``app_id`` being the appliance node and
``version`` its commit sequence. Before writing, :meth:`EventsTable.commit`
refreshes its snapshot and skips the write when the table already records
that version, so a commit retried after an ambiguous failure (or a crash) is
never applied twice.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import DeltaError

from appliance.lake.errors import CommitError, LakeError, TableSchemaError
from appliance.lake.rows import DedupeKey, dedupe_scope
from appliance.lake.schema import (
    EVENTS_SCHEMA,
    PARTITION_COLUMNS,
    READER_VERSION,
    TABLE_CONFIGURATION,
    WRITER_VERSION,
)

__all__ = ["EventsTable"]


class EventsTable:
    """The ``events`` table at ``uri`` (a local path or an object-store URI).

    Not thread-safe: the writer drives it from one worker thread at a time.
    """

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = uri
        self._storage_options = storage_options
        self._table: DeltaTable | None = None

    @property
    def _dt(self) -> DeltaTable:
        if self._table is None:
            raise LakeError("the events table is not open")
        return self._table

    def open_or_create(self) -> None:
        """Open the table, creating it with the appliance's schema when absent.

        Raises:
            TableSchemaError: an existing table has another schema, or a
                protocol that Spark readers of DESIGN §3 cannot read.
            LakeError: the storage failed.
        """
        try:
            if "://" not in self.uri:
                os.makedirs(self.uri, exist_ok=True)
            if DeltaTable.is_deltatable(self.uri, storage_options=self._storage_options):
                self._table = DeltaTable(self.uri, storage_options=self._storage_options)
                self._check()
            else:
                self._table = DeltaTable.create(
                    self.uri,
                    EVENTS_SCHEMA,
                    mode="ignore",
                    partition_by=PARTITION_COLUMNS,
                    name="events",
                    description="Log events received by the appliance (bronze)",
                    configuration=TABLE_CONFIGURATION,
                    storage_options=self._storage_options,
                )
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot open or create the events table at {self.uri}: {exc}") from exc

    def _check(self) -> None:
        protocol = self._dt.protocol()
        # Spark readers of DESIGN §3 need reader version 1; the writer side
        # is deltalake's to honour.
        if protocol.min_reader_version > READER_VERSION:
            raise TableSchemaError(
                f"events table needs reader {protocol.min_reader_version}, "
                f"writer {protocol.min_writer_version}; the appliance writes reader "
                f"{READER_VERSION} / writer {WRITER_VERSION}"
            )
        names = set(pa.schema(self._dt.schema()).names)
        missing = set(EVENTS_SCHEMA.names) - names
        if missing:
            raise TableSchemaError(f"events table lacks columns: {', '.join(sorted(missing))}")

    def protocol_versions(self) -> tuple[int, int]:
        """``(min_reader_version, min_writer_version)`` of the table."""
        protocol = self._dt.protocol()
        return protocol.min_reader_version, protocol.min_writer_version

    def committed_version(self, app_id: str) -> int | None:
        """The last commit sequence the table records for ``app_id``, if any."""
        try:
            self._dt.update_incremental()
            version = self._dt.transaction_version(app_id)
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read the events table: {exc}") from exc
        return None if version is None else int(version)

    def commit(self, data: pa.Table, app_id: str, version: int) -> bool:
        """Append ``data`` as the commit ``(app_id, version)``, at most once.

        Returns:
            True when this call wrote the rows, False when the table already
            held that commit (a retry after an ambiguous failure).

        Raises:
            CommitError: nothing was committed; the caller may retry.
        """
        try:
            self._dt.update_incremental()
            done = self._dt.transaction_version(app_id)
            if done is not None and int(done) >= version:
                return False
            write_deltalake(
                self._dt,
                data,
                mode="append",
                partition_by=PARTITION_COLUMNS,
                commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
            )
        except (DeltaError, OSError) as exc:
            raise CommitError(str(exc)) from exc
        return True

    def recent_batch_keys(self, since_ns: int) -> set[DedupeKey]:
        """Dedupe keys of batches received at or after ``since_ns`` (epoch ns).

        Seeds the writer's dedupe cache at start-up, so a chunk committed just
        before a restart and resent just after is not written twice.
        """
        try:
            self._dt.update_incremental()
            dataset = self._dt.to_pyarrow_dataset()
            cutoff = pa.scalar(since_ns // 1000, type=pa.int64()).cast(
                EVENTS_SCHEMA.field("received_at").type
            )
            table = dataset.to_table(
                columns=["protocol", "source", "peer", "batch_id"],
                filter=(pc.field("received_at") >= cutoff) & pc.field("batch_id").is_valid(),
            )
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read recent batch ids: {exc}") from exc
        rows: list[dict[str, Any]] = (
            table.group_by(["protocol", "source", "peer", "batch_id"]).aggregate([]).to_pylist()
        )
        return {(r["protocol"], dedupe_scope(r["source"], r["peer"]), r["batch_id"]) for r in rows}

    def row_count(self) -> int:
        """How many rows the table holds (for tests, the CLI and benchmarks)."""
        self._dt.update_incremental()
        return int(self._dt.count())
