"""WebSocket messages as the answering loop's transport, over trio-websocket, and the close codes.

A unit is one message (text or binary) as trio-websocket assembled it; an
answer is one text message, sent within ``send_timeout`` (a client that
reads nothing must not hold its connection). The transport keeps how the
connection ended on its side, so the listener can close the WebSocket with
the right code: :attr:`WebSocketMessages.peer_close_code` when the peer
closed it, :attr:`WebSocketMessages.send_failure` when an answer could not
be sent.
"""

from __future__ import annotations

from typing import Final

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from appliance.server.connection import PeerGone
from appliance.server.listener import ConnectionInfo

__all__ = [
    "CLOSE_ABNORMAL",
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "SHUTTING_DOWN",
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
