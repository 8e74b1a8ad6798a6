"""Runs the real ``appliance serve`` command as a subprocess for interop tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable

#: Fixtures of their own modules, registered once for the whole session.
pytest_plugins = ["tests.postgres", "tests.s3server"]

#: Seconds the service has to come up (first start generates a CA and the table).
STARTUP_TIMEOUT_SECONDS = 60


def free_port() -> int:
    """A port that was free a moment ago: for what must be known before the service starts.

    A listener of :func:`start_appliance` binds port 0 instead (no race).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ApplianceProcess:
    """A running ``appliance serve`` and where to find its parts."""

    process: subprocess.Popen[str]
    state_dir: Path
    log_path: Path
    #: The port each listener bound, by name (a Logjam PULL socket as ``<name>-pull``).
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.pem"

    @property
    def table_uri(self) -> str:
        return str(self.state_dir / "lake" / "events")

    def rows(self) -> list[dict[str, object]]:
        return DeltaTable(self.table_uri).to_pyarrow_table().to_pylist()

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


#: The ``service.ready`` log line's ports: ``listeners=name:port,name:port``.
_READY_PORTS = re.compile(r"event=service\.ready .*?\blisteners=(\S*)")


def _wait_ready(app: ApplianceProcess) -> None:
    """Wait for ``service.ready`` and take the ports the listeners bound from it."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if app.process.poll() is not None:
            raise RuntimeError(f"appliance exited with {app.process.returncode}:\n{app.log()}")
        ready = _READY_PORTS.search(app.log())
        if ready:
            pairs = (item.rpartition(":") for item in ready.group(1).strip('"').split(","))
            app.ports = {name: int(port) for name, _, port in pairs if name}
            return
        time.sleep(0.1)
    app.stop()
    raise RuntimeError(f"appliance not ready within {STARTUP_TIMEOUT_SECONDS}s:\n{app.log()}")


def unless_given_in(toml: str, key: str, line: str) -> str:
    """``line``, unless the TOML text ``toml`` sets ``key`` itself."""
    return "" if re.search(rf"^{key}\s*=", toml, re.MULTILINE) else line


def start_appliance(
    directory: Path, listeners: dict[str, str], extra: str = "", index: int = 0, lake: str = ""
) -> ApplianceProcess:
    """Start ``appliance serve`` with ``listeners`` (name -> TOML body) under ``directory``.

    The config is ``directory/appliance{index}.toml``; every listener binds
    port 0 on loopback unless its body has a ``bind``, and
    :attr:`ApplianceProcess.ports` holds the port it got (from the
    ``service.ready`` log line). ``lake`` adds keys to ``[lake]``;
    without a ``commit_max_delay_seconds`` in it, commits are 0.1 s apart; without an
    ``ack`` key, ``ack = "commit"``: the tests read the table right after an ack.
    """
    state = directory / f"state{index}"

    def unless_given(key: str, line: str) -> str:
        return unless_given_in(lake, key, line)

    delay = unless_given("commit_max_delay_seconds", "commit_max_delay_seconds = 0.1")
    ack = unless_given("ack", 'ack = "commit"')
    # One process unless the test asks for workers: the ports, logs and state
    # directory below are a single service's (workers = "auto" is the default).
    workers = unless_given_in(extra, "workers", "workers = 1")
    parts = [f'state_dir = "{state}"', workers, extra, "[lake]", delay, ack, lake]
    for name, body in listeners.items():
        bind = unless_given_in(body, "bind", 'bind = "127.0.0.1:0"')
        parts += ["[[listeners]]", f'name = "{name}"', bind, body]
    config = directory / f"appliance{index}.toml"
    config.write_text("\n".join(parts) + "\n")
    log_path = directory / f"appliance{index}.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    app = ApplianceProcess(process, state, log_path)
    _wait_ready(app)
    return app


@pytest.fixture
def appliance(tmp_path: Path) -> Iterator[Callable[..., ApplianceProcess]]:
    """A factory: ``appliance({name: toml_body})`` starts the service with those listeners."""
    started: list[ApplianceProcess] = []

    def start(listeners: dict[str, str], extra: str = "") -> ApplianceProcess:
        app = start_appliance(tmp_path, listeners, extra, index=len(started))
        started.append(app)
        return app

    yield start
    for app in started:
        app.stop()


def appliance_cli(config: Path, *args: str, stdin: str = "", timeout: float = 120) -> str:
    """``appliance ARGS --config CONFIG``, which must succeed; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "appliance", *args, "--config", str(config)],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout
