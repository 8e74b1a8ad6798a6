"""What the stores of forward credentials share: the vault that seals secrets, and rows by name.

Users, shared keys and client networks (:mod:`auth.users`,
:mod:`auth.keys`, :mod:`auth.networks`) are separate responsibilities over
tables that refer to each other; :class:`CredentialTables` is their common
base (and :class:`auth.store.SqlCredentialStore` combines them). A write
that stores a secret holds the vault's shared lock, so a rotation of the key
file never interleaves with it.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, selectinload

from auth.errors import InvalidValueError, NotFoundError
from auth.models import ClientNetwork, SharedKey, User
from auth.tablestore import TableStore
from auth.vault import SecretVault

__all__ = [
    "KIND_KEY",
    "KIND_USER",
    "MAX_SECRET_BYTES",
    "CredentialTables",
    "check_secret",
    "parse_cidr",
]

#: Longest password or shared key accepted, in bytes.
MAX_SECRET_BYTES: Final = 1024
#: Associated-data kinds of the sealed secrets (a ciphertext opens only as its own kind).
KIND_USER: Final = "user"
KIND_KEY: Final = "shared-key"
#: Bytes of the stand-in password opened for a user that has none: about a typical password's.
DECOY_PASSWORD_BYTES: Final = 32


def check_secret(what: str, secret: bytes) -> bytes:
    """``secret`` as given, if it is an acceptable ``what`` (password, shared key).

    Raises:
        InvalidValueError: empty or longer than :data:`MAX_SECRET_BYTES` (never repeated).
    """
    if not secret:
        raise InvalidValueError(f"the {what} is empty")
    if len(secret) > MAX_SECRET_BYTES:
        raise InvalidValueError(f"the {what} is longer than {MAX_SECRET_BYTES} bytes")
    return secret


def parse_cidr(text: str) -> str:
    """The normalized CIDR of a network (``10.1.0.0/16``; a bare address is a /32 or /128).

    Raises:
        InvalidValueError: not a network, or host bits set (``10.1.2.3/16``).
    """
    try:
        return str(ipaddress.ip_network(text.strip(), strict=True))
    except ValueError as exc:
        raise InvalidValueError(f"{text!r} is not a network in CIDR notation: {exc}") from None


class CredentialTables(TableStore):
    """Users, shared keys and client networks, their secrets sealed by a key file.

    Args:
        engine: the process's engine on the auth database.
        secret_key_file: the key file that seals passwords and shared keys
            (created 0600 when the first secret is stored).
    """

    def __init__(self, engine: Engine, secret_key_file: Path) -> None:
        super().__init__(engine)
        self.vault = SecretVault(secret_key_file)
        # A stand-in sealed under a key of its own, opened for a user that
        # has no password to open: as long as opening a real one.
        self._decoy_key = AESGCM.generate_key(256)
        self._decoy_nonce = os.urandom(12)
        self._decoy_sealed = AESGCM(self._decoy_key).encrypt(
            self._decoy_nonce, bytes(DECOY_PASSWORD_BYTES), KIND_USER.encode()
        )

    def _open_decoy(self) -> None:
        """Spend on an unknown or disabled user what opening a password costs.

        Whether a username exists must not show in the time a handshake
        takes; the look-up itself is the same query either way.
        """
        AESGCM(self._decoy_key).decrypt(self._decoy_nonce, self._decoy_sealed, KIND_USER.encode())

    @contextmanager
    def _write(self, *, seals: bool = False) -> Iterator[Session]:
        """One write transaction; ``seals``: it stores secrets (holds off a key rotation)."""
        with self._errors():
            if seals:
                with self.vault.lock(exclusive=False), self._write_session() as session:
                    yield session
            else:
                with self._write_session() as session:
                    yield session

    # -- rows by name ------------------------------------------------------------------

    @staticmethod
    def _user(session: Session, name: str) -> User:
        user = session.scalar(
            select(User).where(User.name == name).options(selectinload(User.networks))
        )
        if user is None:
            raise NotFoundError(f"no user named {name!r}")
        return user

    @staticmethod
    def _key(session: Session, name: str) -> SharedKey:
        key = session.scalar(
            select(SharedKey).where(SharedKey.name == name).options(selectinload(SharedKey.network))
        )
        if key is None:
            raise NotFoundError(f"no shared key named {name!r}")
        return key

    @staticmethod
    def _network(session: Session, cidr: str) -> ClientNetwork:
        normalized = parse_cidr(cidr)
        network = session.scalar(
            select(ClientNetwork)
            .where(ClientNetwork.cidr == normalized)
            .options(selectinload(ClientNetwork.users), selectinload(ClientNetwork.keys))
        )
        if network is None:
            raise NotFoundError(f"no client network {normalized}")
        return network
