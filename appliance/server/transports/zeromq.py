"""ZeroMQ sockets driven from trio, and a socket's messages as the answering loop's transport.

How the sockets meet trio (docs/logjam.md, "Sockets and trio"): every socket
is used only from the trio thread. A reader waits on the socket's file
descriptor with :func:`trio.lowlevel.wait_readable` and then drains while
``ZMQ_EVENTS`` reports ``POLLIN``. ZeroMQ's descriptor is edge-triggered and
any send or ``EVENTS`` query may consume the edge, so a reply sent by another
task wakes the reader (:meth:`Pump.poke`) to look again, and the wait
re-checks ``EVENTS`` every ``FD_RECHECK_SECONDS`` as a second guard. No
message crosses a thread, a slow writer stops the reader (libzmq then queues
up to ``rcvhwm`` messages per peer and TCP pushes back), and shutdown is a
trio cancel.

Bounded work per message (docs/decisions.md#every-queue-has-a-limit): the pump reads at most
``MAX_MESSAGE_FRAMES + 1`` frames of a message as views (no copy) and drops
the rest unread in batches of ``DISCARD_BATCH_FRAMES`` with a checkpoint
between batches, so a message of a million empty frames costs neither a
million copies nor a stalled event loop. (libzmq itself holds a message's
frames until its last one arrives; ``max_message_bytes`` bounds each frame,
not their number, and no ZeroMQ option bounds that.)

:class:`ZeroMQFrames` is one socket as the loop's transport: a unit is a
:class:`ZmqMessage` (the frames kept, the peer's address and CURVE user id,
the frames dropped), an answer is a reply's frames. A reply that cannot be
sent (the peer's queue is full, the peer is gone) is counted and logged and
costs no other peer anything: it never ends the socket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import trio
import zmq

from appliance.logs import StructLogger
from appliance.metrics import ListenerMetrics
from appliance.protocols.logjam import MAX_MESSAGE_FRAMES, FrameData

__all__ = [
    "DISCARD_BATCH_FRAMES",
    "FD_RECHECK_SECONDS",
    "REPLY_LINGER_SECONDS",
    "Pump",
    "ZeroMQFrames",
    "ZmqMessage",
    "frame_property",
]

#: Longest wait on a socket's descriptor before ``ZMQ_EVENTS`` is asked again.
FD_RECHECK_SECONDS: Final = 1.0
#: Frames past ``MAX_MESSAGE_FRAMES`` are dropped unread this many at a time,
#: with a trio checkpoint between batches (a count).
DISCARD_BATCH_FRAMES: Final = 1024
#: Seconds the last replies may take to leave when the listener closes.
REPLY_LINGER_SECONDS: Final = 2.0


class Pump:
    """One ZeroMQ socket driven from trio: edge-triggered FD, drained by ``EVENTS``.

    A message is read frame by frame, at most ``max_frames + 1`` of them: a
    message with more sets :attr:`truncated`, and its other frames stay
    unread until :meth:`discard_rest` drops them.
    """

    def __init__(self, sock: zmq.Socket[bytes], max_frames: int = MAX_MESSAGE_FRAMES) -> None:
        self.sock = sock
        self._fd = sock.FD
        self._waiting: trio.CancelScope | None = None
        self._max_frames = max_frames
        #: The last message received has frames past ``max_frames + 1`` still unread.
        self.truncated = False

    def try_receive(self) -> list[zmq.Frame] | None:
        """The next message's first frames if one is queued (not copied: their metadata is read).

        libzmq delivers a message whole, so once its first frame is here every
        other one is too and the non-blocking reads of the rest cannot fail.
        """
        assert not self.truncated, "discard_rest() first"
        if not int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN:
            return None
        try:
            frames = [self.sock.recv(zmq.NOBLOCK, copy=False)]
        except zmq.Again:
            return None
        while frames[-1].more and len(frames) <= self._max_frames:
            frames.append(self.sock.recv(zmq.NOBLOCK, copy=False))
        self.truncated = frames[-1].more
        return frames

    async def discard_rest(self) -> int:
        """Drop the unread frames of a truncated message; returns how many there were.

        Linear in the frames, with a checkpoint every ``DISCARD_BATCH_FRAMES``
        so a message of millions of frames does not stall the other tasks.
        """
        dropped = 0
        while self.truncated:
            for _ in range(DISCARD_BATCH_FRAMES):
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
                dropped += 1
                if not frame.more:
                    self.truncated = False
                    break
            await trio.lowlevel.checkpoint()
        return dropped

    async def receive(self) -> list[zmq.Frame]:
        """The next message's frames, waiting for one."""
        while True:
            frames = self.try_receive()
            if frames is not None:
                return frames
            with trio.move_on_after(FD_RECHECK_SECONDS) as self._waiting:
                await trio.lowlevel.wait_readable(self._fd)
            self._waiting = None

    def poke(self) -> None:
        """Make a waiting :meth:`receive` look at ``EVENTS`` again (after a send)."""
        if self._waiting is not None:
            self._waiting.cancel()

    def send(self, frames: Sequence[bytes]) -> str | None:
        """Send without blocking; the reason it could not be sent, or None."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return "the peer's reply queue is full (sndhwm)"
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return "the peer is gone"
            # Any other failure loses this one reply, never the listener.
            return f"send failed: {exc.strerror}"
        finally:
            self.poke()
        return None

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        self.sock.close(linger=int(REPLY_LINGER_SECONDS * 1000))


def frame_property(frame: zmq.Frame, name: str) -> str:
    """A message property of ``frame`` (``Peer-Address``, ``User-Id``), or "" when it has none."""
    try:
        value = frame.get(name)
    except zmq.ZMQError:
        return ""
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class ZmqMessage:
    """One message read from a socket."""

    #: Views of libzmq's buffers (the codec copies a frame once its size is checked).
    frames: list[FrameData]
    #: ZeroMQ's ``Peer-Address`` of the message ("" when it has none).
    peer: str
    #: The ZAP user id (the CURVE key's name), "" without CURVE.
    user_id: str
    #: Frames past ``MAX_MESSAGE_FRAMES + 1``, dropped unread.
    dropped: int


class ZeroMQFrames:
    """One ZeroMQ socket's messages in, reply frames out (never raises ``PeerGone``)."""

    def __init__(
        self, pump: Pump, *, listener: str, log: StructLogger, metrics: ListenerMetrics
    ) -> None:
        self._pump = pump
        self._listener = listener
        self._log = log
        self._metrics = metrics
        #: Replies sent, and replies that could not be.
        self.sent = 0
        self.unsent = 0

    async def receive(self) -> ZmqMessage:
        """The next message (one already queued is taken without a wait)."""
        pump = self._pump
        zframes = pump.try_receive()
        if zframes is None:
            zframes = await pump.receive()
        else:
            # A flood must not starve the other tasks; a message taken is
            # never dropped by a cancel here.
            await trio.lowlevel.cancel_shielded_checkpoint()
        dropped = 0
        if pump.truncated:
            # Frames past MAX_MESSAGE_FRAMES were never copied: drop them unread
            # (linear, with checkpoints), before the next message can be read.
            with trio.CancelScope(shield=True):
                dropped = await pump.discard_rest()
        last = zframes[-1]
        frames: list[FrameData] = [f.buffer for f in zframes]
        self._metrics.received_bytes.inc(sum(map(len, frames)))
        return ZmqMessage(frames, frame_property(last, "Peer-Address"),
                          frame_property(last, "User-Id"), dropped)  # fmt: skip

    async def send(self, frames: list[bytes]) -> None:
        """Send a reply without blocking; one that cannot be sent is counted and logged."""
        problem = self._pump.send(frames)
        if problem is None:
            self.sent += 1
            return
        self.unsent += 1
        self._log.warning("reply.undeliverable", listener=self._listener, reason=problem)
