"""The credential store on SQLAlchemy: what the handshake asks, and what the CLI changes.

:class:`SqlCredentialStore` implements :class:`auth.policy.CredentialStore`
(the resolution rules are in that module's docstring and in docs/auth.md)
and the administrative operations of ``appliance user|key|client``. Every
look-up reads the database afresh, so a change made by the CLI applies to the
next handshake of a running service.

Every method raises only :class:`auth.errors.AuthError` subclasses: database
failures become :class:`DatabaseError` with a message that carries no SQL
parameter and no URL password. Every administrative change writes an audit
entry in the same transaction; no audit entry ever holds a secret.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from appliance.logs import get_logger
from auth.db import DEFAULT_POOL_SIZE, IMMEDIATE, display_url, make_engine
from auth.errors import (
    ConflictError,
    DatabaseError,
    InvalidValueError,
    NotFoundError,
    SecretKeyError,
)
from auth.models import (
    ADDRESS_LENGTH,
    NAME_LENGTH,
    AuditEntry,
    ClientNetwork,
    SharedKey,
    User,
    utc_now,
)
from auth.policy import CredentialStore, SourcePolicy
from auth.vault import SecretVault, key_id_of

__all__ = [
    "MAX_SECRET_BYTES",
    "AuditInfo",
    "KeyInfo",
    "NetworkInfo",
    "RotationResult",
    "SqlCredentialStore",
    "UserInfo",
    "parse_cidr",
]

log = get_logger("auth")

#: Longest password or shared key accepted, in bytes.
MAX_SECRET_BYTES: Final = 1024
#: Longest audit detail kept, in characters (a failure reason comes from the wire).
MAX_DETAIL_CHARS: Final = 1000
#: Associated-data kinds of the sealed secrets (a ciphertext opens only as its own kind).
KIND_USER: Final = "user"
KIND_KEY: Final = "shared-key"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


# -- values the CLI shows -----------------------------------------------------------


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


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


# -- validation ----------------------------------------------------------------------


def _check_name(what: str, name: str) -> str:
    if not name or len(name) > NAME_LENGTH:
        raise InvalidValueError(f"a {what} name needs 1 to {NAME_LENGTH} characters")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidValueError(f"a {what} name cannot hold spaces or control characters")
    return name


def _check_secret(what: str, secret: bytes) -> bytes:
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


def _parse_address(address: str) -> IpAddress | None:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
    return ip


def _clean(text: str, limit: int) -> str:
    """Printable text for the audit log: control characters escaped, length capped."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)[:limit]


def _user_info(user: User) -> UserInfo:
    return UserInfo(
        name=user.name,
        enabled=user.enabled,
        created_at=user.created_at,
        updated_at=user.updated_at,
        last_login_at=user.last_login_at,
        last_login_address=user.last_login_address,
        networks=tuple(n.cidr for n in user.networks),
    )


def _key_info(key: SharedKey) -> KeyInfo:
    return KeyInfo(
        name=key.name,
        network=key.network.cidr if key.network is not None else None,
        created_at=key.created_at,
        updated_at=key.updated_at,
    )


def _network_info(network: ClientNetwork) -> NetworkInfo:
    return NetworkInfo(
        cidr=network.cidr,
        allow_anonymous=network.allow_anonymous,
        restrict_users=network.restrict_users,
        users=tuple(u.name for u in network.users),
        keys=tuple(k.name for k in network.keys),
        created_at=network.created_at,
        updated_at=network.updated_at,
    )


class SqlCredentialStore:
    """Credentials in a SQLite or PostgreSQL database, secrets sealed by a key file.

    Args:
        url: SQLAlchemy URL of the auth database (its schema must be at head:
            see :func:`auth.schema.prepare`).
        secret_key_file: the key file that seals passwords and shared keys
            (created 0600 when the first secret is stored).
        pool_size: connections kept open; the handshakes' worker threads share them.
    """

    def __init__(
        self, url: str, secret_key_file: Path, *, pool_size: int = DEFAULT_POOL_SIZE
    ) -> None:
        self.url = url
        self.vault = SecretVault(secret_key_file)
        self._engine: Engine = make_engine(url, pool_size=pool_size)

    def close(self) -> None:
        """Close the pooled connections."""
        self._engine.dispose()

    def __enter__(self) -> SqlCredentialStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise ConflictError(
                f"the change conflicts with the database's contents: {_first_line(exc)}"
            ) from None
        except SQLAlchemyError as exc:
            raise DatabaseError(
                f"auth database {display_url(self.url)}: {_first_line(exc)}"
            ) from None

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._errors(), Session(self._engine) as session, session.begin():
            yield session

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

    @contextmanager
    def _write_session(self) -> Iterator[Session]:
        with self._engine.connect() as connection:
            connection = connection.execution_options(**{IMMEDIATE: True})
            with Session(bind=connection) as session, session.begin():
                yield session

    @staticmethod
    def _audit(
        session: Session,
        action: str,
        target: str,
        *,
        actor: str | None,
        detail: str = "",
        source_address: str | None = None,
    ) -> None:
        session.add(
            AuditEntry(
                at=utc_now(),
                actor=_clean(actor, NAME_LENGTH) if actor is not None else None,
                source_address=(
                    _clean(source_address, ADDRESS_LENGTH) if source_address is not None else None
                ),
                action=action,
                target=_clean(target, NAME_LENGTH),
                detail=_clean(detail, MAX_DETAIL_CHARS),
            )
        )

    # -- look-ups by name ------------------------------------------------------------

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

    # -- CredentialStore (called per handshake) -------------------------------------

    def _open_keys(self, keys: Sequence[SharedKey]) -> tuple[bytes, ...]:
        opened: list[bytes] = []
        for key in keys:
            try:
                opened.append(self.vault.open(KIND_KEY, key.name, key.secret_sealed))
            except SecretKeyError as exc:
                # Fail closed: the key is left out, and never replaced by another set.
                log.error("auth.secret_unreadable", key=key.name, reason=str(exc))
        return tuple(opened)

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
                return SourcePolicy(network=None, shared_keys=self._open_keys(keys))
            keys = session.scalars(
                select(SharedKey).where(SharedKey.network_id == match.id).order_by(SharedKey.name)
            ).all()
            if not keys:
                keys = session.scalars(global_keys.order_by(SharedKey.name)).all()
            users = None
            if match.restrict_users:
                users = frozenset(u.name for u in match.users)
            return SourcePolicy(
                network=match.cidr,
                shared_keys=self._open_keys(keys),
                allowed_users=users,
                allow_anonymous=match.allow_anonymous,
            )

    def password_of(self, username: str) -> bytes | None:
        """The raw password of an enabled user; None when unknown, disabled or unreadable."""
        with self._read() as session:
            user = session.scalar(select(User).where(User.name == username))
            if user is None or not user.enabled:
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
                user.last_login_address = _clean(address, ADDRESS_LENGTH)

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        """Append a failed handshake to the audit log (the reason must hold no secret)."""
        with self._write() as session:
            self._audit(
                session,
                "auth.failure",
                username or "",
                actor=username,
                source_address=address,
                detail=reason,
            )

    # -- users ---------------------------------------------------------------------------

    def add_user(self, name: str, password: bytes, *, actor: str, enabled: bool = True) -> UserInfo:
        """Create a user (the name must be free)."""
        _check_name("user", name)
        _check_secret("password", password)
        with self._write(seals=True) as session:
            if session.scalar(select(User.id).where(User.name == name)) is not None:
                raise ConflictError(f"user {name!r} already exists")
            now = utc_now()
            user = User(
                name=name,
                password_sealed=self.vault.seal(KIND_USER, name, password),
                enabled=enabled,
                created_at=now,
                updated_at=now,
                networks=[],
            )
            session.add(user)
            self._audit(session, "user.add", name, actor=actor, detail=f"enabled={enabled}")
            session.flush()
            return _user_info(user)

    def list_users(self) -> list[UserInfo]:
        """Every user, by name."""
        with self._read() as session:
            users = session.scalars(
                select(User).options(selectinload(User.networks)).order_by(User.name)
            )
            return [_user_info(u) for u in users]

    def get_user(self, name: str) -> UserInfo:
        """One user."""
        with self._read() as session:
            return _user_info(self._user(session, name))

    def set_user_enabled(self, name: str, enabled: bool, *, actor: str) -> UserInfo:
        """Enable or disable a user (a disabled user's handshakes fail)."""
        with self._write() as session:
            user = self._user(session, name)
            user.enabled = enabled
            user.updated_at = utc_now()
            self._audit(session, "user.enable" if enabled else "user.disable", name, actor=actor)
            return _user_info(user)

    def set_password(self, name: str, password: bytes, *, actor: str) -> UserInfo:
        """Replace a user's password."""
        _check_secret("password", password)
        with self._write(seals=True) as session:
            user = self._user(session, name)
            user.password_sealed = self.vault.seal(KIND_USER, name, password)
            user.updated_at = utc_now()
            self._audit(session, "user.passwd", name, actor=actor, detail="password replaced")
            return _user_info(user)

    def delete_user(self, name: str, *, actor: str) -> None:
        """Delete a user; the networks that allowed it keep their other users."""
        with self._write() as session:
            user = self._user(session, name)
            networks = ", ".join(n.cidr for n in user.networks)
            session.delete(user)
            detail = f"removed from networks {networks}" if networks else ""
            self._audit(session, "user.delete", name, actor=actor, detail=detail)

    # -- shared keys -------------------------------------------------------------------

    def add_key(
        self, name: str, secret: bytes, *, network: str | None = None, actor: str
    ) -> KeyInfo:
        """Create a shared key, global or tied to an existing client network."""
        _check_name("shared key", name)
        _check_secret("shared key", secret)
        with self._write(seals=True) as session:
            if session.scalar(select(SharedKey.id).where(SharedKey.name == name)) is not None:
                raise ConflictError(f"shared key {name!r} already exists")
            owner = self._network(session, network) if network is not None else None
            now = utc_now()
            key = SharedKey(
                name=name,
                secret_sealed=self.vault.seal(KIND_KEY, name, secret),
                network=owner,
                created_at=now,
                updated_at=now,
            )
            session.add(key)
            scope = owner.cidr if owner is not None else "global"
            self._audit(session, "key.add", name, actor=actor, detail=f"scope={scope}")
            session.flush()
            return _key_info(key)

    def list_keys(self) -> list[KeyInfo]:
        """Every shared key, by name (never the secrets)."""
        with self._read() as session:
            keys = session.scalars(
                select(SharedKey).options(selectinload(SharedKey.network)).order_by(SharedKey.name)
            )
            return [_key_info(k) for k in keys]

    def get_key(self, name: str) -> KeyInfo:
        """One shared key (never the secret)."""
        with self._read() as session:
            return _key_info(self._key(session, name))

    def delete_key(self, name: str, *, actor: str) -> None:
        """Delete a shared key."""
        with self._write() as session:
            key = self._key(session, name)
            scope = key.network.cidr if key.network is not None else "global"
            session.delete(key)
            self._audit(session, "key.delete", name, actor=actor, detail=f"scope={scope}")

    # -- client networks ------------------------------------------------------------------

    def add_network(
        self,
        cidr: str,
        *,
        keys: Iterable[str] = (),
        users: Iterable[str] = (),
        allow_anonymous: bool = False,
        actor: str,
    ) -> NetworkInfo:
        """Create a client network; ``keys`` (global) become its own, ``users`` its only users."""
        normalized = parse_cidr(cidr)
        key_names, user_names = sorted(set(keys)), sorted(set(users))
        with self._write() as session:
            exists = select(ClientNetwork.id).where(ClientNetwork.cidr == normalized)
            if session.scalar(exists) is not None:
                raise ConflictError(f"client network {normalized} already exists")
            owned = [self._key(session, k) for k in key_names]
            for key in owned:
                if key.network is not None:
                    raise ConflictError(
                        f"shared key {key.name!r} already belongs to network {key.network.cidr}"
                    )
            now = utc_now()
            network = ClientNetwork(
                cidr=normalized,
                allow_anonymous=allow_anonymous,
                restrict_users=bool(user_names),
                users=[self._user(session, u) for u in user_names],
                keys=owned,
                created_at=now,
                updated_at=now,
            )
            session.add(network)
            for key in owned:
                key.updated_at = now
            detail = (
                f"keys={','.join(key_names) or '-'} users={','.join(user_names) or 'any'} "
                f"allow_anonymous={allow_anonymous}"
            )
            self._audit(session, "client.add", normalized, actor=actor, detail=detail)
            session.flush()
            return _network_info(network)

    def list_networks(self) -> list[NetworkInfo]:
        """Every client network, by CIDR."""
        with self._read() as session:
            networks = session.scalars(
                select(ClientNetwork)
                .options(selectinload(ClientNetwork.users), selectinload(ClientNetwork.keys))
                .order_by(ClientNetwork.cidr)
            )
            return [_network_info(n) for n in networks]

    def get_network(self, cidr: str) -> NetworkInfo:
        """One client network."""
        with self._read() as session:
            return _network_info(self._network(session, cidr))

    def update_network(
        self,
        cidr: str,
        *,
        allow_anonymous: bool | None = None,
        any_user: bool = False,
        actor: str,
    ) -> NetworkInfo:
        """Change whether anonymous clients may connect, or lift the user restriction."""
        with self._write() as session:
            network = self._network(session, cidr)
            changes = []
            if allow_anonymous is not None:
                network.allow_anonymous = allow_anonymous
                changes.append(f"allow_anonymous={allow_anonymous}")
            if any_user:
                network.restrict_users = False
                network.users = []
                changes.append("users=any")
            if not changes:
                raise InvalidValueError("nothing to change")
            network.updated_at = utc_now()
            self._audit(session, "client.set", network.cidr, actor=actor, detail=" ".join(changes))
            return _network_info(network)

    def delete_network(self, cidr: str, *, with_keys: bool = False, actor: str) -> None:
        """Delete a client network; its keys too with ``with_keys`` (never made global)."""
        with self._write() as session:
            network = self._network(session, cidr)
            names = [k.name for k in network.keys]
            if names and not with_keys:
                raise ConflictError(
                    f"client network {network.cidr} has shared keys {', '.join(names)}: delete "
                    "them first ('appliance key delete NAME') or pass --with-keys"
                )
            for key in list(network.keys):
                session.delete(key)
            session.delete(network)
            detail = f"deleted keys {','.join(names)}" if names else ""
            self._audit(session, "client.delete", network.cidr, actor=actor, detail=detail)

    def allow_user(self, name: str, cidr: str, *, actor: str) -> NetworkInfo:
        """Add a user to a network's allowed users (the network then admits only those)."""
        with self._write() as session:
            network = self._network(session, cidr)
            user = self._user(session, name)
            if user not in network.users:
                network.users.append(user)
            network.restrict_users = True
            network.updated_at = utc_now()
            self._audit(session, "user.allow", name, actor=actor, detail=f"network={network.cidr}")
            return _network_info(network)

    def deny_user(self, name: str, cidr: str, *, actor: str) -> NetworkInfo:
        """Remove a user from a network's allowed users (with none left, no user may connect)."""
        with self._write() as session:
            network = self._network(session, cidr)
            user = self._user(session, name)
            if not network.restrict_users:
                raise ConflictError(
                    f"client network {network.cidr} admits any user: name the users it admits "
                    "with 'appliance user allow NAME CIDR' instead"
                )
            if user not in network.users:
                raise NotFoundError(f"user {name!r} is not allowed on {network.cidr} already")
            network.users.remove(user)
            network.updated_at = utc_now()
            self._audit(session, "user.deny", name, actor=actor, detail=f"network={network.cidr}")
            return _network_info(network)

    # -- audit -----------------------------------------------------------------------------

    def record_audit(
        self,
        action: str,
        target: str,
        *,
        actor: str | None,
        detail: str = "",
        source_address: str | None = None,
    ) -> None:
        """Append one audit entry of a change made outside this store (``cert.issue``, ...).

        The caller guarantees that ``detail`` holds no secret; ``target`` and
        ``detail`` are cut to the column sizes, control characters escaped.
        """
        with self._write() as session:
            self._audit(
                session,
                action,
                target,
                actor=actor,
                detail=detail,
                source_address=source_address,
            )

    def audit_entries(self, limit: int = 100) -> list[AuditInfo]:
        """The newest ``limit`` audit entries, newest first."""
        with self._read() as session:
            rows = session.scalars(
                select(AuditEntry).order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(limit)
            )
            return [
                AuditInfo(r.at, r.actor, r.source_address, r.action, r.target, r.detail)
                for r in rows
            ]

    # -- the secret key file ------------------------------------------------------------

    def _reseal(self, session: Session, current: bytes) -> int:
        """Re-encrypt every secret not sealed under ``current``; returns how many."""
        count = 0
        for user in session.scalars(select(User).order_by(User.id).with_for_update()):
            if key_id_of(user.password_sealed) != current:
                plain = self.vault.open(KIND_USER, user.name, user.password_sealed)
                user.password_sealed = self.vault.seal(KIND_USER, user.name, plain)
                count += 1
        for key in session.scalars(select(SharedKey).order_by(SharedKey.id).with_for_update()):
            if key_id_of(key.secret_sealed) != current:
                plain = self.vault.open(KIND_KEY, key.name, key.secret_sealed)
                key.secret_sealed = self.vault.seal(KIND_KEY, key.name, plain)
                count += 1
        return count

    def _count_secrets(self) -> int:
        with self._read() as session:
            users = session.scalar(select(func.count()).select_from(User)) or 0
            keys = session.scalar(select(func.count()).select_from(SharedKey)) or 0
            return users + keys

    def rotate_master_key(self, *, actor: str) -> RotationResult:
        """Replace the secret key file and re-encrypt every secret in one transaction.

        Crash-safe (docs/auth.md): the old key stays in ``secret.key.old``
        until the transaction that re-encrypts under the new key has
        committed, and both keys open secrets meanwhile. A rotation found
        interrupted (``secret.key.old`` present) is completed first.
        """
        with self.vault.lock(exclusive=True):
            resumed = self.vault.rotation_pending
            try:
                if resumed:
                    with self._write() as session:
                        self._reseal(session, self.vault.current_key_id())
                        detail = "completed an interrupted rotation"
                        self._audit(session, "key.rotate-master", "", actor=actor, detail=detail)
                    self.vault.drop_old_key()
                if not self.vault.path.exists() and self._count_secrets() == 0:
                    self.vault.ensure_key()
                new_id = self.vault.stage_new_key()
                with self._write() as session:
                    count = self._reseal(session, new_id)
                    detail = f"re-encrypted {count} secrets under key {new_id.hex()}"
                    self._audit(session, "key.rotate-master", "", actor=actor, detail=detail)
                self.vault.drop_old_key()
            except (SecretKeyError, DatabaseError) as exc:
                if not self.vault.rotation_pending:
                    raise
                raise type(exc)(
                    f"{exc}; the rotation is unfinished but safe (secrets open under the old "
                    f"and the new key): fix that, then run 'appliance key rotate-master' again"
                ) from None
        return RotationResult(key_id=new_id.hex(), resealed=count, resumed=resumed)


def _first_line(exc: SQLAlchemyError) -> str:
    """The driver's message, first line only: no SQL parameters (sealed secrets), no URL."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def _conforms(store: SqlCredentialStore) -> CredentialStore:
    """Never called: makes mypy check the store against the handshake's contract."""
    return store
