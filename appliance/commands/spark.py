"""``appliance spark run|status``: the PySpark jobs that build the derived tables.

* ``spark run JOB``: bring a derived table up to date with ``events`` (each
  job under its own lock in the state directory), docs/spark.md.
* ``spark status``: how many ``events`` commits each job is behind.

pyspark is imported only by ``spark run``, when it builds a session; the
jobs (pyarrow, deltalake) and the lake's lock (trio) only when a command
runs, so that the CLI starts fast (docs/architecture.md).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from appliance.commands.common import (
    Subparsers,
    add_remote_option,
    guarded,
    print_json,
    print_table,
)
from appliance.config import Config
from appliance.lake.errors import LakeError
from appliance.spark.catalog import DERIVED_TABLES
from appliance.spark.errors import SparkError

if TYPE_CHECKING:
    from appliance.spark.jobs import JobResult

__all__ = ["add_parser"]


def _print_result(result: JobResult) -> None:
    if result.mode == "up-to-date":
        print(f"{result.job}: up to date at events version {result.to_version}")
        return
    start = "start" if result.from_version is None else str(result.from_version + 1)
    print(
        f"{result.job}: {result.mode} over events versions {start}..{result.to_version}: "
        f"{result.files_read} file(s) read, {result.rows_written} row(s) written, "
        f"table version {result.table_version}"
        + (f" ({result.reason})" if result.mode == "rebuild" and result.reason else "")
    )


def _spark_run(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake.operations import MaintenanceLock
    from appliance.spark.jobs import JOBS, run_job
    from appliance.spark.session import build_session

    names = list(JOBS) if args.job == "all" else [args.job]
    options = config.lake.storage_options or None
    results: list[JobResult] = []
    spark = build_session(config.spark, args.remote)
    try:
        for name in names:
            lock = MaintenanceLock(config.state_dir / f"spark-job-{name}.lock", what=f"job {name}")
            with lock:
                result = run_job(
                    spark,
                    JOBS[name],
                    config.table_uri,
                    config.derived_table_uri(name),
                    options,
                    rebuild=args.rebuild,
                )
            results.append(result)
            if not args.json:
                _print_result(result)
    finally:
        spark.stop()
    if args.json:
        print_json([r.to_json() for r in results])
    return 0


def _spark_status(args: argparse.Namespace, config: Config) -> int:
    from appliance.spark.jobs import JOBS, job_status

    tables = {name: config.derived_table_uri(name) for name in JOBS}
    statuses = job_status(config.table_uri, tables, config.lake.storage_options or None)
    if args.json:
        print_json([s.to_json() for s in statuses])
        return 0
    print_table(
        ["job", "events version consumed", "events version", "commits behind", "table"],
        [[s.job, s.consumed_version, s.events_version, s.behind, s.table_uri] for s in statuses],
    )
    return 0


# -- parser ------------------------------------------------------------------------


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``spark`` and its subcommands to the CLI."""
    handle = guarded(LakeError, SparkError)
    spark = commands.add_parser("spark", help="PySpark jobs that build the derived tables")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True, metavar="COMMAND")
    run = spark_sub.add_parser(
        "run", help="bring a derived table up to date with events", parents=[common]
    )
    run.add_argument(
        "job",
        choices=[*DERIVED_TABLES, "all"],
        metavar="JOB",
        help=f"{', '.join(DERIVED_TABLES)}, all",
    )
    add_remote_option(run)
    run.add_argument("--rebuild", action="store_true", help="recompute from the whole events table")
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=handle(_spark_run))
    status = spark_sub.add_parser(
        "status", help="each job's progress against events", parents=[common]
    )
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=handle(_spark_status))
