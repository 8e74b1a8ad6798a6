"""Real storage faults for tests: a directory that refuses writes, a small filesystem that fills.

As root, permissions do not stop writes, so the directory is made immutable
with ``chattr +i`` (root cannot create files in it either). As another user,
``chmod 0555`` does the same. Where neither works (a filesystem without
immutable attributes, no chattr), the caller skips with the printed reason.

A disk that fills up for real is a small tmpfs (:func:`small_tmpfs`): mounting
one needs root; elsewhere the caller skips, saying why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _set(path: Path, read_only: bool) -> None:
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root and chattr is missing: cannot make a directory read-only")
        result = subprocess.run(
            ["chattr", "+i" if read_only else "-i", str(path)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"chattr cannot make {path} immutable here: {result.stderr.strip()}")
    else:
        path.chmod(0o555 if read_only else 0o755)


class ReadOnlyDir:
    """A directory that can be switched between refusing and accepting writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_only = False

    def break_(self) -> None:
        _set(self.path, True)
        self.read_only = True
        probe = self.path / ".probe"
        try:
            probe.write_text("x")
        except OSError:
            return
        probe.unlink()
        self.heal()
        pytest.skip(f"{self.path} still accepts writes after being made read-only")

    def heal(self) -> None:
        if self.read_only:
            _set(self.path, False)
            self.read_only = False


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[ReadOnlyDir]:
    """A :class:`ReadOnlyDir` for ``path`` that is always healed on exit."""
    fault = ReadOnlyDir(path)
    try:
        yield fault
    finally:
        fault.heal()


@contextlib.contextmanager
def small_tmpfs(mountpoint: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``mountpoint`` (created), lazily unmounted on exit.

    Skips the test, printing why, when it cannot be mounted (not root, no
    mount(8), a sandbox that refuses).
    """
    if os.geteuid() != 0 or shutil.which("mount") is None:
        reason = "mounting a tmpfs needs root and mount(8)"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
