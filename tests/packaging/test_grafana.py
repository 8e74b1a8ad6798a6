"""The Grafana dashboard (packaging/grafana/appliance.json) matches the real metrics.

Grafana cannot run here, so the dashboard is checked against what the
service really exports: every metric a panel queries, and every label it
selects or groups by, must exist in a scrape of a real ``Metrics`` registry
with every group on (the listeners with each labelled family touched once,
the writer, maintenance, the write-ahead log's collector, the process
collectors); and every family of that scrape must have a panel, but for
the few named in :data:`NOT_CHARTED`. A renamed metric or label fails this
test instead of leaving an empty panel in an operator's Grafana, and a new
metric without a panel fails it too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.metrics import Instance, Metrics, WalSample

DASHBOARD = Path(__file__).resolve().parents[2] / "packaging" / "grafana" / "appliance.json"
#: Grafana's grid is 24 columns wide.
GRID_COLUMNS = 24
METRIC = re.compile(r"\b((?:appliance|process)_[a-z_]+)\b")
BY = re.compile(r"\bby \(([^)]*)\)")
SELECTOR = re.compile(r"\b((?:appliance|process)_[a-z_]+)\{([^}]*)\}")
LEGEND_LABEL = re.compile(r"\{\{(\w+)\}\}")
#: Labels that Prometheus itself adds at scrape time.
TARGET_LABELS = frozenset({"instance", "job"})
#: Families of the scrape that no panel shows, and why.
NOT_CHARTED = {
    "python_gc_objects_collected": "interpreter internals (gc_policy logs its collections)",
    "python_gc_objects_uncollectable": "interpreter internals",
    "python_gc_collections": "interpreter internals",
    "python_info": "the interpreter's version, a label of no panel's interest",
}

#: What the write-ahead log's collector reports in the test registry (any values do).
_WAL = WalSample(
    file_bytes=1, max_bytes=2, uncommitted_bytes=1, segments=1, at_cap=False, appends=1,
    syncs=1, failed_syncs=0, written_bytes=1, cap_waits=0, cap_refusals=0,
    sync_wait_seconds=0.0, cache_bytes=0, groups_from_cache=0, groups_read_back=0,
)  # fmt: skip


def _scrape() -> str:
    """A real registry's exposition, every group on and every labelled family touched."""
    metrics = Metrics()
    listener = metrics.listener("forward", "forward")
    listener.connection_refused("max_connections")
    listener.tls_failure("timeout")
    listener.protocol_error("limit")
    listener.events_dropped("invalid time", 1)
    listener.auth("shared_key", "success")
    listener.batch_refused("write-ahead log full: the table is not keeping up")
    listener.ack_latency.observe(0.01)
    lake = metrics.lake
    lake.commit_failures_storage.inc()
    lake.dedupe_committed.inc()
    lake.commit_duration.observe(0.1)
    metrics.maintenance("compact", "ok", finished_at=1.0, seconds=1.0)
    metrics.watch_wal(lambda: _WAL)
    metrics.identify(Instance("node-1", "/var/lib/appliance", 1, "0", None))
    return metrics.exposition()[0].decode()


def _exported() -> dict[str, set[str]]:
    """Sample name -> label names."""
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(_scrape()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def _families() -> dict[str, set[str]]:
    """Family name -> the names of its samples."""
    return {
        family.name: {sample.name for sample in family.samples}
        for family in text_string_to_metric_families(_scrape())
    }


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def test_every_queried_metric_and_label_is_exported(dashboard: dict[str, Any]) -> None:
    exported = _exported()
    problems: list[str] = []
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            expr: str = target["expr"]
            names = set(METRIC.findall(expr))
            assert names, f"{panel['title']}: no metric in {expr!r}"
            for name in names - exported.keys():
                problems.append(f"{panel['title']}: {name} is not exported")
            known = set().union(*(exported.get(n, set()) for n in names)) | TARGET_LABELS
            grouped = {label.strip() for group in BY.findall(expr) for label in group.split(",")}
            grouped.discard("le")
            selected = {
                part.split("=")[0].strip().rstrip("!~")
                for _, body in SELECTOR.findall(expr)
                for part in body.split(",")
            }
            legend = set(LEGEND_LABEL.findall(target.get("legendFormat", "")))
            for label in (grouped | selected | legend) - known:
                problems.append(f"{panel['title']}: label {label!r} not on {sorted(names)}")
    assert not problems, "\n".join(problems)


def test_the_issue_s_metric_groups_each_have_a_panel(dashboard: dict[str, Any]) -> None:
    queried = {
        m for p in _panels(dashboard) for t in p["targets"] for m in METRIC.findall(t["expr"])
    }
    for needed in (
        "appliance_connections_open",
        "appliance_connections_refused_total",
        "appliance_tls_handshake_failures_total",
        "appliance_events_received_total",
        "appliance_received_bytes_total",
        "appliance_events_dropped_total",
        "appliance_protocol_errors_total",
        "appliance_acks_sent_total",
        "appliance_ack_latency_seconds_bucket",
        "appliance_lake_commits_total",
        "appliance_lake_commit_duration_seconds_bucket",
        "appliance_lake_commit_failures_total",
        "appliance_lake_queue_blocks",
        "appliance_lake_dedupe_hits_total",
        "appliance_auth_attempts_total",
        "appliance_lake_table_version",
        "appliance_lake_table_files",
        "appliance_lake_last_commit_age_seconds",
        "appliance_maintenance_last_run_timestamp_seconds",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ):
        assert needed in queried, needed


def test_every_exported_family_has_a_panel(dashboard: dict[str, Any]) -> None:
    queried = {
        m for p in _panels(dashboard) for t in p["targets"] for m in METRIC.findall(t["expr"])
    }
    families = _families()
    assert any(name.startswith("appliance_wal_") for name in families), "no log collector"
    assert any(name.startswith("process_") for name in families), "no process collector"
    unknown = NOT_CHARTED.keys() - families.keys()
    assert not unknown, f"NOT_CHARTED names what is not exported: {sorted(unknown)}"
    without = sorted(
        name
        for name, samples in families.items()
        if name not in NOT_CHARTED and not samples & queried
    )
    assert not without, f"families without a panel: {without}"


def test_panels_fit_the_grid_without_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= GRID_COLUMNS, panel["title"]
        cells = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_query_uses_the_datasource_and_instance_variables(
    dashboard: dict[str, Any],
) -> None:
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "listener"} <= names
    for panel in _panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert '$instance"' in target["expr"], (panel["title"], target["expr"])
