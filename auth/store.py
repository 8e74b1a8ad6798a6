"""The credential store on SQLAlchemy: what the forward handshake asks, and what the CLI changes.

:class:`SqlCredentialStore` implements :class:`auth.policy.CredentialStore`
(the resolution rules are in that module's docstring and in docs/auth.md):
the look-ups here run at every handshake. The administrative operations of
``appliance user|key|client`` come from the stores it combines, one module a
responsibility: :mod:`auth.users`, :mod:`auth.keys`, :mod:`auth.networks`,
:mod:`auth.rotation` and :mod:`auth.audit`. Every look-up reads the database
afresh, so a change made by the CLI applies to the next handshake of a
running service.

Every method raises only :class:`auth.errors.AuthError` subclasses: database
failures become :class:`DatabaseError` with a message that carries no SQL
parameter and no URL password. Every administrative change writes an audit
entry in the same transaction; no audit entry ever holds a secret.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from sqlalchemy import select

from auth.audit import AuditLog
from auth.credentials import KIND_KEY, KIND_USER
from auth.errors import SecretKeyError
from auth.keys import SharedKeyAdmin
from auth.logs import get_logger
from auth.models import ADDRESS_LENGTH, ClientNetwork, SharedKey, User, utc_now
from auth.networks import NetworkAdmin
from auth.policy import CredentialStore, SourcePolicy
from auth.principals import escape_claimed, unauthenticated_actor
from auth.rotation import MasterKeyRotation
from auth.tablestore import clean
from auth.users import UserAdmin

__all__ = ["SqlCredentialStore"]

log = get_logger()

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse_address(address: str) -> IpAddress | None:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
    return ip


class SqlCredentialStore(UserAdmin, SharedKeyAdmin, NetworkAdmin, MasterKeyRotation, AuditLog):
    """Credentials in a SQLite or PostgreSQL database, secrets sealed by a key file.

    Open it with :func:`auth.database.open_database` (``.credentials``).

    Args:
        engine: the process's engine on the auth database (schema at head).
        secret_key_file: the key file that seals passwords and shared keys
            (created 0600 when the first secret is stored).
    """

    def _open_keys(self, keys: Sequence[SharedKey]) -> tuple[tuple[bytes, ...], tuple[str, ...]]:
        """The secrets of ``keys`` that open, and their names in the same order."""
        opened: list[bytes] = []
        names: list[str] = []
        for key in keys:
            try:
                opened.append(self.vault.open(KIND_KEY, key.name, key.secret_sealed))
            except SecretKeyError as exc:
                # Fail closed: the key is left out, and never replaced by another set.
                log.error("auth.secret_unreadable", key=key.name, reason=str(exc))
                continue
            names.append(key.name)
        return tuple(opened), tuple(names)

    def resolve_source(self, address: str) -> SourcePolicy:
        """The policy for a source address (rules in :mod:`auth.policy`)."""
        ip = _parse_address(address)
        with self._read() as session:
            match: ClientNetwork | None = None
            best = -1
            if ip is not None:
                for network in session.scalars(select(ClientNetwork)):
                    parsed: IpNetwork = ipaddress.ip_network(network.cidr)
                    if parsed.version == ip.version and ip in parsed and parsed.prefixlen > best:
                        match, best = network, parsed.prefixlen
            global_keys = select(SharedKey).where(SharedKey.network_id.is_(None))
            if match is None:
                keys = session.scalars(global_keys.order_by(SharedKey.name)).all()
                opened, names = self._open_keys(keys)
                return SourcePolicy(network=None, shared_keys=opened, shared_key_names=names)
            keys = session.scalars(
                select(SharedKey).where(SharedKey.network_id == match.id).order_by(SharedKey.name)
            ).all()
            if not keys:
                keys = session.scalars(global_keys.order_by(SharedKey.name)).all()
            users = None
            if match.restrict_users:
                users = frozenset(u.name for u in match.users)
            opened, names = self._open_keys(keys)
            return SourcePolicy(
                network=match.cidr,
                shared_keys=opened,
                allowed_users=users,
                allow_anonymous=match.allow_anonymous,
                shared_key_names=names,
            )

    def password_of(self, username: str) -> bytes | None:
        """The raw password of an enabled user; None when unknown, disabled or unreadable."""
        with self._read() as session:
            user = session.scalar(select(User).where(User.name == username))
            if user is None or not user.enabled:
                self._open_decoy()
                return None
            try:
                return self.vault.open(KIND_USER, user.name, user.password_sealed)
            except SecretKeyError as exc:
                log.error("auth.secret_unreadable", user=user.name, reason=str(exc))
                return None

    def note_login(self, username: str | None, address: str) -> None:
        """Record a successful handshake: the user's last login time and address."""
        if username is None:
            return
        with self._write() as session:
            user = session.scalar(select(User).where(User.name == username))
            if user is not None:
                user.last_login_at = utc_now()
                user.last_login_address = clean(address, ADDRESS_LENGTH)

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        """Append a failed handshake to the audit log (the reason must hold no secret).

        Its actor is ``unauthenticated:<address>``: the username is only what
        the client claimed (it could claim ``cli:root``), so it is the
        entry's target, escaped, never its actor.
        """
        with self._write() as session:
            self._audit(
                session,
                "auth.failure",
                escape_claimed(username or ""),
                actor=unauthenticated_actor(address),
                source_address=address,
                detail=reason,
            )


def _conforms(store: SqlCredentialStore) -> CredentialStore:
    """Never called: makes mypy check the store against the handshake's contract."""
    return store
