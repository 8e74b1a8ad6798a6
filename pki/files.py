"""Writing PEM files with the right modes: private keys 0600, never world-readable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private", "write_public"]


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    tmp = path.with_name(path.name + ".tmp")
    # O_EXCL|mode at creation: the key is never readable by others, not even
    # for the moment between open and chmod.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_private(path: Path, data: bytes) -> None:
    """Write a private key (or any secret) with mode 0600, atomically."""
    _write(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    """Write a certificate or CRL with mode 0644, atomically."""
    _write(path, data, 0o644)
