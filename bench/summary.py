"""The lead cases of every protocol in one table: bench/RESULTS.md's "Current figures".

Runs each case's own benchmark module as a subprocess (``python -m
bench.NAME ... --json FILE``, this tree first on ``PYTHONPATH``), each under
``flock /tmp/bench.lock`` so that it never overlaps another benchmark on the
machine (the lock is taken per run, not for the whole summary), reads the
JSON and prints one markdown table: events/s, p50 / p99, events per server
CPU-second, peak RSS, the ratio to the reference (forward: npm
``@fluent-org/logger``'s ``FluentServer``, run by the forward bench in the same
minutes) and, with ``--baseline-tree DIR``, the ratio of events per server
CPU-second to that checkout's server, run with this tree's clients right
after this tree's (``--server-tree``), alternating, ``--rounds`` times. Then
the rounds, the commands, the machine, the commits, the date and the command
line of the summary itself.

A case whose run fails (a non-zero exit, no JSON, a table that does not hold
what was acknowledged) says ``failed: REASON`` in its row, never a number,
and the summary exits 1 after printing everything.

    .venv/bin/python -m bench.summary
    .venv/bin/python -m bench.summary --baseline-tree ../base --rounds 3 --write-results
    .venv/bin/python -m bench.summary --only forward,logjam --duration 4
    .venv/bin/python -m bench.summary --from-log-dir DIR --write-results   # runs nothing

Every run's output, JSON and exit code stay in ``--log-dir`` with the
summary's options (``run.json``): ``--from-log-dir`` renders that run's
table again without running anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import harness

#: The lock every benchmark run on this machine takes (one run at a time).
BENCH_LOCK = "/tmp/bench.lock"
#: Seconds one run may take, waiting for the lock included, before it is killed as failed.
RUN_TIMEOUT_SECONDS = 1800
#: Characters of a failure's reason kept in the table (the whole log stays on disk).
REASON_CHARS = 160
#: The section of bench/RESULTS.md that ``--write-results`` replaces.
SECTION_HEADING = "## Current figures"
RESULTS_FILE = harness.ROOT / "bench" / "RESULTS.md"


@dataclasses.dataclass(frozen=True)
class Case:
    """One lead case: which module runs it, with which options, and how its JSON reads."""

    key: str
    protocol: str
    label: str
    module: str
    options: tuple[str, ...]
    #: The forward cases also run the reference (``--reference``) beside this tree.
    reference: bool = False


@dataclasses.dataclass
class Figures:
    """What one run of a case found (or why it has no figures)."""

    events_per_second: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    events_per_server_cpu_second: float = math.nan
    server_peak_rss_mb: float = math.nan
    #: The reference's events/s and events per server CPU-second (forward only).
    reference_events_per_second: float = math.nan
    reference_per_cpu_second: float = math.nan
    #: ``sum(range(10**6))`` on the server core and the other processes' CPU, as printed.
    speed: str = ""
    other_cpu_pct: float = math.nan
    machine: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Why the run has no figures; empty when it has.
    failure: str = ""


@dataclasses.dataclass
class CaseReport:
    """Every run of one case: this tree's, and the baseline's of the same rounds."""

    case: Case
    runs: list[Figures] = dataclasses.field(default_factory=list)
    baseline_runs: list[Figures] = dataclasses.field(default_factory=list)
    #: Why the baseline is not run for this case (printed), when it is not.
    baseline_skipped: str = ""

    @property
    def failure(self) -> str:
        """Why a run of this tree failed, else why a baseline run did; empty when none did."""
        return self.own_failure or self.baseline_failure

    @property
    def own_failure(self) -> str:
        return next((r.failure for r in self.runs if r.failure), "")

    @property
    def baseline_failure(self) -> str:
        return next((r.failure for r in self.baseline_runs if r.failure), "")

    def shown(self) -> Figures:
        """This tree's run the row shows: the median events per server CPU-second."""
        ranked = sorted(self.runs, key=lambda r: r.events_per_server_cpu_second)
        return ranked[(len(ranked) - 1) // 2]

    def round_ratios(self) -> list[float]:
        return [
            run.events_per_server_cpu_second / base.events_per_server_cpu_second
            for run, base in zip(self.runs, self.baseline_runs, strict=False)
        ]


def lead_cases(workers: int, logjam_messages: int) -> list[Case]:
    """The lead case of each protocol; forward twice: one process and ``workers``."""
    tls = ("--duration", "{duration}", "--warmup", "{warmup}", "--no-commit-ceiling")
    forward = ("--cases", "1000:4:4", *tls, "--reference")
    return [
        Case("forward-1", "forward", "1 process, 4 x 4, 1,000 events a chunk",
             "forward_bench", forward, reference=True),
        Case("forward-auto", "forward",
             f'workers = {workers} (what "auto" resolves to here; the bench is given the'
             " count: it pins the server to that many cores), 4 x 4, 1,000 events a chunk",
             "forward_bench", (*forward, "--processes", str(workers)), reference=True),
        Case("lumberjack", "Lumberjack v2", "window 1,000, 4 x 8 windows in flight",
             "lumberjack_bench", ("--cases", "1000:8", *tls)),
        Case("courier", "Log Courier", "JDAT 1,024 events, 4 x 10 in flight",
             "courier_bench", ("--cases", "1024:10", "--message", "jdat", *tls)),
        Case("websocket", "WebSocket", "/ingest, 1,000 events a message, 4 x 8 in flight",
             "websocket_bench", ("--cases", "1000:8", *tls, "--no-tail")),
        Case("logjam", "Logjam",
             f"snappy, CURVE, {logjam_messages:,} async PUSH messages (~1 KB of JSON), 2 senders;"
             " end to end, no ack: no latency",
             "logjam_bench", ("--cases", "snappy:curve", "--messages", str(logjam_messages))),
    ]  # fmt: skip


# -- reading a run's JSON --------------------------------------------------------------


def _speed_ms(machine: dict[str, str]) -> str:
    found = re.search(r"takes ([0-9.]+) ms", machine.get("speed", ""))
    return f"{found.group(1)} ms" if found else ""


def read_figures(case: Case, data: dict[str, Any], with_reference: bool) -> Figures:
    """The figures of ``case`` from its bench's JSON; ``failure`` says what is wrong.

    ``with_reference``: the run had ``--reference`` (its JSON must hold the reference's).
    """
    machine = data.get("machine") or {}
    if case.module == "forward_bench":
        results = data.get("results") or []
    else:
        results = data.get("cases") or []
    if not results:
        return Figures(machine=machine, failure="no case in the JSON")
    result = results[0]
    if not result.get("ok"):
        return Figures(machine=machine, failure=table_failure(result))
    if case.module == "logjam_bench":
        figures = Figures(
            events_per_second=float(result["messages_per_s"]),
            events_per_server_cpu_second=float(result["events_per_server_cpu_second"]),
            server_peak_rss_mb=float(result["server_peak_rss_mb"]),
        )
    else:
        figures = Figures(
            events_per_second=float(result["events_per_second"]),
            p50_ms=float(result["p50_ms"]),
            p99_ms=float(result["p99_ms"]),
            events_per_server_cpu_second=float(result["events_per_server_cpu_second"]),
            server_peak_rss_mb=float(result["server_peak_rss_mb"]),
            other_cpu_pct=float(result.get("other_cpu_pct", math.nan)),
        )
    figures.machine = machine
    figures.speed = _speed_ms(machine)
    references = data.get("references") or []
    if with_reference:
        if not references:
            figures.failure = "the reference did not run"
        else:
            figures.reference_events_per_second = float(references[0]["events_per_second"])
            figures.reference_per_cpu_second = float(references[0]["events_per_server_cpu_second"])
    return figures


def table_failure(result: dict[str, Any]) -> str:
    """Why a case's result is not OK, from the fields it has."""
    acked = result.get("acked_events")
    rows = result.get("table_rows", result.get("rows_in_table"))
    code = result.get("server_exit")
    parts = ["the table does not hold what was acknowledged"]
    if acked is not None or rows is not None:
        parts.append(f"acked {acked}, table rows {rows}")
    if code is not None:
        parts.append(f"server exit {code}")
    return ": ".join(parts[:1]) + (f" ({', '.join(parts[1:])})" if parts[1:] else "")


# -- running ------------------------------------------------------------------------------


def bench_command(
    case: Case, duration: float, warmup: float, server_tree: Path | None
) -> list[str]:
    """``python -m bench.MODULE OPTIONS`` for ``case`` (without ``--json`` and the lock)."""
    options = [o.format(duration=f"{duration:g}", warmup=f"{warmup:g}") for o in case.options]
    if server_tree is not None:
        # The reference is this tree's to compare with; the baseline run needs only its server.
        options = [o for o in options if o != "--reference"]
        options += ["--server-tree", str(server_tree)]
    return [*harness.bench_module(case.module), *options]


def shown_command(command: Sequence[str]) -> str:
    return " ".join(["python", *command[1:]])


def last_line(log: Path) -> str:
    """The last non-empty line of a run's output: what it said when it stopped."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def run_case(case: Case, command: list[str], log_dir: Path, name: str) -> Figures:
    """One run under the lock; its figures, or why there are none."""
    json_path = log_dir / f"{name}.json"
    log_path = log_dir / f"{name}.log"
    argv = [
        "flock",
        "--wait",
        str(RUN_TIMEOUT_SECONDS),
        BENCH_LOCK,
        *command,
        "--json",
        str(json_path),
    ]
    print(f"summary: {shown_command(command)} (output: {log_path})", file=sys.stderr, flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=harness.ROOT,
            env=harness.tree_env(), start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -signal.SIGKILL
    (log_dir / f"{name}.exit").write_text(f"{code}\n", encoding="ascii")
    return collect(case, command, log_dir, name)


def collect(case: Case, command: list[str], log_dir: Path, name: str) -> Figures:
    """The figures of the run ``name`` in ``log_dir``: its JSON, exit code and output."""
    json_path = log_dir / f"{name}.json"
    log_path = log_dir / f"{name}.log"
    try:
        code: int | None = int((log_dir / f"{name}.exit").read_text(encoding="ascii"))
    except (OSError, ValueError):
        code = None  # a run directory from before the exit codes were recorded
    if code == -signal.SIGKILL:
        return Figures(failure=f"no result within {RUN_TIMEOUT_SECONDS} s (killed)")
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Figures(failure=f"exit {code}, no JSON: {last_line(log_path)}")
    figures = read_figures(case, data, "--reference" in command)
    if code not in (0, None) and not figures.failure:
        figures.failure = f"exit {code}: {last_line(log_path)}"
    return figures


def logjam_baseline_reason(baseline: Path) -> str:
    """Why the baseline's Logjam server cannot run with these senders, or empty when it can.

    Its ``--serve`` must print the same hello (the ports and keys as JSON) and the
    same row reports; the lines are compared as this tree's module writes them.
    """
    mine = (harness.ROOT / "bench" / "logjam_bench.py").read_text(encoding="utf-8")
    try:
        theirs = (baseline / "bench" / "logjam_bench.py").read_text(encoding="utf-8")
    except OSError:
        return f"{baseline} has no bench/logjam_bench.py"

    def hello(text: str) -> list[str]:
        return re.findall(r'print\(json\.dumps\(\{"(?:router|rows|done)"[^\n]*', text)

    if hello(mine) != hello(theirs) or not hello(mine):
        return f"the --serve of {baseline} prints other lines than this tree's senders read"
    return ""


def run_all(
    cases: Sequence[Case],
    args: argparse.Namespace,
    log_dir: Path,
    run: Callable[[Case, list[str], Path, str], Figures] = run_case,
) -> list[CaseReport]:
    reports = []
    for case in cases:
        report = CaseReport(case)
        baseline: Path | None = args.baseline_tree
        if baseline is not None and case.module == "logjam_bench":
            report.baseline_skipped = logjam_baseline_reason(baseline)
            if report.baseline_skipped:
                print(
                    f"summary: no baseline for Logjam: {report.baseline_skipped}", file=sys.stderr
                )
                baseline = None
        for index in range(args.rounds if baseline is not None else 1):
            mine = bench_command(case, args.duration, args.warmup, None)
            report.runs.append(run(case, mine, log_dir, f"{case.key}-{index + 1}"))
            if baseline is not None:
                theirs = bench_command(case, args.duration, args.warmup, baseline)
                report.baseline_runs.append(
                    run(case, theirs, log_dir, f"{case.key}-{index + 1}-baseline")
                )
        reports.append(report)
    return reports


# -- the table -----------------------------------------------------------------------------


def rate(value: float) -> str:
    return harness.fmt_rate(value)


def ratio(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "n/a"


def cell(text: str) -> str:
    """``text`` safe in a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def row(report: CaseReport, baseline: str | None) -> str:
    case = report.case
    if report.own_failure:
        failed = cell(f"failed: {report.own_failure}"[:REASON_CHARS])
        return f"| {case.protocol} | {cell(case.label)} | {failed} | | | | | |"
    shown = report.shown()
    latency = (
        "n/a" if not math.isfinite(shown.p50_ms) else f"{shown.p50_ms:.1f} / {shown.p99_ms:.1f}"
    )
    if case.reference:
        to_reference = (
            f"{ratio(shown.events_per_second / shown.reference_events_per_second)} events/s"
            f" ({rate(shown.reference_events_per_second)}),"
            f" {ratio(shown.events_per_server_cpu_second / shown.reference_per_cpu_second)}"
            f" per CPU-s ({rate(shown.reference_per_cpu_second)})"
        )
    else:
        to_reference = "no reference"
    if baseline is None:
        to_baseline = "not run"
    elif report.baseline_skipped:
        to_baseline = cell(f"not run: {report.baseline_skipped}")
    elif report.baseline_failure:
        to_baseline = cell(f"failed: {report.baseline_failure}"[:REASON_CHARS])
    else:
        ratios = report.round_ratios()
        to_baseline = f"**{ratio(statistics.median(ratios))}**"
        if len(ratios) > 1:
            to_baseline += f" (median of {len(ratios)} rounds)"
    return (
        f"| {case.protocol} | {cell(case.label)} | {rate(shown.events_per_second)} | {latency}"
        f" | **{rate(shown.events_per_server_cpu_second)}** | {shown.server_peak_rss_mb:.0f}"
        f" | {to_reference} | {to_baseline} |"
    )


#: The machine's fields, each under the names the benches give it (forward has its own).
MACHINE_FIELDS = (
    ("cpus", ("cpus",)),
    ("cpu", ("cpu", "cpu_model")),
    ("memory", ("memory",)),
    ("kernel", ("kernel",)),
    ("python", ("python",)),
    ("openssl", ("openssl",)),
)


def bench_commits(reports: Sequence[CaseReport]) -> list[str]:
    """The commits this tree's runs printed (``commit``, or forward's ``source ... at C``)."""
    found: list[str] = []
    for report in reports:
        for run in report.runs:
            commit = (
                run.machine.get("commit") or run.machine.get("source", "").rpartition(" at ")[2]
            )
            if commit and commit not in found:
                found.append(commit)
    return found


def machine_lines(reports: Sequence[CaseReport]) -> list[str]:
    """The machine as the benches printed it: one line, the libraries of all of them."""
    machines = [r.machine for rep in reports for r in rep.runs if r.machine]
    if not machines:
        return ["machine: no run printed it"]
    libraries: dict[str, str] = {}
    for machine in machines:
        listed = machine.get("libraries") or machine.get("packages") or ""
        for item in listed.split(", "):
            name, _, version = item.partition(" ")
            if name:
                libraries.setdefault(name, version)
    fields = []
    for label, keys in MACHINE_FIELDS:
        found = next((m[k] for m in machines for k in keys if m.get(k)), "")
        if found:
            fields.append(f"{label} {found}")
    fields.append("libraries " + ", ".join(f"{k} {v}" for k, v in libraries.items()))
    speeds = [
        float(r.speed.split()[0]) for rep in reports for r in (*rep.runs, *rep.baseline_runs)
        if r.speed
    ]  # fmt: skip
    line = "machine: " + "; ".join(fields)
    if speeds:
        line += (
            f"; `sum(range(10**6))` {min(speeds):.1f}-{max(speeds):.1f} ms on the server core"
            " over the runs (each run's in the rounds above)"
        )
    return [line]


def round_lines(reports: Sequence[CaseReport], baseline: str | None) -> list[str]:
    """Each run's events per server CPU-second, speed line and neighbours' CPU."""
    lines = []

    def about(figures: Figures) -> str:
        if figures.failure:
            return f"failed: {figures.failure}"
        extra = [f"`sum(range(10**6))` {figures.speed}"] if figures.speed else []
        if math.isfinite(figures.other_cpu_pct):
            extra.append(f"other processes {figures.other_cpu_pct:.0f}% of a core")
        return rate(figures.events_per_server_cpu_second) + (
            f" ({', '.join(extra)})" if extra else ""
        )

    for report in reports:
        for index, mine in enumerate(report.runs):
            text = f"- {report.case.protocol}, {report.case.label}, round {index + 1}: this tree "
            text += about(mine)
            if index < len(report.baseline_runs):
                theirs = report.baseline_runs[index]
                text += f"; {baseline} {about(theirs)}"
                if not mine.failure and not theirs.failure:
                    own, base = (
                        mine.events_per_server_cpu_second,
                        theirs.events_per_server_cpu_second,
                    )
                    text += f"; ratio {ratio(own / base)}"
            lines.append(text)
    return lines


def render(
    reports: Sequence[CaseReport],
    *,
    commit: str,
    baseline_tree: Path | None,
    baseline_commit: str,
    date: str,
    command: str,
    duration: float,
    warmup: float,
) -> str:
    """The "Current figures" section: the table, the rounds, the commands, the machine."""
    baseline = baseline_commit if baseline_tree is not None else None
    to_baseline = (
        f"ratio to the baseline {baseline} (per CPU-s)" if baseline else "ratio to the baseline"
    )
    out = [
        SECTION_HEADING,
        "",
        f"Run {date}, commit {commit}, by `{command}`.",
        "",
        "| protocol | case | events/s | p50 / p99 ms | events per server CPU-s | peak RSS MB"
        f" | ratio to the reference (forward) | {to_baseline} |",
        "|---|---|---:|---:|---:|---:|---|---|",
        *(row(r, baseline) for r in reports),
        "",
        "Each bench checks that the table holds exactly the acknowledged events; a case"
        " whose run failed says why instead of a figure. The row shows the run with the"
        " median events per server CPU-second; the ratio to the reference is of that run"
        " (the reference: npm `@fluent-org/logger`'s `FluentServer`, `bench/fluent_server.mjs`,"
        " run by the same client in the same minutes, reference figures in brackets); the"
        " ratio to the baseline is the median over the rounds of this tree's events per server"
        " CPU-second over the baseline server's (run with `--server-tree`, this tree's clients,"
        " right after this tree's run). With `workers = N` the CPU and the peak RSS are the"
        " supervisor's and its workers' together. Logjam's rate is end to end: messages from the"
        " first send to the commit that holds the last, with the server's CPU over that time.",
    ]
    rounds = round_lines(reports, baseline)
    if rounds:
        out += ["", "Events per server CPU-second, each run:", "", *rounds]
    out += [
        "",
        "Commands (each run as `flock /tmp/bench.lock COMMAND --json FILE`, from the root):",
        "",
    ]
    for report in reports:
        mine = shown_command(bench_command(report.case, duration, warmup, None))
        text = f"- {report.case.protocol}, {report.case.label}: `{mine}`"
        if baseline_tree is not None and not report.baseline_skipped:
            text += "; the baseline: the same" + (
                " without `--reference`," if report.case.reference else ""
            )
            text += f" with `--server-tree {baseline_tree}`"
        elif report.baseline_skipped:
            text += f"; no baseline: {report.baseline_skipped}"
        out.append(text)
    out += ["", *machine_lines(reports)]
    return "\n".join(out) + "\n"


def replace_section(text: str, section: str) -> str:
    """``text`` (RESULTS.md) with its "Current figures" section replaced by ``section``.

    The section runs from its heading to the next ``## `` heading (or the end).
    """
    start = text.find(f"\n{SECTION_HEADING}\n")
    if start < 0:
        raise ValueError(f"no {SECTION_HEADING!r} section")
    start += 1
    after = text.find("\n## ", start + len(SECTION_HEADING))
    rest = "" if after < 0 else text[after + 1 :]
    return text[:start] + section + ("\n" + rest if rest else "")


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    found.add_argument(
        "--only",
        help="comma-separated: forward (both forward cases), forward-1, forward-auto,"
        " lumberjack, courier, websocket, logjam (default: all)",
    )
    found.add_argument("--baseline-tree", type=Path, help="a checkout to A/B the servers against")
    found.add_argument("--rounds", type=int, default=1, help="A/B rounds with a baseline (1)")
    found.add_argument("--duration", type=float, default=8.0, help="measured seconds (8)")
    found.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds (2)")
    found.add_argument(
        "--logjam-messages", type=int, default=30_000, help="Logjam messages, ~10 s here (30000)"
    )
    found.add_argument("--log-dir", type=Path, help="each run's output and JSON (a temp dir)")
    found.add_argument(
        "--from-log-dir",
        type=Path,
        help="run nothing: render the table again from the --log-dir of an earlier run"
        " (its options are in its run.json)",
    )
    found.add_argument(
        "--write-results", action="store_true", help=f"replace {SECTION_HEADING!r} of RESULTS.md"
    )
    return found


def selected_cases(args: argparse.Namespace, workers: int) -> list[Case]:
    """The lead cases ``--only`` names (all by default); ValueError for an unknown name."""
    cases = lead_cases(workers, args.logjam_messages)
    if not args.only:
        return cases
    wanted = {name.strip() for name in args.only.split(",")}
    known = {c.key for c in cases} | {"forward"}
    if wanted - known:
        raise ValueError(f"unknown cases {sorted(wanted - known)}; known: {sorted(known)}")
    return [c for c in cases if c.key in wanted or c.key.split("-")[0] in wanted]


def main(argv: list[str] | None = None) -> int:
    from appliance.config import resolve_workers

    options = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(options)
    replay: Path | None = args.from_log_dir
    if replay is not None:
        # The run's own options, so the cases and their commands are the ones it ran.
        manifest = json.loads((replay / "run.json").read_text(encoding="utf-8"))
        write_results = args.write_results
        options = manifest["argv"]
        args = parser().parse_args(options)
        args.write_results = write_results
        log_dir, workers = replay, int(manifest["workers"])
    else:
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-summary-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        workers = resolve_workers("auto")
        manifest = {
            "argv": options,
            "workers": workers,
            "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        }
        (log_dir / "run.json").write_text(json.dumps(manifest), encoding="utf-8")
    if args.rounds < 1:
        parser().error("--rounds must be at least 1")
    try:
        cases = selected_cases(args, workers)
    except ValueError as error:
        parser().error(str(error))
    reports = run_all(cases, args, log_dir, collect if replay is not None else run_case)
    if replay is None:
        manifest["ended"] = f"{datetime.datetime.now(datetime.UTC):%H:%M}"
        (log_dir / "run.json").write_text(json.dumps(manifest), encoding="utf-8")
    command = " ".join(["python -m bench.summary", *options])
    if replay is not None:
        command += f"`, rendered from its runs by `python -m bench.summary --from-log-dir {replay}"
    section = render(
        reports,
        commit=", ".join(bench_commits(reports)) or harness.git_commit(),
        baseline_tree=args.baseline_tree,
        baseline_commit=harness.git_commit(args.baseline_tree) if args.baseline_tree else "",
        date=f"{manifest['started']}-{manifest.get('ended', '?')} UTC",
        command=command,
        duration=args.duration,
        warmup=args.warmup,
    )
    print(section)
    if args.write_results:
        RESULTS_FILE.write_text(
            replace_section(RESULTS_FILE.read_text(encoding="utf-8"), section), encoding="utf-8"
        )
        print(f"summary: wrote {RESULTS_FILE}", file=sys.stderr)
    print(f"summary: each run's output and JSON are in {log_dir}", file=sys.stderr)
    return 1 if any(r.failure for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
