"""The serving process's garbage collection (appliance/gc_policy.py)."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance import defaults, gc_policy, serving_imports
from appliance.commands import serve as serve_command


def test_tune_freezes_the_start_up_objects_and_raises_the_thresholds() -> None:
    """In a child interpreter: both are settings of the whole process."""
    script = (
        "import gc\n"
        "from appliance import defaults, gc_policy\n"
        "assert gc.get_freeze_count() == 0\n"
        "gc_policy.tune()\n"
        "assert gc.get_threshold() == defaults.SERVE_GC_THRESHOLDS, gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


class _Tuned(Exception):
    pass


def test_serve_tunes_before_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n', encoding="utf-8")

    def tuned() -> None:
        raise _Tuned

    monkeypatch.setattr(gc_policy, "tune", tuned)
    # keep_out() is process-wide (it would leave pandas and pyspark unimportable
    # for the rest of this test session): not here, whatever the order in _serve.
    monkeypatch.setattr(serving_imports, "keep_out", lambda: None)
    args = argparse.Namespace(config=str(config), worker=None, supervisor=None)
    with pytest.raises(_Tuned):
        serve_command._serve(args)


def test_a_young_collection_runs_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[tuple[float, int]] = []

    def collect(generation: int = 2) -> int:
        collected.append((trio.current_time(), generation))
        return 0

    monkeypatch.setattr(gc, "collect", collect)

    async def main() -> None:
        with trio.move_on_after(3.5):
            await gc_policy.collect_young()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    interval = defaults.SERVE_GC_YOUNG_INTERVAL_SECONDS
    assert collected == [(interval * k, 1) for k in (1, 2, 3)]
