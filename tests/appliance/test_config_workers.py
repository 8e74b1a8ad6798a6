"""``workers``: ``"auto"`` (the default, one process per available core) or a number.

docs/configuration.md#top-level, docs/decisions.md#processes-and-idle-memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from appliance import defaults
from appliance.config import (
    Config,
    ConfigError,
    available_cores,
    default_config,
    load_config,
    parse_config,
    resolve_workers,
)
from appliance.node import left_log_dirs, worker_config
from tests.support.cli import run_cli


def cores(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Make this process see ``count`` cores in its CPU affinity."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(count)), raising=False)


def test_the_embedded_default_is_auto() -> None:
    assert Config().workers == "auto"
    assert default_config().workers == "auto"


@pytest.mark.parametrize(("count", "expected"), [(1, 1), (2, 2), (4, 4), (200, 64)])
def test_auto_is_one_per_core_in_the_affinity_up_to_the_maximum(
    monkeypatch: pytest.MonkeyPatch, count: int, expected: int
) -> None:
    cores(monkeypatch, count)
    assert available_cores() == count
    assert resolve_workers("auto") == expected == Config().worker_count
    assert expected <= defaults.MAX_WORKERS


def test_a_one_core_machine_runs_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    cores(monkeypatch, 1)
    config = parse_config('workers = "auto"\n')
    assert (config.workers, config.worker_count) == ("auto", 1)
    # One process: no worker directories are running, its own log is its own.
    assert left_log_dirs(config) == []


def test_a_number_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    cores(monkeypatch, 8)
    assert parse_config("workers = 3\n").worker_count == 3
    assert parse_config("workers = 1\n").worker_count == 1
    assert parse_config(f"workers = {defaults.MAX_WORKERS}\n").worker_count == defaults.MAX_WORKERS


def test_a_worker_of_an_auto_config_is_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    cores(monkeypatch, 4)
    config = parse_config('state_dir = "/srv/a"\nworkers = "auto"\n')
    worker = worker_config(config, 3)
    assert (worker.worker_count, worker.worker) == (1, 3)
    with pytest.raises(ValueError, match="worker 4 of 4"):
        worker_config(config, 4)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"many"', "workers: must be a whole number or 'auto', not 'many'"),
        ('"Auto"', "workers: must be a whole number or 'auto', not 'Auto'"),
        ('"4"', "workers: must be a whole number or 'auto', not '4'"),
        ("0", 'workers: must be "auto" or within 1..64'),
        ("65", 'workers: must be "auto" or within 1..64'),
        ("2.5", "workers: must be a whole number"),
        ("true", "workers: must be a number"),
    ],
)
def test_bad_values_are_refused_at_their_line(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(f'state_dir = "{tmp_path}"\n\nworkers = {value}\n')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}:3: {message}"


def test_config_check_prints_the_resolved_count(tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(f'state_dir = "{tmp_path}"\nworkers = "auto"\n')
    result = run_cli("config", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith(f"; workers: {available_cores()} (auto)")
    path.write_text(f'state_dir = "{tmp_path}"\nworkers = 3\n')
    result = run_cli("config", "check", str(path))
    assert result.stdout.splitlines()[0].endswith("; workers: 3")
