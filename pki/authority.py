"""The appliance's certificate authority: create, issue, revoke, publish a CRL.

Keys are ECDSA P-256 by default, RSA 3072 on request (docs/pki.md). Layout of
the PKI directory (``<state_dir>/pki``)::

    ca.pem        the CA certificate: clients verify the server with it
    ca.key        the CA private key (0600)
    server.pem    the active server certificate, followed by the CA certificate
    server.key    the active server private key (0600)
    crl.pem       the CRL, re-signed on every revocation and before it runs out
    index.json    every certificate issued, and its revocation (pki.inventory)
    issued/       a copy of every certificate issued, by serial

The CA key is kept unencrypted at mode 0600 because the service re-signs the
CRL by itself; protect the state directory accordingly.

Every change (the CA created or imported, a certificate issued or revoked,
the server credentials replaced, a CRL signed) holds the PKI lock
(:mod:`pki.lock`) from the files it reads to the last file it writes, so
changes from several processes (CLI commands, the service's CRL re-sign)
never undo each other. Each CRL carries a CRL number one higher than the
last: a CRL with a number at least N lists every revocation that the CRL
number N listed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pki.errors import PkiError
from pki.files import read_private, write_private, write_public
from pki.inventory import Inventory, IssuedCert
from pki.lock import PKI_LOCK_WAIT_SECONDS, pki_lock
from pki.names import check_client_name, check_server_name, check_server_names

__all__ = [
    "CA_VALIDITY_DAYS",
    "CLIENT_VALIDITY_DAYS",
    "CRL_VALIDITY_DAYS",
    "REVOCATION_REASONS",
    "SERVER_VALIDITY_DAYS",
    "CertificateAuthority",
    "Issued",
    "KeyType",
    "PkiPaths",
    "crl_number",
]

CA_VALIDITY_DAYS: Final = 3650
SERVER_VALIDITY_DAYS: Final = 397
CLIENT_VALIDITY_DAYS: Final = 397
#: A CRL is valid this long; the service re-signs it when less than a third is left.
CRL_VALIDITY_DAYS: Final = 30
#: Backdating of notBefore, for clients whose clocks run a little slow.
_CLOCK_SKEW: Final = dt.timedelta(minutes=5)

KeyType = Literal["ec", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

#: RFC 5280 reason names accepted by ``revoke`` (the CLI's --reason).
REVOCATION_REASONS: Final = {
    "unspecified": x509.ReasonFlags.unspecified,
    "keyCompromise": x509.ReasonFlags.key_compromise,
    "caCompromise": x509.ReasonFlags.ca_compromise,
    "affiliationChanged": x509.ReasonFlags.affiliation_changed,
    "superseded": x509.ReasonFlags.superseded,
    "cessationOfOperation": x509.ReasonFlags.cessation_of_operation,
    "certificateHold": x509.ReasonFlags.certificate_hold,
    "privilegeWithdrawn": x509.ReasonFlags.privilege_withdrawn,
}


@dataclass(frozen=True, slots=True)
class PkiPaths:
    """Where the CA, the server credentials and the CRL live."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def crl(self) -> Path:
        return self.directory / "crl.pem"

    @property
    def index(self) -> Path:
        return self.directory / "index.json"

    @property
    def issued(self) -> Path:
        return self.directory / "issued"


@dataclass(frozen=True, slots=True)
class Issued:
    """A freshly issued certificate and its private key."""

    certificate: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return key_pem(self.key)


def new_key(kind: KeyType = "ec") -> PrivateKey:
    """A new private key: ECDSA P-256, or RSA 3072."""
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    """The unencrypted PKCS#8 PEM of a private key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(data: bytes) -> PrivateKey:
    """A PEM private key (EC or RSA)."""
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PkiError("only EC and RSA keys are supported")
    return key


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _is_server_name(name: str) -> bool:
    try:
        check_server_name(name)
    except PkiError:
        return False
    return True


def default_server_names() -> list[str]:
    """localhost, the loopback addresses, and this machine's names (those that are DNS names)."""
    names = ["localhost", "127.0.0.1", "::1"]
    for name in (socket.gethostname(), socket.getfqdn()):
        if name and name not in names and _is_server_name(name):
            names.append(name)
    return names


def crl_number(crl: x509.CertificateRevocationList) -> int | None:
    """The CRL number of ``crl`` (None: it has none, e.g. signed by an older version)."""
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertificateAuthority:
    """The CA in a PKI directory. Create it with :meth:`create` or :meth:`ensure`."""

    def __init__(self, paths: PkiPaths) -> None:
        self.paths = paths
        self.inventory = Inventory(paths.index)

    def locked(self, wait: float = PKI_LOCK_WAIT_SECONDS) -> AbstractContextManager[None]:
        """The PKI lock, for a change (or a consistent read) of several files.

        Raises:
            pki.lock.PkiLockTimeout: another process held it for ``wait`` seconds.
        """
        return pki_lock(self.paths.directory, wait=wait)

    # -- the CA itself ---------------------------------------------------------

    @property
    def exists(self) -> bool:
        """Whether the CA certificate and key are present."""
        return self.paths.ca_cert.exists() and self.paths.ca_key.exists()

    def certificate(self) -> x509.Certificate:
        """The CA certificate."""
        try:
            return x509.load_pem_x509_certificate(self.paths.ca_cert.read_bytes())
        except (OSError, ValueError) as exc:
            raise PkiError(f"cannot read the CA certificate {self.paths.ca_cert}: {exc}") from None

    def _key(self) -> PrivateKey:
        try:
            return load_key(read_private(self.paths.ca_key))
        except (OSError, ValueError) as exc:
            raise PkiError(f"cannot read the CA key {self.paths.ca_key}: {exc}") from None

    def create(self, common_name: str | None = None, key_type: KeyType = "ec") -> None:
        """Create a new self-signed CA (replaces nothing: fails if one exists)."""
        key = new_key(key_type)
        with self.locked():
            if self.exists:
                raise PkiError(f"a CA already exists in {self.paths.directory}")
            self._create(key, common_name)

    def _create(self, key: PrivateKey, common_name: str | None) -> None:
        now = _now()
        name = x509.Name(
            [
                x509.NameAttribute(
                    NameOID.COMMON_NAME, common_name or f"Appliance CA {socket.gethostname()}"
                )
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + dt.timedelta(days=CA_VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        write_private(self.paths.ca_key, key_pem(key))
        write_public(self.paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
        self.write_crl()

    def ensure(self, server_names: list[str] | None = None) -> bool:
        """Create the CA, a server certificate and a CRL where missing (first start).

        Returns:
            True when something was created.
        """
        paths = self.paths
        if (
            paths.ca_cert.exists()
            and paths.server_cert.exists()
            and paths.server_key.exists()
            and not (paths.ca_key.exists() and self.crl_needs_refresh())
        ):
            return False  # nothing to do: every start of a set-up service, without the lock
        created = False
        with self.locked():
            if not self.paths.ca_cert.exists():
                self.create()
                created = True
            if not self.paths.server_cert.exists() or not self.paths.server_key.exists():
                self.rotate_server(server_names)
                created = True
            if self.paths.ca_key.exists() and self.crl_needs_refresh():
                self.write_crl()
        return created

    # -- issuing -----------------------------------------------------------------

    def _issue(
        self,
        subject: x509.Name,
        *,
        kind: Literal["server", "client"],
        names: list[str],
        days: int,
        key: PrivateKey,
    ) -> Issued:
        # The new key is made by the caller, before the lock: RSA takes a while.
        with self.locked():
            return self._sign(subject, kind=kind, names=names, days=days, key=key)

    def _sign(
        self,
        subject: x509.Name,
        *,
        kind: Literal["server", "client"],
        names: list[str],
        days: int,
        key: PrivateKey,
    ) -> Issued:
        ca_cert = self.certificate()
        ca_key = self._key()
        now = _now()
        usage = (
            ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(_san(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        issued = Issued(cert, key)
        write_public(self.paths.issued / f"{cert.serial_number:x}.pem", issued.cert_pem())
        self.inventory.add(IssuedCert.from_certificate(cert, kind))
        return issued

    def issue_server(
        self, names: list[str], *, days: int = SERVER_VALIDITY_DAYS, key_type: KeyType = "ec"
    ) -> Issued:
        """A server certificate for ``names`` (DNS names or IP addresses; the first is the CN).

        Raises:
            PkiError: a name is not a server name (:func:`pki.names.check_server_names`).
        """
        check_server_names(names)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        return self._issue(subject, kind="server", names=names, days=days, key=new_key(key_type))

    def issue_client(
        self,
        common_name: str,
        *,
        organization: str | None = None,
        days: int = CLIENT_VALIDITY_DAYS,
        key_type: KeyType = "ec",
    ) -> Issued:
        """A client certificate; its subject becomes the ``source`` of the client's events.

        Raises:
            PkiError: ``common_name`` is not a certificate name
                (:func:`pki.names.check_client_name`).
        """
        check_client_name(common_name)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        return self._issue(
            x509.Name(attributes), kind="client", names=[], days=days, key=new_key(key_type)
        )

    def rotate_server(self, names: list[str] | None = None, *, key_type: KeyType = "ec") -> Issued:
        """Issue a new active server certificate (server.pem/server.key).

        The service picks it up on SIGHUP or ``appliance cert reload``; open
        connections keep the certificate they were made with.
        """
        wanted = default_server_names()
        wanted += [n for n in names or [] if n not in wanted]
        check_server_names(wanted)
        key = new_key(key_type)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wanted[0])])
        # One lock from the signature to the last file: two rotations at once cannot
        # leave the key of one next to the certificate of the other.
        with self.locked():
            issued = self._sign(
                subject, kind="server", names=wanted, days=SERVER_VALIDITY_DAYS, key=key
            )
            write_private(self.paths.server_key, issued.key_pem())
            write_public(
                self.paths.server_cert, issued.cert_pem() + self.paths.ca_cert.read_bytes()
            )
        return issued

    # -- revocation ----------------------------------------------------------------

    def revoke(self, serial: int, reason: str = "unspecified") -> IssuedCert:
        """Mark ``serial`` revoked and re-sign the CRL, under one hold of the PKI lock.

        A serial that the index has revoked but the CRL does not list (an earlier
        revoke stopped between the two) gets its CRL now.

        Raises:
            PkiError: unknown reason or serial, or the serial is on the CRL already.
        """
        if reason not in REVOCATION_REASONS:
            raise PkiError(f"unknown reason {reason!r}; one of {', '.join(REVOCATION_REASONS)}")
        with self.locked():
            entry = self.inventory.get(serial)
            if entry.revoked_at is None:
                entry = self.inventory.revoke(serial, reason, _now())
            elif self._listed(serial):
                raise PkiError(f"certificate {entry.serial_hex} is already revoked")
            self.write_crl()
        return entry

    def _listed(self, serial: int) -> bool:
        try:
            crl = self.published_crl()
        except PkiError:
            return False
        return crl.get_revoked_certificate_by_serial_number(serial) is not None

    def published_crl(self) -> x509.CertificateRevocationList:
        """The CRL on disk, its signature checked against the CA certificate.

        Raises:
            PkiError: it cannot be read, or the CA did not sign it.
        """
        try:
            crl = x509.load_pem_x509_crl(self.paths.crl.read_bytes())
        except (OSError, ValueError) as exc:
            raise PkiError(f"cannot read the CRL {self.paths.crl}: {exc}") from None
        public_key = self.certificate().public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
            raise PkiError("only EC and RSA CA keys are supported")
        if not crl.is_signature_valid(public_key):
            raise PkiError(f"the CRL {self.paths.crl} is not signed by the CA {self.paths.ca_cert}")
        return crl

    def confirm_revoked(self, serial: int) -> int:
        """The number of the CRL on disk, once it is read back and found to list ``serial``.

        Raises:
            PkiError: the CRL cannot be read, is not the CA's, or does not list ``serial``.
        """
        crl = self.published_crl()
        if crl.get_revoked_certificate_by_serial_number(serial) is None:
            raise PkiError(f"the CRL {self.paths.crl} does not list serial {serial:x}")
        return crl_number(crl) or 0

    def _last_crl_number(self) -> int:
        """The highest CRL number signed so far: the index's, or the CRL file's if higher."""
        number = self.inventory.last_crl_number()
        try:
            on_disk = crl_number(x509.load_pem_x509_crl(self.paths.crl.read_bytes()))
        except (OSError, ValueError):
            on_disk = None
        return max(number, on_disk or 0)

    def write_crl(self) -> x509.CertificateRevocationList:
        """Sign a CRL listing every revoked serial, valid ``CRL_VALIDITY_DAYS``.

        Under the PKI lock from reading the index to writing ``crl.pem``: a
        revocation made meanwhile by another process is either in the index
        read here, or waits and signs a CRL of its own after this one.
        """
        with self.locked():
            return self._write_crl()

    def _write_crl(self) -> x509.CertificateRevocationList:
        ca_cert = self.certificate()
        ca_key = self._key()
        now = _now()
        number = self._last_crl_number() + 1
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now - _CLOCK_SKEW)
            .next_update(now + dt.timedelta(days=CRL_VALIDITY_DAYS))
            .add_extension(x509.CRLNumber(number), critical=False)
        )
        for entry in self.inventory.entries():
            if entry.revoked_at is None:
                continue
            revoked = (
                x509.RevokedCertificateBuilder()
                .serial_number(entry.serial)
                .revocation_date(entry.revoked_at)
                .add_extension(
                    x509.CRLReason(REVOCATION_REASONS[entry.reason or "unspecified"]),
                    critical=False,
                )
                .build()
            )
            builder = builder.add_revoked_certificate(revoked)
        crl = builder.sign(ca_key, hashes.SHA256())
        write_public(self.paths.crl, crl.public_bytes(serialization.Encoding.PEM))
        self.inventory.record_crl_number(number)
        return crl

    def refresh_crl(self, wait: float = PKI_LOCK_WAIT_SECONDS) -> bool:
        """Re-sign the CRL when it is missing or a third of its validity is left.

        The check and the signature are under one hold of the lock, so several
        processes that find it due sign it once between them.

        Returns:
            True when a new CRL was signed.

        Raises:
            pki.lock.PkiLockTimeout: another process held the lock for ``wait`` seconds.
        """
        with self.locked(wait):
            if not self.exists or not self.crl_needs_refresh():
                return False
            self._write_crl()
            return True

    def crl_needs_refresh(self) -> bool:
        """True when the CRL is missing or has less than a third of its validity left."""
        try:
            crl = x509.load_pem_x509_crl(self.paths.crl.read_bytes())
        except (OSError, ValueError):
            return True
        next_update = crl.next_update_utc
        if next_update is None:
            return True
        return next_update - _now() < dt.timedelta(days=CRL_VALIDITY_DAYS / 3)

    # -- import ----------------------------------------------------------------------

    def import_ca(self, cert_pem: bytes, key_pem_data: bytes) -> None:
        """Use an operator's CA (certificate and key) instead of the generated one."""
        cert = _load_cert(cert_pem)
        key = load_key(key_pem_data)
        _check_pair(cert, key)
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if not constraints.ca:
            raise PkiError("the certificate is not a CA certificate (basicConstraints CA:FALSE)")
        with self.locked():
            write_private(self.paths.ca_key, key_pem(key))
            write_public(self.paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
            self.write_crl()

    def import_server(self, chain_pem: bytes, key_pem_data: bytes) -> None:
        """Use an operator's server certificate (chain, leaf first) and key."""
        certs = x509.load_pem_x509_certificates(chain_pem)
        key = load_key(key_pem_data)
        _check_pair(certs[0], key)
        with self.locked():
            write_private(self.paths.server_key, key_pem(key))
            write_public(
                self.paths.server_cert,
                b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs),
            )


def _load_cert(data: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate: {exc}") from None


def _check_pair(cert: x509.Certificate, key: PrivateKey) -> None:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise PkiError("the private key does not belong to the certificate")
