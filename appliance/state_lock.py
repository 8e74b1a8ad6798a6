"""One process per state directory: an exclusive ``flock`` on ``<state_dir>/appliance.lock``.

Two services on one state directory would share one node id, so one Delta
app id, and each would take the other's commits for its own (acked data
lost). The lock is taken at start and held for the process's life
(the kernel drops it when the process dies, even by SIGKILL). Only the lock
holder writes and removes ``appliance.pid``, so the CLI's reload signal
always reaches the running service.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Final

__all__ = ["LOCK_FILE", "PID_FILE", "StateLock", "StateLocked", "held_state_dirs", "holder_pid"]

LOCK_FILE: Final = "appliance.lock"
PID_FILE: Final = "appliance.pid"
#: Tries, and seconds between them, before a start gives up on the lock: a
#: CLI's :func:`holder_pid` probe holds it for an instant.
_LOCK_TRIES: Final = 10
_LOCK_RETRY_SECONDS: Final = 0.05

#: The state directories (absolute) whose lock this process holds, in the order taken.
_held: list[Path] = []


class StateLocked(Exception):
    """Another process holds the state directory."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"state directory {state_dir} is in use by {who} (lock {state_dir / LOCK_FILE}); "
            "one appliance per state directory: stop it, or give this one its own state_dir"
        )
        self.state_dir = state_dir
        self.pid = pid


def _read_pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / LOCK_FILE).read_text(encoding="ascii").strip() or "x")
    except (OSError, ValueError):
        return None


class StateLock:
    """The held lock; :meth:`release` (or process exit) gives it back."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        path = state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        for attempt in range(_LOCK_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 == _LOCK_TRIES:
                    os.close(fd)
                    raise StateLocked(state_dir, _read_pid(state_dir)) from None
                time.sleep(_LOCK_RETRY_SECONDS)
        # The lock file names its holder too, for the message of a second start.
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd: int | None = fd
        self._held = state_dir.resolve()
        _held.append(self._held)

    def write_pid_file(self) -> None:
        """Write ``appliance.pid`` (only the lock holder does)."""
        (self.state_dir / PID_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")

    def release(self) -> None:
        """Remove the pid file and give the lock back."""
        if self._fd is None:
            return
        pid_path = self.state_dir / PID_FILE
        try:
            if pid_path.read_text(encoding="ascii").strip() == str(os.getpid()):
                pid_path.unlink()
        except OSError:
            pass
        fd, self._fd = self._fd, None
        _held.remove(self._held)
        os.close(fd)  # closing the descriptor drops the flock


def held_state_dirs() -> tuple[Path, ...]:
    """The state directories (absolute) whose lock this process holds now."""
    return tuple(_held)


def holder_pid(state_dir: Path) -> int | None:
    """The pid of the service holding ``state_dir``, or None when no service holds it."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(state_dir)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
