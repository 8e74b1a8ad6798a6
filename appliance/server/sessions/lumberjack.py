"""The Lumberjack (Beats) session: windows to rows, ordered acks, keepalives.

Mapping into ``events`` (docs/lumberjack.md) is
:mod:`appliance.rows.lumberjack`'s; the codec
(:mod:`appliance.protocols.lumberjack`) already took each value out of the
record and checked it.

Strict strings (docs/decisions.md#strict-strings): a tag or host string from the record that cannot
be stored (over ``MAX_TAG_BYTES`` / ``MAX_HOST_BYTES``) does not fail the
window: that event gets the listener's ``tag`` / a null host, and the count
is logged (``event=fields.invalid``) and kept on the session.

Acks: each window's ack carries its highest sequence (the codec's rule) and
is built when it is sent, after the commit, from two numbers: the window's
events are not kept alive by the ack. Lumberjack batches carry no globally
unique id, so there is no dedupe: ``batch_id`` is empty.
"""

from __future__ import annotations

from functools import partial

from appliance.config import LumberjackListenerConfig, settings_from
from appliance.logs import get_logger
from appliance.protocols.errors import ProtocolViolation
from appliance.protocols.lumberjack import (
    LumberjackLimits,
    LumberjackServerConnection,
)
from appliance.rows.lumberjack import window_block
from appliance.server.connection import Action, Arrival, DriverSettings, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo
from appliance.server.transports.stream import ByteStreamSession, StreamHandler, close_for

__all__ = ["LumberjackSession", "lumberjack_handler"]

log = get_logger("lumberjack")


class LumberjackSession(ByteStreamSession):
    """One Lumberjack connection: the codec and what its windows become."""

    def __init__(self, settings: LumberjackListenerConfig, info: ConnectionInfo) -> None:
        self._settings = settings
        self._info = info
        self._codec = LumberjackServerConnection(
            settings_from(settings, LumberjackLimits), tag_fields=settings.tag_fields
        )
        #: Events whose tag / host field held a string that cannot be stored,
        #: over the connection's life (each window's count is logged).
        self.invalid_tags = 0
        self.invalid_hosts = 0

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished frame (0 between frames).

        A frame, not a window, is the unit the request deadline times: a v1
        client may announce a window and send its events as they come (npm
        lumberjack-protocol), and a window's bytes are bounded by
        ``max_window_bytes`` anyway.
        """
        return self._codec.frame_bytes

    def completes_nothing(self, data: bytes | bytearray) -> bool:
        """What the codec's frame headers say: ``data`` leaves the unfinished frame short."""
        return self._codec.completes_nothing(data)

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        """The actions of the windows ``data`` completes (a violation's Close last)."""
        actions: list[Action[bytes]] = []
        for window in self._codec.receive_data(data):
            if isinstance(window, ProtocolViolation):
                actions.append(close_for(window))
                continue  # the codec's last event
            if window.invalid_tags or window.invalid_hosts:
                self.invalid_tags += window.invalid_tags
                self.invalid_hosts += window.invalid_hosts
                log.warning(
                    "fields.invalid", listener=self._info.listener, peer=self._info.peer,
                    sequence=window.highest_sequence, tags=window.invalid_tags,
                    hosts=window.invalid_hosts,
                )  # fmt: skip
            highest = window.highest_sequence
            actions.append(
                Submit(
                    window_block(
                        window,
                        tag=self._settings.tag,
                        source=self._info.source,
                        peer=self._info.peer,
                        received_at_ns=arrival.time_ns,
                    ),
                    # Computed when sent (acks go out in window order after each
                    # commit); it keeps two numbers, not the window, alive.
                    ack=partial(self._codec.ack_bytes_for, highest, window.acks),
                    label=f"seq {highest}",
                    keepalive=self._codec.keepalive_bytes,
                )
            )
        return actions


def lumberjack_handler(
    settings: LumberjackListenerConfig, context: ServiceContext
) -> StreamHandler:
    """The connection handler of one Lumberjack listener."""
    return StreamHandler(
        lambda info: LumberjackSession(settings, info),
        DriverSettings.from_listener(settings, keepalive_seconds=settings.keepalive_seconds),
        context.writer,
        context.lifecycle,
        log,
    )
