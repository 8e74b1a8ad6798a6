"""PySpark jobs that build derived Delta tables from ``events``, incrementally.

How a run works (docs/spark.md, "Derived tables"):

1. **Pin the input.** The run reads the current version ``V'`` of ``events``
   and the job's progress ``V``: the last ``events`` version it consumed.
2. **Choose the files.** Incremental: the data files that commits
   ``V+1 .. V'`` added with ``dataChange=true`` (the same rule as Delta's
   streaming source), read from those commits' log entries. A compaction
   commits its rewritten files with ``dataChange=false``, so rows are never
   counted twice, and the files it replaced stay readable for the vacuum
   retention (at least 168 h). Rebuild (first run, ``--rebuild``, or when a
   needed log entry or data file is gone): every file of the snapshot ``V'``.
3. **Compute with Spark.** The files become a temporary view, and the job's
   SQL turns them into the derived rows (``toArrow()`` brings them back).
4. **Commit with deltalake, atomically with the progress.** The rows go into
   the derived table in one Delta commit carrying the app transaction
   ``(appliance.spark.<job>, V')``: the table's own log records its progress,
   so data and progress can never disagree. ``events_per_minute`` merges
   (adds counts to existing minutes), ``logjam_requests`` appends; a rebuild
   overwrites. A run that finds ``V = V'`` does nothing, so a second run on
   the same input changes nothing.

Writing through deltalake rather than through Spark keeps derived tables at
Delta protocol reader 1 / writer 2 with UTC timestamps, records the app
transaction (neither Sail nor every Spark honours ``txnAppId``), and works the
same whichever engine computed the rows. One runner per job at a time: the CLI
holds a lock file per job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError
from deltalake.fs import DeltaStorageHandler

from appliance.lake.arrow import PLAUSIBLE_FUTURE_NS, PLAUSIBLE_PAST_NS
from appliance.lake.errors import LakeError
from appliance.logs import get_logger
from appliance.spark.errors import SparkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "EVENTS_PER_MINUTE",
    "INPUT_VIEW",
    "JOBS",
    "LOGJAM_REQUESTS",
    "Job",
    "JobResult",
    "JobStatus",
    "Plan",
    "job_status",
    "plan_run",
    "run_job",
]

log = get_logger("spark")

#: The temporary view holding the ``events`` rows a run processes.
INPUT_VIEW: Final = "appliance_job_input"

#: The ``events`` columns stored in its data files (``event_date`` is the
#: partition column: it lives in the path, and the jobs recompute it).
EVENTS_FILE_COLUMNS: Final = (
    "event_time TIMESTAMP, event_time_ns BIGINT, received_at TIMESTAMP, protocol STRING, "
    "tag STRING, source STRING, peer STRING, host STRING, record STRING, batch_id STRING"
)

#: ``event_date`` of ``events`` (docs/table.md, "Partition rule"), as Spark SQL:
#: the same comparison in epoch nanoseconds as :func:`appliance.lake.arrow.blocks_to_arrow`.
EVENT_DATE_SQL: Final = (
    "CASE WHEN event_time_ns BETWEEN "
    f"unix_micros(received_at) * 1000 - {PLAUSIBLE_PAST_NS} AND "
    f"unix_micros(received_at) * 1000 + {PLAUSIBLE_FUTURE_NS} "
    "THEN to_date(event_time) ELSE to_date(received_at) END"
)

_UTC: Final = pa.timestamp("us", tz="UTC")

Mode = Literal["up-to-date", "incremental", "rebuild"]


@dataclass(frozen=True, slots=True)
class Job:
    """A derived table: its SQL over :data:`INPUT_VIEW`, schema and how rows land.

    ``merge_keys`` set: new rows are merged on those keys, ``merge_add``
    columns summed into existing rows. Unset: new rows are appended.
    """

    name: str
    description: str
    sql: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    merge_keys: tuple[str, ...] = ()
    merge_add: tuple[str, ...] = ()

    @property
    def app_id(self) -> str:
        """The Delta app transaction id that records this job's progress."""
        return f"appliance.spark.{self.name}"


EVENTS_PER_MINUTE: Final = Job(
    name="events_per_minute",
    description="Events per minute of event time, by protocol, tag and source",
    sql=f"""
        SELECT date_trunc('MINUTE', event_time) AS minute,
               protocol, tag, source,
               count(*) AS events
        FROM {INPUT_VIEW}
        GROUP BY date_trunc('MINUTE', event_time), protocol, tag, source
    """,  # noqa: S608 -- built from this module's constants only
    schema=pa.schema(
        [
            pa.field("minute", _UTC, nullable=False),
            pa.field("protocol", pa.string(), nullable=False),
            pa.field("tag", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("events", pa.int64(), nullable=False),
        ]
    ),
    merge_keys=("minute", "protocol", "tag", "source"),
    merge_add=("events",),
)


def _json(path: str) -> str:
    return f"get_json_object(record, '$.{path}')"


def _number(path: str, sql_type: str) -> str:
    return f"try_cast({_json(path)} AS {sql_type})"


LOGJAM_REQUESTS: Final = Job(
    name="logjam_requests",
    description="Request metrics from Logjam request bodies (topic logs...)",
    sql=f"""
        WITH requests AS (
            SELECT *,
                   {_json("app_env")} AS app_env_field,
                   substring_index({_json("app_env")}, '-', -1) AS env_of_app_env
            FROM {INPUT_VIEW}
            WHERE protocol = 'logjam'
              AND (tag = 'logs' OR tag LIKE 'logs.%')
              AND {_json("action")} IS NOT NULL
        )
        SELECT {EVENT_DATE_SQL} AS event_date,
               coalesce(try_to_timestamp({_json("started_at")}),
                        timestamp_millis({_number("started_ms", "BIGINT")}),
                        event_time) AS started_at,
               coalesce({_json("app")},
                        substring(app_env_field, 1,
                                  length(app_env_field) - length(env_of_app_env) - 1)) AS app,
               coalesce({_json("env")}, env_of_app_env) AS env,
               {_json("action")} AS action,
               coalesce({_number("code", "INT")}, {_number("status", "INT")}) AS status,
               {_number("total_time", "DOUBLE")} AS total_time,
               {_number("db_time", "DOUBLE")} AS db_time,
               {_number("view_time", "DOUBLE")} AS view_time,
               {_number("gc_time", "DOUBLE")} AS gc_time,
               {_number("db_calls", "BIGINT")} AS db_calls,
               {_number("severity", "INT")} AS severity,
               {_json("request_id")} AS request_id,
               {_json("caller_id")} AS caller_id,
               coalesce({_json("host")}, host) AS host,
               {_json("ip")} AS ip,
               tag AS topic,
               source,
               received_at
        FROM requests
    """,  # noqa: S608 -- built from this module's constants only
    schema=pa.schema(
        [
            pa.field("event_date", pa.date32(), nullable=False),
            pa.field("started_at", _UTC, nullable=False),
            pa.field("app", pa.string()),
            pa.field("env", pa.string()),
            pa.field("action", pa.string(), nullable=False),
            pa.field("status", pa.int32()),
            pa.field("total_time", pa.float64()),
            pa.field("db_time", pa.float64()),
            pa.field("view_time", pa.float64()),
            pa.field("gc_time", pa.float64()),
            pa.field("db_calls", pa.int64()),
            pa.field("severity", pa.int32()),
            pa.field("request_id", pa.string()),
            pa.field("caller_id", pa.string()),
            pa.field("host", pa.string()),
            pa.field("ip", pa.string()),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("received_at", _UTC, nullable=False),
        ]
    ),
    partition_by=("event_date",),
)

#: Every job by name; each builds the derived table of the same name.
JOBS: Final[Mapping[str, Job]] = {job.name: job for job in (EVENTS_PER_MINUTE, LOGJAM_REQUESTS)}


# -- planning ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """Which ``events`` files a run reads, and why."""

    mode: Mode
    #: The job's progress before the run (None: never ran).
    from_version: int | None
    #: The ``events`` version the run consumes.
    to_version: int
    files: list[str] = field(default_factory=list)
    reason: str = ""


def _filesystem(uri: str, storage_options: dict[str, str] | None) -> pafs.FileSystem:
    return pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options))


def _full_uri(table_uri: str, path: str) -> str:
    if "://" in path or path.startswith("/"):
        return path
    return f"{table_uri.rstrip('/')}/{path}"


def _added_since(
    uri: str, storage_options: dict[str, str] | None, after: int, upto: int
) -> tuple[list[str] | None, str]:
    """Data files committed with ``dataChange=true`` by versions ``after+1 .. upto``.

    Returns ``(None, reason)`` when that cannot be known exactly: a log entry
    was cleaned up, a file was vacuumed, or a commit removed rows.
    """
    fs = _filesystem(uri, storage_options)
    relative: list[str] = []
    for version in range(after + 1, upto + 1):
        name = f"_delta_log/{version:020d}.json"
        try:
            with fs.open_input_stream(name) as stream:
                text = stream.read().decode("utf-8")
        except FileNotFoundError:
            return None, f"log entry {name} is gone (log cleanup)"
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            add = action.get("add")
            if add is not None and add.get("dataChange", True):
                relative.append(unquote(add["path"]))
            remove = action.get("remove")
            if remove is not None and remove.get("dataChange", True):
                return None, f"version {version} removed rows"
    local = [p for p in relative if "://" not in p and not p.startswith("/")]
    for info in fs.get_file_info(local):
        if info.type == pafs.FileType.NotFound:
            return None, f"data file {info.path} is gone (vacuum)"
    return [_full_uri(uri, p) for p in relative], ""


def plan_run(
    events_uri: str,
    done: int | None,
    storage_options: dict[str, str] | None = None,
    *,
    rebuild: bool = False,
) -> Plan:
    """Decide what a run reads, given the job's progress ``done``.

    Raises:
        LakeError: ``events`` cannot be read, or is older than the progress
            (it was recreated: run with ``rebuild``).
    """
    try:
        events = DeltaTable(events_uri, storage_options=storage_options)
        target = int(events.version())
        if done is not None and done > target and not rebuild:
            raise LakeError(
                f"the job consumed events version {done} but the table is at {target}: "
                "was it recreated? run the job with --rebuild"
            )
        if done == target and not rebuild:
            return Plan("up-to-date", done, target)
        reason = "first run" if done is None else "asked to rebuild"
        if done is not None and not rebuild:
            files, reason = _added_since(events_uri, storage_options, done, target)
            if files is not None:
                return Plan("incremental", done, target, files)
        return Plan("rebuild", done, target, list(events.file_uris()), reason)
    except (DeltaError, OSError) as exc:
        raise LakeError(f"cannot read the events table at {events_uri}: {exc}") from exc


# -- running -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a run did."""

    job: str
    mode: Mode
    from_version: int | None
    to_version: int
    files_read: int
    rows_written: int
    table_version: int | None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "job": self.job,
            "mode": self.mode,
            "events_version_from": self.from_version,
            "events_version_to": self.to_version,
            "files_read": self.files_read,
            "rows_written": self.rows_written,
            "table_version": self.table_version,
            "reason": self.reason,
        }


def _open_or_create(job: Job, uri: str, storage_options: dict[str, str] | None) -> DeltaTable:
    if DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return DeltaTable(uri, storage_options=storage_options)
    return DeltaTable.create(
        uri,
        job.schema,
        mode="ignore",
        partition_by=list(job.partition_by) or None,
        name=job.name,
        description=job.description,
        configuration={"delta.checkpointInterval": "50"},
        storage_options=storage_options,
    )


def progress(job: Job, uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The ``events`` version the job last consumed, or None (never ran, no table)."""
    try:
        if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
            return None
        table = DeltaTable(uri, storage_options=storage_options)
        version = table.transaction_version(job.app_id)
    except (DeltaError, OSError) as exc:
        raise LakeError(f"cannot read the derived table at {uri}: {exc}") from exc
    return None if version is None else int(version)


def compute(spark: SparkSession, job: Job, files: list[str]) -> pa.Table:
    """Run the job's SQL over the given ``events`` data files; rows in the job's schema.

    Raises:
        SparkError: the query failed.
    """
    from pyspark.errors import PySparkException

    if not files:
        return job.schema.empty_table()
    try:
        spark.read.schema(EVENTS_FILE_COLUMNS).parquet(*files).createOrReplaceTempView(INPUT_VIEW)
        result = spark.sql(job.sql).toArrow()
    except PySparkException as exc:
        raise SparkError(f"job {job.name}: query failed: {exc}") from exc
    return result.select(job.schema.names).cast(job.schema)


def _commit(
    job: Job,
    table: DeltaTable,
    rows: pa.Table,
    plan: Plan,
    events_uri: str,
) -> None:
    properties = CommitProperties(
        app_transactions=[Transaction(job.app_id, plan.to_version)],
        custom_metadata={
            "appliance.job": job.name,
            "appliance.mode": plan.mode,
            "appliance.events_table": events_uri,
            "appliance.events_version": str(plan.to_version),
        },
    )
    partition_by = list(job.partition_by) or None
    if plan.mode == "rebuild":
        write_deltalake(
            table, rows, mode="overwrite", partition_by=partition_by, commit_properties=properties
        )
    elif job.merge_keys and rows.num_rows:
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in job.merge_keys)
        (
            table.merge(
                rows,
                predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            .when_matched_update({c: f"t.{c} + s.{c}" for c in job.merge_add})
            .when_not_matched_insert_all()
            .execute()
        )
    else:
        # An append, possibly of no rows: it still commits the progress.
        write_deltalake(
            table, rows, mode="append", partition_by=partition_by, commit_properties=properties
        )


def run_job(
    spark: SparkSession,
    job: Job,
    events_uri: str,
    table_uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    rebuild: bool = False,
) -> JobResult:
    """Bring the derived table of ``job`` up to the current ``events`` version.

    Not safe to run twice at once for one job (the CLI holds a lock).

    Raises:
        SparkError: the Spark query failed.
        LakeError: a table could not be read or written.
    """
    done = progress(job, table_uri, storage_options)
    plan = plan_run(events_uri, done, storage_options, rebuild=rebuild)
    if plan.mode == "up-to-date":
        return JobResult(job.name, plan.mode, done, plan.to_version, 0, 0, None)
    if plan.mode == "rebuild":
        log.info("job.rebuild", job=job.name, events_version=plan.to_version, reason=plan.reason)
    rows = compute(spark, job, plan.files)
    try:
        table = _open_or_create(job, table_uri, storage_options)
        _commit(job, table, rows, plan, events_uri)
        table.update_incremental()
        version = int(table.version())
    except (DeltaError, OSError) as exc:
        raise LakeError(f"job {job.name}: cannot write {table_uri}: {exc}") from exc
    log.info(
        "job.done",
        job=job.name,
        mode=plan.mode,
        events_from=plan.from_version,
        events_to=plan.to_version,
        files=len(plan.files),
        rows=rows.num_rows,
        table_version=version,
    )
    return JobResult(
        job.name,
        plan.mode,
        done,
        plan.to_version,
        len(plan.files),
        rows.num_rows,
        version,
        plan.reason,
    )


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A job's progress against the current ``events`` version."""

    job: str
    table_uri: str
    consumed_version: int | None
    events_version: int | None

    @property
    def behind(self) -> int | None:
        """Commits of ``events`` not yet consumed (None when unknown)."""
        if self.events_version is None:
            return None
        consumed = -1 if self.consumed_version is None else self.consumed_version
        return self.events_version - consumed

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "job": self.job,
            "table": self.table_uri,
            "events_version_consumed": self.consumed_version,
            "events_version": self.events_version,
            "commits_behind": self.behind,
        }


def job_status(
    events_uri: str, tables: Mapping[str, str], storage_options: dict[str, str] | None = None
) -> list[JobStatus]:
    """Progress of every job; ``tables`` maps job names to derived-table URIs."""
    try:
        current: int | None = None
        if DeltaTable.is_deltatable(events_uri, storage_options=storage_options):
            current = int(DeltaTable(events_uri, storage_options=storage_options).version())
    except (DeltaError, OSError) as exc:
        raise LakeError(f"cannot read the events table at {events_uri}: {exc}") from exc
    return [
        JobStatus(name, uri, progress(JOBS[name], uri, storage_options), current)
        for name, uri in tables.items()
    ]
