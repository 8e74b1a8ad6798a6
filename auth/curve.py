"""CURVE identities of Logjam producers, and the appliance's own CURVE keypair.

ZeroMQ has no TLS; the Logjam listener encrypts with CURVE instead, and a
client may connect only with a public key authorised here. The key's name
becomes the ``source`` of its events (docs/logjam.md).

* :class:`CurveKey` - a client public key (Z85) with its name, on the same
  declarative :class:`~auth.models.Base` as the other auth tables; created by
  Alembic revision ``0002``.
* :class:`CurveKeyStore` - ``appliance curve add|list|revoke`` and the look-up
  the ZAP handler makes at every CURVE handshake (read afresh each time, so a
  revocation applies to the next connection of a running service).
* :func:`ensure_server_keypair` - ``<state>/curve/server.key_secret`` (0600)
  and ``server.key`` (public), created on first use, in ZeroMQ's ZPL
  certificate format (``zmq.auth.load_certificate`` reads them).

Every method raises only :class:`auth.errors.AuthError` subclasses; no
message, log or audit entry ever holds a secret key.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import zmq
import zmq.auth
from sqlalchemy import String, select
from sqlalchemy.orm import Mapped, mapped_column
from zmq.utils import z85

from auth.errors import ConflictError, InvalidValueError
from auth.models import NAME_LENGTH, Base, UtcDateTime, utc_now
from auth.principals import check_principal_name
from auth.records import CurveKeyInfo
from auth.tablestore import TableStore

__all__ = [
    "Z85_KEY_LENGTH",
    "CurveKey",
    "CurveKeyStore",
    "ServerKeypair",
    "check_public_key",
    "ensure_server_keypair",
    "generate_keypair",
    "load_server_public_key",
    "server_key_paths",
]

#: A 32-byte CURVE key in Z85 text.
Z85_KEY_LENGTH: Final = 40
#: Where the server keypair lives, under the state directory.
CURVE_DIR: Final = "curve"
SERVER_PUBLIC_FILE: Final = "server.key"
SERVER_SECRET_FILE: Final = "server.key_secret"  # noqa: S105 -- a file name
_Z85_ALPHABET: Final = frozenset(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


class CurveKey(Base):
    """A client's CURVE public key, authorised under a unique name until revoked."""

    __tablename__ = "curve_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    #: Z85 text of the 32-byte public key; one name per key.
    public_key: Mapped[str] = mapped_column(String(Z85_KEY_LENGTH), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    #: Set by ``appliance curve revoke``; a revoked key is refused at the next handshake.
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


def _info(key: CurveKey) -> CurveKeyInfo:
    return CurveKeyInfo(key.name, key.public_key, key.created_at, key.revoked_at)


def check_public_key(text: str) -> str:
    """A Z85 CURVE public key, as given (40 characters of the Z85 alphabet).

    Raises:
        InvalidValueError: not a Z85 key (the message does not repeat it).
    """
    key = text.strip()
    if len(key) != Z85_KEY_LENGTH or not set(key) <= _Z85_ALPHABET:
        raise InvalidValueError(
            f"a CURVE public key is {Z85_KEY_LENGTH} characters of Z85 text "
            "(as zmq.curve_keypair() or curve_keygen print it)"
        )
    try:
        z85.decode(key)
    except ValueError:
        raise InvalidValueError("the CURVE public key is not valid Z85") from None
    return key


def generate_keypair() -> tuple[str, str]:
    """A new CURVE keypair as Z85 text: (public, secret)."""
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


class CurveKeyStore(TableStore):
    """The ``curve_keys`` table of the auth database.

    Args:
        url: SQLAlchemy URL of the auth database (schema at head: see
            :func:`auth.schema.prepare`).
        pool_size: connections kept open.
    """

    def add(self, name: str, public_key: str, *, actor: str) -> CurveKeyInfo:
        """Authorise ``public_key`` under ``name``.

        Raises:
            InvalidValueError: a bad name or key.
            ConflictError: the name or the key is already there (revoked ones too).
        """
        name = check_principal_name("CURVE key", name)
        key = check_public_key(public_key)
        with self._write() as session:
            taken = session.scalar(
                select(CurveKey).where((CurveKey.name == name) | (CurveKey.public_key == key))
            )
            if taken is not None:
                what = "name" if taken.name == name else "public key"
                raise ConflictError(
                    f"the {what} is already registered as CURVE key {taken.name!r} "
                    f"({'revoked' if taken.revoked_at else 'active'})"
                )
            row = CurveKey(name=name, public_key=key, created_at=utc_now())
            session.add(row)
            self._audit(session, "curve.add", name, actor=actor, detail=f"public key {key}")
            session.flush()
            return _info(row)

    def list(self) -> list[CurveKeyInfo]:
        """Every key, active and revoked, by name."""
        return self._all_by_name(CurveKey, CurveKey.name, _info)

    def revoke(self, name: str, *, actor: str) -> CurveKeyInfo:
        """Refuse ``name``'s key from the next handshake on.

        Raises:
            NotFoundError: no such key.
            ConflictError: it is revoked already.
        """
        return self._revoke_named(
            CurveKey,
            CurveKey.name,
            name,
            _info,
            what="CURVE key",
            action="curve.revoke",
            actor=actor,
        )

    def active_name(self, public_key: str) -> str | None:
        """The name of the active key ``public_key`` (Z85), or None: the ZAP handler's question."""
        with self._read() as session:
            return session.scalar(
                select(CurveKey.name).where(
                    CurveKey.public_key == public_key, CurveKey.revoked_at.is_(None)
                )
            )


# -- the server keypair ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerKeypair:
    """The appliance's CURVE keypair (Z85 bytes, as pyzmq's socket options take them)."""

    public: bytes
    secret: bytes
    public_file: Path
    secret_file: Path


def server_key_paths(state_dir: Path) -> tuple[Path, Path]:
    """(public, secret) key file paths under ``state_dir``."""
    base = state_dir / CURVE_DIR
    return base / SERVER_PUBLIC_FILE, base / SERVER_SECRET_FILE


def _zpl(public: str, secret: str | None) -> str:
    """A ZPL certificate, as zmq.auth.create_certificates writes one."""
    lines = [
        "#   ****  Generated by the appliance  ****",
        "#   ZeroMQ CURVE " + ("**Secret** Certificate" if secret else "Public Certificate"),
        "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions."
        if secret
        else "#   Clients need the public-key below as their server key.",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public}"',
    ]
    if secret:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(text)


def ensure_server_keypair(state_dir: Path) -> ServerKeypair:
    """Load the server keypair, creating it (secret 0600, directory 0700) on first use.

    Raises:
        OSError: the files cannot be read or written.
        ValueError: an existing file holds no valid keypair.
    """
    public_file, secret_file = server_key_paths(state_dir)
    public_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not secret_file.exists():
        public, secret = generate_keypair()
        public_file.unlink(missing_ok=True)
        _write_new(secret_file, _zpl(public, secret), 0o600)
        _write_new(public_file, _zpl(public, None), 0o644)
    elif not public_file.exists():
        loaded_public, _ = zmq.auth.load_certificate(secret_file)
        _write_new(public_file, _zpl(loaded_public.decode("ascii"), None), 0o644)
    public_key, secret_key = zmq.auth.load_certificate(secret_file)
    if secret_key is None or len(public_key) != Z85_KEY_LENGTH:
        raise ValueError(f"{secret_file} holds no CURVE secret key")
    return ServerKeypair(public_key, secret_key, public_file, secret_file)


def load_server_public_key(state_dir: Path) -> str | None:
    """The server's public key (Z85), or None before the keypair exists."""
    public_file, _ = server_key_paths(state_dir)
    if not public_file.exists():
        return None
    public, _ = zmq.auth.load_certificate(public_file)
    return public.decode("ascii")
