"""The one place that builds the appliance's TLS contexts.

TLS 1.2 is the minimum and 1.3 is preferred; TLS 1.2 offers only ECDHE
suites with AEAD ciphers; compression and renegotiation are off. Client
authentication is per listener: ``off``, ``optional`` or ``required``. When
it is on, client certificates are verified against the client CA and, when a
CRL is given, the leaf's serial is checked against it during the handshake,
so a revoked certificate never completes a connection. Why TLS everywhere:
docs/decisions.md#tls-unless-a-listener-says-otherwise.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final, Literal

from cryptography import x509

from pki.errors import PkiError

__all__ = ["TLS12_CIPHERS", "ClientAuth", "peer_subject", "server_context"]

#: TLS 1.2 suites: forward secrecy and AEAD only (TLS 1.3 suites are all modern).
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"

ClientAuth = Literal["off", "optional", "required"]


def server_context(
    cert_chain: Path,
    key: Path,
    *,
    client_auth: ClientAuth = "off",
    client_ca: Path | None = None,
    crl: Path | None = None,
) -> ssl.SSLContext:
    """A server-side context presenting ``cert_chain`` (leaf first) with ``key``.

    Raises:
        PkiError: a file is missing or unreadable, or client auth has no CA.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(cert_chain, key)
        if client_auth != "off":
            if client_ca is None:
                raise PkiError("client authentication needs a client CA certificate")
            context.verify_mode = (
                ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
            )
            context.load_verify_locations(cafile=client_ca)
            if crl is not None:
                context.load_verify_locations(cafile=crl)
                context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except (OSError, ssl.SSLError) as exc:
        raise PkiError(f"cannot build the TLS context: {exc}") from None
    return context


def peer_subject(der: bytes | None) -> str | None:
    """The subject (RFC 4514) of a verified client certificate in DER, or None without one."""
    if not der:
        return None
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()
