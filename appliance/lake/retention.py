"""Retention by age and erasure on the ``events`` table: the policy, its predicates, expire, erase.

**Expire** (``[retention]``, ``appliance table expire``): every event has an
age limit, ``max_age_days`` unless a rule for its tag prefix or protocol
says otherwise (the first matching rule wins). An ``event_date`` partition is
expired once all of it is older than its limit: ``event_date < today(UTC) -
max_age_days``. Partitions older than the longest limit (the *horizon*) go
whole, in one delete whose predicate names only ``event_date``: delta-rs then
commits ``remove`` actions and no rewritten file (the commit's
``operationMetrics`` say ``num_added_files = 0``, ``num_copied_rows = 0``).
Rows under a shorter rule, younger than the horizon, go in a second delete
that rewrites the files they share with other rows. Nothing to remove means
no delete and no commit.

**Erase** (``appliance table erase``): one delete with a predicate built from
``--tag``/``--source``/``--since``/``--until`` (each value quoted as an SQL
string literal, ``'`` doubled) or an operator's ``--where`` expression, which
delta-rs's SQL parser reads. Only files holding matching rows are rewritten.

Both need ``delta.appendOnly = false``: the table is created with ``true``
(nothing deletes by accident), and the first expire or erase that has rows to
remove sets it to ``false`` in a commit of its own
(:func:`allow_deletes`). That is a property change, not a protocol change:
the table stays at reader 1 / writer 2 with no table features.

The bytes stay on disk until a vacuum older than the retention floor deletes
the replaced files; every result says so (``vacuum`` in its details).

Runs in a worker thread, through ``LakeWriter.run_exclusive`` in the
service (never alongside one of its commits), under the maintenance lock.
While the service runs, the CLI hands its erase and expire to it
(:mod:`appliance.lake.table_requests`): a delete from another process
would race the service's appends, and delta-rs fails whichever commits
second (a delete when an append added a file its predicate might match, an
append when a delete removed a file). With no service, the CLI deletes
itself, and a delete that lost such a race runs again on a fresh snapshot,
up to :data:`DELETE_ATTEMPTS` times.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import CommitFailedError

from appliance import defaults
from appliance.lake.errors import LakeError
from appliance.lake.operations import (
    SQL_TABLE,
    MaintenanceResult,
    PartitionInfo,
    Progress,
    add_actions,
    file_stats,
    lake_errors,
    no_progress,
    open_table,
    partitions,
)
from appliance.logs import get_logger

if TYPE_CHECKING:
    # pyarrow loads at the first retention run, not at the service's start
    # (docs/performance.md#idle-memory).
    import pyarrow as pa

    from appliance.config import RetentionConfig

__all__ = [
    "APPEND_ONLY",
    "DELETE_ATTEMPTS",
    "ExpirePlan",
    "ExpireStep",
    "RetentionPolicy",
    "RuleLike",
    "allow_deletes",
    "erase",
    "erase_predicate",
    "expire",
    "plan_expire",
    "sql_string",
]

log = get_logger("maintenance")

#: Tries of one delete that loses its race with concurrent commits (another process).
DELETE_ATTEMPTS: Final = 5
#: The table property that refuses deletes; retention and erasure set it to false.
APPEND_ONLY: Final = "delta.appendOnly"


class RuleLike(Protocol):
    """A retention rule: events with this tag prefix and/or protocol keep ``max_age_days``."""

    @property
    def max_age_days(self) -> int: ...

    @property
    def tag_prefix(self) -> str | None: ...

    @property
    def protocol(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long events are kept: ``max_age_days`` (None: forever) unless a rule matches."""

    max_age_days: int | None = None
    rules: tuple[RuleLike, ...] = ()

    @classmethod
    def from_config(cls, config: RetentionConfig) -> RetentionPolicy:
        """The policy of a ``[retention]`` section."""
        return cls(config.max_age_days, tuple(config.rules))

    @property
    def enabled(self) -> bool:
        """Whether anything ever expires."""
        return self.max_age_days is not None or bool(self.rules)


# -- predicates ----------------------------------------------------------------------


def sql_string(value: str) -> str:
    """``value`` as an SQL string literal: in quotes, a quote doubled; nothing else is special.

    Raises:
        ValueError: ``value`` holds a NUL character (no column holds one).
    """
    if "\x00" in value:
        raise ValueError("a value cannot contain a NUL character")
    return "'" + value.replace("'", "''") + "'"


def _date(day: dt.date) -> str:
    return sql_string(day.isoformat())


def _rule_match(rule: RuleLike) -> str:
    parts: list[str] = []
    if rule.tag_prefix is not None:
        parts.append(f"starts_with(tag, {sql_string(rule.tag_prefix)})")
    if rule.protocol is not None:
        parts.append(f"protocol = {sql_string(rule.protocol)}")
    if not parts:
        raise ValueError("a retention rule needs a tag_prefix or a protocol")
    return "(" + " AND ".join(parts) + ")"


def _describe(rule: RuleLike) -> str:
    parts = []
    if rule.tag_prefix is not None:
        parts.append(f"tag prefix {rule.tag_prefix!r}")
    if rule.protocol is not None:
        parts.append(f"protocol {rule.protocol!r}")
    return " and ".join(parts)


def _ns(moment: dt.datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def erase_predicate(
    *,
    tag: str | None = None,
    tag_prefix: str | None = None,
    source: str | None = None,
    protocol: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> str:
    """The delete predicate of ``appliance table erase``'s flags, all of them ANDed.

    Strings become quoted literals (:func:`sql_string`), times integer
    comparisons on ``event_time_ns`` (``since`` inclusive, ``until``
    exclusive; a naive time is UTC), so no flag value can change the
    predicate's structure.

    Raises:
        ValueError: no flag given (that would erase everything), or ``since``
            is not before ``until``.
    """
    parts: list[str] = []
    if tag is not None:
        parts.append(f"tag = {sql_string(tag)}")
    if tag_prefix is not None:
        if not tag_prefix:
            raise ValueError("an empty tag prefix matches every event")
        parts.append(f"starts_with(tag, {sql_string(tag_prefix)})")
    if source is not None:
        parts.append(f"source = {sql_string(source)}")
    if protocol is not None:
        parts.append(f"protocol = {sql_string(protocol)}")
    if since is not None:
        parts.append(f"event_time_ns >= {_ns(since)}")
    if until is not None:
        parts.append(f"event_time_ns < {_ns(until)}")
    if since is not None and until is not None and _ns(since) >= _ns(until):
        raise ValueError("--since must be before --until")
    if not parts:
        raise ValueError("name what to erase: --where, or --tag/--tag-prefix/--source/--since/...")
    return " AND ".join(parts)


# -- table helpers -------------------------------------------------------------------------


def _count(table: DeltaTable, predicate: str) -> int:
    """Rows of the table's current version that ``predicate`` matches (validates it too)."""
    query = QueryBuilder().register(SQL_TABLE, table)
    # The predicate is the one the delete runs: built from quoted values, or an
    # admin's --where, which delta-rs's parser reads anyway. One statement only.
    sql = f"SELECT count(*) AS n FROM {SQL_TABLE} WHERE ({predicate})"  # noqa: S608
    import pyarrow as pa

    try:
        result = pa.table(query.execute(sql).read_all())
    except Exception as exc:  # DataFusion raises plain Exceptions for SQL errors
        raise LakeError(f"cannot evaluate the predicate {predicate!r}: {exc}") from exc
    return int(result.column("n")[0].as_py())


def append_only(table: DeltaTable) -> bool:
    """Whether the table still refuses deletes (``delta.appendOnly = true``)."""
    return table.metadata().configuration.get(APPEND_ONLY, "false").lower() == "true"


def allow_deletes(table: DeltaTable) -> bool:
    """Set ``delta.appendOnly = false`` unless it is already; True when this call changed it.

    A metadata commit with no protocol change (still reader 1 / writer 2). A
    commit of the service racing it from another process fails once and is
    retried by the writer.
    """
    table.update_incremental()
    if not append_only(table):
        return False
    table.alter.set_table_properties({APPEND_ONLY: "false"})
    table.update_incremental()
    log.info("table.deletes_allowed", table=table.table_uri, property=f"{APPEND_ONLY}=false")
    return True


def _delete(
    uri: str, storage_options: dict[str, str] | None, predicate: str
) -> tuple[dict[str, Any], int]:
    """One delete, run again on a fresh snapshot when a concurrent commit wins the race.

    Returns:
        delta-rs's metrics and the attempts it took.
    """
    for attempt in range(1, DELETE_ATTEMPTS + 1):
        table = DeltaTable(uri, storage_options=storage_options)
        try:
            return table.delete(predicate), attempt
        except CommitFailedError as exc:
            if "concurrent" not in str(exc).lower() or attempt == DELETE_ATTEMPTS:
                raise
            log.info("delete.retry", table=uri, attempt=attempt, reason=str(exc).splitlines()[0])
    raise AssertionError("unreachable")  # pragma: no cover


def _removed_bytes(before: pa.Table, after: pa.Table) -> tuple[int, int]:
    """Files, and their bytes, live in ``before`` and gone in ``after``."""
    gone = set(before.column("path").to_pylist()) - set(after.column("path").to_pylist())
    sizes = [
        int(size)
        for path, size in zip(
            before.column("path").to_pylist(), before.column("size_bytes").to_pylist(), strict=True
        )
        if path in gone
    ]
    return len(sizes), sum(sizes)


def _vacuum_note(files: int, nbytes: int, retention_hours: int) -> str:
    if not files:
        return "nothing for a vacuum to delete"
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=retention_hours)
    return (
        f"{files} replaced file(s), {nbytes} bytes, stay on disk (and readable by time "
        f"travel) until a vacuum deletes them: 'appliance table vacuum' from "
        f"{when:%Y-%m-%d %H:%MZ} (vacuum_retention_hours = {retention_hours}), or at once "
        "with 'appliance table vacuum --retention-hours 0 --allow-short-retention' "
        "(which also ends time travel to earlier versions)"
    )


# -- expire ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpireStep:
    """Rows of one rule's class that are past its limit but younger than the horizon."""

    description: str
    max_age_days: int
    predicate: str


@dataclass(frozen=True, slots=True)
class ExpirePlan:
    """What an expire removes from one version of the table."""

    today: dt.date
    #: Partitions before this date go whole (None: some events are kept forever).
    cutoff: dt.date | None
    #: The partitions that go whole.
    partitions: list[PartitionInfo]
    #: Row-level deletes under shorter rules (they rewrite files).
    steps: list[ExpireStep]

    @property
    def partition_predicate(self) -> str | None:
        """The whole-partition delete: a predicate on ``event_date`` alone."""
        if self.cutoff is None or not self.partitions:
            return None
        return f"event_date < {_date(self.cutoff)}"

    @property
    def row_predicate(self) -> str | None:
        """The row-level delete, every step ORed (one commit)."""
        if not self.steps:
            return None
        return " OR ".join(f"({step.predicate})" for step in self.steps)


def plan_expire(
    actions: pa.Table, policy: RetentionPolicy, today: dt.date | None = None
) -> ExpirePlan:
    """What ``policy`` removes from the table whose live files are ``actions``.

    Each event's limit is its first matching rule's ``max_age_days``, else
    the policy's. Partitions older than every limit go whole; rows of a class
    with a shorter limit go row by row, only in partitions that exist between
    its cutoff and the horizon.
    """
    today = today or dt.datetime.now(dt.UTC).date()
    live = partitions(actions)
    if not policy.enabled:
        return ExpirePlan(today, None, [], [])
    classes: list[tuple[int | None, str, str]] = []  # limit, predicate, description
    earlier: list[str] = []
    for rule in policy.rules:
        match = _rule_match(rule)
        own = match if not earlier else f"{match} AND NOT ({' OR '.join(earlier)})"
        classes.append((rule.max_age_days, own, _describe(rule)))
        earlier.append(match)
    rest = f"NOT ({' OR '.join(earlier)})" if earlier else "TRUE"
    classes.append((policy.max_age_days, rest, "events no rule matches"))
    limits = [days for days, _, _ in classes]
    horizon = None if any(d is None for d in limits) else max(d for d in limits if d is not None)
    cutoff = None if horizon is None else today - dt.timedelta(days=horizon)
    whole = [p for p in live if cutoff is not None and p.event_date < cutoff]
    steps: list[ExpireStep] = []
    for days, predicate, description in classes:
        if days is None or (horizon is not None and days >= horizon):
            continue
        own_cutoff = today - dt.timedelta(days=days)
        if not any(
            p.event_date < own_cutoff and (cutoff is None or p.event_date >= cutoff) for p in live
        ):
            continue  # no partition where this class could have expired rows
        bounds = f"event_date < {_date(own_cutoff)}"
        if cutoff is not None:
            bounds += f" AND event_date >= {_date(cutoff)}"
        steps.append(ExpireStep(description, days, f"{bounds} AND {predicate}"))
    return ExpirePlan(today, cutoff, whole, steps)


def expire(
    uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    policy: RetentionPolicy,
    today: dt.date | None = None,
    dry_run: bool = False,
    vacuum_retention_hours: int = defaults.VACUUM_RETENTION_HOURS,
    progress: Progress = no_progress,
) -> MaintenanceResult:
    """Remove the events ``policy`` says are too old; with ``dry_run``, only say what.

    At most two commits: whole partitions (``remove`` actions only), then
    rows under shorter rules (rewrites). A table with nothing to remove gets
    no commit, and its ``delta.appendOnly`` is left as it is.

    Raises:
        LakeError: no table there, the storage failed, or a delete kept losing
            its race with concurrent commits.
    """
    table = open_table(uri, storage_options)
    steps = 4
    with lake_errors("expire", uri):
        progress(1, steps, "reading the table's files")
        before = file_stats(table)
        actions = add_actions(table)
        plan = plan_expire(actions, policy, today)
        details: dict[str, Any] = {
            "dry_run": dry_run,
            "cutoff": None if plan.cutoff is None else plan.cutoff.isoformat(),
            "partitions_removed" if not dry_run else "partitions_to_remove": [
                p.event_date.isoformat() for p in plan.partitions
            ],
            "partition_rows": sum(p.rows for p in plan.partitions),
            "partition_bytes": sum(p.bytes for p in plan.partitions),
        }
        if plan.steps:
            details["rules"] = [f"{s.description}: {s.max_age_days} days" for s in plan.steps]
        row_predicate = plan.row_predicate
        if dry_run:
            progress(2, steps, "counting the rows shorter rules remove")
            if row_predicate is not None:
                details["rule_rows_to_remove"] = _count(table, row_predicate)
            progress(steps, steps, "done (dry run)")
            return MaintenanceResult("expire", uri, before, before, details)
        partition_predicate = plan.partition_predicate
        if partition_predicate is not None:
            progress(2, steps, f"removing {len(plan.partitions)} whole partition(s)")
            allow_deletes(table)
            metrics, attempts = _delete(uri, storage_options, partition_predicate)
            details["partition_delete"] = {**metrics, "attempts": attempts}
            if metrics.get("num_added_files", 0) or metrics.get("num_copied_rows", 0):
                log.warning("expire.rewrote_files", table=uri, metrics=metrics)
        if row_predicate is not None:
            progress(3, steps, f"removing rows under {len(plan.steps)} shorter rule(s)")
            table.update_incremental()
            # While deletes are refused, only turn them on when there is a row to remove.
            if not append_only(table) or _count(table, row_predicate) > 0:
                allow_deletes(table)
                metrics, attempts = _delete(uri, storage_options, row_predicate)
                details["rule_delete"] = {**metrics, "attempts": attempts}
                details["rule_rows_removed"] = metrics.get("num_deleted_rows")
        table.update_incremental()
        after = file_stats(table)
        # The totals the audit entry and the CLI report: whole partitions count
        # by their files' statistics (a remove-only delete reads no row).
        partition = details.get("partition_delete") or {}
        rule = details.get("rule_delete") or {}
        details["rows_deleted"] = (details["partition_rows"] if partition else 0) + int(
            rule.get("num_deleted_rows") or 0
        )
        details["files_removed"] = int(partition.get("num_removed_files") or 0) + int(
            rule.get("num_removed_files") or 0
        )
        files, nbytes = _removed_bytes(actions, add_actions(table))
        details["files_awaiting_vacuum"] = files
        details["bytes_awaiting_vacuum"] = nbytes
        details["vacuum"] = _vacuum_note(files, nbytes, vacuum_retention_hours)
        progress(steps, steps, "done")
    return MaintenanceResult("expire", uri, before, after, details)


# -- erase ------------------------------------------------------------------------------


def erase(
    uri: str,
    storage_options: dict[str, str] | None = None,
    *,
    predicate: str,
    dry_run: bool = False,
    vacuum_retention_hours: int = defaults.VACUUM_RETENTION_HOURS,
    progress: Progress = no_progress,
) -> MaintenanceResult:
    """Delete the rows ``predicate`` matches, rewriting only the files that hold them.

    The predicate is counted first (which also checks that it parses); no
    match means no commit. With ``dry_run``, only the count.

    Raises:
        LakeError: no table there, an invalid predicate, the storage failed,
            or the delete kept losing its race with concurrent commits.
    """
    table = open_table(uri, storage_options)
    steps = 3
    with lake_errors("erase", uri):
        progress(1, steps, "counting the matching rows")
        before = file_stats(table)
        actions = add_actions(table)
        matched = _count(table, predicate)
        details: dict[str, Any] = {
            "predicate": predicate,
            "dry_run": dry_run,
            "rows_matched": matched,
        }
        if dry_run or matched == 0:
            details["vacuum"] = _vacuum_note(0, 0, vacuum_retention_hours)
            progress(steps, steps, "done (dry run)" if dry_run else "done: no row matches")
            return MaintenanceResult("erase", uri, before, before, details)
        progress(2, steps, f"deleting {matched} row(s)")
        allow_deletes(table)
        metrics, attempts = _delete(uri, storage_options, predicate)
        table.update_incremental()
        after = file_stats(table)
        files, nbytes = _removed_bytes(actions, add_actions(table))
        details.update(
            rows_deleted=metrics.get("num_deleted_rows"),
            files_removed=metrics.get("num_removed_files"),
            files_added=metrics.get("num_added_files"),
            rows_copied=metrics.get("num_copied_rows"),
            attempts=attempts,
            files_awaiting_vacuum=files,
            bytes_awaiting_vacuum=nbytes,
            vacuum=_vacuum_note(files, nbytes, vacuum_retention_hours),
        )
        progress(steps, steps, "done")
    return MaintenanceResult("erase", uri, before, after, details)
