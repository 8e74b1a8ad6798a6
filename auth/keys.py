"""Forward shared keys, global or tied to one client network, and ``appliance key ...``.

Part of the credential store (:class:`auth.store.SqlCredentialStore`); every
change writes its audit entry in the same transaction, never the secret.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from auth.credentials import KIND_KEY, CredentialTables, check_secret
from auth.errors import ConflictError
from auth.models import SharedKey, utc_now
from auth.records import KeyInfo
from auth.tablestore import check_name

__all__ = ["SharedKeyAdmin"]


def _key_info(key: SharedKey) -> KeyInfo:
    return KeyInfo(
        name=key.name,
        network=key.network.cidr if key.network is not None else None,
        created_at=key.created_at,
        updated_at=key.updated_at,
    )


class SharedKeyAdmin(CredentialTables):
    """The ``shared_keys`` table: create, list, show, delete (never the secrets)."""

    def add_key(
        self, name: str, secret: bytes, *, network: str | None = None, actor: str
    ) -> KeyInfo:
        """Create a shared key, global or tied to an existing client network."""
        check_name("shared key", name)
        check_secret("shared key", secret)
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
