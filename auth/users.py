"""Forward-protocol users: their sealed passwords, enabling, and ``appliance user ...``.

Part of the credential store (:class:`auth.store.SqlCredentialStore`); every
change writes its audit entry in the same transaction, never the password.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from auth.credentials import KIND_USER, CredentialTables, check_secret
from auth.errors import ConflictError
from auth.models import User, utc_now
from auth.principals import check_principal_name
from auth.records import UserInfo

__all__ = ["UserAdmin"]


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


class UserAdmin(CredentialTables):
    """The ``users`` table: create, list, enable or disable, change the password, delete."""

    def add_user(self, name: str, password: bytes, *, actor: str, enabled: bool = True) -> UserInfo:
        """Create a user (the name must be free)."""
        check_principal_name("user", name)
        check_secret("password", password)
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
        check_secret("password", password)
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
