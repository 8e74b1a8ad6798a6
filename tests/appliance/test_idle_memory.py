"""At most 150 MiB RSS per idle process with ``workers = "auto"`` (docs/performance.md#idle-memory).

Real processes: ``appliance serve`` on the embedded default (its listeners
moved to free ports, its state in a temporary directory), one worker per core
of this machine. Once every process is ready, the ``VmRSS`` of the
supervisor (when there is one) and of each worker is read from
``/proc/PID/status``. Memory, never time: readiness is polled.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

import pytest

from appliance.config import resolve_workers
from tests.support.cli import cli_argv, cli_env
from tests.support.ports import free_port, free_port_run
from tests.support.service import STARTUP_TIMEOUT_SECONDS

#: The bound of docs/decisions.md#processes-and-idle-memory, per process.
MAX_IDLE_RSS_BYTES: Final = 150 * 1024 * 1024

pytestmark = pytest.mark.slow


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def children(pid: int) -> list[int]:
    """The child processes of ``pid``, whichever of its threads started them."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(found)


def ready(admin_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_every_idle_process_of_the_embedded_default_stays_under_150_mib(tmp_path: Path) -> None:
    workers = resolve_workers("auto")
    # Worker k's admin listener binds the admin port + k: all of them free.
    admin = free_port_run(workers + 1)
    listener = free_port()
    while admin <= listener < admin + workers:
        listener = free_port()
    config = tmp_path / "appliance.toml"
    # The embedded default, on free ports: only the addresses differ.
    config.write_text(
        f'state_dir = "{tmp_path / "var"}"\nworkers = "auto"\n'
        f'[admin]\nbind = "127.0.0.1:{admin}"\n'
        f'[[listeners]]\nbind = "127.0.0.1:{listener}"\n'
    )
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            cli_argv(["serve"], config), stdout=subprocess.DEVNULL, stderr=stderr,
            cwd=tmp_path, env=cli_env(),
        )  # fmt: skip
    try:
        # Every worker's admin listener (worker k: the admin port + k) says ready,
        # and the supervisor has seen them all.
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS * 2
        while not (
            all(ready(admin + k) for k in range(workers))
            and (workers == 1 or "event=supervisor.ready" in log.read_text())
        ):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"not ready:\n{log.read_text()}"
            time.sleep(0.2)
        pids = [process.pid, *children(process.pid)]
        assert len(pids) == (1 if workers == 1 else 1 + workers), pids
        measured = {pid: rss_bytes(pid) for pid in pids}
        over = {pid: rss for pid, rss in measured.items() if rss > MAX_IDLE_RSS_BYTES}
        shown = {pid: f"{rss / 2**20:.0f} MiB" for pid, rss in measured.items()}
        assert not over, f"idle RSS above 150 MiB: {shown}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
