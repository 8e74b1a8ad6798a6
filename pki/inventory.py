"""The record of every certificate the CA issued, and of revocations (``index.json``).

A small JSON file rather than a database table: the CA must work before the
auth database exists (first start), and the file is rewritten atomically
with mode 0644 (it holds no secrets). Every change reads, changes and
rewrites it under the PKI lock (:mod:`pki.lock`), so concurrent changes
(two ``cert issue-client`` and a ``cert revoke`` at once) all land. It also
keeps the number of the latest CRL signed, so CRL numbers keep growing even
if ``crl.pem`` is lost.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from cryptography import x509

from pki.errors import PkiError
from pki.files import write_public
from pki.lock import pki_lock

__all__ = ["EXPIRY_WARNING_DAYS", "Inventory", "IssuedCert", "status"]

#: Certificates expiring within this many days are flagged by `cert list` and the service log.
EXPIRY_WARNING_DAYS: Final = 30

Status = Literal["valid", "expiring", "expired", "revoked"]


@dataclass(frozen=True, slots=True)
class IssuedCert:
    """One issued certificate as the inventory remembers it."""

    serial: int
    kind: Literal["server", "client"]
    subject: str
    not_before: dt.datetime
    not_after: dt.datetime
    revoked_at: dt.datetime | None = None
    reason: str | None = None

    @classmethod
    def from_certificate(
        cls, cert: x509.Certificate, kind: Literal["server", "client"]
    ) -> IssuedCert:
        return cls(
            serial=cert.serial_number,
            kind=kind,
            subject=cert.subject.rfc4514_string(),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
        )

    @property
    def serial_hex(self) -> str:
        return f"{self.serial:x}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["serial"] = self.serial_hex
        for key in ("not_before", "not_after", "revoked_at"):
            if data[key] is not None:
                data[key] = data[key].isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IssuedCert:
        def when(value: str | None) -> dt.datetime | None:
            return dt.datetime.fromisoformat(value) if value else None

        return cls(
            serial=int(data["serial"], 16),
            kind=data["kind"],
            subject=data["subject"],
            not_before=dt.datetime.fromisoformat(data["not_before"]),
            not_after=dt.datetime.fromisoformat(data["not_after"]),
            revoked_at=when(data.get("revoked_at")),
            reason=data.get("reason"),
        )


def status(entry: IssuedCert, now: dt.datetime | None = None) -> Status:
    """Whether a certificate is valid, expiring soon, expired or revoked."""
    now = now or dt.datetime.now(dt.UTC)
    if entry.revoked_at is not None:
        return "revoked"
    if entry.not_after <= now:
        return "expired"
    if entry.not_after - now <= dt.timedelta(days=EXPIRY_WARNING_DAYS):
        return "expiring"
    return "valid"


def _entries(data: dict[str, Any]) -> list[IssuedCert]:
    return [IssuedCert.from_json(item) for item in data.get("certificates", [])]


def _crl_number(data: dict[str, Any]) -> int:
    number = data.get("crl_number", 0)
    return number if isinstance(number, int) else 0


class Inventory:
    """The issued certificates in ``index.json``; changes hold the PKI lock of its directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise PkiError(f"cannot read {self.path}: {exc}") from None
        if not isinstance(data, dict):
            raise PkiError(f"cannot read {self.path}: not a JSON object")
        return data

    def entries(self) -> list[IssuedCert]:
        """Every certificate issued, oldest first."""
        return _entries(self._load())

    def last_crl_number(self) -> int:
        """The number of the latest CRL signed (0: none yet)."""
        return _crl_number(self._load())

    def _save(self, entries: list[IssuedCert], crl_number: int) -> None:
        payload: dict[str, Any] = {"certificates": [e.to_json() for e in entries]}
        if crl_number:
            payload["crl_number"] = crl_number
        write_public(self.path, (json.dumps(payload, indent=2) + "\n").encode())

    def add(self, entry: IssuedCert) -> None:
        """Record a newly issued certificate."""
        with pki_lock(self.path.parent):
            data = self._load()
            self._save([*_entries(data), entry], _crl_number(data))

    def record_crl_number(self, number: int) -> None:
        """Remember ``number`` as the latest CRL's (the CA calls this when it signs one)."""
        with pki_lock(self.path.parent):
            data = self._load()
            self._save(_entries(data), max(number, _crl_number(data)))

    def get(self, serial: int) -> IssuedCert:
        """The certificate with ``serial``.

        Raises:
            PkiError: there is none.
        """
        for entry in self.entries():
            if entry.serial == serial:
                return entry
        raise PkiError(f"no certificate with serial {serial:x}")

    def find(self, ref: str) -> IssuedCert:
        """The certificate whose serial (hex) or common name is ``ref``."""
        entries = self.entries()
        by_serial = [e for e in entries if e.serial_hex == ref.lower().removeprefix("0x")]
        if by_serial:
            return by_serial[0]
        by_name = [e for e in entries if f"CN={ref}" in e.subject.split(",")]
        if len(by_name) == 1:
            return by_name[0]
        if len(by_name) > 1:
            live = [e for e in by_name if e.revoked_at is None]
            if len(live) == 1:
                return live[0]
            serials = ", ".join(e.serial_hex for e in by_name)
            raise PkiError(f"several certificates are named {ref!r}: use a serial ({serials})")
        raise PkiError(f"no certificate with serial or name {ref!r}")

    def revoke(self, serial: int, reason: str, when: dt.datetime) -> IssuedCert:
        """Mark ``serial`` revoked (read, changed and written under the PKI lock).

        Raises:
            PkiError: there is no such certificate, or it is revoked already.
        """
        with pki_lock(self.path.parent):
            data = self._load()
            entries = _entries(data)
            for index, entry in enumerate(entries):
                if entry.serial == serial:
                    if entry.revoked_at is not None:
                        raise PkiError(f"certificate {entry.serial_hex} is already revoked")
                    entries[index] = replace(entry, revoked_at=when, reason=reason)
                    self._save(entries, _crl_number(data))
                    return entries[index]
        raise PkiError(f"no certificate with serial {serial:x}")
