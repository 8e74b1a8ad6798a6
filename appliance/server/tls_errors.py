"""Why a TLS handshake failed, in words an operator can act on.

OpenSSL's text (``[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca
(_ssl.c:1006)``) names a library routine; the log line says instead what
happened and whose side to look at, keeping OpenSSL's reason code in
brackets for searching. Codes not listed keep OpenSSL's text.
"""

from __future__ import annotations

import ssl
from typing import Final

__all__ = ["handshake_failure"]

#: OpenSSL reason code -> what it means for the operator (who has to act).
_PLAIN: Final = {
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust this server's certificate "
    "(unknown ca: give the client the appliance's CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client refused this server's certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the client refused this server's certificate "
    "(certificate unknown: does it name the host the client dialled?)",
    "TLSV1_ALERT_DECRYPT_ERROR": "the client could not verify the handshake",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate failed verification",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client sent no certificate, and this "
    "listener requires one (client_auth)",
    "NO_SHARED_CIPHER": "no cipher suite in common with the client",
    "NO_SUITABLE_SIGNATURE_ALGORITHM": "no signature algorithm in common with the client",
    "UNSUPPORTED_PROTOCOL": "the client offers only TLS versions this server refuses "
    "(TLS 1.2 and 1.3 are accepted)",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the client refuses every TLS version this server offers",
    "WRONG_VERSION_NUMBER": "not a TLS handshake (plaintext or another protocol)",
    "HTTP_REQUEST": "a plaintext HTTP request on a TLS port",
    "UNEXPECTED_EOF_WHILE_READING": "the client closed the connection during the handshake",
    "VERSION_TOO_LOW": "the client offers only TLS versions this server refuses",
}


def handshake_failure(error: BaseException | None) -> str:
    """A readable reason for a failed server-side handshake (``error``: its cause)."""
    if isinstance(error, ssl.SSLError):
        code = getattr(error, "reason", None)
        if isinstance(code, str) and code in _PLAIN:
            # OpenSSL's verify message says which check failed (revoked, expired, ...).
            detail = getattr(error, "verify_message", None)
            said = (
                f"{_PLAIN[code]}: {detail}" if isinstance(detail, str) and detail else _PLAIN[code]
            )
            return f"{said} [{code}]"
        if isinstance(code, str) and code:
            return f"TLS handshake failed [{code}]"
    if error is None:
        return "peer closed during handshake"
    text = str(error)
    return text or f"peer closed during handshake ({type(error).__name__})"
