"""Exactly once across processes, in randomized rounds: every acked chunk in the table once.

Two topologies, each its own test:

* **workers**: one ``appliance serve`` with ``workers = 2`` (two worker
  processes on the supervisor's socket, one local table);
* **three nodes**: three ``appliance serve`` processes (each its own state
  directory and ``node_id``) on one S3 table (moto's server,
  ``conditional_put = "etag"``) and the session's PostgreSQL auth database;
  the clients log in with the forward ``users`` handshake.

A round, all of it drawn from ``random.Random(seed)``: 1-3 Fluentd-like
clients (tests/fleet/chunk_client.py: unique 16-byte chunk ids, windows of
2-8 chunks in flight, acks) stream 40-120 chunks each; the round's
``commit_interval_seconds`` is 0.2 s to 30 s. After a random share of the acks a
worker or node that holds a client's connection is SIGKILLed (once or twice
a round) and started again (the supervisor restarts a worker; a node is
restarted by the test), replaying its write-ahead log. Clients also drop
connections themselves now and then (the server lives on). After every
break a client resends its unacked chunks and some acked ones (their acks
lost with the connection) to another worker or node. Each client holds its
last chunks back until the kills are over, sends them, and (most clients)
resends some of them, acked, to another worker or node; right after that
every process is stopped at once (SIGTERM to all together: each commits its
log at the same moment), started again (their logs replay) and stopped
again. The table must then hold every acked chunk exactly once: per batch
id, exactly as many rows as the chunk had events.

``APPLIANCE_EO_ROUNDS`` (default 3) rounds per topology; ``APPLIANCE_EO_SEED``
fixes the first round's seed (round ``k`` uses seed + ``k``); each round
prints its seed and counts, see them with ``pytest -s``. Twenty rounds of
both topologies::

    APPLIANCE_EO_ROUNDS=20 .venv/bin/pytest -s tests/fleet/test_exactly_once_rounds.py
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
from deltalake import DeltaTable

from tests.appliance.test_supervisor import alive, forward_on, table_chunks, wait_for, worker_pid
from tests.fleet.chunk_client import Link, Streamer, Tally, make_chunks, open_tls
from tests.fleet.test_three_nodes import LISTENERS, PASSWORD, SHARED_KEY, USER, StreamClient
from tests.postgres import PostgresServer
from tests.s3server import S3Server
from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

pytestmark = [pytest.mark.interop, pytest.mark.slow]

#: Rounds per topology: few by default (CI); set it to 20 or more by hand.
ROUNDS = int(os.environ.get("APPLIANCE_EO_ROUNDS", "3"))
#: The first round's seed; a fresh one per run unless given (printed either way).
SEED_ENV = "APPLIANCE_EO_SEED"
#: Port 0 for the admin listener (workers: each any free port): nothing binds a fixed port.
ADMIN = '[admin]\nbind = "127.0.0.1:0"\n'
#: Generous deadlines (seconds): the test waits for events, never for a fixed time.
STREAM_SECONDS = 300
RESTART_SECONDS = 120
STOP_SECONDS = 120
CONNECT_SECONDS = 120
#: Seconds to wait for a worker to log a connection it accepted before dialing again
#: (it may have been killed right after the accept; a redial costs nothing).
ACCEPT_LOG_SECONDS = 10
#: Connections a client opens at most to reach the other worker before taking either.
OTHER_WORKER_ATTEMPTS = 40


@dataclass(frozen=True)
class ClientPlan:
    seed: int
    chunks: int
    max_events: int
    window: int
    drop_chance: float
    final_resend: bool


@dataclass(frozen=True)
class Plan:
    """One round, drawn from its seed."""

    seed: int
    commit_interval: float
    clients: list[ClientPlan]
    #: The share of all chunks acked before each SIGKILL.
    kills: list[float]

    @classmethod
    def draw(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        # Short intervals commit resent chunks mid-stream; long ones leave them for the
        # stop, where every process commits its log at the same moment.
        interval = rng.choice([0.2, 1.0, 5.0, 30.0])
        clients = [
            ClientPlan(
                seed=rng.getrandbits(64),
                chunks=rng.randint(40, 120),
                max_events=rng.randint(1, 20),
                window=rng.randint(2, 8),
                drop_chance=rng.choice([0.0, 0.01, 0.03]),
                final_resend=rng.random() < 0.9,
            )
            for _ in range(rng.randint(1, 3))
        ]
        kills = sorted(rng.uniform(0.1, 0.8) for _ in range(rng.randint(1, 2)))
        return cls(seed, interval, clients, kills)


class Cluster(Protocol):
    """The processes of one round, whatever the topology."""

    @property
    def router(self) -> RoutingBase: ...

    def kill(self, target: int) -> None:
        """SIGKILL ``target``; it is started again (its log replayed) in the background."""

    def settle(self) -> None:
        """Wait until every killed target serves again (raise what a restart raised)."""

    def stop_all(self) -> None:
        """SIGTERM every process at the same moment; wait until all exited cleanly."""

    def start_all(self) -> None: ...

    def batch_counts(self) -> Counter[str]: ...


class RoutingBase:
    """What both balancers share: who is down, and how many connections each target holds."""

    def __init__(self, targets: int, seed: int) -> None:
        self.targets = targets
        self.lock = threading.Lock()
        self.down: set[int] = set()
        self.active: Counter[int] = Counter()
        self.rng = random.Random(seed)

    def _link(self, tls: ssl.SSLSocket, unpacker: object, target: int) -> Link:
        with self.lock:
            self.active[target] += 1

        def closed() -> None:
            with self.lock:
                self.active[target] -= 1

        return Link(tls, unpacker, target, closed)

    def connect(self, avoid: int | None) -> Link:
        raise NotImplementedError

    def victim(self, rng: random.Random) -> int | None:
        """A live target, one holding a client's connection if any (a kill mid-stream).

        None while killing one more would leave no target up.
        """
        with self.lock:
            if len(self.down) + 1 >= self.targets:
                return None
            up = [t for t in range(self.targets) if t not in self.down]
            busy = [t for t in up if self.active[t] > 0]
        return rng.choice(busy or up)


class Restarts:
    """Restarts running in threads of their own while the clients stream on."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def start(self, restart: Callable[[], None]) -> None:
        def run() -> None:
            try:
                restart()
            except BaseException as exc:  # settle() raises it in the test's thread
                self._errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def settle(self) -> None:
        for thread in self._threads:
            thread.join(RESTART_SECONDS)
            assert not thread.is_alive(), f"a restart took more than {RESTART_SECONDS}s"
        self._threads.clear()
        if self._errors:
            raise self._errors[0]


# -- topology (a): one supervisor, two workers -------------------------------------------


class WorkerRouter(RoutingBase):
    """The workers' accept gate balances; a client that wants the other worker redials.

    Which worker took a connection is read from its ``connection.open`` line
    (``worker=<k> ... peer=127.0.0.1:<the client's port>``), searched only in
    what the log gained after the dial: a reused client port cannot match an
    older line.
    """

    def __init__(self, workers: WorkerPair, seed: int) -> None:
        super().__init__(2, seed)
        self.workers = workers

    def connect(self, avoid: int | None) -> Link:
        deadline = time.monotonic() + CONNECT_SECONDS
        attempts = 0
        while True:
            attempts += 1
            app = self.workers.app
            offset = app.log_path.stat().st_size
            try:
                tls, unpacker = open_tls(self.workers.port, app.ca_file)
            except (OSError, ssl.SSLError):
                if time.monotonic() > deadline:
                    raise
                continue  # a worker died between accept and handshake: dial again
            worker = self._worker_of(app, tls, offset)
            with self.lock:
                other_up = avoid is not None and 1 - avoid not in self.down
            if worker is not None and (
                worker != avoid or not other_up or attempts >= OTHER_WORKER_ATTEMPTS
            ):
                return self._link(tls, unpacker, worker)
            tls.close()
            if time.monotonic() > deadline:
                raise AssertionError(f"no connection to a worker within {CONNECT_SECONDS}s")

    @staticmethod
    def _worker_of(app: ApplianceProcess, tls: ssl.SSLSocket, offset: int) -> int | None:
        line = f"listener=forward peer=127.0.0.1:{tls.getsockname()[1]} "
        deadline = time.monotonic() + ACCEPT_LOG_SECONDS
        while time.monotonic() < deadline:
            with app.log_path.open("rb") as log:
                log.seek(offset)
                for text in log.read().decode(errors="replace").splitlines():
                    if "event=connection.open worker=" in text and line in text:
                        return int(text.split(" worker=", 1)[1].split(" ", 1)[0])
            time.sleep(0.02)  # poll for the line: the worker writes it once it accepted
        return None  # the worker died before it logged: the caller dials again


class WorkerPair:
    """``appliance serve`` with ``workers = 2`` on a local table."""

    def __init__(self, directory: Path, commit_interval: float, seed: int) -> None:
        self.directory = directory
        self.port = free_port()  # the workers share it, so it must be known beforehand
        self.lake = f'ack = "wal"\ncommit_interval_seconds = {commit_interval}\n'
        self.starts = 0
        self.app = self._start()
        self.router = WorkerRouter(self, seed)
        self.restarts = Restarts()

    def _start(self) -> ApplianceProcess:
        if self.starts:  # start_appliance truncates the log: keep the last run's
            shutil.copy(self.directory / "appliance0.log", self.directory / f"run{self.starts}.log")
        self.starts += 1
        app = start_appliance(
            self.directory, forward_on(self.port), f"workers = 2\n{ADMIN}", lake=self.lake
        )
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        return app

    def kill(self, target: int) -> None:
        app = self.app
        old = worker_pid(app, target)
        ready = f"event=service.ready worker={target} "
        before = app.log().count(ready)
        with self.router.lock:
            self.router.down.add(target)
        os.kill(old, signal.SIGKILL)

        def restarted() -> bool:
            try:
                pid = worker_pid(app, target)
            except (OSError, ValueError):
                return False  # its pid file is being written
            return pid != old and alive(pid) and app.log().count(ready) > before

        def watch() -> None:  # the supervisor restarts it; the balancer learns when
            wait_for(restarted, f"worker {target} restarted", RESTART_SECONDS, app=app)
            with self.router.lock:
                self.router.down.discard(target)

        self.restarts.start(watch)

    def settle(self) -> None:
        self.restarts.settle()

    def stop_all(self) -> None:
        # As systemd stops the unit: every process of it gets SIGTERM at once.
        pids = [worker_pid(self.app, k) for k in (0, 1)]
        for pid in [*pids, self.app.process.pid]:
            os.kill(pid, signal.SIGTERM)
        code = self.app.process.wait(STOP_SECONDS)
        assert code == 0, self.app.log()[-4000:]
        wait_for(lambda: not any(alive(pid) for pid in pids), "workers gone", STOP_SECONDS)

    def start_all(self) -> None:
        self.app = self._start()

    def batch_counts(self) -> Counter[str]:
        return table_chunks(self.app.state_dir / "lake" / "events")


# -- topology (b): three nodes, one S3 table, one PostgreSQL auth database ----------------


class NodeRouter(RoutingBase):
    """A TCP balancer over three nodes: any live node, another one after a break."""

    def __init__(self, nodes: ThreeNodes, seed: int) -> None:
        super().__init__(3, seed)
        self.nodes = nodes

    def connect(self, avoid: int | None) -> Link:
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            with self.lock:
                live = [i for i in range(3) if i not in self.down]
                target = self.rng.choice([i for i in live if i != avoid] or live)
                node = self.nodes.nodes[target]
            try:
                tls, unpacker = StreamClient(SHARED_KEY)._connect(node)
            except (OSError, ssl.SSLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                continue  # it died while we dialed: the balancer tries another
            return self._link(tls, unpacker, target)


class ThreeNodes:
    """Three ``appliance serve`` processes, each its own state and node id, one S3 table."""

    def __init__(
        self, directory: Path, s3: S3Server, auth: str, commit_interval: float, seed: int
    ) -> None:
        self.directory = directory
        self.uri = f"s3://{s3.bucket()}/events"
        self.options = s3.storage_options()
        self.auth = auth
        self.lake = (
            f'path = "{self.uri}"\nack = "wal"\ncommit_interval_seconds = {commit_interval}\n'
        )
        self.lake += s3.toml_options()
        self.runs = [0, 0, 0]
        self.nodes: list[ApplianceProcess] = [self._start(0)]  # it creates the table
        with ThreadPoolExecutor(2) as pool:
            self.nodes += pool.map(self._start, (1, 2))
        self.router = NodeRouter(self, seed)
        self.restarts = Restarts()

    def _start(self, index: int) -> ApplianceProcess:
        if self.runs[index]:  # start_appliance truncates the log: keep the last run's
            log = self.directory / f"appliance{index}.log"
            shutil.copy(log, self.directory / f"node{index}-run{self.runs[index]}.log")
        self.runs[index] += 1
        extra = f'node_id = "node-{index}"\n{ADMIN}{self.auth}'
        return start_appliance(self.directory, {"forward": LISTENERS["forward"]}, extra,
                               index=index, lake=self.lake)  # fmt: skip

    def kill(self, target: int) -> None:
        with self.router.lock:
            self.router.down.add(target)
        node = self.nodes[target]
        node.process.kill()
        node.process.wait(STOP_SECONDS)

        def restart() -> None:
            restarted = self._start(target)  # replays its log before its listener opens
            with self.router.lock:
                self.nodes[target] = restarted
                self.router.down.discard(target)

        self.restarts.start(restart)

    def settle(self) -> None:
        self.restarts.settle()

    def stop_all(self) -> None:
        for node in self.nodes:
            node.process.send_signal(signal.SIGTERM)
        for i, node in enumerate(self.nodes):
            code = node.process.wait(STOP_SECONDS)
            assert code == 0, f"node {i}:\n{node.log()[-4000:]}"

    def start_all(self) -> None:
        # All at once, as after a fleet-wide restart: the replays race each other.
        with ThreadPoolExecutor(3) as pool:
            self.nodes = list(pool.map(self._start, range(3)))

    def batch_counts(self) -> Counter[str]:
        table = DeltaTable(self.uri, storage_options=self.options)
        rows = table.to_pyarrow_table(columns=["batch_id"]).to_pylist()
        return Counter(str(row["batch_id"]) for row in rows)

    def kill_leftovers(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.kill()
                node.process.wait()


# -- the rounds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    seed: int
    commit_interval: float
    clients: int
    sent: int
    acked: int
    resent: int
    resent_acked: int
    kills: int
    lost: int
    doubled: int

    def line(self, topology: str, round_index: int) -> str:
        return (
            f"{topology} round {round_index}: seed={self.seed} clients={self.clients} "
            f"commit_interval={self.commit_interval}s chunks sent={self.sent} "
            f"acked={self.acked} resent={self.resent} (of them acked={self.resent_acked}) "
            f"kills={self.kills} lost={self.lost} doubled={self.doubled}"
        )


def run_round(plan: Plan, cluster: Cluster) -> Outcome:
    tally = Tally()
    total = sum(c.chunks for c in plan.clients)
    # The clients and this thread: the final resends start once the kills are over.
    barrier = threading.Barrier(len(plan.clients) + 1)
    streamers = []
    for i, client in enumerate(plan.clients):
        rng = random.Random(client.seed)
        chunks = make_chunks(rng, client.chunks, client.max_events)
        streamers.append(Streamer(
            f"client-{i}", chunks, client.window, cluster.router, tally, rng,
            client.drop_chance, client.final_resend, barrier,
        ))  # fmt: skip
    for streamer in streamers:
        streamer.start()

    def finished() -> bool:
        return all(s.streamed.is_set() or not s.is_alive() for s in streamers)

    kill_rng = random.Random(plan.seed ^ 0x5EED)
    kills = 0
    try:
        for share in plan.kills:
            tally.wait_acks(int(share * total), finished, STREAM_SECONDS)
            if finished():
                break  # nothing left mid-stream to kill
            victim = cluster.router.victim(kill_rng)
            if victim is not None:  # else every other target is down already
                cluster.kill(victim)
                kills += 1
        cluster.settle()
    except BaseException:
        barrier.abort()  # the clients must not wait for a round that failed
        raise
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: raised below
        barrier.wait(STREAM_SECONDS)
    deadline = time.monotonic() + STREAM_SECONDS
    for streamer in streamers:
        streamer.join(max(0.0, deadline - time.monotonic()))
        assert not streamer.is_alive(), f"{streamer.name} still streaming after {STREAM_SECONDS}s"
    # The first real failure, not the broken barrier it left the others.
    errors = sorted((s.error for s in streamers if s.error is not None),
                    key=lambda e: isinstance(e, threading.BrokenBarrierError))  # fmt: skip
    if errors:
        raise errors[0]
    assert len(tally.acked) == total, (len(tally.acked), total)

    cluster.stop_all()  # right after the last resends: copies in two logs, committed at once
    cluster.start_all()  # each log replays (what the stop left in it)
    cluster.stop_all()
    counts = cluster.batch_counts()
    lost = sum(1 for c in tally.acked if counts[c] < tally.events[c])
    doubled = sum(1 for c, n in counts.items() if n > tally.events.get(c, n))
    return Outcome(
        plan.seed, plan.commit_interval, len(plan.clients), len(tally.events), len(tally.acked),
        tally.resent, tally.resent_acked, kills, lost, doubled,
    )  # fmt: skip


def run_rounds(topology: str, one_round: Callable[[Plan, int], Outcome]) -> None:
    base = int(os.environ.get(SEED_ENV) or random.SystemRandom().getrandbits(32))
    print(f"\n{topology}: {ROUNDS} rounds from seed {base} ({SEED_ENV}={base} repeats them)")
    outcomes = []
    for k in range(ROUNDS):
        outcome = one_round(Plan.draw(base + k), k)
        print(outcome.line(topology, k), flush=True)
        outcomes.append(outcome)
    bad = [o for o in outcomes if o.lost or o.doubled]
    lost = sum(o.lost for o in bad)
    doubled = sum(o.doubled for o in bad)
    assert not bad, (
        f"{topology}: {len(bad)} of {ROUNDS} rounds broke exactly-once: {lost} acked chunks "
        f"lost, {doubled} stored twice; seeds {[o.seed for o in bad]}"
    )


def test_two_workers_store_every_acked_chunk_once(tmp_path: Path) -> None:
    def one_round(plan: Plan, k: int) -> Outcome:
        directory = tmp_path / f"round{k}"
        directory.mkdir()
        workers = WorkerPair(directory, plan.commit_interval, plan.seed)
        try:
            return run_round(plan, workers)
        finally:
            workers.app.stop()

    run_rounds("workers=2", one_round)


@dataclass(frozen=True)
class FleetServices:
    """What the three nodes share: moto's S3 server and the ``[auth]`` section."""

    s3: S3Server
    #: One PostgreSQL database, one secret key file.
    auth: str


@pytest.fixture
def fleet_services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FleetServices]:
    """Skips (and says why) where moto's server or PostgreSQL cannot run.

    The session fixtures are asked for here, not in the test's signature: a
    session fixture there is set up first, and moto's would fail the test.
    """
    try:
        s3: S3Server = request.getfixturevalue("s3_server")
    except pytest.fail.Exception as exc:
        pytest.skip(f"moto's S3 server cannot run here: {exc}")
    postgres: PostgresServer = request.getfixturevalue("postgres_server")
    if postgres.url is None:
        pytest.skip(f"PostgreSQL cannot run here: {postgres.reason}")
    database = postgres.create_database()
    auth = f'[auth]\ndatabase_url = "{database}"\nsecret_key_file = "{tmp_path / "secret.key"}"\n'
    setup = tmp_path / "setup.toml"
    setup.write_text(f'state_dir = "{tmp_path / "setup"}"\n{auth}')
    try:
        run_cli("db", "upgrade", config=setup, check=True)
        run_cli(
            "key",
            "add",
            "fleet",
            "--secret-stdin",
            config=setup,
            stdin=SHARED_KEY + "\n",
            check=True,
        )
        run_cli(
            "user", "add", USER, "--password-stdin", config=setup, stdin=PASSWORD + "\n", check=True
        )
        yield FleetServices(s3, auth)
    finally:
        postgres.drop_database(database)


def test_three_nodes_on_one_s3_table_store_every_acked_chunk_once(
    fleet_services: FleetServices, tmp_path: Path
) -> None:
    def one_round(plan: Plan, k: int) -> Outcome:
        directory = tmp_path / f"round{k}"
        directory.mkdir()
        nodes = ThreeNodes(
            directory, fleet_services.s3, fleet_services.auth, plan.commit_interval, plan.seed
        )
        try:
            return run_round(plan, nodes)
        finally:
            with contextlib.suppress(Exception):  # a failed round: no restart may outlive it
                nodes.settle()
            nodes.kill_leftovers()

    run_rounds("three nodes", one_round)
