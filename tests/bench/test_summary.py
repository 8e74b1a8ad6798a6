"""bench.summary reads each bench's JSON and renders one table: no benchmark runs here."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import summary

CASES = {case.key: case for case in summary.lead_cases(2, 30_000)}
MACHINE = {
    "cpus": "2 (usable: 2)",
    "cpu": "Test CPU",
    "memory": "1.0 GiB",
    "python": "CPython 3.11.7",
    "openssl": "OpenSSL 3",
    "libraries": "trio 0.35.0, deltalake 1.6.6",
    "commit": "abc1234",
    "speed": "sum(range(10**6)) takes 19.5 ms on the server core",
}


def forward_json(per_cpu: float, ok: bool = True) -> dict[str, object]:
    return {
        "machine": MACHINE,
        "results": [
            {
                "events_per_second": 250_000.0,
                "p50_ms": 57.25,
                "p99_ms": 112.9,
                "events_per_server_cpu_second": per_cpu,
                "server_peak_rss_mb": 672.4,
                "other_cpu_pct": 3.0,
                "acked_events": 10,
                "table_rows": 10 if ok else 9,
                "server_exit": 0,
                "ok": ok,
            }
        ],
        "references": [{"events_per_second": 300_000.0, "events_per_server_cpu_second": 320_000.0}],
    }


def test_forward_figures_and_the_reference_ratio() -> None:
    figures = summary.read_figures(CASES["forward-1"], forward_json(256_000.0), True)
    assert not figures.failure
    assert figures.reference_per_cpu_second == 320_000.0
    assert figures.speed == "19.5 ms"
    line = summary.row(summary.CaseReport(CASES["forward-1"], [figures]), None)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "forward"
    assert cells[2:6] == ["250,000", "57.2 / 112.9", "**256,000**", "672"]
    assert cells[6] == "0.83 events/s (300,000), 0.80 per CPU-s (320,000)"
    assert cells[7] == "not run"


def test_a_missing_reference_is_a_failure_only_when_it_was_asked_for() -> None:
    data = forward_json(256_000.0)
    data["references"] = []
    assert summary.read_figures(CASES["forward-1"], data, True).failure
    assert not summary.read_figures(CASES["forward-1"], data, False).failure


def test_baseline_ratio_is_the_median_of_the_rounds_each_listed() -> None:
    case = CASES["lumberjack"]

    def run(per_cpu: float) -> summary.Figures:
        data = forward_json(per_cpu)
        return summary.read_figures(case, {"machine": MACHINE, "cases": data["results"]}, False)

    report = summary.CaseReport(case, [run(120.0), run(100.0), run(90.0)])
    report.baseline_runs = [run(100.0), run(100.0), run(100.0)]
    line = summary.row(report, "d2f1be4")
    assert "**1.00** (median of 3 rounds)" in line
    assert "**100**" in line  # the run with the median events per CPU-second
    assert "no reference" in line
    rounds = summary.round_lines([report], "d2f1be4")
    assert [r.rsplit("ratio ", 1)[1] for r in rounds] == ["1.20", "1.00", "0.90"]


def test_a_failed_case_shows_its_reason_and_no_number() -> None:
    case = CASES["courier"]
    data = {"machine": MACHINE, "cases": forward_json(1.0, ok=False)["results"]}
    figures = summary.read_figures(case, data, False)
    assert "acked 10, table rows 9" in figures.failure
    line = summary.row(summary.CaseReport(case, [figures]), None)
    assert "failed: the table does not hold what was acknowledged" in line
    assert "250,000" not in line
    no_case = summary.read_figures(case, {"machine": MACHINE, "cases": []}, False)
    assert no_case.failure == "no case in the JSON"


def test_logjam_has_no_latency() -> None:
    case = CASES["logjam"]
    data = {
        "machine": MACHINE,
        "cases": [
            {
                "messages_per_s": 6000,
                "events_per_server_cpu_second": 7000.5,
                "server_peak_rss_mb": 300,
                "rows_in_table": 10,
                "ok": True,
            }
        ],
    }
    figures = summary.read_figures(case, data, False)
    line = summary.row(summary.CaseReport(case, [figures]), None)
    assert "| 6,000 | n/a | **7,000** | 300 |" in line


def test_run_all_alternates_the_trees_and_fails_a_run_in_its_row(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def fake(case: summary.Case, command: list[str], log_dir: Path, name: str) -> summary.Figures:
        calls.append(command)
        if "--server-tree" in command:
            return summary.Figures(failure="exit 1: boom | here")
        return summary.read_figures(case, forward_json(200_000.0), "--reference" in command)

    args = argparse.Namespace(baseline_tree=tmp_path, rounds=2, duration=8.0, warmup=2.0)
    reports = summary.run_all([CASES["forward-1"]], args, tmp_path, fake)
    assert ["--server-tree" in c for c in calls] == [False, True, False, True]
    assert all("--reference" not in c for c in calls if "--server-tree" in c)
    assert calls[0][-8:] == ["--cases", "1000:4:4", "--duration", "8", "--warmup", "2",
                             "--no-commit-ceiling", "--reference"]  # fmt: skip
    text = summary.render(
        reports, commit="abc", baseline_tree=tmp_path, baseline_commit="d2f1be4",
        date="2026-11-27 15:00-15:10 UTC", command="python -m bench.summary", duration=8.0,
        warmup=2.0,
    )  # fmt: skip
    assert "failed: exit 1: boom \\| here" in text
    assert text.startswith(summary.SECTION_HEADING + "\n")


def test_write_results_replaces_only_the_current_figures() -> None:
    text = "# Results\n\nintro\n\n## Current figures\n\nold table\n\n## Forward\n\nkept\n"
    new = summary.replace_section(text, "## Current figures\n\nnew table\n")
    assert new == "# Results\n\nintro\n\n## Current figures\n\nnew table\n\n## Forward\n\nkept\n"
    last = "# Results\n\n## Current figures\n\nold\n"
    assert summary.replace_section(last, "## Current figures\n\nnew\n") == (
        "# Results\n\n## Current figures\n\nnew\n"
    )


def test_a_failed_baseline_run_keeps_this_trees_figures() -> None:
    case = CASES["websocket"]
    data = {"machine": MACHINE, "cases": forward_json(200_000.0)["results"]}
    report = summary.CaseReport(case, [summary.read_figures(case, data, False)])
    report.baseline_runs = [summary.Figures(failure="exit 2, no JSON: Traceback")]
    line = summary.row(report, "d2f1be4")
    assert "**200,000**" in line
    assert line.endswith("| failed: exit 2, no JSON: Traceback |")
    assert report.failure  # the summary exits 1


def test_forward_names_its_machine_fields_its_own_way(tmp_path: Path) -> None:
    forward_machine = {"cpu_model": "Other CPU", "python": "3.11.7", "packages": "msgpack 1.2.4",
                       "source": "/src at abc1234", "speed": MACHINE["speed"]}  # fmt: skip
    data = forward_json(1.0)
    data["machine"] = forward_machine
    report = summary.CaseReport(
        CASES["forward-1"], [summary.read_figures(CASES["forward-1"], data, True)]
    )
    other = summary.CaseReport(
        CASES["lumberjack"],
        [
            summary.read_figures(
                CASES["lumberjack"], {"machine": MACHINE, "cases": data["results"]}, False
            )
        ],
    )
    (line,) = summary.machine_lines([report, other])
    assert "cpu Other CPU" in line
    assert "msgpack 1.2.4, trio 0.35.0, deltalake 1.6.6" in line
    assert "19.5-19.5 ms" in line
    assert summary.bench_commits([report, other]) == ["abc1234"]


def test_collect_reads_a_run_directory(tmp_path: Path) -> None:
    import json

    case = CASES["courier"]
    data = {"machine": MACHINE, "cases": forward_json(5.0)["results"]}
    (tmp_path / "courier-1.json").write_text(json.dumps(data))
    (tmp_path / "courier-1.log").write_text("last words\n")
    (tmp_path / "courier-1.exit").write_text("0\n")
    assert not summary.collect(case, [], tmp_path, "courier-1").failure
    (tmp_path / "courier-1.exit").write_text("1\n")
    assert summary.collect(case, [], tmp_path, "courier-1").failure == "exit 1: last words"
    (tmp_path / "courier-1.json").unlink()
    assert summary.collect(case, [], tmp_path, "courier-1").failure == (
        "exit 1, no JSON: last words"
    )
