"""The suite's ``appliance serve`` (:class:`HostileService`): credentials, log, memory, rows."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import zmq
from deltalake import DeltaTable

from appliance.cli import main as cli_main
from tests.hostile.limits import listener_bodies
from tests.support.service import ApplianceProcess, start_appliance

# -- logs --------------------------------------------------------------------------

_LOGFMT = re.compile(r'([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_logfmt(line: str) -> dict[str, str]:
    """One logfmt line (``appliance.logs``) as a dict of strings."""
    fields: dict[str, str] = {}
    for key, raw in _LOGFMT.findall(line):
        fields[key] = json.loads(raw) if raw.startswith('"') else raw
    return fields


#: Log events that close a stream connection because of what it sent, with a
#: reason. (``connection.refused``, the per-address limit, is not one: a test
#: that expects a protocol refusal must not pass on it.)
CLOSE_EVENTS = frozenset(
    {"protocol.error", "block.refused", "request.timeout", "handshake.timeout"}
)
#: Log events of the catch-alls: an exception escaped a codec or a driver.
BUG_EVENTS = frozenset({"connection.failed", "message.failed"})


# -- memory ------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise LookupError(f"{key} not in /proc/{pid}/status")


def reset_peak_rss(pid: int) -> int:
    """Reset the peak RSS (VmHWM) of ``pid`` to its current RSS; returns that RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss(pid: int) -> int:
    """The peak RSS (VmHWM) of ``pid`` since the last reset, in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


# -- the service -------------------------------------------------------------------


def _cli(config: Path, group: str, command: str, *args: str) -> str:
    """The real ``appliance`` CLI, in-process (no interpreter start-up per call).

    Options first and ``--`` before the arguments: a Z85 key may begin with ``-``.
    """
    out = io.StringIO()
    argv = [group, command, "--config", str(config), "--json", *(["--", *args] if args else [])]
    with contextlib.redirect_stdout(out):
        code = cli_main(argv)
    assert code == 0, f"appliance {' '.join(argv)} exited {code}: {out.getvalue()}"
    return out.getvalue()


@dataclass
class Credentials:
    shared_key: str
    curve_server_key: bytes
    curve_public: bytes
    curve_secret: bytes
    token: str


class HostileService:
    """The suite's ``appliance serve``, started again (new state) if a test took it down."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.starts = 0
        self.app: ApplianceProcess | None = None
        self.credentials: Credentials | None = None
        #: Why earlier instances died (a test that crashed the service).
        self.deaths: list[str] = []

    def start(self) -> None:
        index = self.starts
        self.starts += 1
        app = start_appliance(self.directory, listener_bodies(), index=index)
        config = self.directory / f"appliance{index}.toml"
        try:
            key = json.loads(_cli(config, "key", "generate", "fleet"))["secret"]
            server_key = json.loads(_cli(config, "curve", "server-key"))["public_key"]
            public, secret = zmq.curve_keypair()
            _cli(config, "curve", "add", "good-producer", public.decode())
            token = json.loads(_cli(config, "token", "add", "good-sender"))["token"]
        except BaseException:
            app.stop()  # never leave a service running behind a failed fixture
            raise
        self.app = app
        self.credentials = Credentials(key, server_key.encode(), public, secret, token)

    def ensure_running(self) -> None:
        if self.app is None:
            self.start()
            return
        if self.app.process.poll() is not None:
            self.deaths.append(f"exit {self.app.process.returncode}")
            self.start()

    def stop(self) -> None:
        if self.app is not None:
            self.app.stop()

    # -- parts ---------------------------------------------------------------------

    @property
    def running(self) -> ApplianceProcess:
        assert self.app is not None
        return self.app

    @property
    def creds(self) -> Credentials:
        assert self.credentials is not None
        return self.credentials

    @property
    def pid(self) -> int:
        return self.running.process.pid

    def port(self, listener: str) -> int:
        return self.running.ports[listener]

    @property
    def logjam_pull_port(self) -> int:
        """The port the Logjam listener's PULL socket bound."""
        return self.port("logjam-pull")

    @property
    def ca_file(self) -> Path:
        return self.running.ca_file

    def alive(self) -> bool:
        return self.running.process.poll() is None

    # -- logs --------------------------------------------------------------------

    def log_mark(self) -> int:
        """The log's current length: lines after it belong to what happens next."""
        return self.running.log_path.stat().st_size

    def log_lines(self, mark: int = 0) -> list[dict[str, str]]:
        with open(self.running.log_path, "rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        return [parse_logfmt(line) for line in text.splitlines() if "event=" in line]

    def log_tail(self, mark: int = 0, lines: int = 40) -> str:
        with open(self.running.log_path, "rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_log(
        self, mark: int, match: Callable[[dict[str, str]], bool], timeout: float = 15.0
    ) -> dict[str, str] | None:
        """The first log line after ``mark`` that ``match``es, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for fields in self.log_lines(mark):
                if match(fields):
                    return fields
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    # -- rows --------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        columns = ["event_time_ns", "received_at", "protocol", "tag", "source", "peer", "host",
                   "record", "batch_id"]  # fmt: skip
        table = DeltaTable(self.running.table_uri).to_pyarrow_table(columns=columns)
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows


def rows_from(rows: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
    """The rows whose peer is ``address`` (any port; ZeroMQ's Peer-Address has none)."""
    return [r for r in rows if r["peer"] == address or r["peer"].startswith(address + ":")]


def received_at_ns(row: dict[str, Any]) -> int:
    """A row's ``received_at`` in epoch nanoseconds (the column holds microseconds)."""
    value: datetime = row["received_at"]
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def has_receive_time(row: dict[str, Any]) -> bool:
    """Whether the row's event time is its receive time (docs/table.md: no usable time)."""
    return bool(row["event_time_ns"] // 1000 * 1000 == received_at_ns(row))


def record(row: dict[str, Any]) -> Any:
    return json.loads(row["record"])
