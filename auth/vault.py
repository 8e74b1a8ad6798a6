"""Encryption of the secrets the forward handshake needs in clear (docs/auth.md).

The handshake digests are computed from the raw shared key and password, so
the database cannot keep only a hash: it keeps each secret sealed with
AES-256-GCM under a key that lives outside the database, in a 0600 file
(default ``<state_dir>/auth/secret.key``, created on first use).

A sealed secret is ``version (1) | key id (8) | nonce (12) | ciphertext+tag``.
The associated data binds it to its header and to its row (kind and name), so
a ciphertext copied onto another user or key fails authentication instead of
granting that secret to someone else. The key id (a truncated SHA-256 of the
key) says which key sealed it: during a rotation of the key file
(:meth:`SecretVault.stage_new_key`) the previous key stays in
``secret.key.old`` and secrets under either key open, so every ciphertext in
the database stays readable at every instant (docs/auth.md, "Crash safety").
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from auth.errors import SecretKeyError
from pki.files import write_private

__all__ = ["KEY_ID_BYTES", "SecretVault", "key_id_of"]

#: Format byte of a sealed secret.
_VERSION: Final = 1
#: Bytes of the key id in a sealed secret.
KEY_ID_BYTES: Final = 8
#: Bytes of the AES-GCM nonce (random per seal: 2**-32 collision odds after 2**32 seals).
_NONCE_BYTES: Final = 12
_HEADER_BYTES: Final = 1 + KEY_ID_BYTES + _NONCE_BYTES
#: AES-256.
_KEY_BITS: Final = 256
_AAD_PREFIX: Final = b"appliance-auth-secret\x00"
_KEY_ID_PREFIX: Final = b"appliance-auth-key-id\x00"


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(_KEY_ID_PREFIX + key).digest()[:KEY_ID_BYTES]


def key_id_of(sealed: bytes) -> bytes:
    """The id of the key that sealed ``sealed`` (empty when it is not a sealed secret)."""
    if len(sealed) < _HEADER_BYTES or sealed[0] != _VERSION:
        return b""
    return sealed[1 : 1 + KEY_ID_BYTES]


def _aad(header: bytes, kind: str, name: str) -> bytes:
    return b"".join([_AAD_PREFIX, header, b"\x00", kind.encode(), b"\x00", name.encode()])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SecretVault:
    """Seals and opens secrets with the key file at ``path`` (and ``path.old`` mid-rotation).

    Thread-safe for :meth:`open` (the forward session calls it from worker
    threads). Keys are cached and re-read when a sealed secret names a key id
    the cache does not hold, so a rotation made by the CLI applies to a
    running service without a restart.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._keys: dict[bytes, bytes] = {}

    @property
    def old_path(self) -> Path:
        """Where the previous key waits while a rotation is under way."""
        return self.path.with_name(self.path.name + ".old")

    @property
    def lock_path(self) -> Path:
        """The lock file that serializes rotations against writers of secrets."""
        return self.path.with_name(self.path.name + ".lock")

    # -- key files ---------------------------------------------------------------

    def _read_key(self, path: Path) -> bytes | None:
        try:
            info = path.stat()
        except FileNotFoundError:
            return None
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise SecretKeyError(
                f"{path} is accessible by others (mode {mode:04o}): run 'chmod 600 {path}'"
            )
        text = path.read_bytes().strip()
        try:
            key = base64.b64decode(text, validate=True)
        except binascii.Error:
            key = b""
        if len(key) != _KEY_BITS // 8:
            raise SecretKeyError(f"{path} is not an appliance secret key file")
        return key

    def _write_key(self, path: Path, key: bytes) -> None:
        write_private(path, base64.b64encode(key) + b"\n")
        _fsync_dir(path.parent)

    def _reload(self) -> dict[bytes, bytes]:
        keys: dict[bytes, bytes] = {}
        for path in (self.old_path, self.path):
            key = self._read_key(path)
            if key is not None:
                keys[_key_id(key)] = key
        self._keys = keys
        return keys

    def _current_key(self, create: bool) -> bytes:
        key = self._read_key(self.path)
        if key is None:
            if not create:
                raise SecretKeyError(
                    f"secret key file {self.path} is missing: the secrets in the auth "
                    "database cannot be opened without it (restore it from a backup)"
                )
            self._create_key()
            key = self._read_key(self.path)
            assert key is not None
        return key

    def _create_key(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staged = self.path.with_name(f"{self.path.name}.{os.getpid()}.new")
        write_private(staged, base64.b64encode(AESGCM.generate_key(_KEY_BITS)) + b"\n")
        try:
            # link() never replaces: when two processes create the key at
            # once, the first one wins and both use its key.
            os.link(staged, self.path)
        except FileExistsError:
            pass
        finally:
            staged.unlink()
        _fsync_dir(self.path.parent)

    def ensure_key(self) -> str:
        """Create the key file if it is missing; returns the current key id (hex)."""
        return _key_id(self._current_key(create=True)).hex()

    def current_key_id(self) -> bytes:
        """The id of the key in ``path`` (raises when the file is missing)."""
        return _key_id(self._current_key(create=False))

    # -- sealing -------------------------------------------------------------------

    def seal(self, kind: str, name: str, plaintext: bytes) -> bytes:
        """Encrypt a secret of row ``kind``/``name`` under the current key (created if missing)."""
        key = self._current_key(create=True)
        nonce = os.urandom(_NONCE_BYTES)
        header = bytes([_VERSION]) + _key_id(key) + nonce
        return header + AESGCM(key).encrypt(nonce, plaintext, _aad(header, kind, name))

    def open(self, kind: str, name: str, sealed: bytes) -> bytes:
        """Decrypt the secret of row ``kind``/``name``.

        Raises:
            SecretKeyError: no key file holds its key, or it fails authentication
                (tampered, or copied from another row).
        """
        key_id = key_id_of(sealed)
        if not key_id:
            raise SecretKeyError(f"the stored secret of {kind} {name!r} is not a sealed secret")
        key = self._keys.get(key_id) or self._reload().get(key_id)
        if key is None:
            if not self.path.exists():
                self._current_key(create=False)  # raises: the file is missing
            raise SecretKeyError(
                f"the secret of {kind} {name!r} was sealed with key {key_id.hex()}, which "
                f"neither {self.path} nor {self.old_path} holds"
            )
        header = sealed[:_HEADER_BYTES]
        try:
            return AESGCM(key).decrypt(
                header[1 + KEY_ID_BYTES :], sealed[_HEADER_BYTES:], _aad(header, kind, name)
            )
        except InvalidTag:
            raise SecretKeyError(
                f"the stored secret of {kind} {name!r} fails authentication (tampered with?)"
            ) from None

    # -- rotation ------------------------------------------------------------------

    @contextmanager
    def lock(self, *, exclusive: bool) -> Iterator[None]:
        """Hold the rotation lock: shared to write secrets, exclusive to rotate the key."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    @property
    def rotation_pending(self) -> bool:
        """True while ``secret.key.old`` exists: a rotation is under way or was interrupted."""
        return self.old_path.exists()

    def stage_new_key(self) -> bytes:
        """Keep the current key as ``.old`` and put a new key in place; returns its id.

        Call with the exclusive lock held. From here until :meth:`drop_old_key`
        secrets sealed under either key open.
        """
        current = self._current_key(create=False)
        self._write_key(self.old_path, current)
        new = AESGCM.generate_key(_KEY_BITS)
        self._write_key(self.path, new)
        self._reload()
        return _key_id(new)

    def drop_old_key(self) -> None:
        """Delete ``.old`` once no secret in the database is sealed under it."""
        self.old_path.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)
        self._reload()
