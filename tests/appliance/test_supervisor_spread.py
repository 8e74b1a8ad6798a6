"""``workers = 2``: one accept queue per port, and connections spread by the fewest open.

Real processes, real TLS. The supervisor binds the forward port once and
hands the socket to both workers; each takes a pending connection at once
only while it holds the fewest open connections (appliance/server/spread.py).
Connections open one after another, each acknowledged before the next, so
the spread does not hang on a race; the bound leaves room for each time a
worker was slow to wake and the busier one took the connection after the
grace, which the log says.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import msgpack
import pytest

from appliance.reload_status import read_status
from tests.appliance.test_supervisor import _none, acked, forward_on, wait_for, worker_pid
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

HELD = 8
EVENTS = 5


@contextmanager
def held_connection(app: ApplianceProcess, port: int, chunk: str) -> Iterator[ssl.SSLSocket]:
    """A TLS forward connection whose first chunk is acknowledged; open until the block ends."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    entries = b"".join(msgpack.packb([int(time.time()), {"i": i}]) for i in range(EVENTS))
    request = msgpack.packb(["spread", entries, {"chunk": chunk, "size": EVENTS}])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=60) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(request)
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = tls.recv(65536)
            assert data, "closed before the ack"
            unpacker.feed(data)
            answers = list(unpacker)
            if answers:
                assert answers[0] == {"ack": chunk}, answers
                break
        yield tls


def opened_by_worker(app: ApplianceProcess) -> Counter[int]:
    return Counter(int(k) for k in re.findall(r"event=connection\.open worker=(\d)", app.log()))


def spread_metric(app: ApplianceProcess) -> dict[int, float]:
    """``appliance_worker_connections_open`` as worker 0's admin listener serves it."""
    found = re.search(r"event=admin\.ready worker=0 bind=([\d.]+:\d+)", app.log())
    assert found, app.log()
    with urllib.request.urlopen(f"http://{found[1]}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        int(worker): float(value)
        for worker, value in re.findall(
            r'^appliance_worker_connections_open\{worker="(\d+)"\} (\S+)$', text, re.MULTILINE
        )
    }


def test_connections_opened_one_after_another_are_spread_over_both_workers(
    tmp_path: Path,
) -> None:
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2")
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        with ExitStack() as stack:
            for i in range(HELD):
                stack.enter_context(held_connection(app, port, f"held-{i}"))
            by_worker = opened_by_worker(app)
            assert sum(by_worker.values()) == HELD, app.log()
            # Each connection goes to the worker holding the fewest, unless that
            # one was slow to wake and the other took it after the grace (a line
            # each). Taken in turn the eight end 4/4; each late one can widen the
            # gap by one: at worst (HELD - 1 - late) / 2 for the smaller side.
            late = app.log().count("event=connection.accepted_after_grace")
            assert min(by_worker[0], by_worker[1]) >= math.ceil((HELD - 1 - late) / 2), (
                by_worker,
                late,
            )
            # Every worker's scrape shows them all: what each holds now.
            assert spread_metric(app) == {k: float(n) for k, n in by_worker.items()}
    finally:
        code = app.stop()
    assert code == 0, app.log()


def test_the_port_keeps_accepting_while_a_worker_restarts(tmp_path: Path) -> None:
    """The supervisor holds the socket: a dead worker's queue is the live one's."""
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2")
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        killed = worker_pid(app, 1)
        os.kill(killed, signal.SIGKILL)
        # At once, and all along its restart: every connection is served.
        chunks = [f"during-{i}" for i in range(6)]
        assert [acked(app, port, chunk) for chunk in chunks] == chunks
        wait_for(lambda: "event=worker.restarted" in app.log(), "worker.restarted", app=app)
        assert worker_pid(app, 1) != killed
        # The restarted worker serves the same socket: it takes its share again.
        before = opened_by_worker(app)[1]
        with ExitStack() as stack:
            for i in range(4):
                stack.enter_context(held_connection(app, port, f"after-{i}"))
            assert opened_by_worker(app)[1] - before >= 1, app.log()
    finally:
        code = app.stop()
    assert code == 0, app.log()


def test_a_listener_a_reload_removes_closes_its_port_and_one_it_adds_opens(
    tmp_path: Path,
) -> None:
    """No process keeps the old socket queueing; a new listener is bound by the workers."""
    kept, removed, added = free_port(), free_port(), free_port()
    listeners = {
        "forward": f'protocol = "forward"\nbind = "127.0.0.1:{kept}"',
        "old": f'protocol = "forward"\nbind = "127.0.0.1:{removed}"',
    }
    app = start_appliance(tmp_path, listeners, "workers = 2")
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        assert acked(app, removed, "before") == "before"
        config = tmp_path / "appliance0.toml"
        text = config.read_text()
        config.write_text(text.replace(f"127.0.0.1:{removed}", f"127.0.0.1:{added}"))
        os.kill(app.process.pid, signal.SIGHUP)
        wait_for(lambda: (read_status(app.state_dir) or _none()).generation == 1, "reload", app=app)
        status = read_status(app.state_dir)
        assert status is not None
        assert status.ok, (status, app.log())
        assert "event=supervisor.listener_closed listener=old" in app.log()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", removed), timeout=10).close()
        # Moved: each worker binds the new address itself (SO_REUSEPORT).
        assert acked(app, added, "moved") == "moved"
        assert acked(app, kept, "kept") == "kept"
    finally:
        code = app.stop()
    assert code == 0, app.log()


def test_once_every_worker_has_stopped_the_port_refuses(tmp_path: Path) -> None:
    """On SIGTERM the port refuses once the workers stop accepting, as one process's does.

    The supervisor closes its copies of the shared sockets as it stops, and
    each worker its own, so a client is not queued through the drain on a
    socket no process accepts from again (and reset at the end).
    """
    port = free_port()
    app = start_appliance(tmp_path, forward_on(port), "workers = 2")
    wait_for(lambda: "event=supervisor.ready" in app.log(), "ready", app=app)
    assert acked(app, port, "warm") == "warm"
    app.process.send_signal(signal.SIGTERM)
    # Both workers have drained (their accept loops ended long before this line).
    while app.log().count("event=service.stopped") < 2 and app.process.poll() is None:
        time.sleep(0.001)
    outcome = "exited first"
    if app.process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            outcome = "connected"  # queued on a socket nobody will accept from again
        except ConnectionRefusedError:
            outcome = "refused"
    assert app.process.wait(timeout=60) == 0, app.log()
    # A socket still held by the supervisor would queue it: "connected".
    assert outcome in ("refused", "exited first"), outcome


def test_every_reload_closes_what_the_file_moved_also_the_supervisor_s_own(
    tmp_path: Path,
) -> None:
    """The hourly CRL re-sign reloads the workers too: a listener the file now moves stops
    queueing in the supervisor then as well, not only on SIGHUP (``_reload_serialized``)."""
    import trio

    from appliance.config import load_config
    from appliance.server.spread import InheritedSockets
    from appliance.supervisor import _reload_serialized, _Shared

    kept, moved_from, moved_to = free_port(), free_port(), free_port()
    path = tmp_path / "appliance.toml"
    text = (
        f'state_dir = "{tmp_path / "var"}"\nworkers = 2\n'
        f'[[listeners]]\nname = "kept"\nbind = "127.0.0.1:{kept}"\n'
        f'[[listeners]]\nname = "old"\nbind = "127.0.0.1:{moved_from}"\n'
    )
    path.write_text(text)
    config = load_config(path)
    sockets = {name: socket.socket() for name in ("kept", "old")}
    shared = _Shared(
        InheritedSockets.of(
            {
                "kept": (f"127.0.0.1:{kept}", [os.dup(sockets["kept"].fileno())]),
                "old": (f"127.0.0.1:{moved_from}", [os.dup(sockets["old"].fileno())]),
            }
        ),
        None,
    )
    try:
        path.write_text(text.replace(f":{moved_from}", f":{moved_to}"))
        trio.run(lambda: _reload_serialized(trio.Lock(), config, [], shared, publish=False))
        assert set(shared.sockets.described()) == {"kept"}
    finally:
        shared.close()
        for sock in sockets.values():
            sock.close()
