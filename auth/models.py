"""The auth database: users, shared keys, client networks and the audit log.

Typed SQLAlchemy 2.0 models; the schema itself is created and changed only by
the Alembic revisions in ``migrations/versions`` (``appliance db upgrade``),
and a test checks that the head revision and these models agree.

Secrets (``User.password_sealed``, ``SharedKey.secret_sealed``) are stored
sealed by :class:`auth.vault.SecretVault`, never in clear and never hashed
only: the forward handshake needs them raw (docs/auth.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

__all__ = [
    "AuditEntry",
    "Base",
    "ClientNetwork",
    "SharedKey",
    "User",
    "UtcDateTime",
    "network_users",
    "utc_now",
]

#: Longest user, key and audit target name.
NAME_LENGTH = 255
#: Longest CIDR or address text (an IPv6 network with its prefix is at most 43).
ADDRESS_LENGTH = 64


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite keeps no offset: values are converted to UTC before they are
    written and marked UTC when read, so both databases behave alike.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base; constraint names are fixed so migrations can name them."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


#: Which users may connect from which client network (many-to-many).
network_users = Table(
    "client_network_users",
    Base.metadata,
    Column(
        "network_id",
        ForeignKey("client_networks.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("user_id", ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True),
)


class User(Base):
    """A forward-protocol user: name and (sealed) password."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    password_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    #: The last successful handshake, and from where.
    last_login_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    last_login_address: Mapped[str | None] = mapped_column(String(ADDRESS_LENGTH))

    networks: Mapped[list[ClientNetwork]] = relationship(
        secondary=network_users, back_populates="users", order_by="ClientNetwork.cidr"
    )


class ClientNetwork(Base):
    """A client network (CIDR): its keys, its allowed users, anonymous clients."""

    __tablename__ = "client_networks"

    id: Mapped[int] = mapped_column(primary_key=True)
    #: Normalized CIDR text (``10.0.0.0/8``, ``2001:db8::/32``).
    cidr: Mapped[str] = mapped_column(String(ADDRESS_LENGTH), unique=True)
    #: Clients from this network may connect without a username.
    allow_anonymous: Mapped[bool] = mapped_column(default=False)
    #: Only ``users`` may connect from it (when false, any enabled user may).
    #: Kept apart from the list so that removing the last allowed user never
    #: silently opens the network to every user.
    restrict_users: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)

    users: Mapped[list[User]] = relationship(
        secondary=network_users, back_populates="networks", order_by="User.name"
    )
    keys: Mapped[list[SharedKey]] = relationship(
        back_populates="network", order_by="SharedKey.name"
    )


class SharedKey(Base):
    """A forward shared key: global (no network) or tied to one client network."""

    __tablename__ = "shared_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    secret_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    #: None: a global key. Deleting a network that still has keys is refused.
    network_id: Mapped[int | None] = mapped_column(
        ForeignKey("client_networks.id", ondelete="RESTRICT"), index=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)

    network: Mapped[ClientNetwork | None] = relationship(back_populates="keys")


class AuditEntry(Base):
    """One admin change or authentication failure. Never holds a secret."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now, index=True)
    #: Who: the operating-system user of an admin command, or the claimed username of a
    #: failed handshake.
    actor: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    #: The peer address of a handshake (None for admin commands).
    source_address: Mapped[str | None] = mapped_column(String(ADDRESS_LENGTH))
    #: ``user.add``, ``key.delete``, ``auth.failure``, ...
    action: Mapped[str] = mapped_column(String(64))
    #: The user, key name or CIDR acted on.
    target: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    detail: Mapped[str] = mapped_column(Text, default="")
