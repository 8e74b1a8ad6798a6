"""``workers = 2``: ``appliance serve`` supervising two worker processes (appliance/supervisor.py).

Real processes, real TLS, a real table. The supervisor makes the PKI once,
starts ``appliance serve --worker 0`` and ``--worker 1`` (each its own state
directory under ``<state>/workers/``, one socket per port that the
supervisor binds and both inherit, one table), restarts a worker that
dies, forwards SIGHUP and combines the workers' reload answers, and stops
them all on SIGTERM. Every acknowledged chunk is in the table once, also
across a worker's SIGKILL and the client's resend.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

from appliance.config import load_config, resolve_workers
from appliance.reload_status import read_status
from appliance.supervisor import ready_status
from tests.appliance.test_one_writer import send_chunk
from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

CHUNKS = 40
EVENTS = 10
#: An hour between commits: what is acked stays in the write-ahead log until a stop.
LOGGED = 'ack = "wal"\ncommit_interval_seconds = 3600'


def forward_on(port: int) -> dict[str, str]:
    """One forward listener on ``port`` (the workers share it)."""
    return {"forward": f'protocol = "forward"\nbind = "127.0.0.1:{port}"'}


def wait_for(
    predicate: object, what: str, seconds: float = 60, app: ApplianceProcess | None = None
) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            tail = "" if app is None else "\n" + "\n".join(app.log().splitlines()[-40:])
            raise AssertionError(f"not within {seconds}s: {what}{tail}")
        time.sleep(0.1)


def worker_pid(app: ApplianceProcess, index: int) -> int:
    return int((app.state_dir / "workers" / str(index) / "appliance.pid").read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie not yet reaped by whoever adopted it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def acked(app: ApplianceProcess, port: int, chunk: str) -> str:
    answer = send_chunk(app, port, chunk, events=EVENTS)
    assert isinstance(answer, dict), answer
    return str(answer["ack"])


def test_systemd_hears_what_listens_and_how_many_workers_share_it(tmp_path: Path) -> None:
    """``systemctl status`` under workers reads like one process's, plus the count."""
    path = tmp_path / "appliance.toml"
    path.write_text(
        f'state_dir = "{tmp_path}"\nworkers = 2\n'
        '[[listeners]]\nname = "forward"\nbind = "127.0.0.1:24224"\n'
        '[[listeners]]\nname = "beats"\nprotocol = "lumberjack"\nbind = "127.0.0.1:5044"\n'
    )
    status = ready_status(load_config(path), 2)
    assert status == "STATUS=listening: forward, beats; workers: 2"


def test_two_workers_share_the_port_and_the_table_and_survive_a_kill(tmp_path: Path) -> None:
    port = free_port()
    app = start_appliance(
        tmp_path,
        forward_on(port),
        "workers = 2",
        lake='commit_interval_seconds = 0.2\nack = "wal"',
    )
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        pids = [worker_pid(app, 0), worker_pid(app, 1)]
        assert len(set(pids)) == 2
        assert all(alive(pid) for pid in pids)
        table = app.state_dir / "lake" / "events"
        chunks = [f"chunk-{i}" for i in range(CHUNKS)]
        assert [acked(app, port, chunk) for chunk in chunks[: CHUNKS // 2]] == chunks[: CHUNKS // 2]

        # A worker dies: the supervisor starts it again on its own state directory.
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: "event=worker.restarted" in app.log(), "worker.restarted", app=app)
        assert worker_pid(app, 1) != pids[1]
        assert "event=worker.exited worker=1" in app.log()
        # Each worker's lines say which worker wrote them.
        assert "event=service.ready worker=1 " in app.log()
        # Every chunk, the first half again (a client resending what it is unsure of).
        assert [acked(app, port, chunk) for chunk in chunks] == chunks

        # SIGHUP: every worker reloads, and the supervisor writes the combined answer.
        os.kill(app.process.pid, signal.SIGHUP)
        wait_for(lambda: (read_status(app.state_dir) or _none()).generation == 1, "reload", app=app)
        status = read_status(app.state_dir)
        assert status is not None
        assert status.ok, (status, app.log())
        assert "tls" in status.applied
        workers_now = [worker_pid(app, 0), worker_pid(app, 1)]
    finally:
        code = app.stop()
    assert code == 0, app.log()
    assert not any(alive(pid) for pid in workers_now)
    assert "event=supervisor.stopped" in app.log()
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["batch_id"]).to_pylist()
    assert Counter(str(row["batch_id"]) for row in rows) == dict.fromkeys(chunks, EVENTS)
    # Both workers committed, each from its own log under its own node id.
    delta = DeltaTable(str(table))
    for index in (0, 1):
        node = (app.state_dir / "workers" / str(index) / "node-id").read_text().strip()
        assert delta.transaction_version(f"{node}#wal") is not None, index


def _none() -> object:
    class _NoStatus:
        generation = -1

    return _NoStatus()


def test_a_worker_that_cannot_start_fails_the_start_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    import socket

    # Worker 1's admin listener binds the admin port + 1, taken here: worker 1
    # cannot start (worker 0 may fail first if the admin port itself is taken).
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        admin = blocker.getsockname()[1] - 1
        try:
            app = start_appliance(
                tmp_path,
                forward_on(free_port()),
                f'workers = 2\n[admin]\nbind = "127.0.0.1:{admin}"\n',
            )
        except RuntimeError as exc:
            message = str(exc)  # it failed before worker 0 said it was ready
        else:
            # Worker 0 said it was ready (start_appliance's sign); the supervisor still fails.
            try:
                ready = [worker_pid(app, 0)]
            except FileNotFoundError:
                ready = []  # already stopped (its pid file goes with it)
            assert app.process.wait(timeout=120) == 1, app.log()
            message = app.log()
            assert not any(alive(pid) for pid in ready)  # the ready worker was stopped too
    # The workers start together: whichever fails first is named.
    assert re.search(r"worker \d exited with 1 before it was ready", message), message
    assert "the admin listener cannot bind" in message


def test_a_port_in_use_fails_the_supervisor_s_start_naming_the_listener(tmp_path: Path) -> None:
    """The supervisor binds the shared ports itself, before any worker starts."""
    port = free_port()
    import socket

    with socket.socket() as blocker:  # without SO_REUSEPORT: nobody else can bind it
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        try:
            start_appliance(tmp_path, forward_on(port), "workers = 2")
        except RuntimeError as exc:
            message = str(exc)
        else:
            raise AssertionError("the supervisor started")
    assert f"listener 'forward' cannot bind 127.0.0.1:{port}" in message, message
    assert "worker=" not in message  # no worker was started


def test_worker_is_only_for_the_supervisor_s_own_workers(tmp_path: Path) -> None:
    # The embedded default: workers = "auto", one per core of this machine.
    beyond = resolve_workers("auto")
    done = run_cli("serve", "--worker", str(beyond), cwd=tmp_path)  # no config: the defaults
    assert done.returncode == 2
    assert f"--worker {beyond}: the config has workers = {beyond} (auto)" in done.stderr
    assert not (tmp_path / "var").exists()  # nothing was started or written


def table_chunks(path: Path) -> Counter[str]:
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["batch_id"]).to_pylist()
    return Counter(str(row["batch_id"]) for row in rows)


def test_going_from_one_process_to_workers_commits_what_the_one_had_logged(
    tmp_path: Path,
) -> None:
    """Acked batches left in ``<state>/wal`` by a single process reach the table, once."""
    port = free_port()
    single = start_appliance(tmp_path, forward_on(port), "", lake=LOGGED)
    chunks = [f"left-{i}" for i in range(5)]
    assert [acked(single, port, chunk) for chunk in chunks] == chunks
    single.process.kill()  # SIGKILL: the log holds them, the table does not
    single.process.wait()
    table = single.state_dir / "lake" / "events"
    assert not DeltaTable(str(table)).to_pyarrow_table().num_rows
    # The same state directory, now with workers: the supervisor commits the old log first.
    app = start_appliance(tmp_path, forward_on(port), "workers = 2", lake=LOGGED)
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        assert "event=supervisor.log_drained" in app.log()
        assert table_chunks(table) == dict.fromkeys(chunks, EVENTS)
        # A resend of them now is a duplicate, whichever worker takes it.
        assert [acked(app, port, chunk) for chunk in chunks] == chunks
    finally:
        assert app.stop() == 0
    assert table_chunks(table) == dict.fromkeys(chunks, EVENTS)


def test_workers_stop_by_themselves_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2")
    wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
    pids = [worker_pid(app, 0), worker_pid(app, 1)]
    app.process.kill()
    app.process.wait()
    wait_for(lambda: not any(alive(pid) for pid in pids), "the workers to exit", 60, app=app)
    assert "event=service.supervisor_gone" in app.log()
    # The port and the state directories are free: a new start on them works.
    again = start_appliance(tmp_path, forward_on(port), "workers = 2")
    assert again.stop() == 0


def test_going_from_workers_to_one_process_commits_what_the_workers_had_logged(
    tmp_path: Path,
) -> None:
    """Acked batches left in ``workers/<k>/wal`` reach the table when ``workers`` goes back to 1."""
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2", lake=LOGGED)
    wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
    chunks = [f"w-{i}" for i in range(8)]
    assert [acked(app, port, chunk) for chunk in chunks] == chunks
    # Everything at once, with no chance to drain: the logs keep what was acked.
    pids = [worker_pid(app, 0), worker_pid(app, 1)]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    app.process.kill()
    app.process.wait()
    wait_for(lambda: not any(alive(pid) for pid in pids), "the workers to be gone", app=app)
    table = app.state_dir / "lake" / "events"
    assert sum(table_chunks(table).values()) < len(chunks) * EVENTS
    single = start_appliance(tmp_path, forward_on(port), "", lake=LOGGED)
    try:
        assert "event=supervisor.log_drained" in single.log()
        assert table_chunks(table) == dict.fromkeys(chunks, EVENTS)
    finally:
        assert single.stop() == 0
    assert table_chunks(table) == dict.fromkeys(chunks, EVENTS)


def test_systemd_s_stop_of_the_whole_group_drains_every_worker(tmp_path: Path) -> None:
    """``systemctl stop`` SIGTERMs every process of the unit: each worker gets two SIGTERMs.

    A worker takes the first, drains, and ignores the second (its own
    supervisor's); none dies undrained, and the supervisor exits 0.
    """
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2", lake=LOGGED)
    wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
    chunks = [f"g-{i}" for i in range(6)]
    assert [acked(app, port, chunk) for chunk in chunks] == chunks
    for pid in (worker_pid(app, 0), worker_pid(app, 1), app.process.pid):
        os.kill(pid, signal.SIGTERM)
    assert app.process.wait(timeout=120) == 0, app.log()
    log = app.log()
    assert "event=worker.stopped worker=0 code=0" in log
    assert "event=worker.stopped worker=1 code=0" in log
    # Drained, not killed: the logs were committed at the stop, an hour early.
    assert table_chunks(app.state_dir / "lake" / "events") == dict.fromkeys(chunks, EVENTS)
