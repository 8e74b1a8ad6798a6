"""Ask the running service to reload, and find out whether it did.

The service that holds ``<state_dir>``'s lock (:func:`appliance.state_lock.holder_pid`)
is the one to signal; a PID file another process could overwrite is not
trusted. The CLI reads the service's reload status
(:mod:`appliance.reload_status`), sends SIGHUP, and waits up to
:data:`RELOAD_CONFIRM_TIMEOUT_SECONDS` for a status with a newer generation
from that same process. Only that status lets a command say "reloaded".
A command that changed the CRL (``cert revoke``, ``cert crl``, ``cert import
--ca-cert``) also gives the CRL number it wrote: the status must report a
CRL at least that new (a supervisor reports the lowest of its workers'), or
the reload is not confirmed.

A service that holds the lock but has written no status yet is still
starting (or predates reload confirmation): it is not signalled until it
writes its first status, because SIGHUP would kill a process that has not
yet installed its handler.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from appliance.reload_status import ReloadStatus, read_status
from appliance.state_lock import holder_pid

__all__ = [
    "RELOAD_ADVICE",
    "RELOAD_CONFIRM_TIMEOUT_SECONDS",
    "RELOAD_POLL_SECONDS",
    "ReloadOutcome",
    "request_reload",
]

#: Seconds a command waits for the running service to confirm its reload.
RELOAD_CONFIRM_TIMEOUT_SECONDS: Final = 10.0
#: Seconds between two reads of the status file while waiting.
RELOAD_POLL_SECONDS: Final = 0.05
#: What an operator does when the reload cannot be confirmed.
RELOAD_ADVICE: Final = "run 'systemctl reload appliance' and check 'journalctl -u appliance'"

Outcome = Literal["not-running", "reloaded", "failed", "unconfirmed"]


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What became of a reload request."""

    outcome: Outcome
    #: The service's process id (None when none holds the state directory).
    pid: int | None
    #: One sentence for the operator.
    message: str
    #: The status that confirmed (or refused) the reload.
    status: ReloadStatus | None = None

    @property
    def confirmed(self) -> bool:
        """The running service reloaded and said it succeeded."""
        return self.outcome == "reloaded"


def _not_running(state_dir: Path) -> ReloadOutcome:
    return ReloadOutcome(
        "not-running",
        None,
        f"the service is not running (no process holds {state_dir.absolute()}); "
        "the change applies at its next start",
    )


def _reloaded(pid: int, status: ReloadStatus, crl_number: int | None) -> ReloadOutcome:
    if not status.ok:
        return ReloadOutcome(
            "failed",
            pid,
            f"the running service (pid {pid}) could not reload: {status.error or 'no reason given'}"
            f"; it keeps its previous settings: fix that, then {RELOAD_ADVICE}",
            status,
        )
    if crl_number is not None and status.crl_number is None:
        return ReloadOutcome(
            "unconfirmed",
            pid,
            f"the running service (pid {pid}) reloaded but reports no CRL of this CA in use "
            f"([tls] client_ca_file or crl_file set, or a version that does not say): "
            f"CRL number {crl_number} is not confirmed in force",
            status,
        )
    message = f"the running service (pid {pid}) reloaded"
    if status.applied:
        message += f" ({', '.join(status.applied)})"
    if crl_number is not None:
        message += f"; it checks CRL number {status.crl_number}"
    if status.restart_required:
        message += (
            f"; these changes need a restart to apply: {', '.join(status.restart_required)} "
            "('systemctl restart appliance')"
        )
    return ReloadOutcome("reloaded", pid, message, status)


def _confirms(status: ReloadStatus, crl_number: int | None) -> bool:
    """Whether ``status`` answers a reload that must bring CRL number ``crl_number`` or later.

    A reload that was under way before the change (it loaded an older CRL) does not:
    the signal sent after the change brings the next one.
    """
    if not status.ok or crl_number is None or status.crl_number is None:
        return True
    return status.crl_number >= crl_number


def request_reload(
    state_dir: Path,
    *,
    crl_number: int | None = None,
    timeout: float = RELOAD_CONFIRM_TIMEOUT_SECONDS,
    poll: float = RELOAD_POLL_SECONDS,
    holder: Callable[[Path], int | None] = holder_pid,
    read: Callable[[Path], ReloadStatus | None] = read_status,
    send: Callable[[int, int], None] = os.kill,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReloadOutcome:
    """Signal the service holding ``state_dir`` to reload and wait for its confirmation.

    ``crl_number``: the CRL the command wrote; the service must confirm it checks
    that one or a later one. The keyword arguments after ``poll`` are for tests (a
    fake clock, status, signal).
    """
    pid = holder(state_dir)
    if pid is None:
        return _not_running(state_dir)
    deadline = clock() + timeout

    def wait_for(accept: Callable[[ReloadStatus], bool]) -> ReloadStatus | None:
        while True:
            status = read(state_dir)
            if status is not None and status.pid == pid and accept(status):
                return status
            if clock() >= deadline:
                return None
            sleep(poll)

    before = wait_for(lambda status: True)
    if before is None:
        return ReloadOutcome(
            "unconfirmed",
            pid,
            f"the service (pid {pid}) holds {state_dir.absolute()} but has reported no reload "
            f"status within {timeout:g} s (still starting, or a version without reload "
            f"confirmation); it was not signalled: {RELOAD_ADVICE}",
        )
    try:
        send(pid, signal.SIGHUP)
    except ProcessLookupError:
        return _not_running(state_dir)
    except PermissionError:
        return ReloadOutcome(
            "unconfirmed",
            pid,
            f"not allowed to signal the service (pid {pid}): run this command as the "
            f"service's user or root, or {RELOAD_ADVICE}",
        )
    seen = before.generation
    after = wait_for(lambda status: status.generation > seen and _confirms(status, crl_number))
    if after is not None:
        return _reloaded(pid, after, crl_number)
    latest = read(state_dir)
    if (
        crl_number is not None
        and latest is not None
        and latest.pid == pid
        and latest.generation > seen
        and latest.crl_number is not None
    ):
        return ReloadOutcome(
            "unconfirmed",
            pid,
            f"the running service (pid {pid}) reloaded but still checks CRL number "
            f"{latest.crl_number}, not {crl_number} or later, after {timeout:g} s: "
            f"{RELOAD_ADVICE}",
            latest,
        )
    if holder(state_dir) != pid:
        return ReloadOutcome(
            "unconfirmed",
            pid,
            f"the service (pid {pid}) stopped before it confirmed the reload: check "
            "'journalctl -u appliance'; the change applies at its next start",
        )
    return ReloadOutcome(
        "unconfirmed",
        pid,
        f"the running service (pid {pid}) did not confirm a reload within {timeout:g} s: "
        f"{RELOAD_ADVICE}",
    )
