"""``cert revoke|rotate-server|crl|reload`` say only what they can confirm.

The polling is tested with a fake clock; the commands run as the real CLI
against ``fake_service.py``, which holds the state directory's lock and answers
SIGHUP with a reload status as the service does.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from appliance.commands.reload import (
    RELOAD_CONFIRM_TIMEOUT_SECONDS,
    ReloadOutcome,
    request_reload,
)
from appliance.reload_status import ReloadStatus
from tests.support.cli import run_cli

FAKE_SERVICE = Path(__file__).with_name("fake_service.py")
STATE = Path("/srv/appliance/var")
PID = 4242


class FakeWorld:
    """A clock, a status file and a service that answers signals, all in memory."""

    def __init__(self, status: ReloadStatus | None, answer: ReloadStatus | None) -> None:
        self.now = 0.0
        self.status = status
        self.answer = answer
        self.sent: list[tuple[int, int]] = []
        self.holder: int | None = PID
        self.send_error: OSError | None = None
        #: Seconds the fake service takes to answer a signal.
        self.delay = 0.5
        self._answer_at: float | None = None

    def read(self, state_dir: Path) -> ReloadStatus | None:
        assert state_dir == STATE
        if self._answer_at is not None and self.now >= self._answer_at:
            self.status = self.answer
        return self.status

    def send(self, pid: int, signum: int) -> None:
        if self.send_error is not None:
            raise self.send_error
        self.sent.append((pid, signum))
        if self.answer is not None:
            self._answer_at = self.now + self.delay

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def run(self, timeout: float = RELOAD_CONFIRM_TIMEOUT_SECONDS) -> ReloadOutcome:
        return request_reload(
            STATE,
            timeout=timeout,
            holder=lambda _: self.holder,
            read=self.read,
            send=self.send,
            clock=lambda: self.now,
            sleep=self.sleep,
        )


def started(generation: int = 0, pid: int = PID) -> ReloadStatus:
    return ReloadStatus(pid, generation, True)


def test_no_service_is_not_signalled() -> None:
    world = FakeWorld(started(), started(1))
    world.holder = None
    outcome = world.run()
    assert outcome.outcome == "not-running"
    assert "the service is not running" in outcome.message
    assert world.sent == []


def test_a_newer_generation_from_the_holder_confirms() -> None:
    world = FakeWorld(started(3), ReloadStatus(PID, 4, True, ["tls"]))
    outcome = world.run()
    assert world.sent == [(PID, signal.SIGHUP)]
    assert outcome.confirmed
    assert outcome.message == f"the running service (pid {PID}) reloaded (tls)"
    assert world.now < 1.0  # it stopped polling once confirmed


def test_restart_required_keys_are_named() -> None:
    answer = ReloadStatus(PID, 1, True, ["tls"], restart_required=["state_dir", "node_id"])
    outcome = FakeWorld(started(), answer).run()
    assert outcome.confirmed
    assert "need a restart to apply: state_dir, node_id" in outcome.message


def test_a_failed_reload_is_reported_with_its_error() -> None:
    answer = ReloadStatus(PID, 1, False, error="cannot read /x/server.pem")
    outcome = FakeWorld(started(), answer).run()
    assert outcome.outcome == "failed"
    assert "could not reload: cannot read /x/server.pem" in outcome.message
    assert "systemctl reload appliance" in outcome.message


def test_no_answer_within_the_timeout_is_unconfirmed() -> None:
    world = FakeWorld(started(2), None)
    outcome = world.run(timeout=10)
    assert world.sent == [(PID, signal.SIGHUP)]
    assert outcome.outcome == "unconfirmed"
    assert outcome.message == (
        f"the running service (pid {PID}) did not confirm a reload within 10 s: "
        "run 'systemctl reload appliance' and check 'journalctl -u appliance'"
    )
    assert 10 <= world.now < 10.2


def test_the_same_generation_or_another_pid_does_not_confirm() -> None:
    # A status rewritten by another process (say, a second start that failed)
    # with a higher generation is not this service's answer.
    world = FakeWorld(started(5), ReloadStatus(PID + 1, 9, True))
    assert world.run(timeout=2).outcome == "unconfirmed"


def test_a_service_without_a_status_is_not_signalled() -> None:
    # Still starting (SIGHUP could kill it before its handler is in place),
    # or a status left by an earlier process with another pid.
    for status in (None, started(7, pid=PID - 1)):
        world = FakeWorld(status, started(8))
        outcome = world.run(timeout=3)
        assert world.sent == []
        assert outcome.outcome == "unconfirmed"
        assert "has reported no reload status within 3 s" in outcome.message
        assert "was not signalled" in outcome.message


def test_a_service_that_writes_its_start_status_late_is_then_signalled() -> None:
    world = FakeWorld(None, started(1))
    real_sleep = world.sleep

    def sleep(seconds: float) -> None:
        real_sleep(seconds)
        if world.now >= 1.0 and world.status is None:
            world.status = started(0)

    world.sleep = sleep  # type: ignore[method-assign]
    outcome = world.run()
    assert outcome.confirmed
    assert world.sent == [(PID, signal.SIGHUP)]


def test_signal_errors() -> None:
    world = FakeWorld(started(), started(1))
    world.send_error = PermissionError()
    outcome = world.run()
    assert outcome.outcome == "unconfirmed"
    assert "not allowed to signal the service" in outcome.message
    world = FakeWorld(started(), started(1))
    world.send_error = ProcessLookupError()
    assert world.run().outcome == "not-running"


def test_a_service_that_stops_instead_of_answering() -> None:
    world = FakeWorld(started(), None)
    real_send = world.send

    def send(pid: int, signum: int) -> None:
        real_send(pid, signum)
        world.holder = None

    world.send = send  # type: ignore[method-assign]
    outcome = world.run(timeout=1)
    assert outcome.outcome == "unconfirmed"
    assert "stopped before it confirmed the reload" in outcome.message


def test_after_a_crl_change_the_service_must_check_that_crl_or_a_newer_one() -> None:
    answer = ReloadStatus(PID, 1, True, ["tls"], crl_number=7)
    world = FakeWorld(started(), answer)
    outcome = request_reload(
        STATE, crl_number=7, holder=lambda _: PID, read=world.read, send=world.send,
        clock=lambda: world.now, sleep=world.sleep,
    )  # fmt: skip
    assert outcome.confirmed
    assert (
        outcome.message == f"the running service (pid {PID}) reloaded (tls); it checks CRL number 7"
    )


def test_a_reload_that_loaded_an_older_crl_does_not_confirm_a_revocation() -> None:
    # A reload under way before the revocation (say, another SIGHUP) answers with
    # the CRL before it: not the answer; the one after it is.
    world = FakeWorld(started(), ReloadStatus(PID, 1, True, ["tls"], crl_number=6))
    real_read = world.read

    def read(state_dir: Path) -> ReloadStatus | None:
        status = real_read(state_dir)
        if world.now >= 2.0:
            return ReloadStatus(PID, 2, True, ["tls"], crl_number=7)
        return status

    def run(timeout: float) -> ReloadOutcome:
        return request_reload(
            STATE, crl_number=7, timeout=timeout, holder=lambda _: PID, read=read,
            send=world.send, clock=lambda: world.now, sleep=world.sleep,
        )  # fmt: skip

    stuck = run(timeout=1.5)
    assert stuck.outcome == "unconfirmed"
    assert stuck.message == (
        f"the running service (pid {PID}) reloaded but still checks CRL number 6, not 7 or "
        "later, after 1.5 s: run 'systemctl reload appliance' and check "
        "'journalctl -u appliance'"
    )
    world.now = 0.0
    outcome = run(timeout=10)
    assert outcome.confirmed
    assert outcome.status is not None
    assert outcome.status.crl_number == 7


def test_a_service_that_reports_no_crl_does_not_confirm_a_revocation() -> None:
    world = FakeWorld(started(), ReloadStatus(PID, 1, True, ["tls"]))
    outcome = request_reload(
        STATE, crl_number=3, holder=lambda _: PID, read=world.read, send=world.send,
        clock=lambda: world.now, sleep=world.sleep,
    )  # fmt: skip
    assert outcome.outcome == "unconfirmed"
    assert "reports no CRL of this CA in use" in outcome.message
    assert "CRL number 3 is not confirmed in force" in outcome.message


# -- the real CLI against a fake service ---------------------------------------------------


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Run:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')

    run: Run = functools.partial(run_cli, "cert", config=config)

    assert run("init").returncode == 0
    return run


@pytest.fixture
def fake_service(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(mode: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(FAKE_SERVICE), str(tmp_path / "state"), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        started.append(process)
        return process

    yield start
    for process in started:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=30)


def hups(tmp_path: Path) -> int:
    path = tmp_path / "state" / "hups"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_without_a_service_changes_apply_at_start_but_reload_fails(cli: Run, tmp_path) -> None:
    cli("issue-client", "web-01", "--out", str(tmp_path / "out"))
    revoked = cli("revoke", "web-01")
    assert revoked.returncode == 0, revoked.stderr
    assert (
        f"the service is not running (no process holds {tmp_path / 'state'}); "
        "the change applies at its next start"
    ) in revoked.stdout
    rotated = cli("rotate-server")
    assert rotated.returncode == 0, rotated.stderr
    assert "the service is not running" in rotated.stdout
    reloaded = cli("reload")
    assert reloaded.returncode == 1
    assert (
        f"appliance: no service holds the state directory {tmp_path / 'state'}: nothing to reload"
    ) in reloaded.stderr


def test_confirmed_reloads_name_the_service(cli: Run, fake_service, tmp_path: Path) -> None:
    service = fake_service("ok")
    cli("issue-client", "web-01", "--out", str(tmp_path / "out"))
    for args in (["revoke", "web-01"], ["rotate-server"], ["crl"], ["reload"]):
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        assert f"the running service (pid {service.pid}) reloaded (tls, config)" in result.stdout
    assert hups(tmp_path) == 4


def test_restart_required_is_said_but_the_reload_counts(cli: Run, fake_service) -> None:
    service = fake_service("restart")
    result = cli("reload")
    assert result.returncode == 0, result.stderr
    assert f"(pid {service.pid}) reloaded (tls); these changes need a restart" in result.stdout
    assert "listeners[0].bind" in result.stdout


def test_a_failed_reload_exits_1_with_the_error_and_what_to_do(
    cli: Run, fake_service, tmp_path: Path
) -> None:
    service = fake_service("fail")
    cli("issue-client", "web-01", "--out", str(tmp_path / "out"))
    result = cli("revoke", "web-01")
    assert result.returncode == 1
    assert "revoked" in result.stdout  # the change itself is made
    assert (
        f"appliance: the running service (pid {service.pid}) could not reload: "
        "cannot build the TLS context: bad key; it keeps its previous settings: fix that, "
        "then run 'systemctl reload appliance' and check 'journalctl -u appliance'"
    ) in result.stderr


def test_a_silent_service_is_not_reported_as_reloaded(
    cli: Run, fake_service, tmp_path: Path
) -> None:
    service = fake_service("silent")
    result = cli("rotate-server", "--reload-timeout", "0.5")
    assert result.returncode == 1
    assert "reloaded" not in result.stdout
    assert (
        f"appliance: the running service (pid {service.pid}) did not confirm a reload within "
        "0.5 s: run 'systemctl reload appliance' and check 'journalctl -u appliance'"
    ) in result.stderr
    assert hups(tmp_path) == 1


def test_a_service_without_status_is_left_alone(cli: Run, fake_service, tmp_path: Path) -> None:
    service = fake_service("nostatus")
    result = cli("reload", "--reload-timeout", "0.3")
    assert result.returncode == 1
    assert f"the service (pid {service.pid}) holds {tmp_path / 'state'}" in result.stderr
    assert "it was not signalled" in result.stderr
    assert hups(tmp_path) == 0
    assert service.poll() is None


def test_a_stale_pid_file_is_not_trusted(cli: Run, fake_service, tmp_path: Path) -> None:
    # The failure seen: a second process overwrote appliance.pid (and may have
    # removed it). The lock holder is who gets the signal.
    service = fake_service("ok")
    (tmp_path / "state" / "appliance.pid").write_text("1\n")
    result = cli("reload")
    assert result.returncode == 0, result.stderr
    assert f"(pid {service.pid}) reloaded" in result.stdout
    (tmp_path / "state" / "appliance.pid").unlink()
    assert cli("reload").returncode == 0
    assert hups(tmp_path) == 2


def test_revoke_confirms_the_serial_on_the_crl_the_service_checks(
    cli: Run, fake_service, tmp_path: Path
) -> None:
    service = fake_service("ok")
    cli("issue-client", "web-01", "--out", str(tmp_path / "out"))
    result = cli("revoke", "web-01")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("revoked ")
    number = int(lines[1].split()[2])
    assert lines[1] == f"CRL number {number} lists it: {tmp_path / 'state' / 'pki' / 'crl.pem'}"
    assert lines[2] == (
        f"the running service (pid {service.pid}) reloaded (tls, config); "
        f"it checks CRL number {number}"
    )


def test_a_service_that_keeps_its_old_crl_fails_the_revoke(
    cli: Run, fake_service, tmp_path: Path
) -> None:
    cli("issue-client", "web-01", "--out", str(tmp_path / "out"))
    service = fake_service("oldcrl")
    result = cli("revoke", "web-01", "--reload-timeout", "0.5")
    assert result.returncode == 1
    assert "revoked" in result.stdout  # on disk all the same
    assert (
        f"appliance: the running service (pid {service.pid}) reloaded but still checks CRL number"
    ) in result.stderr
