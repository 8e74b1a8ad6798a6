"""``appliance status``: what the running service is doing, from its admin listener.

It reads ``/metrics`` (parsed with ``prometheus_client.parser``) and
``/readyz`` from the ``[admin]`` listener of the configuration (``--url`` for
another) and prints one table: readiness, which appliance answered (node id,
state directory, pid, worker), the process, each listener with its open
connections, rates and errors (refused batches among them, by reason), the
table's last commit, the writer's queue (``ack = "commit"``) or the
write-ahead log (``ack = "wal"``), and the maintenance runs. ``--json``
prints the same as one JSON document.

Which appliance answered is checked: an admin listener whose ``/readyz``
names another state directory than the configuration's is an error (another
appliance holds the address), unless ``--url`` was given. The metric names
come from :class:`~appliance.metric_names.MetricNames`; a scrape without a
family that status reads is an error too (a CLI and a service of different
versions), never a silent 0.

Rates need two scrapes: a single ``status`` scrapes twice, ``--interval``
seconds apart (1 by default). ``--watch`` redraws the table in place every
``--interval`` seconds until Ctrl-C, and adds the errors of the last minute
(from the scrapes it has seen, so the window fills during the first
minute); the table's commit rates and the log's waits and refusals are
taken over that window too. A failed scrape does not end ``--watch``: it
says so, keeps the last answer on screen, and tries again after a growing
pause of at most :data:`WATCH_RETRY_MAX_SECONDS`.

The bearer token, when the admin listener wants one, comes from
``$APPLIANCE_ADMIN_TOKEN``, ``--token-stdin``, or the configured
``token_file`` when this user may read it; never from argv. Exit code: 0
ready, 1 not ready, not reachable, or another appliance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from appliance import __version__
from appliance.commands.common import (
    ADMIN_TOKEN_ENV,
    NoRedirect,
    Subparsers,
    admin_token,
    admin_url,
    ca_context,
    fail,
    token_may_go_to,
)
from appliance.config import Config
from appliance.metric_names import MetricNames
from appliance.state_lock import holder_pid

__all__ = [
    "TOKEN_ENV",
    "WATCH_RETRY_MAX_SECONDS",
    "Scrape",
    "StatusError",
    "add_parser",
    "check_instance",
    "default_url",
    "expected_state_dir",
    "render",
    "summarize",
]

#: Environment variable that may hold the admin listener's bearer token.
TOKEN_ENV: Final = ADMIN_TOKEN_ENV
#: Seconds one request to the admin listener may take.
REQUEST_TIMEOUT_SECONDS: Final = 10.0
#: Largest /metrics answer read, in bytes.
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: The window of "errors in the last minute" (--watch), in seconds; the table's
#: commit rates and the log's waits and refusals are taken over it too.
ERROR_WINDOW_SECONDS: Final = 60.0
#: Longest pause of ``--watch`` between two tries while the admin listener does
#: not answer, in seconds: the pause doubles from ``--interval`` up to this.
WATCH_RETRY_MAX_SECONDS: Final = 30.0
#: Rates below this are shown as "<0.01" (the table shows two decimals at most).
_SMALLEST_SHOWN: Final = 0.01
#: What ``--watch`` writes before each table: cursor home, clear the screen.
_REDRAW: Final = "\x1b[H\x1b[2J"

Labels = frozenset[tuple[str, str]]


class StatusError(Exception):
    """The admin listener cannot be reached, answered something unusable, or is another's."""


def _error_counters() -> dict[str, str]:
    """Counters whose increase is an error, by the short name the table shows."""
    n = MetricNames
    return {
        "tls": n.TLS_FAILURES,
        "refused": n.CONNECTIONS_REFUSED,
        "protocol": n.PROTOCOL_ERRORS,
        "dropped_events": n.EVENTS_DROPPED,
        "failed": n.CONNECTIONS_FAILED,
        "batches_refused": n.BATCHES_REFUSED,
    }


def _required() -> list[str]:
    """The families every service exports and status reads (the log's: :func:`_wal_names`)."""
    n = MetricNames
    return [
        *_error_counters().values(),
        n.CONNECTIONS_OPEN, n.CONNECTIONS_ACCEPTED, n.REQUESTS, n.EVENTS_RECEIVED,
        n.RECEIVED_BYTES, n.ACKS_SENT, n.ACK_LATENCY, n.LAKE_COMMITS, n.LAKE_COMMIT_DURATION,
        n.LAKE_COMMITTED_ROWS, n.LAKE_COMMIT_FAILURES, n.LAKE_COMMIT_RETRYING,
        n.LAKE_QUEUE_BLOCKS, n.LAKE_QUEUE_CAPACITY, n.LAKE_DEDUPE_HITS, n.LAKE_BLOCKS_REFUSED,
        n.LAKE_COMMIT_CONFLICTS, n.LAKE_BATCHES_STORED_ELSEWHERE, n.LAKE_DEDUPE_KEYS,
        n.LAKE_DEDUPE_EVICTED, n.LAKE_TABLE_VERSION, n.LAKE_LAST_COMMIT_TIMESTAMP,
        n.LAKE_LAST_COMMIT_AGE, n.LAKE_TABLE_FILES, n.MAINTENANCE_RUNS, n.MAINTENANCE_LAST_RUN,
        n.MAINTENANCE_LAST_DURATION, n.BUILD_INFO,
    ]  # fmt: skip


def _wal_names() -> list[str]:
    """The write-ahead log's families status reads (exported with ``ack = "wal"`` once open)."""
    n = MetricNames
    return [
        n.WAL_FILE_BYTES, n.WAL_MAX_BYTES, n.WAL_UNCOMMITTED_BYTES, n.WAL_OLDEST_UNCOMMITTED_AGE,
        n.WAL_SEGMENTS, n.WAL_AT_CAP, n.WAL_CACHE_BYTES, n.WAL_APPENDS, n.WAL_FAILED_SYNCS,
        n.WAL_WRITTEN_BYTES, n.WAL_CAP_WAITS, n.WAL_CAP_REFUSALS, n.WAL_GROUPS_FROM_CACHE,
        n.WAL_GROUPS_READ_BACK, n.WAL_RECORDS_LOST,
    ]  # fmt: skip


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """One reading of /metrics: every sample, and when it was taken (monotonic seconds)."""

    at: float
    samples: dict[tuple[str, Labels], float]
    #: Every family and sample name in it (a counter's family both with and without ``_total``).
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        """The samples of a text exposition."""
        from prometheus_client.parser import text_string_to_metric_families

        samples: dict[tuple[str, Labels], float] = {}
        names: set[str] = set()
        try:
            for family in text_string_to_metric_families(text):
                names.add(family.name)
                if family.type == "counter":
                    names.add(f"{family.name}_total")
                for sample in family.samples:
                    names.add(sample.name)
                    samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        except ValueError as exc:
            raise StatusError(f"/metrics is not in the Prometheus text format: {exc}") from None
        return cls(at, samples, frozenset(names))

    def value(self, name: str, **labels: str) -> float:
        """One sample (0 when absent)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, int]:
        """The samples of ``name`` whose labels include ``labels``, summed by ``label``, if > 0."""
        wanted = set(labels.items())
        found: dict[str, int] = {}
        for (n, ls), v in self.samples.items():
            if n == name and wanted <= ls and v > 0:
                key = dict(ls).get(label, "")
                found[key] = found.get(key, 0) + int(v)
        return dict(sorted(found.items()))

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """A histogram's ``(le, cumulative count)`` pairs, ordered by ``le``."""
        found: list[tuple[float, float]] = []
        for (n, ls), v in self.samples.items():
            if n != f"{name}_bucket":
                continue
            label_map = dict(ls)
            if all(label_map.get(k) == w for k, w in labels.items()):
                found.append((float(label_map["le"]), v))
        return sorted(found)

    def listeners(self) -> list[tuple[str, str]]:
        """``(listener, protocol)`` of every listener the service reports."""
        wanted = (MetricNames.CONNECTIONS_OPEN, MetricNames.REQUESTS)
        pairs = {
            (dict(ls).get("listener", ""), dict(ls).get("protocol", ""))
            for (n, ls), _ in self.samples.items()
            if n in wanted
        }
        return sorted(p for p in pairs if p[0])

    def uses_wal(self) -> bool:
        """Whether the service exports the write-ahead log's figures (``ack = "wal"``, log open).

        By prefix, so that a log family status does not know still says that
        there is a log (and :func:`summarize` then names what it lacks).
        """
        unstorable = MetricNames.WAL_RECORDS_UNSTORABLE  # the writer's: there without a log
        theirs = {unstorable, unstorable.removesuffix("_total")}
        return any(name.startswith("appliance_wal_") and name not in theirs for name in self.names)

    def missing(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` the scrape lacks."""
        return [name for name in names if name not in self.names]


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's ``histogram_quantile`` on cumulative buckets; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # above the largest finite bucket
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def _delta_buckets(
    now: list[tuple[float, float]], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    earlier = dict(before)
    return [(le, count - earlier.get(le, 0.0)) for le, count in now]


# -- what the table shows -----------------------------------------------------------------------


def _rate(now: Scrape, before: Scrape | None, name: str, **labels: str) -> float | None:
    if before is None or now.at <= before.at:
        return None
    return max(now.total(name, **labels) - before.total(name, **labels), 0.0) / (now.at - before.at)


def _increase(now: Scrape, before: Scrape | None, name: str) -> int | None:
    if before is None or now.at <= before.at:
        return None
    return int(max(now.total(name) - before.total(name), 0.0))


def _errors(scrape: Scrape, **labels: str) -> dict[str, int]:
    return {short: int(scrape.total(name, **labels)) for short, name in _error_counters().items()}


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _log(now: Scrape, before: Scrape | None, window: Scrape | None) -> dict[str, Any]:
    """The write-ahead log's section: room, backlog, backpressure over ``window``, the cache."""
    n = MetricNames
    max_bytes = int(now.value(n.WAL_MAX_BYTES))
    file_bytes = int(now.value(n.WAL_FILE_BYTES))
    recent: dict[str, Any] | None = None
    if window is not None and now.at > window.at:
        recent = {
            "seconds": now.at - window.at,
            "cap_waits": _increase(now, window, n.WAL_CAP_WAITS),
            "cap_refusals": _increase(now, window, n.WAL_CAP_REFUSALS),
            "failed_syncs": _increase(now, window, n.WAL_FAILED_SYNCS),
        }
    return {
        "file_bytes": file_bytes,
        "max_bytes": max_bytes,
        "used_fraction": file_bytes / max_bytes if max_bytes else None,
        "uncommitted_bytes": int(now.value(n.WAL_UNCOMMITTED_BYTES)),
        "oldest_uncommitted_age_seconds": _finite(now.value(n.WAL_OLDEST_UNCOMMITTED_AGE)),
        "segments": int(now.value(n.WAL_SEGMENTS)),
        "at_cap": now.value(n.WAL_AT_CAP) > 0,
        "cap_waits": int(now.value(n.WAL_CAP_WAITS)),
        "cap_refusals": int(now.value(n.WAL_CAP_REFUSALS)),
        "failed_syncs": int(now.value(n.WAL_FAILED_SYNCS)),
        "recent": recent,
        "appends_per_second": _rate(now, before, n.WAL_APPENDS),
        "written_bytes_per_second": _rate(now, before, n.WAL_WRITTEN_BYTES),
        "records_lost": int(now.value(n.WAL_RECORDS_LOST)),
        "cache_bytes": int(now.value(n.WAL_CACHE_BYTES)),
        "groups_from_cache": int(now.value(n.WAL_GROUPS_FROM_CACHE)),
        "groups_read_back": int(now.value(n.WAL_GROUPS_READ_BACK)),
    }


def summarize(
    now: Scrape,
    before: Scrape | None = None,
    readiness: dict[str, Any] | None = None,
    minute_ago: Scrape | None = None,
    wall_time: float | None = None,
) -> dict[str, Any]:
    """The status as a JSON-ready mapping.

    Args:
        now: the latest scrape.
        before: an earlier scrape, for rates (None: no rates).
        readiness: the /readyz document.
        minute_ago: the oldest scrape of the last minute, for errors in it (None:
            not shown), and the window of the table's commit rates and the log's
            waits and refusals (None: ``before``'s).
        wall_time: Unix time of ``now`` (ages of the last commit and maintenance runs).

    Raises:
        StatusError: the scrape lacks a family status reads (a renamed metric:
            the CLI and the service differ in version).
    """
    n = MetricNames
    uses_wal = now.uses_wal()
    missing = now.missing([*_required(), *(_wal_names() if uses_wal else [])])
    if missing:
        found = next(
            (dict(ls).get("version") for (m, ls) in now.samples if m == n.BUILD_INFO), None
        )
        raise StatusError(
            f"the service does not export {', '.join(missing)}: this command "
            f"({__version__}) and the service ({found or 'version unknown'}) read different "
            "metrics; use the appliance command of the service's version"
        )
    wall = time.time() if wall_time is None else wall_time
    window = minute_ago if minute_ago is not None else before
    listeners: list[dict[str, Any]] = []
    for name, protocol in now.listeners():
        labels = {"listener": name, "protocol": protocol}
        latency = now.buckets(n.ACK_LATENCY, **labels)
        if before is not None:
            recent = _delta_buckets(latency, before.buckets(n.ACK_LATENCY, **labels))
            latency = recent if recent and recent[-1][1] > 0 else latency
        errors = _errors(now, **labels)
        entry: dict[str, Any] = {
            "listener": name,
            "protocol": protocol,
            "connections_open": int(now.value(n.CONNECTIONS_OPEN, **labels)),
            "connections_accepted": int(now.value(n.CONNECTIONS_ACCEPTED, **labels)),
            "requests": int(now.value(n.REQUESTS, **labels)),
            "events": int(now.value(n.EVENTS_RECEIVED, **labels)),
            "acks": int(now.value(n.ACKS_SENT, **labels)),
            "requests_per_second": _rate(now, before, n.REQUESTS, **labels),
            "events_per_second": _rate(now, before, n.EVENTS_RECEIVED, **labels),
            "received_bytes_per_second": _rate(now, before, n.RECEIVED_BYTES, **labels),
            "ack_latency_p50_seconds": _quantile(0.5, latency),
            "ack_latency_p99_seconds": _quantile(0.99, latency),
            "errors": errors,
            "batches_refused": now.by_label(n.BATCHES_REFUSED, "reason", **labels),
            "errors_last_minute": None,
        }
        if minute_ago is not None:
            earlier = _errors(minute_ago, **labels)
            entry["errors_last_minute"] = sum(errors.values()) - sum(earlier.values())
        listeners.append(entry)
    last_commit = now.value(n.LAKE_LAST_COMMIT_TIMESTAMP)
    lake = {
        "table_version": int(now.value(n.LAKE_TABLE_VERSION)),
        "last_commit_age_seconds": now.value(n.LAKE_LAST_COMMIT_AGE),
        "last_commit_unix": last_commit or None,
        "commits": int(now.value(n.LAKE_COMMITS)),
        "rows_committed": int(now.value(n.LAKE_COMMITTED_ROWS)),
        "rate_window_seconds": None if window is None else now.at - window.at,
        "commits_in_window": _increase(now, window, n.LAKE_COMMITS),
        "commits_per_second": _rate(now, window, n.LAKE_COMMITS),
        "rows_per_second": _rate(now, window, n.LAKE_COMMITTED_ROWS),
        "commit_p99_seconds": _quantile(0.99, now.buckets(n.LAKE_COMMIT_DURATION)),
        # The writer's queue holds batches with ack = "commit" only.
        "queue_blocks": None if uses_wal else int(now.value(n.LAKE_QUEUE_BLOCKS)),
        "queue_capacity_blocks": None if uses_wal else int(now.value(n.LAKE_QUEUE_CAPACITY)),
        "retrying": now.value(n.LAKE_COMMIT_RETRYING) > 0,
        "commit_failures": {
            kind: int(now.value(n.LAKE_COMMIT_FAILURES, kind=kind)) for kind in ("storage", "data")
        },
        "dedupe_hits": int(now.total(n.LAKE_DEDUPE_HITS)),
        "dedupe_keys": int(now.value(n.LAKE_DEDUPE_KEYS)),
        "dedupe_evicted": int(now.value(n.LAKE_DEDUPE_EVICTED)),
        "commit_conflicts": int(now.value(n.LAKE_COMMIT_CONFLICTS)),
        "batches_stored_elsewhere": int(now.value(n.LAKE_BATCHES_STORED_ELSEWHERE)),
        "blocks_refused": int(now.value(n.LAKE_BLOCKS_REFUSED)),
        "table_files": int(now.value(n.LAKE_TABLE_FILES)) or None,
    }
    maintenance: dict[str, Any] = {}
    for operation in ("compact", "checkpoint", "vacuum"):
        finished = now.value(n.MAINTENANCE_LAST_RUN, operation=operation)
        maintenance[operation] = {
            "last_run_age_seconds": wall - finished if finished else None,
            "duration_seconds": now.value(n.MAINTENANCE_LAST_DURATION, operation=operation)
            if finished
            else None,
            "failed": int(now.value(n.MAINTENANCE_RUNS, operation=operation, result="failed")),
        }
    started = now.value(n.PROCESS_START_TIME)
    cpu = _rate(now, before, n.PROCESS_CPU_SECONDS)
    process = {
        "resident_memory_bytes": int(now.value(n.PROCESS_RESIDENT_MEMORY)),
        "cpu_percent": None if cpu is None else 100 * cpu,
        "open_fds": int(now.value(n.PROCESS_OPEN_FDS)),
        "uptime_seconds": wall - started if started else None,
    }
    version = next((dict(ls).get("version") for (m, ls) in now.samples if m == n.BUILD_INFO), None)
    instance = (readiness or {}).get("instance")
    return {
        "version": version,
        "instance": instance if isinstance(instance, dict) else None,
        "ready": bool(readiness and readiness.get("status") == "ready"),
        "checks": (readiness or {}).get("checks", {}),
        "ack": "wal" if uses_wal or "wal" in (readiness or {}).get("checks", {}) else "commit",
        "listeners": listeners,
        "lake": lake,
        "log": _log(now, before, window) if uses_wal else None,
        "maintenance": maintenance,
        "process": process,
    }


def expected_state_dir(config: Config) -> Path:
    """The state directory of the appliance whose admin listener the configuration names.

    With ``workers = N`` the configured address is worker 0's, which keeps
    its own state directory (:func:`~appliance.node.worker_config`).
    """
    state_dir = config.worker_state_dir(0) if config.worker_count > 1 else config.state_dir
    return state_dir.resolve()


def _holder(state_dir: Path) -> int | None:
    """The pid holding ``state_dir``'s lock, or None (none, or not this user's to read)."""
    try:
        return holder_pid(state_dir)
    except OSError:
        return None


def check_instance(readiness: dict[str, Any] | None, expected: Path, url: str) -> None:
    """Refuse an answer from another appliance than the one whose state is ``expected``.

    Raises:
        StatusError: ``/readyz`` names another state directory (or, when it
            cannot tell its own, another pid than the one holding ``expected``),
            or does not say which appliance it is.
    """
    instance = (readiness or {}).get("instance")
    if not isinstance(instance, dict):
        raise StatusError(
            f"the admin listener at {url} does not say which appliance it is (no instance "
            "in /readyz: another program, or an older appliance); --url reads it anyway"
        )
    answered = instance.get("state_dir")
    pid = instance.get("pid")
    holder = _holder(expected)
    if answered is not None and Path(str(answered)) == expected:
        return
    if answered is None and (holder is None or holder == pid):
        return  # it cannot tell its state directory, and nothing says it is another's
    here = (
        f"no appliance runs on {expected}"
        if holder is None
        else f"pid {holder} holds {expected}: its admin listener is elsewhere"
    )
    raise StatusError(
        f"the admin listener at {url} belongs to another appliance: state directory "
        f"{answered or 'unknown'} (node {instance.get('node_id')}, pid {pid}) answered, "
        f"expected {expected}; {here} (--url reads another appliance on purpose)"
    )


# -- rendering ----------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    """A rate or count: thousands separated, ``digits`` decimals under 1,000, small ones kept."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if value >= 1000 or digits == 0:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:,.{digits}f}"
    if value < _SMALLEST_SHOWN:
        return f"<{_SMALLEST_SHOWN:g}"
    return f"{value:.2f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} B"


def _seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{_seconds(seconds)} ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h{minutes:02d}m" if days else f"{hours}h{minutes:02d}m"


def _table(rows: list[list[str]], right: Iterable[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    aligned = set(right)
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in aligned else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _instance_line(instance: dict[str, Any] | None) -> str:
    if instance is None:
        return "instance: unknown (/readyz did not say)"
    worker = instance.get("worker")
    return (
        f"instance: node {instance.get('node_id')}, state {instance.get('state_dir') or '?'}, "
        f"pid {instance.get('pid')}, worker {'-' if worker is None else worker}"
    )


def _refusals(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count:,}" for reason, count in counts.items())


def _table_lines(lake: dict[str, Any]) -> list[str]:
    last = _age(lake["last_commit_age_seconds"]) if lake["last_commit_unix"] else "none yet"
    window = lake["rate_window_seconds"]
    if lake["commits_in_window"] == 0 and window is not None:
        # Commits come every commit interval: a window without one says so, not "0 rows/s".
        rates = f"no commit in the last {_seconds(window)}"
    else:
        rates = (
            f"{_num(lake['commits_per_second'])} commits/s, {_num(lake['rows_per_second'])} rows/s"
        )
    failures = lake["commit_failures"]
    commits = (
        f"commits: {lake['rows_committed']:,} rows in {lake['commits']:,} commits; "
        f"dedupe hits {lake['dedupe_hits']:,}; "
        f"commit failures {failures['storage']:,} storage, {failures['data']:,} data"
        + (" (RETRYING)" if lake["retrying"] else "")
    )
    for key, text in (
        ("commit_conflicts", "conflicts"),
        ("batches_stored_elsewhere", "stored elsewhere"),
        ("dedupe_evicted", "dedupe ids evicted"),
    ):
        if lake[key]:
            commits += f"; {text} {lake[key]:,}"
    lines = [
        f"table: version {lake['table_version']}, last commit {last}, {rates}, "
        f"commit p99 {_duration(lake['commit_p99_seconds'])}",
        commits,
    ]
    if lake["queue_capacity_blocks"] is not None:
        lines.append(f"queue: {lake['queue_blocks']}/{lake['queue_capacity_blocks']} batches")
    return lines


def _log_lines(log: dict[str, Any]) -> list[str]:
    used = log["used_fraction"]
    oldest = log["oldest_uncommitted_age_seconds"]
    first = (
        f"log: {_bytes(log['file_bytes'])} of {_bytes(log['max_bytes'])}"
        + ("" if used is None else f" ({100 * used:.0f}%)")
        + f", {_bytes(log['uncommitted_bytes'])} uncommitted"
        + (
            ""
            if not log["uncommitted_bytes"]
            else f", oldest {'unknown' if oldest is None else _seconds(oldest)}"
        )
        + f", {log['segments']} segment{'' if log['segments'] == 1 else 's'}"
        + ("; AT CAP: connections wait for commits" if log["at_cap"] else "")
    )
    recent = log["recent"]
    since = (
        f"since start {log['cap_waits']:,} waits, {log['cap_refusals']:,} refused, "
        f"{log['failed_syncs']:,} failed syncs"
    )
    if recent is None:
        second = f"log backpressure: {since}"
    else:
        second = (
            f"log backpressure, last {_seconds(recent['seconds'])}: {recent['cap_waits']:,} "
            f"waits, {recent['cap_refusals']:,} refused, {recent['failed_syncs']:,} failed "
            f"syncs ({since})"
        )
    third = (
        f"log: {_num(log['appends_per_second'])} appends/s, "
        f"{_bytes(log['written_bytes_per_second'])}/s; cache {_bytes(log['cache_bytes'])}, "
        f"groups {log['groups_from_cache']:,} from cache, {log['groups_read_back']:,} read back; "
        f"records lost {log['records_lost']:,}"
    )
    return [first, second, third]


def render(summary: dict[str, Any], url: str) -> str:
    """The human table of a :func:`summarize` mapping."""
    lines: list[str] = []
    if summary["ready"]:
        state = "ready"
    else:
        reasons = [
            f"{name}: {check.get('reason')}"
            for name, check in summary["checks"].items()
            if not check.get("ok")
        ]
        state = "NOT READY (" + "; ".join(reasons or ["no answer from /readyz"]) + ")"
    lines.append(f"appliance {summary['version'] or '?'} at {url}: {state}")
    lines.append(_instance_line(summary["instance"]))
    process = summary["process"]
    lines.append(
        f"process: up {_uptime(process['uptime_seconds'])}, "
        f"RSS {process['resident_memory_bytes'] / 1024**2:.0f} MiB, "
        f"CPU {_num(process['cpu_percent'])}%, {process['open_fds']} open fds"
    )
    lines.append("")
    header = ["LISTENER", "PROTOCOL", "OPEN", "ACCEPTED", "REQ/S", "EVENTS/S", "KB/S",
              "ACK p50", "ACK p99", "ERRORS", "ERR/MIN"]  # fmt: skip
    rows = [header]
    for item in summary["listeners"]:
        received = item["received_bytes_per_second"]
        rows.append(
            [
                item["listener"],
                item["protocol"],
                str(item["connections_open"]),
                f"{item['connections_accepted']:,}",
                _num(item["requests_per_second"]),
                _num(item["events_per_second"]),
                _num(None if received is None else received / 1024),
                _duration(item["ack_latency_p50_seconds"]),
                _duration(item["ack_latency_p99_seconds"]),
                f"{sum(item['errors'].values()):,}",
                "-" if item["errors_last_minute"] is None else f"{item['errors_last_minute']:,}",
            ]
        )
    lines += _table(rows, right=range(2, len(header)))
    totals: dict[str, int] = {}
    refused: dict[str, int] = {}
    for item in summary["listeners"]:
        for name, count in item["errors"].items():
            totals[name] = totals.get(name, 0) + count
        for reason, count in item["batches_refused"].items():
            refused[reason] = refused.get(reason, 0) + count
    if any(totals.values()):
        shown = ", ".join(
            f"{name} {count:,}" + (f" ({_refusals(refused)})" if name == "batches_refused" else "")
            for name, count in totals.items()
            if count
        )
        lines.append(f"errors since start: {shown}")
    lines.append("")
    lines += _table_lines(summary["lake"])
    if summary["log"] is not None:
        lines += _log_lines(summary["log"])
    elif summary["ack"] == "wal":
        lines.append("log: not open yet")
    runs = []
    for operation, run in summary["maintenance"].items():
        text = f"{operation} {_age(run['last_run_age_seconds'])}"
        if run["duration_seconds"] is not None:
            text += f" ({_duration(run['duration_seconds'])})"
        if run["failed"]:
            text += f", {run['failed']} failed"
        runs.append(text)
    files = summary["lake"]["table_files"]
    lines.append("maintenance: " + ", ".join(runs) + (f"; {files:,} live files" if files else ""))
    return "\n".join(lines)


# -- fetching -----------------------------------------------------------------------------------


def default_url(config: Config) -> str:
    """``http(s)://host:port`` of the configured admin listener."""
    return admin_url(config)


@dataclass(frozen=True, slots=True)
class _Client:
    url: str
    token: str | None
    context: ssl.SSLContext | None
    #: The state directory the answering appliance must have (None: ``--url``, any).
    expected: Path | None = None

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url.rstrip("/") + path)  # noqa: S310 -- http(s) only
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        # No redirects: a redirect would carry the token to wherever it points.
        opener = urllib.request.build_opener(
            NoRedirect(), urllib.request.HTTPSHandler(context=self.context)
        )
        try:
            with opener.open(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
                return int(response.status), response.read(MAX_RESPONSE_BYTES)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(MAX_RESPONSE_BYTES)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StatusError(f"cannot reach the admin listener at {self.url}: {reason}") from None

    def scrape(self) -> Scrape:
        status, body = self.get("/metrics")
        if status == 401 and self.token:
            raise StatusError(
                "the admin listener refused the bearer token given (wrong or revoked token)"
            )
        if status == 401:
            raise StatusError(
                f"the admin listener wants a bearer token: set ${TOKEN_ENV} or use --token-stdin"
            )
        if 300 <= status < 400:
            raise StatusError(f"/metrics answered a redirect ({status}), which is not followed")
        if status != 200:
            raise StatusError(
                f"/metrics answered {status}: {body[:200].decode('utf-8', 'replace')}"
            )
        return Scrape.parse(body.decode("utf-8", "replace"), time.monotonic())

    def readiness(self) -> dict[str, Any] | None:
        """The /readyz document, checked to come from the expected appliance."""
        status, body = self.get("/readyz")
        document: dict[str, Any] | None = None
        if status in (200, 503):
            try:
                loaded = orjson.loads(body)
            except orjson.JSONDecodeError:
                loaded = None
            document = loaded if isinstance(loaded, dict) else None
        if self.expected is not None:
            check_instance(document, self.expected, self.url)
        return document


def _clock(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix).strftime("%H:%M:%S")


class _Watch:
    """``--watch``: redraw every interval; a failed round is said, and tried again later."""

    def __init__(
        self, client: _Client, interval: float, emit: Callable[[str], None], as_json: bool
    ) -> None:
        self._client = client
        self._interval = interval
        self._emit = emit
        self._json = as_json
        self._history: deque[Scrape] = deque()
        self._previous: Scrape | None = None
        self._pid: object = None
        self._shown: tuple[float, str] | None = None  # the last table, and when (Unix time)
        self._failures = 0
        self._failing_since = 0.0

    def round(self) -> float:
        """One scrape and redraw; the seconds to wait before the next."""
        try:
            now = self._client.scrape()
            readiness = self._client.readiness()
        except StatusError as exc:
            return self._failed(exc)
        pid = ((readiness or {}).get("instance") or {}).get("pid")
        if pid != self._pid:
            # Another process (a restart): its counters start again from 0.
            self._history.clear()
            self._previous, self._pid = None, pid
        self._history.append(now)
        while self._history and now.at - self._history[0].at > ERROR_WINDOW_SECONDS:
            self._history.popleft()
        try:
            summary = summarize(now, self._previous, readiness, self._history[0])
        except StatusError as exc:
            return self._failed(exc)
        self._previous = now
        self._failures = 0
        if self._json:
            self._emit(orjson.dumps(summary).decode())
        else:
            text = render(summary, self._client.url)
            self._shown = (time.time(), text)
            self._emit(_REDRAW + text + "\n")
        return self._interval

    def _failed(self, exc: StatusError) -> float:
        wall = time.time()
        if not self._failures:
            self._failing_since = wall
        self._failures += 1
        pause = min(
            self._interval * 2.0 ** (self._failures - 1),
            max(self._interval, WATCH_RETRY_MAX_SECONDS),
        )
        if self._json:
            failure = {
                "error": str(exc),
                "failures": self._failures,
                "since_unix": self._failing_since,
                "retry_in_seconds": pause,
            }
            self._emit(orjson.dumps(failure).decode())
            return pause
        lines = [
            f"{self._client.url}: NO ANSWER at {_clock(wall)} ({self._failures} failed "
            f"{'try' if self._failures == 1 else 'tries'} since {_clock(self._failing_since)}): "
            f"{exc}",
            f"next try in {pause:g} s",
        ]
        if self._shown is not None:
            lines += ["", f"last answer, {_seconds(wall - self._shown[0])} ago:", self._shown[1]]
        self._emit(_REDRAW + "\n".join(lines) + "\n")
        return pause


def _watch(client: _Client, interval: float, emit: Callable[[str], None], as_json: bool) -> int:
    watch = _Watch(client, interval, emit, as_json)
    while True:
        time.sleep(watch.round())


def _run(args: argparse.Namespace, config: Config) -> int:
    if not args.url and not config.admin.enabled:
        return fail("the admin listener is off ([admin] enabled = false): nothing to read")
    url = args.url or default_url(config)
    if not url.startswith(("http://", "https://")):
        return fail(f"--url must be http:// or https://, not {url!r}", 2)
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        context = ca_context(args.ca, config, system_if_missing=True)
    token = admin_token(args.token_stdin, config)
    if token and not token_may_go_to(url):
        return fail(
            f"not sending the admin token in clear to {url}: use https:// (with --ca) "
            "or a loopback address",
            2,
        )
    # With --url any appliance may answer; else it must be this configuration's.
    client = _Client(url, token, context, None if args.url else expected_state_dir(config))

    def emit(text: str) -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    if args.watch:
        try:
            return _watch(client, args.interval, emit, args.json)
        except KeyboardInterrupt:
            return 0
    try:
        before = client.scrape()
        time.sleep(args.interval)
        now = client.scrape()
        summary = summarize(now, before, client.readiness())
    except StatusError as exc:
        return fail(str(exc))
    emit(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() if args.json
         else render(summary, url))  # fmt: skip
    return 0 if summary["ready"] else 1


def _interval(text: str) -> float:
    value = float(text)
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError("between 0.1 and 3600 seconds")
    return value


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``status``."""
    status = commands.add_parser(
        "status",
        help="what the running service is doing (from its admin listener)",
        parents=[common],
        allow_abbrev=False,
    )
    status.set_defaults(func=_run)
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.add_argument(
        "--watch", action="store_true",
        help="redraw every --interval seconds until Ctrl-C (a failed scrape is retried)",
    )  # fmt: skip
    status.add_argument(
        "--interval", type=_interval, default=1.0, metavar="SECONDS",
        help="seconds between the scrapes that rates are taken over (1)",
    )  # fmt: skip
    status.add_argument(
        "--url",
        help="http(s)://host:port of the admin listener ([admin] bind); any appliance may answer",
    )
    status.add_argument("--ca", metavar="FILE", help="CA of an https admin listener")
    status.add_argument(
        "--token-stdin", action="store_true", help=f"read the token from stdin (else ${TOKEN_ENV})"
    )
