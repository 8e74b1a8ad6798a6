"""Blocking operations on the ``events`` Delta table, called from a worker thread.

A thin typed layer over ``deltalake``: create or open the table, commit an
Arrow table idempotently, and read what the dedupe cache needs at start-up.
Every deltalake or OS failure leaves this module as a
:class:`~appliance.lake.errors.LakeError`.

Idempotent commits (docs/decisions.md#every-commit-is-idempotent): every
commit carries a Delta app transaction ``(app_id, version)``, ``app_id`` being
the appliance node and ``version`` its commit sequence. Before writing,
:meth:`EventsTable.commit` refreshes its snapshot and skips the write when the
table already records that version, so a commit retried after an ambiguous
failure (or a crash) is never applied twice.

One live writer per app id (docs/table.md#one-writer-per-app-id): every commit
also records two more app transactions, ``<app_id>#writer`` (a random token
the process drew at start) and ``<app_id>#lease`` (the commit's time in epoch
milliseconds). A process claims its app id at start with a commit of only
those two (:meth:`EventsTable.claim`), refused while another token's lease is
fresh; and before every commit it checks that the last writer under its app id
is still itself. So a version it did not write is never taken for its own.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from arro3.core import RecordBatchReader
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    QueryBuilder,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from appliance.blocks.identity import DedupeKey, dedupe_scope
from appliance.lake.commit_info import CommitBatches, read_commit_info
from appliance.lake.errors import (
    AppIdInUse,
    CommitConflict,
    CommitError,
    LakeError,
    TableSchemaError,
)
from appliance.lake.schema import (
    EVENTS_ARRO3_SCHEMA,
    PARTITION_COLUMNS,
    READER_VERSION,
    TABLE_CONFIGURATION,
    WRITER_VERSION,
    events_schema,
    unindexed_columns,
)

if TYPE_CHECKING:
    # Opening, claiming, renewing and the start-up scan need no pyarrow: it
    # loads at the first data commit (docs/performance.md#idle-memory).
    import pyarrow as pa

__all__ = [
    "EventsTable",
    "Lease",
    "TableChanges",
    "lease_app_ids",
    "on_object_storage",
    "shared_with_others",
]


def on_object_storage(uri: str) -> bool:
    """Whether ``uri`` names object storage (``s3://`` and the like), not a local path."""
    return "://" in uri and not uri.startswith("file://")


def shared_with_others(mode: Literal["auto", "on", "off"], uri: str) -> bool:
    """Whether other processes write (or maintain) the table at ``uri`` too.

    ``"auto"``: a table on object storage is taken to be shared (a fleet,
    docs/fleet.md), a local one not; ``"on"`` for worker processes sharing
    a local table (docs/performance.md).
    """
    if mode == "auto":
        return on_object_storage(uri)
    return mode == "on"


def lease_app_ids(app_id: str) -> tuple[str, str]:
    """The app transaction ids that hold ``app_id``'s writer token and lease time."""
    return f"{app_id}#writer", f"{app_id}#lease"


def _no_rows() -> RecordBatchReader:
    """An ``events`` stream of no rows: a commit of app transactions only, without pyarrow."""
    return RecordBatchReader.from_batches(EVENTS_ARRO3_SCHEMA, [])


#: The Parquet writer's settings for the rows of a commit: delta-rs's own
#: default (snappy) with no Parquet statistics (row group or page min/max)
#: for the columns the table keeps no Delta statistics for (``record``,
#: ``peer``, ``batch_id``: :func:`~appliance.lake.schema.unindexed_columns`).
#: Their min/max over long strings cost the writer about 0.03 µs an event
#: (0.40 against 0.44, `write_deltalake` of 240,000 forward-bench rows,
#: docs/performance.md#the-sixth-pass-on-forward-throughput), and no query
#: skips on them. The indexed columns keep the writer's default, page
#: statistics: delta-rs takes a file's Delta statistics from them.
_COMMIT_WRITER_PROPERTIES: WriterProperties = WriterProperties(
    compression="SNAPPY",
    column_properties={
        name: ColumnProperties(statistics_enabled="NONE") for name in unindexed_columns()
    },
)


class Lease:
    """Who last committed under an app id, and when (epoch ms)."""

    __slots__ = ("at_ms", "token")

    def __init__(self, token: int | None, at_ms: int | None) -> None:
        self.token = token
        self.at_ms = at_ms


class TableChanges:
    """The table's commits after a version a writer had checked, as one refresh saw them."""

    __slots__ = ("commits", "done", "version", "writer")

    def __init__(
        self,
        version: int,
        done: int | None,
        commits: list[CommitBatches],
        writer: int | None = None,
    ) -> None:
        #: The table's latest version: a commit prepared now is for ``version + 1``.
        self.version = version
        #: The last commit sequence the table records for the asking app id.
        self.done = done
        #: The commits after the checked version, oldest first.
        self.commits = commits
        #: The writer token the asking app id's lease names (table.py, "One live writer").
        self.writer = writer


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
                protocol that Spark readers cannot read
                (docs/decisions.md#utc-timestamps-delta-reader-1-and-writer-2).
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
                    EVENTS_ARRO3_SCHEMA,
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
        # Spark readers need reader version 1 (docs/table.md#reader-compatibility);
        # the writer side is deltalake's to honour.
        if protocol.min_reader_version > READER_VERSION:
            raise TableSchemaError(
                f"events table needs reader {protocol.min_reader_version}, "
                f"writer {protocol.min_writer_version}; the appliance writes reader "
                f"{READER_VERSION} / writer {WRITER_VERSION}"
            )
        names = {field.name for field in self._dt.schema().fields}
        missing = set(EVENTS_ARRO3_SCHEMA.names) - names
        if missing:
            raise TableSchemaError(f"events table lacks columns: {', '.join(sorted(missing))}")

    def version(self) -> int:
        """The table's version as this object last read or wrote it."""
        return int(self._dt.version())

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

    def lease(self, app_id: str) -> Lease:
        """The writer token and lease time last recorded under ``app_id``."""
        writer_id, lease_id = lease_app_ids(app_id)
        try:
            token, at_ms = self._refreshed_transactions(writer_id, lease_id)
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read the events table: {exc}") from exc
        return Lease(token, at_ms)

    def _refreshed_transactions(self, *app_ids: str) -> list[int | None]:
        """Refresh the handle; the app transaction version of each of ``app_ids`` it records.

        Raises:
            DeltaError, OSError: the table cannot be read.
        """
        self._dt.update_incremental()
        versions = [self._dt.transaction_version(app_id) for app_id in app_ids]
        return [None if version is None else int(version) for version in versions]

    def claim(self, app_id: str, token: int, now_ms: int, lease_ms: int) -> Lease:
        """Take ``app_id`` for the writer ``token`` with a commit of no rows.

        Returns:
            The lease found before (its token is the previous writer's).

        Raises:
            AppIdInUse: another token's lease is younger than ``lease_ms``, or
                another process claimed it at the same moment.
            LakeError: the table cannot be read or written.
        """
        before = self.lease(app_id)
        if before.token is not None and before.token != token and before.at_ms is not None:
            age_ms = now_ms - before.at_ms
            if age_ms < lease_ms:
                raise AppIdInUse(
                    f"app id {app_id!r} is in use: another appliance committed to {self.uri} "
                    f"under it {max(age_ms, 0) / 1000:.0f}s ago (lease {lease_ms / 1000:.0f}s). "
                    "Every node needs its own node_id: a cloned machine keeps the "
                    "<state_dir>/node-id of its image (docs/table.md, 'One writer per app id')"
                )
        try:
            write_deltalake(
                self._dt,
                _no_rows(),
                mode="append",
                partition_by=PARTITION_COLUMNS,
                commit_properties=CommitProperties(
                    app_transactions=self._lease_transactions(app_id, token, now_ms)
                ),
            )
        except DeltaError as exc:
            if "oncurrent" in str(exc):
                raise AppIdInUse(
                    f"app id {app_id!r} was claimed by another appliance at the same moment"
                ) from exc
            raise LakeError(f"cannot claim app id {app_id!r}: {exc}") from exc
        except OSError as exc:
            raise LakeError(f"cannot claim app id {app_id!r}: {exc}") from exc
        return before

    def renew(self, app_id: str, token: int, now_ms: int) -> None:
        """Renew the lease of ``token`` on ``app_id`` with a commit of no rows (an idle node).

        Raises:
            AppIdInUse: another writer committed under ``app_id``.
            CommitError: the renewal was not written; the caller may retry.
        """
        try:
            self._dt.update_incremental()
            self._check_writer(app_id, token)
            write_deltalake(
                self._dt,
                _no_rows(),
                mode="append",
                partition_by=PARTITION_COLUMNS,
                commit_properties=CommitProperties(
                    app_transactions=self._lease_transactions(app_id, token, now_ms)
                ),
            )
        except (DeltaError, OSError) as exc:
            raise CommitError(str(exc)) from exc

    @staticmethod
    def _lease_transactions(app_id: str, token: int, now_ms: int) -> list[Transaction]:
        writer_id, lease_id = lease_app_ids(app_id)
        return [Transaction(writer_id, token), Transaction(lease_id, now_ms)]

    def _check_writer(self, app_id: str, token: int | None) -> None:
        if token is None:
            return
        found = self._dt.transaction_version(lease_app_ids(app_id)[0])
        if found is not None and int(found) != token:
            raise AppIdInUse(
                f"another appliance committed to {self.uri} under this node's app id "
                f"{app_id!r}: two nodes share a node_id; this one stops acknowledging"
            )

    def changes_since(self, checked: int, app_id: str) -> TableChanges:
        """Refresh, and read what the commits after version ``checked`` say of their batches.

        Reads one ``commitInfo`` per commit after ``checked`` (delta-rs
        ``history``), never a data file: the cost is the number of commits
        since the last check.

        deltalake 1.6.6's ``history(limit)`` lists every commit file from
        ``snapshot - limit + 1`` on, including commits that landed after the
        refresh, and numbers them down from the snapshot's version, which is
        then wrong by as many (shown by test_exactly_once.py,
        ``test_commits_landing_during_the_read_are_numbered_right``). So the
        labels are not used: the entries, newest first, are ``checked + n``
        down to ``checked + 1``. When they go past the refresh, the handle
        is refreshed again, to at least the last commit read: a put prepared
        on what was read then goes after it (:meth:`commit` refuses a handle
        that is not at the version checked), instead of losing a race that
        was already known. On a busy table, whose reads take long, that was
        most of a check's lost races.

        Raises:
            LakeError: the table cannot be read, or commits after ``checked``
                are missing from its log (removed by log clean-up): the
                caller retries, and never commits on a partial view.
        """
        writer_id = lease_app_ids(app_id)[0]
        try:
            done, writer = self._refreshed_transactions(app_id, writer_id)
            latest = int(self._dt.version())
            infos = self._dt.history(latest - checked) if latest > checked else []
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read the table's recent commits: {exc}") from exc
        count = len(infos)
        if count > latest - checked:
            try:
                # What the refreshed handle records, read from the same refresh
                # as the handle a put goes on: a commit of ours that landed
                # meanwhile (an earlier attempt's late put) is settled here,
                # never taken for a version the put would go after.
                done, writer = self._refreshed_transactions(app_id, writer_id)
            except (DeltaError, OSError) as exc:
                raise LakeError(f"cannot read the table's recent commits: {exc}") from exc
        if latest > checked and count < latest - checked:
            raise LakeError(
                f"the table's log lacks commits after version {checked}: found {count} "
                f"of {latest - checked} (removed by log clean-up?)"
            )
        commits = [read_commit_info(checked + count - i, info) for i, info in enumerate(infos)]
        commits.reverse()
        return TableChanges(max(latest, checked + count), done, commits, writer)

    def commit(
        self,
        data: pa.Table,
        app_id: str,
        version: int,
        token: int | None = None,
        now_ms: int | None = None,
        also: Sequence[tuple[str, int]] = (),
        *,
        read_version: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Append ``data`` as the commit ``(app_id, version)``, at most once.

        With ``token``, the commit renews the writer's lease (at ``now_ms``),
        and is refused when another writer committed under ``app_id``.
        ``also`` are more app transactions ``(id, version)`` the same commit
        records (the write-ahead log's position, ``<app_id>#wal``);
        ``metadata``, more ``commitInfo`` entries (the batch digests).

        ``read_version``: the table version the caller checked the commit
        against (:meth:`changes_since`). The commit is then written as exactly
        the next version, with delta-rs's own retries off: if another writer
        took that version, nothing is written and :class:`CommitConflict`
        says so. Without it, the handle is refreshed first and delta-rs moves
        a commit that lost a race to the next version (for writers that add
        no batch ids: seeds, tests, benchmarks).

        Returns:
            True when this call wrote the rows, False when the table already
            held that commit (a retry after an ambiguous failure; without
            ``read_version`` only).

        Raises:
            AppIdInUse: the last writer under ``app_id`` is not ``token``.
            CommitConflict: another commit took ``read_version + 1``, or the
                table already holds this commit, which the check at
                ``read_version`` did not see (a stale check: check again).
            CommitError: nothing was committed; the caller may retry.
        """
        transactions = [Transaction(app_id, version)]
        transactions += [Transaction(txn_id, txn_version) for txn_id, txn_version in also]
        if token is not None:
            transactions += self._lease_transactions(app_id, token, now_ms or 0)
        try:
            if read_version is None:
                self._dt.update_incremental()
            elif int(self._dt.version()) != read_version:
                # The handle moved (table maintenance on it): check again.
                raise CommitConflict(
                    f"the table is at version {self._dt.version()}, not the checked {read_version}"
                )
            # Before the version check: a version recorded by another writer
            # must never pass for this writer's own commit.
            self._check_writer(app_id, token)
            done = self._dt.transaction_version(app_id)
            if done is not None and int(done) >= version:
                if read_version is not None:
                    # Checked on a view that did not hold it: the check was
                    # stale, so check again (which settles the commit as
                    # landed) rather than take this for a commit at
                    # read_version + 1.
                    raise CommitConflict(
                        f"the table already records commit {done} under {app_id!r}, "
                        f"which the check at version {read_version} did not see"
                    )
                return False
            write_deltalake(
                self._dt,
                data,
                mode="append",
                partition_by=PARTITION_COLUMNS,
                writer_properties=_COMMIT_WRITER_PROPERTIES,
                commit_properties=CommitProperties(
                    app_transactions=transactions,
                    custom_metadata=None if metadata is None else dict(metadata),
                    max_commit_retries=None if read_version is None else 0,
                ),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
            )
        except CommitFailedError as exc:
            if read_version is not None:
                # deltalake says only "Failed to commit transaction: <n>", for a
                # lost race (the usual case) and for a refusal of its own alike.
                raise CommitConflict(
                    f"the put at version {read_version + 1} was refused, most likely "
                    f"taken by another commit ({exc})"
                ) from exc
            raise CommitError(str(exc)) from exc
        except (DeltaError, OSError) as exc:
            raise CommitError(str(exc)) from exc
        return True

    def recent_batch_keys(self, since_ns: int) -> set[DedupeKey]:
        """Dedupe keys of batches received at or after ``since_ns`` (epoch ns).

        Seeds the writer's dedupe cache at start-up, so a chunk committed just
        before a restart and resent just after is not written twice.
        """
        # delta-rs's own query engine (DataFusion), not a pyarrow dataset: the
        # same columns, filter and file skipping on ``received_at`` statistics,
        # read into arro3 arrays, so a service starts without pyarrow
        # (docs/performance.md#idle-memory). ``since_ns`` is an int: the SQL
        # holds no text from outside.
        cutoff_us = int(since_ns) // 1000
        query = (
            "SELECT DISTINCT protocol, source, peer, batch_id FROM events"  # noqa: S608 -- an int only
            " WHERE received_at >= arrow_cast("
            f"{cutoff_us}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
            " AND batch_id IS NOT NULL"
        )
        keys: set[DedupeKey] = set()
        try:
            self._dt.update_incremental()
            batches = QueryBuilder().register("events", self._dt).execute(query)
            for batch in batches:
                columns = [batch.column(i).to_pylist() for i in range(4)]
                for protocol, source, peer, batch_id in zip(*columns, strict=True):
                    keys.add((protocol, dedupe_scope(source, peer), batch_id))
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read recent batch ids: {exc}") from exc
        return keys

    def batch_keys_present(self, keys: Collection[DedupeKey], since_ns: int) -> set[DedupeKey]:
        """Which of ``keys`` the table already holds in rows received at or after ``since_ns``.

        Another node may have stored a batch that this node logged: a client
        that got no ack from a node that then died resends the chunk to the
        next node (docs/fleet.md). Reads the dedupe columns of the files whose
        ``received_at`` statistics reach ``since_ns``, filtered on the ids.
        """
        ids = sorted({key[2] for key in keys})
        if not ids:
            return set()
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            self._dt.update_incremental()
            cutoff = pa.scalar(since_ns // 1000, type=pa.int64()).cast(
                events_schema().field("received_at").type
            )
            table = self._dt.to_pyarrow_dataset().to_table(
                columns=["protocol", "source", "peer", "batch_id"],
                filter=(pc.field("received_at") >= cutoff) & pc.field("batch_id").isin(ids),
            )
        except (DeltaError, OSError) as exc:
            raise LakeError(f"cannot read recent batch ids: {exc}") from exc
        rows: list[dict[str, Any]] = (
            table.group_by(["protocol", "source", "peer", "batch_id"]).aggregate([]).to_pylist()
        )
        found = {(r["protocol"], dedupe_scope(r["source"], r["peer"]), r["batch_id"]) for r in rows}
        return found & set(keys)

    def row_count(self) -> int:
        """How many rows the table holds (for tests, the CLI and benchmarks)."""
        self._dt.update_incremental()
        return int(self._dt.count())
