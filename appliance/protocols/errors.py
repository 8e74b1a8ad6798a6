"""Protocol errors that say whose fault they are (the h11 convention).

A :class:`RemoteProtocolError` means the peer sent something we cannot
accept: the driver logs ``reason`` and closes that one connection, after
sending ``reply`` if the codec prepared one. A :class:`LocalProtocolError`
means the appliance itself misused a codec: it is a bug, never the peer's
fault, and is not meant to be caught.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every codec error."""

    def __init__(self, reason: str, *, reply: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        #: Bytes to send the peer before closing (for example a PONG false).
        self.reply = reply


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol; close this connection, log ``reason``."""


class LocalProtocolError(ProtocolError):
    """The appliance used a codec wrongly (a bug in the appliance)."""
