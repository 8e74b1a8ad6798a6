"""``appliance table ...``: maintenance, statistics, retention and erasure of the tables.

* ``table stats``: files, sizes and rows, per day and protocol, and the disk's outlook.
* ``table compact|checkpoint|vacuum``: maintenance, under the state
  directory's maintenance lock (docs/maintenance.md).
* ``table expire|erase``: deletes from ``events``, handed to the running
  service when it takes table requests, else done here; an erase is audited.

The lake's modules (deltalake, pyarrow, trio) load only when a command runs,
so that the CLI starts fast (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from appliance import defaults
from appliance.commands.common import (
    Handler,
    Subparsers,
    fail,
    guarded,
    non_negative_int,
    positive_int,
    print_json,
    print_table,
)
from appliance.commands.progress import ProgressReporter
from appliance.config import RETENTION_PROTOCOLS, Config
from appliance.lake.errors import LakeError
from appliance.spark.catalog import EVENTS, appliance_tables, find_table
from appliance.spark.errors import SparkError
from appliance.state_lock import holder_pid

if TYPE_CHECKING:
    from appliance.lake.operations import MaintenanceResult, TableStats
    from appliance.lake.usage import Usage

__all__ = ["add_parser"]


def _stats_row(label: str, stats: TableStats) -> list[Any]:
    return [
        label,
        stats.version,
        stats.files,
        stats.bytes,
        stats.average_file_bytes,
        stats.partitions,
        "" if stats.rows is None else stats.rows,
    ]


_STATS_HEADERS = ["", "version", "files", "bytes", "avg file bytes", "partitions", "rows"]


def _print_maintenance(result: MaintenanceResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
        return
    print(f"{result.operation} {result.uri}")
    print_table(
        _STATS_HEADERS,
        [_stats_row("before", result.before), _stats_row("after", result.after)],
    )
    for line in _detail_lines(result.details):
        print(line)


def _plain(value: Any) -> str:
    """One value as an operator reads it: no Python reprs."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value)


def _detail_lines(details: dict[str, Any], indent: str = "") -> list[str]:
    """``key: value`` lines; a mapping's keys indented under it, a list's items likewise."""
    lines: list[str] = []
    for key, value in details.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:" + ("" if value else " -"))
            lines += _detail_lines(value, indent + "  ")
        elif isinstance(value, list | tuple):
            lines.append(f"{indent}{key}:" + ("" if value else " none"))
            lines += [f"{indent}  - {_plain(item)}" for item in value]
        else:
            lines.append(f"{indent}{key}: {_plain(value)}")
    return lines


def _table_uri(args: argparse.Namespace, config: Config) -> str:
    return find_table(config, args.table).uri


def _table_stats(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import maintenance
    from appliance.lake import usage as lake_usage

    uri = _table_uri(args, config)
    options = config.lake.storage_options or None
    stats = maintenance.table_stats(uri, options)
    usage = None
    if args.table == EVENTS:
        usage = lake_usage.usage(
            uri,
            options,
            min_free_bytes=config.lake.min_free_bytes,
            min_free_percent=config.lake.min_free_percent,
            by_protocol=not args.no_protocols,
        )
    if args.json:
        extra = {} if usage is None else {"usage": usage.to_json()}
        print_json({"table": args.table, **stats.to_json(), **extra})
        return 0
    print(f"{args.table} {uri}")
    print_table(_STATS_HEADERS, [_stats_row("now", stats)])
    if usage is not None:
        _print_usage(usage, args.days)
    return 0


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _print_usage(usage: Usage, days: int) -> None:
    shown = usage.days if days == 0 else usage.days[-days:]
    print()
    print(
        f"partitions: {len(usage.days)}, oldest {usage.oldest or '-'}, newest {usage.newest or '-'}"
        + (f" (the last {len(shown)} shown; --days 0 for all)" if len(shown) < len(usage.days)
           else "")
    )  # fmt: skip
    per_protocol: dict[Any, list[str]] = {}
    for p in usage.protocols:
        per_protocol.setdefault(p.event_date, []).append(f"{p.protocol} {p.rows}")
    print_table(
        ["event_date", "files", "bytes", "size", "rows", "rows per protocol"],
        [
            [d.event_date, d.files, d.bytes, _size(d.bytes), d.rows,
             ", ".join(per_protocol.get(d.event_date, []))]
            for d in shown
        ],
    )  # fmt: skip
    if usage.protocols:
        totals: dict[str, list[int]] = {}
        for p in usage.protocols:
            entry = totals.setdefault(p.protocol, [0, 0])
            entry[0] += p.rows
            entry[1] += p.approx_bytes
        print()
        print_table(
            ["protocol", "rows", "approx size"],
            [[name, rows, _size(nbytes)] for name, (rows, nbytes) in sorted(totals.items())],
        )
    print()
    print(f"growth: {_size(usage.bytes_per_day) or 'unknown'} per day")
    if usage.free_bytes is not None:
        print(
            f"free: {_size(usage.free_bytes)}, disk guard watermark: {_size(usage.watermark_bytes)}"
        )
    if usage.days_until_watermark is not None:
        print(f"days until the watermark: {usage.days_until_watermark} ({usage.projection_note})")
    else:
        print(f"days until the watermark: unknown ({usage.projection_note})")


def _locked(config: Config, operation: Callable[[], MaintenanceResult]) -> MaintenanceResult:
    from appliance.lake.operations import MaintenanceLock, lock_path

    with MaintenanceLock(lock_path(config.state_dir)):
        return operation()


def _progress(args: argparse.Namespace, operation: str) -> ProgressReporter:
    return ProgressReporter(operation, enabled=not args.json)


if TYPE_CHECKING:
    #: One maintenance operation: the table's URI, its storage options and the progress reporter.
    _Operation: TypeAlias = Callable[
        [str, dict[str, str] | None, ProgressReporter], MaintenanceResult
    ]


def _maintain(
    args: argparse.Namespace,
    config: Config,
    name: str,
    operation: _Operation,
    *,
    progress: bool = True,
) -> int:
    """Run ``operation`` on ``--table`` under the maintenance lock and print its result."""
    options = config.lake.storage_options or None
    with ProgressReporter(name, enabled=progress and not args.json) as reporter:
        result = _locked(config, lambda: operation(_table_uri(args, config), options, reporter))
    _print_maintenance(result, args.json)
    return 0


def _table_compact(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import maintenance

    target = args.target_file_bytes or config.maintenance.target_file_bytes
    return _maintain(
        args,
        config,
        "compact",
        lambda uri, options, progress: maintenance.compact(
            uri, options, target_file_bytes=target, progress=progress
        ),
    )


def _table_checkpoint(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import maintenance

    # A checkpoint is one quick step: no progress shown.
    return _maintain(
        args,
        config,
        "checkpoint",
        lambda uri, options, _: maintenance.checkpoint(uri, options),
        progress=False,
    )


def _table_vacuum(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import maintenance

    hours = (
        args.retention_hours
        if args.retention_hours is not None
        else config.maintenance.vacuum_retention_hours
    )
    allow_short = args.allow_short_retention or config.maintenance.allow_short_vacuum_retention
    try:
        defaults.check_retention(hours, allow_short=allow_short, override="--allow-short-retention")
    except ValueError as exc:
        return fail(str(exc))
    return _maintain(
        args,
        config,
        "vacuum",
        lambda uri, options, progress: maintenance.vacuum(
            uri,
            options,
            retention_hours=hours,
            allow_short_retention=allow_short,
            dry_run=args.dry_run,
            progress=progress,
        ),
    )


if TYPE_CHECKING:
    #: A delete from events, :func:`retention.expire` or :func:`retention.erase` with its criteria.
    _Delete: TypeAlias = Callable[..., MaintenanceResult]


def _delete_events(
    args: argparse.Namespace,
    config: Config,
    progress: ProgressReporter,
    delete: _Delete,
    request: dict[str, Any],
) -> MaintenanceResult:
    """Run ``delete`` (or a dry run) here, or as ``request`` in the running service.

    A dry run runs here. A delete runs in the running service when it takes
    table requests (no commit of its own meanwhile), else here: a delete from
    this process would race the service's commits, and delta-rs fails it
    whenever an append adds a file it might have to read
    (appliance/lake/table_requests.py).
    """

    def here() -> MaintenanceResult:
        return delete(
            config.table_uri,
            config.lake.storage_options or None,
            dry_run=args.dry_run,
            vacuum_retention_hours=config.maintenance.vacuum_retention_hours,
            progress=progress,
        )

    if args.dry_run:
        return _locked(config, here)
    from appliance.lake import table_requests

    pid = table_requests.serving_pid(config.state_dir)
    if pid is not None:
        request = {**request, "vacuum_retention_hours": config.maintenance.vacuum_retention_hours}
        return table_requests.hand_off(config.state_dir, request, pid, progress)
    running = holder_pid(config.state_dir)
    if running is not None:
        why = (
            f"its {config.worker_count} workers hand table requests to no one"
            if config.worker_count > 1
            else "[maintenance] enabled = false"
        )
        print(
            f"note: the running service (pid {running}) takes no table requests ({why}): "
            "deleting alongside its commits, under the maintenance lock it shares",
            file=sys.stderr,
        )
    return _locked(config, here)


def _table_expire(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import retention

    policy = retention.RetentionPolicy.from_config(config.retention)
    if args.max_age_days is not None:
        policy = retention.RetentionPolicy(args.max_age_days, policy.rules)
    if not policy.enabled:
        return fail(
            "retention is off: set [retention] max_age_days (or rules), or pass --max-age-days N"
        )
    request = {
        "operation": "expire",
        "max_age_days": policy.max_age_days,
        "rules": [
            {"max_age_days": r.max_age_days, "tag_prefix": r.tag_prefix, "protocol": r.protocol}
            for r in policy.rules
        ],
    }
    expire = functools.partial(retention.expire, policy=policy)
    criteria = f"max_age_days={policy.max_age_days} rules={len(policy.rules)}"
    return _audited_delete(args, config, "expire", expire, request, criteria)


def _moment(text: str) -> dt.datetime:
    """A time for --since/--until: ISO 8601 / RFC 3339, or a date (midnight); naive means UTC."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a date or time: {text!r} (2026-01-31 or 2026-01-31T12:00:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _erase_predicate(args: argparse.Namespace) -> str:
    flags = {
        "tag": args.tag,
        "tag_prefix": args.tag_prefix,
        "source": args.source,
        "protocol": args.protocol,
        "since": args.since,
        "until": args.until,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if args.where is not None:
        if given:
            raise ValueError("--where cannot be combined with the other filters")
        if not args.where.strip():
            raise ValueError("--where is empty")
        return str(args.where)
    from appliance.lake import retention

    return retention.erase_predicate(**given)


def _table_erase(args: argparse.Namespace, config: Config) -> int:
    from appliance.lake import retention

    try:
        predicate = _erase_predicate(args)
    except ValueError as exc:
        return fail(str(exc))
    erase = functools.partial(retention.erase, predicate=predicate)
    request = {"operation": "erase", "predicate": predicate}
    return _audited_delete(args, config, "erase", erase, request, f"predicate={predicate}")


def _audited_delete(
    args: argparse.Namespace,
    config: Config,
    operation: str,
    delete: _Delete,
    request: dict[str, Any],
    criteria: str,
) -> int:
    """A delete from events (``expire`` or ``erase``) with its ``table.<operation>`` audit entry.

    A dry run deletes nothing and is not audited. Otherwise the audit log is
    opened first, so a delete never happens without its entry, and a failed
    delete is audited too. ``criteria`` (the predicate or the policy) ends the
    entry's detail.
    """
    if args.dry_run:
        with _progress(args, operation) as progress:
            result = _delete_events(args, config, progress, delete, request)
        _print_maintenance(result, args.json)
        return 0
    from appliance.commands.auth_common import admin, open_auth

    action = f"table.{operation}"
    with open_auth(config, create=True) as db:
        store = db.audit
        try:
            with _progress(args, operation) as progress:
                result = _delete_events(args, config, progress, delete, request)
        except LakeError as exc:
            store.record_audit(
                action, config.table_uri, actor=admin(),
                detail=f"failed: {str(exc)[:200]} {criteria}",
            )  # fmt: skip
            raise
        details = result.details
        store.record_audit(
            action, config.table_uri, actor=admin(),
            detail=f"rows={details.get('rows_deleted', 0) or 0} "
            f"files_replaced={details.get('files_removed', 0) or 0} "
            f"version={result.after.version} {criteria}",
        )  # fmt: skip
    _print_maintenance(result, args.json)
    return 0


# -- parser ------------------------------------------------------------------------


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``table`` and its subcommands to the CLI."""
    handle = guarded(LakeError, SparkError)
    table = commands.add_parser("table", help="table maintenance and statistics")
    table_sub = table.add_subparsers(dest="table_command", required=True, metavar="COMMAND")
    names = [t.name for t in appliance_tables(Config())]

    def add(name: str, func: Handler, help_text: str) -> argparse.ArgumentParser:
        parser = table_sub.add_parser(name, help=help_text, parents=[common])
        parser.add_argument(
            "--table", choices=names, default=EVENTS, help="which table (default: events)"
        )
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=handle(func))
        return parser

    stats = add("stats", _table_stats, "files, sizes and rows, per day and protocol")
    stats.add_argument(
        "--days",
        type=non_negative_int,
        default=14,
        help="days listed, newest last (default: 14; 0: all)",
    )
    stats.add_argument(
        "--no-protocols", action="store_true", help="skip the rows per protocol (a table scan)"
    )
    compact = add("compact", _table_compact, "rewrite small files into large ones")
    compact.add_argument(
        "--target-file-bytes",
        type=positive_int,
        help="size to aim for (default: [maintenance] target_file_bytes)",
    )
    add("checkpoint", _table_checkpoint, "write a checkpoint and delete expired log files")
    vacuum = add("vacuum", _table_vacuum, "delete files no recent version refers to")
    vacuum.add_argument(
        "--retention-hours",
        type=non_negative_int,
        help="keep files younger than this (default: [maintenance] vacuum_retention_hours)",
    )
    vacuum.add_argument(
        "--allow-short-retention",
        action="store_true",
        help=f"allow a retention under {defaults.MIN_VACUUM_RETENTION_HOURS} h",
    )
    vacuum.add_argument("--dry-run", action="store_true", help="list, do not delete")

    def add_events(name: str, func: Handler, help_text: str) -> argparse.ArgumentParser:
        parser = table_sub.add_parser(name, help=help_text, parents=[common])
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--dry-run", action="store_true", help="say what, change nothing")
        parser.set_defaults(func=handle(func), table=EVENTS)
        return parser

    expire = add_events(
        "expire", _table_expire, "remove events older than [retention] allows (whole days)"
    )
    expire.add_argument(
        "--max-age-days",
        type=positive_int,
        help="keep this many days (default: [retention] max_age_days; rules still apply)",
    )
    erase = add_events(
        "erase",
        _table_erase,
        "delete the events a filter matches (audited; a vacuum removes the bytes)",
    )
    erase.add_argument(
        "--where",
        metavar="PREDICATE",
        help="an SQL predicate for delta-rs, e.g. \"source = 'token:x'\" "
        "(admin only: passed to its SQL parser as written)",
    )
    erase.add_argument("--tag", help="events with exactly this tag")
    erase.add_argument("--tag-prefix", help="events whose tag starts with this")
    erase.add_argument("--source", help="events of this source (authenticated principal)")
    erase.add_argument("--protocol", choices=RETENTION_PROTOCOLS, help="events of this protocol")
    erase.add_argument(
        "--since", type=_moment, help="events whose event_time is at or after this (UTC if naive)"
    )
    erase.add_argument(
        "--until", type=_moment, help="events whose event_time is before this (UTC if naive)"
    )
