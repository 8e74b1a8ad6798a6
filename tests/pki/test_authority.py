"""The CA's changes under the PKI lock: a CRL re-sign never undoes a revocation; CRL numbers."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Final

import pytest
from cryptography import x509

from pki.authority import CertificateAuthority, PkiPaths, crl_number
from pki.errors import PkiError

#: Certificates the revoking process revokes while the other re-signs the CRL.
REVOCATIONS: Final = 30
#: Seconds either process may take (a safety net against a hang, not a speed check).
PROCESS_TIMEOUT_SECONDS: Final = 300


def _revoke_each(directory: str, serials: list[int], resigning: Event) -> list[str]:
    """Revoke ``serials`` one by one; after each, every serial revoked so far must be on the CRL."""
    ca = CertificateAuthority(PkiPaths(Path(directory)))
    resigning.wait(PROCESS_TIMEOUT_SECONDS)  # the other process is signing CRLs by now
    problems: list[str] = []
    for done, serial in enumerate(serials, start=1):
        ca.revoke(serial, "keyCompromise")
        for earlier in serials[:done]:
            try:
                ca.confirm_revoked(earlier)
            except PkiError as exc:
                problems.append(f"after revoking {done}: {exc}")
    return problems


def _revoker(directory: str, serials: list[int], resigning: Event, out: Path) -> None:
    out.write_text("\n".join(_revoke_each(directory, serials, resigning)))


def _resigner(directory: str, resigning: Event, stop: Event) -> None:
    """What the service does when the CRL is due (its re-sign), as often as it can."""
    ca = CertificateAuthority(PkiPaths(Path(directory)))
    ca.write_crl()
    resigning.set()
    while not stop.is_set():
        ca.write_crl()


def test_a_crl_re_sign_never_drops_a_revocation_made_meanwhile(tmp_path: Path) -> None:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    serials = [ca.issue_client(f"web-{n}").certificate.serial_number for n in range(REVOCATIONS)]
    spawn = multiprocessing.get_context("spawn")
    resigning, stop = spawn.Event(), spawn.Event()
    report = tmp_path / "problems.txt"
    resigner = spawn.Process(target=_resigner, args=(str(ca.paths.directory), resigning, stop))
    revoker = spawn.Process(
        target=_revoker, args=(str(ca.paths.directory), serials, resigning, report)
    )
    resigner.start()
    revoker.start()
    revoker.join(PROCESS_TIMEOUT_SECONDS)
    stop.set()
    resigner.join(PROCESS_TIMEOUT_SECONDS)
    assert revoker.exitcode == 0
    assert resigner.exitcode == 0
    assert report.read_text() == ""
    assert {entry.serial_number for entry in ca.published_crl()} == set(serials)
    assert all(ca.inventory.get(serial).revoked_at is not None for serial in serials)


def test_crl_numbers_grow_and_survive_a_lost_crl_file(tmp_path: Path) -> None:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    first = crl_number(ca.published_crl())
    assert first == 1
    serial = ca.issue_client("web-01").certificate.serial_number
    ca.revoke(serial)
    assert ca.confirm_revoked(serial) == 2
    ca.paths.crl.unlink()  # the index remembers the last number
    assert crl_number(ca.write_crl()) == 3
    assert ca.confirm_revoked(serial) == 3


def test_a_revocation_that_missed_its_crl_is_signed_by_the_next_revoke(tmp_path: Path) -> None:
    # An earlier revoke stopped between the index and the CRL (a crash, a full disk):
    # revoking again puts the serial on the CRL instead of saying "already revoked".
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    serial = ca.issue_client("web-01").certificate.serial_number
    stale = ca.paths.crl.read_bytes()
    ca.revoke(serial)
    ca.paths.crl.write_bytes(stale)
    assert x509.load_pem_x509_crl(stale).get_revoked_certificate_by_serial_number(serial) is None
    ca.revoke(serial)
    assert ca.confirm_revoked(serial) >= 1
    with pytest.raises(PkiError, match=f"certificate {serial:x} is already revoked"):
        ca.revoke(serial)


def test_confirm_revoked_checks_the_signature(tmp_path: Path) -> None:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    other = CertificateAuthority(PkiPaths(tmp_path / "other"))
    other.create()
    serial = other.issue_client("web-01").certificate.serial_number
    other.revoke(serial)
    ca.paths.crl.write_bytes(other.paths.crl.read_bytes())  # listing it, but not this CA's
    with pytest.raises(PkiError, match="is not signed by the CA"):
        ca.confirm_revoked(serial)
