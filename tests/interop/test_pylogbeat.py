"""PyPI ``pylogbeat`` (Lumberjack v2) over TLS with a client certificate issued by the CLI.

pylogbeat numbers its events across windows (its sequence is never reset), so
it only completes when each ack carries the window's highest sequence.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pylogbeat import PyLogBeatClient

from tests.faults import read_only_dir
from tests.support.cli import run_cli

pytestmark = pytest.mark.interop


def issue_client(config: Path, name: str, out: Path) -> tuple[Path, Path]:
    run_cli("cert", "issue-client", name, "--out", str(out), config=config, check=True)
    return out / f"{name}.crt", out / f"{name}.key"


def client(app, creds: tuple[Path, Path], timeout: float = 30) -> PyLogBeatClient:
    cert, key = creds
    return PyLogBeatClient(
        "127.0.0.1", app.ports["beats"], timeout=timeout, ssl_enable=True, ssl_verify=True,
        ca_certs=str(app.ca_file), certfile=str(cert), keyfile=str(key),
    )  # fmt: skip


def beat_event(i: int, beat: str = "filebeat") -> dict[str, object]:
    return {
        "@timestamp": f"2026-11-22T10:00:{i % 60:02d}.{i:06d}123Z",
        "@metadata": {"beat": beat, "version": "8.15.0"},
        "host": {"name": "web-01"},
        "message": f"line {i}",
        "seq": i,
    }


def test_pylogbeat_numbers_across_windows_and_lands_once(appliance, tmp_path: Path) -> None:
    app = appliance({"beats": 'protocol = "lumberjack"\nclient_auth = "required"'})
    creds = issue_client(tmp_path / "appliance0.toml", "shipper-1", tmp_path / "certs")
    sent = 0
    with client(app, creds) as beats:
        for size in (1, 5, 50, 200):  # several windows on one connection
            beats.send([beat_event(sent + i) for i in range(size)])
            sent += size
    assert app.stop() == 0
    rows = app.rows()
    seqs = sorted(json.loads(r["record"])["seq"] for r in rows)
    assert seqs == list(range(sent))  # every event, exactly once
    row = next(r for r in rows if json.loads(r["record"])["seq"] == 7)
    assert row["protocol"] == "lumberjack"
    assert row["tag"] == "filebeat"
    assert row["host"] == "web-01"
    assert row["source"] == "CN=shipper-1"
    assert row["event_time_ns"] == 1795341607000007123


def test_slow_commit_sends_keepalives_and_waiting_client_completes(
    appliance, tmp_path: Path
) -> None:
    app = appliance({"beats": 'protocol = "lumberjack"\nkeepalive_seconds = 0.5'})
    creds = issue_client(tmp_path / "appliance0.toml", "shipper-2", tmp_path / "certs")
    log_dir = Path(app.table_uri) / "_delta_log"
    # pylogbeat gives up when a read waits longer than its socket timeout
    # (2 s here); only keepalive acks keep it connected through a 6 s stall.
    with client(app, creds, timeout=2) as beats:
        beats.send([beat_event(0)])  # creates the table's first commit
        with read_only_dir(log_dir) as fault:
            fault.break_()
            healed = threading.Event()

            def heal() -> None:
                healed.set()
                fault.heal()

            timer = threading.Timer(6, heal)
            timer.start()
            beats.send([beat_event(i) for i in range(1, 11)])
            acked_after_heal = healed.is_set()
            timer.join()
    assert acked_after_heal, "the window was acked while the table could not be written"
    assert app.stop() == 0
    assert sorted(json.loads(r["record"])["seq"] for r in app.rows()) == list(range(11))
    assert "event=commit.failed" in app.log()
