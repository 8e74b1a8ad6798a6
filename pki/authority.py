"""The appliance's certificate authority: created on first start, issues server certificates.

Keys are ECDSA P-256 by default (DESIGN §5). The layout under the state
directory's ``pki/``::

    ca.pem       the CA certificate: give it to clients to verify the server
    ca.key       the CA private key (0600)
    server.pem   the server certificate followed by the CA certificate
    server.key   the server private key (0600)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pki.files import write_private, write_public

__all__ = ["CA_VALIDITY_DAYS", "SERVER_VALIDITY_DAYS", "PkiPaths", "ensure_ca_and_server"]

CA_VALIDITY_DAYS: Final = 3650
SERVER_VALIDITY_DAYS: Final = 397


@dataclass(frozen=True, slots=True)
class PkiPaths:
    """Where the CA and server credentials live."""

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


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _create_ca(paths: PkiPaths, common_name: str) -> None:
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(paths.ca_key, _key_pem(key))
    write_public(paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM))


def _default_names() -> list[str]:
    names = ["localhost", "127.0.0.1", "::1"]
    for name in (socket.gethostname(), socket.getfqdn()):
        if name and name not in names:
            names.append(name)
    return names


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def issue_server(paths: PkiPaths, names: list[str]) -> None:
    """Issue a server certificate for ``names`` (DNS names or IP addresses) from the CA."""
    ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_private(paths.server_key, _key_pem(key))
    chain = cert.public_bytes(serialization.Encoding.PEM) + paths.ca_cert.read_bytes()
    write_public(paths.server_cert, chain)


def ensure_ca_and_server(paths: PkiPaths, extra_names: list[str] | None = None) -> bool:
    """Create the CA and a server certificate when they do not exist yet.

    Returns:
        True when something was created (first start).
    """
    created = False
    if not paths.ca_cert.exists() or not paths.ca_key.exists():
        _create_ca(paths, f"Appliance CA {socket.gethostname()}")
        created = True
    if created or not paths.server_cert.exists() or not paths.server_key.exists():
        names = _default_names()
        names += [n for n in extra_names or [] if n not in names]
        issue_server(paths, names)
        created = True
    return created
