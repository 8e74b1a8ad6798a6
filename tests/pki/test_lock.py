"""The PKI lock: one change at a time across processes and threads, re-entrant, bounded wait."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pki.authority import CertificateAuthority, PkiPaths
from pki.errors import PkiError
from pki.lock import LOCK_FILE, PkiLockTimeout, pki_lock

#: A process that holds the lock of argv[1] until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
from pki.lock import pki_lock
with pki_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextmanager
def held_elsewhere(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds the PKI lock of ``directory`` for the block."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n"
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)


def test_another_process_waits_and_the_timeout_names_the_holder(tmp_path: Path) -> None:
    with (
        held_elsewhere(tmp_path) as holder,
        pytest.raises(PkiLockTimeout) as caught,
        pki_lock(tmp_path, wait=0.05),
    ):
        pytest.fail("the lock was taken while another process held it")
    assert caught.value.holder == holder.pid
    assert str(caught.value) == (
        f"the PKI is being changed by process {holder.pid} (lock {tmp_path / LOCK_FILE}): "
        "not released within 0.05 s; try again, and if that process hangs, stop it"
    )
    # Released when the holder ends: taken at once.
    with pki_lock(tmp_path, wait=0):
        pass


def test_a_change_waits_for_the_holder_and_then_runs(tmp_path: Path) -> None:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    serial = ca.issue_client("web-01").certificate.serial_number
    done = threading.Event()

    def revoke() -> None:
        ca.revoke(serial)
        done.set()

    with held_elsewhere(ca.paths.directory):
        worker = threading.Thread(target=revoke)
        worker.start()
        # Whatever the machine's speed: the revocation cannot happen while the lock is held.
        assert not done.wait(0.3)
        assert ca.inventory.get(serial).revoked_at is None
    worker.join(timeout=60)
    assert done.is_set()
    assert ca.confirm_revoked(serial) >= 1


def test_re_entrant_in_one_thread_exclusive_between_threads(tmp_path: Path) -> None:
    failures: list[BaseException] = []

    def other_thread() -> None:
        try:
            with pki_lock(tmp_path, wait=0.05):
                pass
        except PkiLockTimeout as exc:
            failures.append(exc)

    with pki_lock(tmp_path, wait=0), pki_lock(tmp_path, wait=0):  # nested: no self-deadlock
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=60)
    assert len(failures) == 1
    # Let go entirely after the outer block, also by another thread.
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(timeout=60)
    assert len(failures) == 1


def test_the_lock_file_is_never_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    pki = tmp_path / "pki"
    pki.mkdir()
    os.symlink(target, pki / LOCK_FILE)
    with (
        pytest.raises(PkiError, match="is a symbolic link: refusing to use it as the lock"),
        pki_lock(pki, wait=0),
    ):
        pass


def test_the_lock_file_is_shared_by_users_and_not_inherited(tmp_path: Path) -> None:
    with pki_lock(tmp_path, wait=0):
        mode = (tmp_path / LOCK_FILE).stat().st_mode & 0o777
        # Opened read-only: the service's user and root (the CLI) can both lock a
        # file either created; a spawned process (a worker) does not inherit it.
        assert mode & 0o044 == 0o044
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
        lock_fds = [
            fd
            for fd in fds
            if os.path.realpath(f"/proc/self/fd/{fd}") == str((tmp_path / LOCK_FILE).resolve())
        ]
        assert lock_fds
        assert all(not os.get_inheritable(fd) for fd in lock_fds)
