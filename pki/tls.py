"""The one place that builds the appliance's TLS contexts (DESIGN §5).

TLS 1.2 is the minimum and 1.3 is preferred; TLS 1.2 offers only ECDHE
suites with AEAD ciphers; compression and renegotiation are off.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

__all__ = ["TLS12_CIPHERS", "server_context"]

#: TLS 1.2 suites: forward secrecy and AEAD only (TLS 1.3 suites are all modern).
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(cert_chain: Path, key: Path) -> ssl.SSLContext:
    """A server-side context presenting ``cert_chain`` (leaf first) with ``key``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    context.load_cert_chain(cert_chain, key)
    return context
