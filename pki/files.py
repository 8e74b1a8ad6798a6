"""Writing and reading the PKI's files: atomically, with the right modes, never through a symlink.

A write goes to a new temporary file in the target's directory, under a
name no other writer uses (so two processes writing the same file never
write into one temporary file), created with ``O_EXCL`` (a new file, never
one that was there) and ``O_NOFOLLOW`` (never a symlink someone planted in
the directory), with its final mode from the start (a key is never readable
by others, not even for a moment). It is fsynced, renamed over the target
(readers see the old file or the new one, whole) and the directory is
fsynced, so the new file survives a crash. A target that is a symbolic link
is refused, not replaced: a link there is someone's mistake or someone's
attack, and either way the operator should see it.

Private keys are read with ``O_NOFOLLOW`` too (:func:`read_private`).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from pki.errors import PkiError

__all__ = ["read_private", "write_private", "write_public"]

#: Random bytes in a temporary file's name: unique among concurrent writers.
_TMP_NAME_BYTES: Final = 8


def _refuse_symlink(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise PkiError(f"{path} is a symbolic link: refusing to replace it")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes, mode: int) -> None:
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o750)
    _refuse_symlink(path)
    tmp = directory / f".{path.name}.{secrets.token_hex(_TMP_NAME_BYTES)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    replaced = False
    try:
        try:
            os.fchmod(fd, mode)  # the mode exactly, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        replaced = True
    finally:
        if not replaced:
            tmp.unlink(missing_ok=True)
    _fsync_directory(directory)


def write_private(path: Path, data: bytes) -> None:
    """Write a private key (or any secret) with mode 0600, atomically.

    Raises:
        PkiError: ``path`` is a symbolic link.
        OSError: the file cannot be written.
    """
    _write(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    """Write a certificate, CRL or the index with mode 0644, atomically.

    Raises:
        PkiError: ``path`` is a symbolic link.
        OSError: the file cannot be written.
    """
    _write(path, data, 0o644)


def read_private(path: Path) -> bytes:
    """The bytes of a private key file, refusing a symbolic link.

    Raises:
        PkiError: ``path`` is a symbolic link.
        OSError: it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PkiError(
                f"{path} is a symbolic link: refusing to read a key through it"
            ) from None
        raise
    with os.fdopen(fd, "rb") as file:
        return file.read()
