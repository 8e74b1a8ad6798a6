"""Rotating the key file that seals every stored secret, crash-safe (docs/auth.md).

Part of the credential store (:class:`auth.store.SqlCredentialStore`):
``appliance key rotate-master`` re-encrypts every password and shared key
under a new key in one transaction, while both keys open secrets.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from auth.credentials import KIND_KEY, KIND_USER, CredentialTables
from auth.errors import DatabaseError, SecretKeyError
from auth.models import SharedKey, User
from auth.records import RotationResult
from auth.vault import key_id_of

__all__ = ["MasterKeyRotation"]


class MasterKeyRotation(CredentialTables):
    """Replaces the secret key file and re-encrypts the secrets of ``users`` and ``shared_keys``."""

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
