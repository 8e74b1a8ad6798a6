"""The service for a test: ``appliance serve`` as a subprocess, or :func:`serve` in-process.

A subprocess (:func:`start_appliance`) is ready when its log says
``event=service.ready``: polled, never assumed after a fixed sleep. Its
listeners and its admin listener bind port 0 unless the test names an
address, and :attr:`ApplianceProcess.ports` holds the ports they got.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from deltalake import DeltaTable

from appliance.config import AdminConfig, Config, LakeConfig
from appliance.service import Running, serve
from tests.support.cli import cli_argv, cli_env

# -- a subprocess ---------------------------------------------------------------------

#: Seconds the service has to come up (first start generates a CA and the table):
#: a liveness bound for a busy machine, not a measurement.
STARTUP_TIMEOUT_SECONDS = 60.0
#: Seconds a stopped service has to exit before it is killed.
STOP_TIMEOUT_SECONDS = 60.0
#: The admin listener on any free port: the default address (docs/observability.md)
#: is one per machine, shared with whatever else runs there.
ANY_ADMIN_PORT = '[admin]\nbind = "127.0.0.1:0"\n'


@dataclass
class ApplianceProcess:
    """A running ``appliance serve`` and where to find its parts."""

    process: subprocess.Popen[str]
    state_dir: Path
    log_path: Path
    #: The port each listener bound, by name (a Logjam PULL socket as ``<name>-pull``).
    ports: dict[str, int] = field(default_factory=dict)
    #: The port the admin listener bound (None: disabled or not available).
    admin_port: int | None = None

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.pem"

    @property
    def table_uri(self) -> str:
        return str(self.state_dir / "lake" / "events")

    def rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = DeltaTable(self.table_uri).to_pyarrow_table().to_pylist()
        return rows

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        """SIGTERM, wait for the exit (SIGKILL after :data:`STOP_TIMEOUT_SECONDS`); the code."""
        return stop_process(self.process)


def stop_process(process: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT_SECONDS) -> int:
    """SIGTERM ``process``, wait for it (SIGKILL after ``timeout`` seconds); its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


#: The ``service.ready`` log line: ``listeners=name:port,name:port`` and ``admin=port``.
_READY = re.compile(r"event=service\.ready .*?\blisteners=(\S*)(?:.*?\badmin=(\d+))?")


def wait_ready(app: ApplianceProcess, timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
    """Poll the log for ``service.ready``; take the ports the listeners bound from it.

    Raises RuntimeError (with the log) if the process exits first or ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.process.poll() is not None:
            raise RuntimeError(f"appliance exited with {app.process.returncode}:\n{app.log()}")
        ready = _READY.search(app.log())
        if ready:
            pairs = (item.rpartition(":") for item in ready.group(1).strip('"').split(","))
            app.ports = {name: int(port) for name, _, port in pairs if name}
            app.admin_port = int(ready.group(2)) if ready.group(2) else None
            return
        time.sleep(0.1)
    app.stop()
    raise RuntimeError(f"appliance not ready within {timeout}s:\n{app.log()}")


def unless_given_in(toml: str, key: str, line: str) -> str:
    """``line``, unless the TOML text ``toml`` sets ``key`` itself."""
    return "" if re.search(rf"^{key}\s*=", toml, re.MULTILINE) else line


def start_serve(config: Path, log_path: Path, state_dir: Path) -> ApplianceProcess:
    """``appliance serve --config CONFIG``, its stderr (the log) to ``log_path``; once ready."""
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            cli_argv(["serve"], config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            text=True,
            env=cli_env(),
        )
    app = ApplianceProcess(process, state_dir, log_path)
    wait_ready(app)
    return app


def start_appliance(
    directory: Path, listeners: dict[str, str], extra: str = "", index: int = 0, lake: str = ""
) -> ApplianceProcess:
    """Start ``appliance serve`` with ``listeners`` (name -> TOML body) under ``directory``.

    The config is ``directory/appliance{index}.toml``; every listener binds
    port 0 on loopback unless its body has a ``bind``, and
    :attr:`ApplianceProcess.ports` holds the port it got (from the
    ``service.ready`` log line). Without an ``[admin]`` table in ``extra``, the
    admin listener binds port 0 too (:data:`ANY_ADMIN_PORT`). ``lake`` adds keys
    to ``[lake]``; without a ``commit_max_delay_seconds`` in it, commits are 0.1 s
    apart; without an ``ack`` key, ``ack = "commit"``: the tests read the table
    right after an ack. Without a ``workers`` key in ``extra``, one process.
    """
    state = directory / f"state{index}"

    def unless_given(key: str, line: str) -> str:
        return unless_given_in(lake, key, line)

    delay = unless_given("commit_max_delay_seconds", "commit_max_delay_seconds = 0.1")
    ack = unless_given("ack", 'ack = "commit"')
    admin = "" if re.search(r"^\[admin\]", extra, re.MULTILINE) else ANY_ADMIN_PORT
    # One process unless the test asks for workers: the ports, logs and state
    # directory below are a single service's (workers = "auto" is the default).
    workers = unless_given_in(extra, "workers", "workers = 1")
    parts = [f'state_dir = "{state}"', workers, extra, admin, "[lake]", delay, ack, lake]
    for name, body in listeners.items():
        bind = unless_given_in(body, "bind", 'bind = "127.0.0.1:0"')
        parts += ["[[listeners]]", f'name = "{name}"', bind, body]
    config = directory / f"appliance{index}.toml"
    config.write_text("\n".join(parts) + "\n")
    return start_serve(config, directory / f"appliance{index}.log", state)


# -- in-process -------------------------------------------------------------------------

#: Commits and retries fast, so a test waits tens of milliseconds for an ack.
#: ``ack = "commit"``: these tests read the table right after an ack (the rows
#: are there once acked); the write-ahead log's own tests use :data:`FAST_WAL_LAKE`.
FAST_LAKE = LakeConfig(
    ack="commit", commit_max_delay_seconds=0.05, retry_initial_seconds=0.05, retry_max_seconds=0.2
)
#: ``ack = "wal"`` (the default): acks from the log, commits every 0.2 s.
FAST_WAL_LAKE = LakeConfig(
    ack="wal", commit_interval_seconds=0.2, retry_initial_seconds=0.05, retry_max_seconds=0.2
)


def service_config(tmp_path: Path, listener_type: Callable[..., Any], **listener: Any) -> Config:
    """A config in ``tmp_path`` with :data:`FAST_LAKE` and one listener on a free port.

    The admin listener binds port 0 as well (:attr:`Running.admin_port`).
    """
    settings: dict[str, Any] = {"bind": "127.0.0.1:0", **listener}
    return Config(
        state_dir=tmp_path / "state",
        lake=FAST_LAKE,
        admin=AdminConfig(bind="127.0.0.1:0"),
        listeners=[listener_type(**settings)],
        shutdown_timeout_seconds=20,
    )


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[Running]:
    """:func:`serve` in the background until the block ends, then a graceful stop."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(
            lambda task_status: serve(config, stop=stop, task_status=task_status)
        )
        try:
            yield info
        finally:
            stop.set()


def table_rows(config: Config) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(config.table_uri).to_pyarrow_table().to_pylist()
    return rows
