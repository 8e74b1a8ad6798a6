"""The values the auth stores return: plain frozen records, never a secret, each with its JSON.

The stores (:mod:`auth.store`, :mod:`auth.curve`, :mod:`auth.tokens`,
:mod:`auth.audit`) build them from database rows inside a transaction, so
they stay valid after it ends; the CLI prints them as a table or, with
``--json``, as :meth:`to_json` documents.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AuditInfo",
    "CurveKeyInfo",
    "KeyInfo",
    "NetworkInfo",
    "RotationResult",
    "TokenGrant",
    "TokenInfo",
    "UserInfo",
]


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def _status(revoked_at: dt.datetime | None) -> str:
    return "revoked" if revoked_at is not None else "active"


@dataclass(frozen=True, slots=True)
class UserInfo:
    """A user as the CLI shows it (never the password)."""

    name: str
    enabled: bool
    created_at: dt.datetime
    updated_at: dt.datetime
    last_login_at: dt.datetime | None
    last_login_address: str | None
    #: Client networks that name this user among their allowed users.
    networks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {
            "name": self.name,
            "enabled": self.enabled,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "last_login_at": _iso(self.last_login_at),
            "last_login_address": self.last_login_address,
            "networks": list(self.networks),
        }


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A shared key as the CLI shows it (never the secret)."""

    name: str
    #: The client network it is tied to; None for a global key.
    network: str | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def scope(self) -> str:
        """``global`` or the network's CIDR."""
        return self.network or "global"

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {
            "name": self.name,
            "scope": self.scope,
            "network": self.network,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class NetworkInfo:
    """A client network as the CLI shows it."""

    cidr: str
    allow_anonymous: bool
    #: True: only ``users`` may connect from it (none when empty); False: any enabled user.
    restrict_users: bool
    users: tuple[str, ...]
    keys: tuple[str, ...]
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def users_text(self) -> str:
        """``any``, ``none`` or the allowed names."""
        if not self.restrict_users:
            return "any"
        return ", ".join(self.users) or "none"

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json`` (``users`` is null when any user may connect)."""
        return {
            "cidr": self.cidr,
            "allow_anonymous": self.allow_anonymous,
            "users": list(self.users) if self.restrict_users else None,
            "keys": list(self.keys),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class AuditInfo:
    """One audit entry."""

    at: dt.datetime
    actor: str | None
    source_address: str | None
    action: str
    target: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {
            "at": _iso(self.at),
            "actor": self.actor,
            "source_address": self.source_address,
            "action": self.action,
            "target": self.target,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class RotationResult:
    """What a rotation of the secret key file did."""

    #: Id (hex) of the key now in the key file.
    key_id: str
    #: Secrets re-encrypted under it.
    resealed: int
    #: An interrupted earlier rotation was completed first.
    resumed: bool

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {"key_id": self.key_id, "resealed": self.resealed, "resumed": self.resumed}


@dataclass(frozen=True, slots=True)
class CurveKeyInfo:
    """A CURVE key as the CLI shows it."""

    name: str
    public_key: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None

    @property
    def status(self) -> str:
        """``active`` or ``revoked``."""
        return _status(self.revoked_at)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {
            "name": self.name,
            "public_key": self.public_key,
            "status": self.status,
            "created_at": _iso(self.created_at),
            "revoked_at": _iso(self.revoked_at),
        }


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """An API token as the CLI shows it (never the secret)."""

    name: str
    scope: str
    tag_prefixes: tuple[str, ...]
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None

    @property
    def status(self) -> str:
        """``active`` or ``revoked``."""
        return _status(self.revoked_at)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``--json``."""
        return {
            "name": self.name,
            "scope": self.scope,
            "tag_prefixes": list(self.tag_prefixes),
            "status": self.status,
            "created_at": _iso(self.created_at),
            "revoked_at": _iso(self.revoked_at),
            "last_used_at": _iso(self.last_used_at),
        }


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """What a verified API token allows: the WebSocket listener's answer to a handshake."""

    name: str
    scope: str
    tag_prefixes: tuple[str, ...]

    def allows_tag(self, tag: str) -> bool:
        """Whether events may be written under ``tag``."""
        return not self.tag_prefixes or tag.startswith(self.tag_prefixes)
