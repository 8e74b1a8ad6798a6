"""One PKI change at a time: an exclusive ``flock`` on ``<pki_dir>/.lock``.

The CLI (any number of ``appliance cert ...`` at once) and the service (its
CRL re-sign) read ``index.json`` and the CRL, change them and write them
back. Two such changes that interleave lose whatever the first one added:
a revocation missing from the CRL, an issued certificate missing from the
index. So every read-modify-write of the index, every CRL signature and
every change of the CA or the server credentials holds this lock. Reading
alone (``cert list``, a TLS reload) does not: every file is replaced
atomically (:mod:`pki.files`), so a reader sees a whole old or a whole new
file.

The lock is re-entrant within a thread (``revoke`` holds it across the index
change and the CRL it signs) and its wait is bounded: a change that cannot
have it within :data:`PKI_LOCK_WAIT_SECONDS` fails with
:class:`PkiLockTimeout`, which names the process that holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from pki.errors import PkiError

__all__ = [
    "LOCK_FILE",
    "PKI_LOCK_POLL_SECONDS",
    "PKI_LOCK_WAIT_SECONDS",
    "PkiLockTimeout",
    "pki_lock",
]

#: The lock file's name inside the PKI directory.
LOCK_FILE: Final = ".lock"
#: Longest a change waits for another to finish, in seconds. A change holds the
#: lock for a signature and a few small file writes (milliseconds); only a
#: process that hangs while holding it (stopped, or on a dead disk) makes the
#: next one wait this long, and then it fails rather than waiting for ever.
PKI_LOCK_WAIT_SECONDS: Final = 10.0
#: Seconds between two tries while another process holds the lock (flock has no
#: timeout of its own).
PKI_LOCK_POLL_SECONDS: Final = 0.005
#: Where Linux lists the file locks held, and by which process (for the timeout's message).
_PROC_LOCKS: Final = Path("/proc/locks")

# Locks this thread holds, by the lock file's (device, inode): how deeply nested.
_held = threading.local()


class PkiLockTimeout(PkiError):
    """Another process held the PKI lock for longer than the wait."""

    def __init__(self, path: Path, waited: float, holder: int | None) -> None:
        who = f"process {holder}" if holder is not None else "another process"
        super().__init__(
            f"the PKI is being changed by {who} (lock {path}): not released within "
            f"{waited:g} s; try again, and if that process hangs, stop it"
        )
        self.path = path
        self.holder = holder


def _holder(fd: int) -> int | None:
    """The process holding the flock on ``fd``'s file, from /proc/locks (None: unknown)."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = _PROC_LOCKS.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def _table() -> dict[tuple[int, int], int]:
    table: dict[tuple[int, int], int] | None = getattr(_held, "locks", None)
    if table is None:
        table = {}
        _held.locks = table
    return table


@contextmanager
def pki_lock(directory: Path, *, wait: float = PKI_LOCK_WAIT_SECONDS) -> Iterator[None]:
    """Hold the PKI lock of ``directory`` for the block (created, mode 0750, if missing).

    Raises:
        PkiLockTimeout: another process held it for ``wait`` seconds.
        PkiError: the lock file is a symbolic link.
        OSError: the directory or the lock file cannot be created or opened.
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o750)
    path = directory / LOCK_FILE
    try:
        # Read-only is enough for flock, and lets the service's user and root (the
        # CLI) share a lock file that either created. Never through a symlink.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PkiError(f"{path} is a symbolic link: refusing to use it as the lock") from None
        raise
    info = os.fstat(fd)
    if info.st_uid == os.geteuid() and info.st_mode & 0o044 != 0o044:
        # Readable by the service's user and root alike, whatever umask created it.
        os.fchmod(fd, 0o644)
    key = (info.st_dev, info.st_ino)
    table = _table()
    if key in table:
        # Already held by this thread (an outer change): one more level, no new flock
        # (a second flock from this process on another descriptor would wait for itself).
        os.close(fd)
        table[key] += 1
        try:
            yield
        finally:
            table[key] -= 1
        return
    acquired = False
    try:
        _acquire(fd, path, wait)
        acquired = True
    finally:
        if not acquired:
            os.close(fd)
    table[key] = 1
    try:
        yield
    finally:
        del table[key]
        os.close(fd)  # closing the descriptor drops the flock


def _acquire(fd: int, path: Path, wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PkiLockTimeout(path, wait, _holder(fd)) from None
            time.sleep(PKI_LOCK_POLL_SECONDS)
