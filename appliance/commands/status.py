"""``appliance status``: what the running service is doing, from its admin listener.

It reads ``/metrics`` (parsed with ``prometheus_client.parser``) and
``/readyz`` from the ``[admin]`` listener of the configuration (``--url`` for
another) and prints one table: readiness, the process, each listener with
its open connections, rates and errors, the table's last commit and queue,
and the maintenance runs. ``--json`` prints the same as one JSON document.

Rates need two scrapes: a single ``status`` scrapes twice, ``--interval``
seconds apart (1 by default). ``--watch`` redraws the table in place every
``--interval`` seconds until Ctrl-C, and adds the errors of the last minute
(from the scrapes it has seen, so the window fills during the first minute).

The bearer token, when the admin listener wants one, comes from
``$APPLIANCE_ADMIN_TOKEN``, ``--token-stdin``, or the configured
``token_file`` when this user may read it; never from argv. Exit code: 0
ready, 1 not ready or not reachable.
"""

from __future__ import annotations

import argparse
import ipaddress
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
from typing import Any, Final

import orjson

from appliance.commands.common import Subparsers, ca_context, fail, listener_host, read_token
from appliance.config import Config

__all__ = [
    "TOKEN_ENV",
    "Scrape",
    "StatusError",
    "add_parser",
    "default_url",
    "render",
    "summarize",
]

#: Environment variable that may hold the admin listener's bearer token.
TOKEN_ENV: Final = "APPLIANCE_ADMIN_TOKEN"  # noqa: S105 -- a variable's name
#: Seconds one request to the admin listener may take.
REQUEST_TIMEOUT_SECONDS: Final = 10.0
#: Largest /metrics answer read, in bytes.
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: The window of "errors in the last minute" (--watch), in seconds.
ERROR_WINDOW_SECONDS: Final = 60.0
#: What ``--watch`` writes before each table: cursor home, clear the screen.
_REDRAW: Final = "\x1b[H\x1b[2J"

#: Counters whose increase is an error, by the short name the table shows.
_ERROR_COUNTERS: Final = {
    "tls": "appliance_tls_handshake_failures_total",
    "refused": "appliance_connections_refused_total",
    "protocol": "appliance_protocol_errors_total",
    "dropped_events": "appliance_events_dropped_total",
    "failed": "appliance_connections_failed_total",
}

Labels = frozenset[tuple[str, str]]


class StatusError(Exception):
    """The admin listener cannot be reached or answered something unusable."""


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """One reading of /metrics: every sample, and when it was taken (monotonic seconds)."""

    at: float
    samples: dict[tuple[str, Labels], float]

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        """The samples of a text exposition."""
        from prometheus_client.parser import text_string_to_metric_families

        samples: dict[tuple[str, Labels], float] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        except ValueError as exc:
            raise StatusError(f"/metrics is not in the Prometheus text format: {exc}") from None
        return cls(at, samples)

    def value(self, name: str, **labels: str) -> float:
        """One sample (0 when absent)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

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
        pairs = {
            (dict(ls).get("listener", ""), dict(ls).get("protocol", ""))
            for (n, ls), _ in self.samples.items()
            if n in ("appliance_connections_open", "appliance_requests_total")
        }
        return sorted(p for p in pairs if p[0])


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


def _errors(scrape: Scrape, **labels: str) -> dict[str, int]:
    return {short: int(scrape.total(name, **labels)) for short, name in _ERROR_COUNTERS.items()}


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
        minute_ago: the oldest scrape of the last minute, for errors in it (None: not shown).
        wall_time: Unix time of ``now`` (ages of the last commit and maintenance runs).
    """
    wall = time.time() if wall_time is None else wall_time
    listeners: list[dict[str, Any]] = []
    for name, protocol in now.listeners():
        labels = {"listener": name, "protocol": protocol}
        latency = now.buckets("appliance_ack_latency_seconds", **labels)
        if before is not None:
            recent = _delta_buckets(
                latency, before.buckets("appliance_ack_latency_seconds", **labels)
            )
            latency = recent if recent and recent[-1][1] > 0 else latency
        errors = _errors(now, **labels)
        entry: dict[str, Any] = {
            "listener": name,
            "protocol": protocol,
            "connections_open": int(now.value("appliance_connections_open", **labels)),
            "connections_accepted": int(
                now.value("appliance_connections_accepted_total", **labels)
            ),
            "requests": int(now.value("appliance_requests_total", **labels)),
            "events": int(now.value("appliance_events_received_total", **labels)),
            "acks": int(now.value("appliance_acks_sent_total", **labels)),
            "requests_per_second": _rate(now, before, "appliance_requests_total", **labels),
            "events_per_second": _rate(now, before, "appliance_events_received_total", **labels),
            "received_bytes_per_second": _rate(
                now, before, "appliance_received_bytes_total", **labels
            ),
            "ack_latency_p50_seconds": _quantile(0.5, latency),
            "ack_latency_p99_seconds": _quantile(0.99, latency),
            "errors": errors,
            "errors_last_minute": None,
        }
        if minute_ago is not None:
            earlier = _errors(minute_ago, **labels)
            entry["errors_last_minute"] = sum(errors.values()) - sum(earlier.values())
        listeners.append(entry)
    last_commit = now.value("appliance_lake_last_commit_timestamp_seconds")
    lake = {
        "table_version": int(now.value("appliance_lake_table_version")),
        "last_commit_age_seconds": now.value("appliance_lake_last_commit_age_seconds"),
        "last_commit_unix": last_commit or None,
        "commits": int(now.value("appliance_lake_commits_total")),
        "rows_committed": int(now.value("appliance_lake_committed_rows_total")),
        "commits_per_second": _rate(now, before, "appliance_lake_commits_total"),
        "rows_per_second": _rate(now, before, "appliance_lake_committed_rows_total"),
        "commit_p99_seconds": _quantile(
            0.99, now.buckets("appliance_lake_commit_duration_seconds")
        ),
        "queue_blocks": int(now.value("appliance_lake_queue_blocks")),
        "queue_capacity_blocks": int(now.value("appliance_lake_queue_capacity_blocks")),
        "retrying": now.value("appliance_lake_commit_retrying") > 0,
        "commit_failures": {
            kind: int(now.value("appliance_lake_commit_failures_total", kind=kind))
            for kind in ("storage", "data")
        },
        "dedupe_hits": int(now.total("appliance_lake_dedupe_hits_total")),
        "blocks_refused": int(now.value("appliance_lake_blocks_refused_total")),
        "table_files": int(now.value("appliance_lake_table_files")) or None,
    }
    maintenance: dict[str, Any] = {}
    for operation in ("compact", "checkpoint", "vacuum"):
        finished = now.value(
            "appliance_maintenance_last_run_timestamp_seconds", operation=operation
        )
        maintenance[operation] = {
            "last_run_age_seconds": wall - finished if finished else None,
            "duration_seconds": now.value(
                "appliance_maintenance_last_duration_seconds", operation=operation
            )
            if finished
            else None,
            "failed": int(
                now.value("appliance_maintenance_runs_total", operation=operation, result="failed")
            ),
        }
    started = now.value("process_start_time_seconds")
    cpu = _rate(now, before, "process_cpu_seconds_total")
    process = {
        "resident_memory_bytes": int(now.value("process_resident_memory_bytes")),
        "cpu_percent": None if cpu is None else 100 * cpu,
        "open_fds": int(now.value("process_open_fds")),
        "uptime_seconds": wall - started if started else None,
    }
    version = next(
        (dict(ls).get("version") for (n, ls) in now.samples if n == "appliance_build_info"), None
    )
    return {
        "version": version,
        "ready": bool(readiness and readiness.get("status") == "ready"),
        "checks": (readiness or {}).get("checks", {}),
        "listeners": listeners,
        "lake": lake,
        "maintenance": maintenance,
        "process": process,
    }


# -- rendering ----------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if value >= 1000 or digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 90:
        return f"{seconds:.1f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


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
    for item in summary["listeners"]:
        for name, count in item["errors"].items():
            totals[name] = totals.get(name, 0) + count
    if any(totals.values()):
        shown = ", ".join(f"{name} {count:,}" for name, count in totals.items() if count)
        lines.append(f"errors since start: {shown}")
    lake = summary["lake"]
    lines.append("")
    lines.append(
        f"table: version {lake['table_version']}, last commit "
        f"{_age(lake['last_commit_age_seconds']) if lake['last_commit_unix'] else 'none yet'}, "
        f"{_num(lake['commits_per_second'])} commits/s, {_num(lake['rows_per_second'])} rows/s, "
        f"commit p99 {_duration(lake['commit_p99_seconds'])}"
    )
    failures = lake["commit_failures"]
    lines.append(
        f"queue: {lake['queue_blocks']}/{lake['queue_capacity_blocks']} batches; "
        f"{lake['rows_committed']:,} rows in {lake['commits']:,} commits; "
        f"dedupe hits {lake['dedupe_hits']:,}; refused {lake['blocks_refused']:,}; "
        f"commit failures {failures['storage']:,} storage, {failures['data']:,} data"
        + (" (RETRYING)" if lake["retrying"] else "")
    )
    runs = []
    for operation, run in summary["maintenance"].items():
        text = f"{operation} {_age(run['last_run_age_seconds'])}"
        if run["duration_seconds"] is not None:
            text += f" ({_duration(run['duration_seconds'])})"
        if run["failed"]:
            text += f", {run['failed']} failed"
        runs.append(text)
    files = lake["table_files"]
    lines.append("maintenance: " + ", ".join(runs) + (f"; {files:,} live files" if files else ""))
    return "\n".join(lines)


# -- fetching -----------------------------------------------------------------------------------


def default_url(config: Config) -> str:
    """``http(s)://host:port`` of the configured admin listener."""
    admin = config.admin
    return f"{'https' if admin.tls else 'http'}://{listener_host(admin.host)}:{admin.port}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: the answer is returned as it is."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def token_may_go_to(url: str) -> bool:
    """Whether a bearer token may be sent to ``url``: over https, or to a loopback address."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https":
        return True
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class _Client:
    url: str
    token: str | None
    context: ssl.SSLContext | None

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url.rstrip("/") + path)  # noqa: S310 -- http(s) only
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        # No redirects: a redirect would carry the token to wherever it points.
        opener = urllib.request.build_opener(
            _NoRedirect(), urllib.request.HTTPSHandler(context=self.context)
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
        status, body = self.get("/readyz")
        if status not in (200, 503):
            return None
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return document if isinstance(document, dict) else None


def _token(args: argparse.Namespace, config: Config) -> str | None:
    token = read_token(args.token_stdin, TOKEN_ENV)
    if token is not None or args.token_stdin:
        return token
    path = config.admin.token_file
    if path is not None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None  # not this user's to read: the 401 says what to do
    return None


def _watch(client: _Client, interval: float, emit: Callable[[str], None], as_json: bool) -> int:
    history: deque[Scrape] = deque()
    previous: Scrape | None = None
    while True:
        now = client.scrape()
        history.append(now)
        while history and now.at - history[0].at > ERROR_WINDOW_SECONDS:
            history.popleft()
        summary = summarize(now, previous, client.readiness(), history[0])
        if as_json:
            emit(orjson.dumps(summary).decode())
        else:
            emit(_REDRAW + render(summary, client.url) + "\n")
        previous = now
        time.sleep(interval)


def _run(args: argparse.Namespace, config: Config) -> int:
    if not args.url and not config.admin.enabled:
        return fail("the admin listener is off ([admin] enabled = false): nothing to read")
    url = args.url or default_url(config)
    if not url.startswith(("http://", "https://")):
        return fail(f"--url must be http:// or https://, not {url!r}", 2)
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        context = ca_context(args.ca, config, system_if_missing=True)
    token = _token(args, config)
    if token and not token_may_go_to(url):
        return fail(
            f"not sending the admin token in clear to {url}: use https:// (with --ca) "
            "or a loopback address",
            2,
        )
    client = _Client(url, token, context)

    def emit(text: str) -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    try:
        if args.watch:
            try:
                return _watch(client, args.interval, emit, args.json)
            except KeyboardInterrupt:
                return 0
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
        "--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C"
    )
    status.add_argument(
        "--interval", type=_interval, default=1.0, metavar="SECONDS",
        help="seconds between the scrapes that rates are taken over (1)",
    )  # fmt: skip
    status.add_argument("--url", help="http(s)://host:port of the admin listener ([admin] bind)")
    status.add_argument("--ca", metavar="FILE", help="CA of an https admin listener")
    status.add_argument(
        "--token-stdin", action="store_true", help=f"read the token from stdin (else ${TOKEN_ENV})"
    )
