"""Protocol errors that say whose fault they are (the h11 convention), and the violation event.

A codec reports a broken protocol to its user as its final event, a
:class:`ProtocolViolation` (the wsproto way: its event stream ends with the
close and the answer to send): nothing is returned after it and the codec is
closed. Inside a codec the violation travels as a
:class:`RemoteProtocolError`, raised where it is found and turned into the
event at the codec's edge; a session or driver never catches one.

A :class:`LocalProtocolError` means the appliance itself misused a codec: it
is a bug, never the peer's fault, and is not meant to be caught.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Fault",
    "LocalProtocolError",
    "ProtocolError",
    "ProtocolViolation",
    "RemoteProtocolError",
]

#: Whose fault a violation is: the peer's (it broke the protocol or a limit)
#: or the appliance's (it cannot serve the peer now, e.g. its credential
#: store is unavailable).
Fault = Literal["peer", "appliance"]


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


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """A codec's final event: the connection ends; send ``reply`` first, log ``reason``.

    Events that came before it in the same input are valid and are returned
    before it (their batches may still be committed and acknowledged).
    """

    reason: str
    #: Bytes to send the peer before closing (for example a PONG false); b"" for none.
    reply: bytes = b""
    fault: Fault = "peer"

    @classmethod
    def of(cls, error: RemoteProtocolError, fault: Fault = "peer") -> ProtocolViolation:
        """The event of a violation a codec raised internally."""
        return cls(error.reason, error.reply, fault)
