"""WebSocket messages as the answering loop's transport, over trio-websocket, and the close codes.

A unit is one message (text or binary) as trio-websocket assembled it; an
answer is one text message, sent within ``send_timeout`` (a client that
reads nothing must not hold its connection). The transport keeps how the
connection ended on its side, so the listener can close the WebSocket with
the right code: :attr:`WebSocketMessages.peer_close_code` when the peer
closed it, :attr:`WebSocketMessages.send_failure` when an answer could not
be sent.

Unmasking: every byte a client sends is XORed with its frame's key (RFC
6455 section 5.3), about 5% of the server's CPU on ``/ingest`` with
wsproto's own masker (``bytearray.translate`` of four strided slices per
read). wsproto takes no masker as an option: its ``FrameDecoder`` builds a
``frame_protocol.XorMaskerSimple`` by that module-level name for each masked
frame header (``parse_header`` in
https://github.com/python-hyper/wsproto/blob/820701baf101b8c364a879440e1215da2fb0973f/src/wsproto/frame_protocol.py,
1.3.2). Importing this module binds that name to :class:`VectorMasker`, a
subclass with the same interface and output whose XOR is
:func:`appliance.protocols.bytescan.xor_mask` (numpy once the process has
it: 4 against 28-60 µs per 16 KiB TLS record).
tests/appliance/server/test_websocket_transport.py holds it to
wsproto's masker byte for byte and checks that wsproto's decoder uses it, so
a wsproto that builds its masker another way fails a test instead of
silently going slower.
"""

from __future__ import annotations

from typing import Final

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection
from wsproto import frame_protocol

from appliance.protocols.bytescan import xor_mask
from appliance.server.connection import PeerGone
from appliance.server.listener import ConnectionInfo

__all__ = [
    "CLOSE_ABNORMAL",
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "SHUTTING_DOWN",
    "VectorMasker",
    "WebSocketMessages",
]

#: WebSocket close codes (RFC 6455 §7.4.1).
CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_ABNORMAL: Final = 1006  # never sent: what a peer that vanished is recorded as
CLOSE_POLICY: Final = 1008
CLOSE_INTERNAL_ERROR: Final = 1011
#: The close reason when the service stops.
SHUTTING_DOWN: Final = "the appliance is shutting down"


class VectorMasker(frame_protocol.XorMaskerSimple):
    """wsproto's masker, the XOR done by :func:`~appliance.protocols.bytescan.xor_mask`.

    Same contract as the parent's ``process``: a new bytearray, and the key
    rotated so that the frame's next read continues where this one stopped.
    """

    def __init__(self, masking_key: bytearray | bytes) -> None:
        super().__init__(masking_key)
        self._key = bytes(masking_key)

    def process(self, data: bytearray) -> bytearray:
        out = bytearray(data)
        if out:
            key = self._key
            xor_mask(out, key)
            rotation = len(out) % 4
            self._key = key[rotation:] + key[:rotation]
        return out


# Module docstring, "Unmasking": wsproto looks the name up at every masked frame header.
frame_protocol.XorMaskerSimple = VectorMasker  # type: ignore[misc]


class WebSocketMessages:
    """One WebSocket connection's messages in, text answers out."""

    def __init__(self, ws: WebSocketConnection, info: ConnectionInfo, send_timeout: float) -> None:
        self._ws = ws
        self._info = info
        self._send_timeout = send_timeout
        #: The code of the peer's close, once a read saw it.
        self.peer_close_code: int | None = None
        #: The close code and reason once an answer could not be sent.
        self.send_failure: tuple[int, str] | None = None

    async def receive(self) -> str | bytes:
        """The next message.

        Raises:
            PeerGone: the peer closed the WebSocket.
        """
        try:
            data = await self._ws.get_message()
        except ConnectionClosed as exc:
            closed = exc.reason
            self.peer_close_code = closed.code if closed else CLOSE_NORMAL
            raise PeerGone("the peer closed the WebSocket") from None
        self._info.metrics.received_bytes.inc(len(data))
        return data

    async def send(self, text: str) -> None:
        """Send one answer.

        Raises:
            PeerGone: the client is gone (rows it sent still commit; a resend is
                deduplicated), or read nothing for ``send_timeout`` seconds.
        """
        with trio.move_on_after(self._send_timeout) as stalled:
            try:
                await self._ws.send_message(text)
            except ConnectionClosed:
                self.send_failure = self.send_failure or (CLOSE_NORMAL, "")
                raise PeerGone("the peer closed the WebSocket") from None
        if stalled.cancelled_caught:
            reason = f"read nothing for {self._send_timeout}s"
            self.send_failure = self.send_failure or (CLOSE_POLICY, reason)
            raise PeerGone(reason)
