"""Log Courier's framing: the message header, the HELO and VERS layouts, writing a message.

Every message is ``type (4 bytes) | length (u32, big-endian) | body``
(appliance/protocols/courier/connection.py).
"""

from __future__ import annotations

import struct
from typing import Final

from appliance.protocols.errors import LocalProtocolError

__all__ = [
    "FLAG_SUPPORTS_EVNT",
    "MAX_COMPACT_HELLO_BYTES",
    "MAX_HELLO_BYTES",
    "SERVER_ID",
    "STREAMED_LENGTH",
    "encode_message",
]

#: The length field of an EVNT message: "streamed, ends with the zlib stream".
STREAMED_LENGTH: Final = 0xFFFFFFFF
#: Longest HELO body accepted (the Go receiver refuses more, ``protocolhelo.go``).
MAX_HELLO_BYTES: Final = 32
#: Longest HELO body read in the compact layout of the Ruby client v2.7.0 and
#: v2.7.1 (8 bytes, ``client_tcp.rb`` ``pack('A4NCCCCA4')``); longer bodies
#: are the Go layout (the Ruby client sends 20 bytes of it since v2.7.2).
MAX_COMPACT_HELLO_BYTES: Final = 8
#: Bit of the first flags byte of HELO/VERS: "I accept EVNT" (``protocolvers.go``).
FLAG_SUPPORTS_EVNT: Final = 0x01
#: The appliance's four-byte id in VERS (Log Courier's own are LCOR, LCVR, RYLC).
SERVER_ID: Final = b"APPL"

_HEADER: Final = struct.Struct(">4sI")
_U32: Final = struct.Struct(">I")
#: The Go layout of HELO/VERS: flags[4], major, minor, patch (u32), client[4], reserved[12].
_WIDE_HELLO: Final = struct.Struct(">4sIII4s12x")
#: The compact layout (Ruby v2.7.0/v2.7.1): flags, major, minor, patch (u8), client[4].
_COMPACT_HELLO: Final = struct.Struct(">BBBB4s")
#: Message types only a server may send; a client sending one is broken.
_SERVER_TYPES: Final = frozenset({b"VERS", b"PONG", b"ACKN"})


def encode_message(kind: bytes, body: bytes = b"") -> bytes:
    """One message: four-byte type, u32 length, body."""
    if len(kind) != 4:
        raise LocalProtocolError(f"message type {kind!r} is not 4 bytes")
    return _HEADER.pack(kind, len(body)) + body
