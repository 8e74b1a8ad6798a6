"""Client credential bundles: PEM (key and chain in one file) and PKCS#12."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from pki.authority import Issued

__all__ = ["pem_bundle", "pkcs12_bundle"]


def pem_bundle(issued: Issued, ca: x509.Certificate) -> bytes:
    """The private key, the certificate and the CA certificate, PEM, in that order."""
    return issued.key_pem() + issued.cert_pem() + ca.public_bytes(serialization.Encoding.PEM)


def pkcs12_bundle(issued: Issued, ca: x509.Certificate, name: str, passphrase: bytes) -> bytes:
    """A PKCS#12 file protected by ``passphrase`` (AES-256, as modern tools expect)."""
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50_000)
        .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
        .hmac_hash(hashes.SHA256())
        .build(passphrase)
    )
    return pkcs12.serialize_key_and_certificates(
        name.encode(), issued.key, issued.certificate, [ca], encryption
    )
