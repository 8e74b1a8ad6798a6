"""The forward protocol's handshake (spec "Handshake Messages"): HELO, PING, PONG.

Pure functions and values, no I/O and no randomness: the driver supplies the
nonce and the auth salt (16 random bytes each, DESIGN §4) and the secrets
looked up for the peer. Digests (spec "PING", "PONG"):

* PING: ``sha512_hex(shared_key_salt + client_hostname + nonce + shared_key)``
* PONG: ``sha512_hex(shared_key_salt + server_hostname + nonce + shared_key)``
* password: ``sha512_hex(auth_salt + username + raw_password)``

Every comparison of a digest uses :func:`hmac.compare_digest`; an empty or
short digest simply fails to match. A failed PING is answered with
``["PONG", false, reason, "", ""]`` (what in_forward sends) and the
connection closes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

__all__ = [
    "AUTH_SALT_BYTES",
    "NONCE_BYTES",
    "REASON_INVALID_PING",
    "REASON_SHARED_KEY",
    "REASON_USER",
    "Helo",
    "Ping",
    "Verdict",
    "anonymous_denied_reason",
    "password_digest",
    "ping_digest",
    "pong_bytes",
    "refusal_bytes",
    "verify_ping",
]

#: Bytes of the server's nonce and of the user-auth salt in HELO.
NONCE_BYTES: Final = 16
AUTH_SALT_BYTES: Final = 16

REASON_INVALID_PING: Final = "invalid ping message"
REASON_SHARED_KEY: Final = "shared_key mismatch"
REASON_USER: Final = "username/password mismatch"


def anonymous_denied_reason(address: str) -> str:
    """The PONG reason for a source outside every client network (in_forward's words)."""
    return f"anonymous source host '{address}' denied"


def _bytes(value: str | bytes) -> bytes:
    # A str that came off the wire may carry surrogate escapes (non-UTF-8 bytes).
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def _sha512_hex(*parts: bytes) -> str:
    digest = hashlib.sha512()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def ping_digest(salt: bytes, hostname: str, nonce: bytes, shared_key: bytes) -> str:
    """The PING's shared-key digest (and, with the server's hostname, the PONG's)."""
    return _sha512_hex(salt, _bytes(hostname), nonce, shared_key)


def password_digest(auth_salt: bytes, username: str, password: bytes) -> str:
    """The PING's password digest."""
    return _sha512_hex(auth_salt, _bytes(username), password)


def _matches(expected_hex: str, received: bytes) -> bool:
    return hmac.compare_digest(expected_hex.encode("ascii"), received)


@dataclass(frozen=True, slots=True)
class Helo:
    """The server's HELO: the nonce, the user-auth salt (empty: no users), keepalive."""

    nonce: bytes
    auth_salt: bytes = b""
    keepalive: bool = True

    def to_bytes(self) -> bytes:
        """``["HELO", {"nonce": bin, "auth": bin, "keepalive": bool}]``."""
        options = {"nonce": self.nonce, "auth": self.auth_salt, "keepalive": self.keepalive}
        packed: bytes = msgpack.packb(["HELO", options], use_bin_type=True)
        return packed


@dataclass(frozen=True, slots=True)
class Ping:
    """A client's PING, as received (secrets are digests only)."""

    client_hostname: str
    shared_key_salt: bytes
    shared_key_hexdigest: bytes
    username: str
    password_digest: bytes

    @classmethod
    def parse(cls, message: Any) -> Ping | None:
        """The PING in a decoded request, or None when it is not a well-formed PING."""
        if type(message) is not list or len(message) != 6 or message[0] != "PING":
            return None
        _, hostname, salt, digest, username, password = message
        if not all(
            isinstance(v, str | bytes) for v in (hostname, salt, digest, username, password)
        ):
            return None
        return cls(
            client_hostname=_bytes(hostname).decode("utf-8", "replace"),
            shared_key_salt=_bytes(salt),
            shared_key_hexdigest=_bytes(digest),
            username=_bytes(username).decode("utf-8", "replace"),
            password_digest=_bytes(password),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking a PING."""

    ok: bool
    reason: str = ""
    #: The shared key the PING matched (signs the PONG).
    shared_key: bytes | None = None
    #: The authenticated username, when users are checked.
    username: str | None = None


def verify_ping(
    ping: Ping,
    *,
    nonce: bytes,
    auth_salt: bytes,
    shared_keys: Sequence[bytes],
    users_required: bool,
    password: bytes | None,
    allowed_users: frozenset[str] | None = None,
    allow_anonymous: bool = False,
) -> Verdict:
    """Check a PING against the candidate shared keys and the user's password.

    Args:
        shared_keys: every key valid for the source (several during a rotation).
        users_required: the listener checks users (security mode "users").
        password: the raw password of ``ping.username`` if that user exists
            and is enabled, else None.
        allowed_users: usernames allowed from the source (None: any).
        allow_anonymous: the source's network admits clients with no username.
    """
    matched: bytes | None = None
    for key in shared_keys:
        expected = ping_digest(ping.shared_key_salt, ping.client_hostname, nonce, key)
        if _matches(expected, ping.shared_key_hexdigest):
            matched = key
    if matched is None:
        return Verdict(False, REASON_SHARED_KEY)
    if not users_required or (allow_anonymous and ping.username == ""):
        return Verdict(True, shared_key=matched)
    # Compute the digest even for an unknown user, so timing does not tell.
    candidate = password if password is not None else b"\x00" * 32
    expected = password_digest(auth_salt, ping.username, candidate)
    good = _matches(expected, ping.password_digest)
    allowed = allowed_users is None or ping.username in allowed_users
    if not (good and password is not None and allowed):
        return Verdict(False, REASON_USER, shared_key=matched)
    return Verdict(True, shared_key=matched, username=ping.username)


def pong_bytes(verdict: Verdict, ping: Ping, *, server_hostname: str, nonce: bytes) -> bytes:
    """``["PONG", ok, reason, server_hostname, digest]``; empty strings on failure."""
    if verdict.ok and verdict.shared_key is not None:
        digest = ping_digest(ping.shared_key_salt, server_hostname, nonce, verdict.shared_key)
        message: list[Any] = ["PONG", True, "", server_hostname, digest]
    else:
        message = ["PONG", False, verdict.reason, "", ""]
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def refusal_bytes(reason: str) -> bytes:
    """A PONG refusing the client before any PING could be checked."""
    packed: bytes = msgpack.packb(["PONG", False, reason, "", ""], use_bin_type=True)
    return packed
