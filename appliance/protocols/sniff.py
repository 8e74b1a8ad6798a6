"""What a client's first bytes on a TLS port say it speaks, when not TLS (pure: no I/O, no trio).

A plaintext client on a TLS listener is a common set-up mistake, and
OpenSSL reports it as a bare "wrong version number". The listener peeks at
the first bytes of each connection (without consuming them, so that the
handshake reads the same bytes) and hands them to :func:`plaintext_guess`,
which names the protocol they look like and the fix. Every TLS connection
starts with a handshake record; Fluentd forward requests are msgpack (or
JSON) arrays; Lumberjack frames start with their version, ``1`` or ``2``;
HTTP and the text protocols start with a letter.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "FORWARD_REASON",
    "LUMBERJACK_REASON",
    "SNIFF_BYTES",
    "TEXT_REASON",
    "TLS_HANDSHAKE_RECORD",
    "plaintext_guess",
]

#: Bytes :func:`plaintext_guess` looks at (the listener peeks this many): the first.
SNIFF_BYTES: Final = 1

#: The first byte of every TLS connection: a handshake record (RFC 8446 §5.1).
TLS_HANDSHAKE_RECORD: Final = 0x16
#: First bytes of a msgpack array (fixarray, array 16, array 32): a forward request.
_MSGPACK_ARRAY: Final = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
#: First bytes of a JSON array or map: a forward request in JSON.
_JSON_OPEN: Final = frozenset(b"[{")
#: Lumberjack's version bytes, the first of every frame (v1, v2).
_LUMBERJACK_VERSIONS: Final = frozenset(b"12")

FORWARD_REASON: Final = (
    "a plaintext Fluentd forward client on a TLS listener: enable TLS in the client "
    "(fluent-bit: tls on; fluentd out_forward: transport tls; fluent-logger: tls options)"
)
LUMBERJACK_REASON: Final = (
    "a plaintext Lumberjack client on a TLS listener: enable TLS (ssl) in the client"
)
TEXT_REASON: Final = "a plaintext client (HTTP or text) on a TLS listener: connect with TLS"


def plaintext_guess(head: bytes) -> str | None:
    """Why a connection's first bytes say the client is not speaking TLS, or None when it may be.

    ``head`` is what the connection has sent so far (any length; only the
    first :data:`SNIFF_BYTES` count). None for no bytes yet (nothing to
    tell) and for the start of a TLS handshake record.
    """
    if not head or head[0] == TLS_HANDSHAKE_RECORD:
        return None
    first = head[0]
    if first in _MSGPACK_ARRAY or first in _JSON_OPEN:
        return FORWARD_REASON
    if first in _LUMBERJACK_VERSIONS:
        return LUMBERJACK_REASON
    if head[:1].isalpha():
        return TEXT_REASON
    return f"the client's first byte 0x{first:02x} is not a TLS handshake: connect with TLS"
