"""The supervisor's reload fan-out: every worker, a restarting one included, confirms the new CRL.

The workers are stand-ins that answer SIGHUP by writing their reload status
as a worker does (with the CRL number on disk); the clock is trio's
autojump clock, so the supervisor's wait passes in virtual time and nothing
depends on the machine's speed.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest
import trio
from cryptography import x509

from appliance.config import Config
from appliance.reload_status import ReloadStatus, read_status, write_status
from appliance.supervisor import (
    RELOAD_WAIT_SECONDS,
    _reload,
    _watch_signals,
    _Worker,
)
from pki.authority import CertificateAuthority, PkiPaths, crl_number

_pids = itertools.count(5000)


def crl_on_disk(config: Config) -> int | None:
    return crl_number(x509.load_pem_x509_crl(PkiPaths(config.pki_dir).crl.read_bytes()))


class FakeWorker:
    """A worker process: answers SIGHUP with a status naming the CRL it then reads."""

    def __init__(self, config: Config, index: int, crl: int | None) -> None:
        self.pid = next(_pids)
        self.returncode: int | None = None
        self.config = config
        self.index = index
        self.generation = 0
        self.hups = 0
        #: Answer the next SIGHUP with this CRL number (a reload under way before the
        #: change finishing), and with the one on disk only at :meth:`answer_fresh`.
        self.stale: int | None = None
        self.write(crl)  # its start status, as a worker writes once ready

    def write(self, crl: int | None) -> None:
        status = ReloadStatus(self.pid, self.generation, True, ["tls"], crl_number=crl)
        self.config.worker_state_dir(self.index).mkdir(parents=True, exist_ok=True)
        write_status(self.config.worker_state_dir(self.index), status)

    def send_signal(self, signum: int) -> None:
        assert signum == signal.SIGHUP
        self.hups += 1
        if self.stale is not None:
            self.generation += 1
            self.write(self.stale)
            self.stale = None
            return
        self.answer_fresh()

    def answer_fresh(self) -> None:
        self.generation += 1
        self.write(crl_on_disk(self.config))


def setup(tmp_path: Path) -> tuple[Config, CertificateAuthority, int | None]:
    config = Config(state_dir=tmp_path / "state", workers=2)
    ca = CertificateAuthority(PkiPaths(config.pki_dir))
    ca.create()
    return config, ca, crl_on_disk(config)


def ready_worker(config: Config, index: int, crl: int | None) -> tuple[_Worker, FakeWorker]:
    fake = FakeWorker(config, index, crl)
    return _Worker(index, process=fake, ready=True), fake  # type: ignore[arg-type]


def revoke_one(ca: CertificateAuthority) -> int:
    serial = ca.issue_client("web-01").certificate.serial_number
    ca.revoke(serial)
    return ca.confirm_revoked(serial)


@pytest.mark.trio
async def test_a_restarting_worker_is_waited_for_and_signalled(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config, ca, before = setup(tmp_path)
    running, running_fake = ready_worker(config, 0, before)
    restarting = _Worker(1)  # its process is down, to be started again
    required = revoke_one(ca)
    late: list[FakeWorker] = []

    async def restart_later() -> None:
        # It comes up after the revocation's signal, having read the files before it.
        await trio.sleep(RELOAD_WAIT_SECONDS / 2)
        fake = FakeWorker(config, 1, before)
        late.append(fake)
        restarting.process = fake  # type: ignore[assignment]
        restarting.ready = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_later)
        status = await _reload(config, [running, restarting], generation=1)
    assert status.ok, status.error
    assert status.crl_number == required
    assert running_fake.hups == 1
    assert late[0].hups == 1  # signalled once ready: it loads the new CRL too
    answer = read_status(config.worker_state_dir(1))
    assert answer is not None
    assert answer.crl_number == required


@pytest.mark.trio
async def test_a_worker_that_stays_down_fails_the_reload_by_name(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config, ca, before = setup(tmp_path)
    running, _ = ready_worker(config, 0, before)
    revoke_one(ca)
    status = await _reload(config, [running, _Worker(1)], generation=1)
    assert not status.ok
    assert status.error == (
        f"worker 1 (restarting) did not confirm the reload within {RELOAD_WAIT_SECONDS:g} s"
    )
    assert status.crl_number is None  # not every worker's: nothing is claimed


@pytest.mark.trio
async def test_an_answer_with_an_older_crl_is_not_taken_for_the_reload(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config, ca, before = setup(tmp_path)
    workers = [ready_worker(config, index, before) for index in range(2)]
    workers[1][1].stale = before  # answers first from a reload begun before the change
    required = revoke_one(ca)

    async def pending_signal() -> None:
        await trio.sleep(1)  # the SIGHUP that came during that reload brings the next
        workers[1][1].answer_fresh()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pending_signal)
        status = await _reload(config, [worker for worker, _ in workers], generation=1)
    assert status.ok, status.error
    assert status.crl_number == required
    answer = read_status(config.worker_state_dir(1))
    assert answer is not None
    assert answer.crl_number == required


@pytest.mark.trio
async def test_a_sighup_before_the_workers_are_ready_reloads_once_they_are(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``systemctl reload`` right after the start: kept for when every worker is ready."""
    send, signals = trio.open_memory_channel[int](10)
    ready = trio.Event()
    reloads: list[float] = []
    stops: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            _watch_signals, signals, ready, lambda: reloads.append(trio.current_time()),
            stops.append,
        )  # fmt: skip
        await send.send(signal.SIGHUP)
        await send.send(signal.SIGHUP)  # a second one meanwhile adds nothing
        await trio.sleep(5)
        assert reloads == []  # the workers are still starting
        ready.set()
        await trio.sleep(1)
        assert len(reloads) == 1
        await send.send(signal.SIGHUP)  # once ready, each signal is a reload
        await trio.sleep(1)
        assert len(reloads) == 2
        await send.send(signal.SIGTERM)
    assert stops == [signal.SIGTERM]


@pytest.mark.trio
async def test_a_stop_before_the_workers_are_ready_drops_a_waiting_reload(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, signals = trio.open_memory_channel[int](10)
    ready = trio.Event()
    reloads: list[int] = []
    stops: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, signals, ready, lambda: reloads.append(1), stops.append)
        await send.send(signal.SIGHUP)
        await send.send(signal.SIGINT)
    ready.set()
    await trio.sleep(1)
    assert (reloads, stops) == ([], [signal.SIGINT])
