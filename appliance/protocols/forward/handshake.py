"""The forward protocol's handshake (spec "Handshake Messages"): HELO, PING, PONG.

Pure functions and values, no I/O and no randomness: the driver supplies the
nonce and the auth salt (16 random bytes each, docs/forward.md) and the secrets
looked up for the peer. Digests (spec "PING", "PONG"):

* PING: ``sha512_hex(shared_key_salt + client_hostname + nonce + shared_key)``
* PONG: ``sha512_hex(shared_key_salt + server_hostname + nonce + shared_key)``
* password: ``sha512_hex(auth_salt + username + raw_password)``

Every comparison of a digest uses :func:`hmac.compare_digest`; an empty or
short digest simply fails to match. A failed PING is answered with
``["PONG", false, reason, "", ""]`` (what in_forward sends) and the
connection closes.

Strings of a PING that reach a column or a log are strict
(appliance/blocks/text.py): ``client_hostname`` becomes the events'
``host`` column, so it must be valid UTF-8 of at most ``MAX_HOST_BYTES``
(empty means no host); ``username`` (the events' ``source`` once
authenticated, and the audit log's user otherwise) must be valid UTF-8 of at
most :data:`MAX_USERNAME_BYTES`. A
PING that breaks either rule is not a PING (:class:`InvalidPing`): the codec
answers ``invalid ping message`` and closes. Its size is bounded by the codec
(``forward.MAX_PING_BYTES``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from appliance.blocks.errors import InvalidText
from appliance.blocks.text import MAX_HOST_BYTES, decode_text

__all__ = [
    "AUTH_SALT_BYTES",
    "MAX_USERNAME_BYTES",
    "NONCE_BYTES",
    "REASON_INVALID_PING",
    "REASON_SHARED_KEY",
    "REASON_USER",
    "Helo",
    "InvalidPing",
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

#: Longest username taken from a PING, in bytes: an authenticated username
#: becomes the events' ``source``, whose column limit this is
#: (``appliance.blocks.checks.MAX_SOURCE_BYTES``).
MAX_USERNAME_BYTES: Final = 1024

REASON_INVALID_PING: Final = "invalid ping message"
REASON_SHARED_KEY: Final = "shared_key mismatch"
REASON_USER: Final = "username/password mismatch"


class InvalidPing(ValueError):
    """A request that is not a well-formed PING; ``reason`` says why (for the log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
        try:
            return cls.from_message(message)
        except InvalidPing:
            return None

    @classmethod
    def from_message(cls, message: Any) -> Ping:
        """The PING in a decoded request (spec "PING").

        Raises:
            InvalidPing: not a six-element ``PING`` array of str/bin, or a
                client hostname or username that breaks the rules above.
        """
        if type(message) is not list or len(message) != 6 or message[0] != "PING":
            raise InvalidPing("expected PING before any request")
        _, hostname, salt, digest, username, password = message
        if not all(
            isinstance(v, str | bytes) for v in (hostname, salt, digest, username, password)
        ):
            raise InvalidPing("a PING field is neither str nor bin")
        try:
            # Strict, not "replace": the digest is computed over these exact
            # bytes, and the hostname is stored in the host column.
            client_hostname = decode_text(_bytes(hostname), "client hostname", MAX_HOST_BYTES)
            user = decode_text(_bytes(username), "username", MAX_USERNAME_BYTES)
        except InvalidText as exc:
            raise InvalidPing(exc.reason) from None
        return cls(
            client_hostname=client_hostname,
            shared_key_salt=_bytes(salt),
            shared_key_hexdigest=_bytes(digest),
            username=user,
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
    #: Why, for the audit log and the service log only: the client gets
    #: in_forward's generic ``reason`` (it must not learn which part failed).
    detail: str = ""


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
        if password is None:
            detail = "unknown or disabled user"
        elif not good:
            detail = "password mismatch"
        else:
            detail = "user not allowed from this client network"
        return Verdict(False, REASON_USER, shared_key=matched, detail=detail)
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
