"""The audit log: entries written by changes made outside the stores, and the newest ones read back.

Every store writes its own entries in the transaction of its change
(:meth:`auth.tablestore.TableStore._audit`); :class:`AuditLog` adds the
entries of changes made elsewhere (``cert.issue``, ``table.erase``, a refused
TLS client, ...) through that same sanitising path. No entry ever holds a
secret.
"""

from __future__ import annotations

from sqlalchemy import select

from auth.models import AuditEntry
from auth.records import AuditInfo
from auth.tablestore import TableStore

__all__ = ["AuditLog"]


class AuditLog(TableStore):
    """The ``audit_log`` table of the auth database."""

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
