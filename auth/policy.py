"""What the forward handshake asks of the credential database (the contract).

The database layer (:mod:`auth.store`) implements :class:`CredentialStore`;
the forward session calls it from a worker thread at every PING, so users,
keys and networks changed with the CLI apply to the next connection without
a restart. Secrets cross this boundary decrypted, in memory only; they are
never logged.

Resolution of a source address (docs/auth.md):

1. The most specific client network containing the address applies.
2. Its shared keys are the keys tied to that network; with none, the global
   keys. Several keys may be valid at once (rotation): a PING matching any of
   them is accepted, and the PONG is signed with the key it matched.
3. Its allowed users restrict usernames (empty: any enabled user), and
   ``allow_anonymous`` lets clients from it connect without a username when
   the listener otherwise requires users.
4. An address in no network is an *anonymous source*: it is accepted only
   when the listener's ``allow_anonymous_source`` is true, with the global
   keys and any enabled user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["CredentialStore", "SourcePolicy"]


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """How the handshake treats one source address."""

    #: The client network (CIDR text) that matched, None for an anonymous source.
    network: str | None
    #: Raw shared keys a PING may be signed with (network keys, else global ones).
    shared_keys: tuple[bytes, ...]
    #: Usernames allowed from this source; None allows every enabled user.
    allowed_users: frozenset[str] | None = None
    #: Clients from this network may connect without a username.
    allow_anonymous: bool = False
    #: The names of ``shared_keys``, in the same order: what logs say of a
    #: key (a connection closed because its key was deleted), never its secret.
    #: Not part of the policy's equality: the policy is the same whatever the names.
    shared_key_names: tuple[str, ...] = field(default=(), compare=False)


class CredentialStore(Protocol):
    """Blocking credential look-ups; call them from a worker thread."""

    def resolve_source(self, address: str) -> SourcePolicy:
        """The policy for a source IP address (IPv4 or IPv6 text)."""
        ...

    def password_of(self, username: str) -> bytes | None:
        """The raw password of an enabled user; None when unknown or disabled."""
        ...

    def note_login(self, username: str | None, address: str) -> None:
        """Record a successful handshake (updates the user's last login)."""
        ...

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        """Record a failed handshake in the audit log (never with a secret)."""
        ...

    def record_audit(
        self,
        action: str,
        target: str,
        *,
        actor: str | None,
        detail: str = "",
        source_address: str | None = None,
    ) -> None:
        """Append one audit entry (``detail`` must hold no secret)."""
        ...
