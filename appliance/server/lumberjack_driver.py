"""The Lumberjack (Beats) session: windows to rows, ordered acks, keepalives.

Mapping into ``events`` (issue 5, docs/lumberjack.md); the codec
(:mod:`appliance.protocols.lumberjack`) already took each value out of the
record and checked it, this module only fills the defaults:

* the record is a ``J`` frame's JSON text as sent, or a ``D`` frame's pairs
  as a JSON object (a value that is not UTF-8 as ``{"$binary": ...}``);
* ``tag`` is the first of the listener's ``tag_fields`` (dotted paths,
  default ``@metadata.beat`` then ``type``) whose value is a non-empty
  string, else the listener's ``tag``;
* ``host`` is ``host.name`` (Beats ≥ 6.3), ``beat.hostname`` (older Beats)
  or a string ``host`` (logstash-forwarder, v1), else null;
* the event time is ``@timestamp`` (RFC 3339, ASCII digits, within int64
  nanoseconds), else the receive time.

Strict strings (issue 13): a tag or host string from the record that cannot
be stored (over ``MAX_TAG_BYTES`` / ``MAX_HOST_BYTES``) does not fail the
window: that event gets the listener's ``tag`` / a null host, and the count
is logged (``event=fields.invalid``) and kept on the session. The record
itself is valid and is stored whole; refusing the window would make the
client resend it for ever.

Acks: each window's ack carries its highest sequence (the codec's rule) and
is built when it is sent, after the commit, from two numbers: the window's
events are not kept alive by the ack. Lumberjack batches carry no globally
unique id, so there is no dedupe: ``batch_id`` is empty.
"""

from __future__ import annotations

from functools import partial

from appliance.config import LumberjackListenerConfig, settings_from
from appliance.lake.rows import ROW_OVERHEAD_BYTES, RowBlock
from appliance.logs import get_logger
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.lumberjack import (
    LumberjackLimits,
    LumberjackServerConnection,
    Window,
)
from appliance.server.connection import Action, DriverSettings, StreamDriver, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo

__all__ = ["LumberjackSession", "lumberjack_driver", "window_block"]

log = get_logger("lumberjack")


def window_block(
    window: Window,
    settings: LumberjackListenerConfig,
    info: ConnectionInfo,
    received_at_ns: int,
) -> RowBlock:
    """The rows of one complete window."""
    texts = window.texts
    default = settings.tag
    return RowBlock(
        protocol="lumberjack",
        source=info.source,
        peer=info.peer,
        received_at_ns=received_at_ns,
        batch_id=None,
        tag=[default if tag is None else tag for tag in window.tags],
        host=window.hosts,
        times_ns=window.times_ns,
        records=texts,
        nbytes=sum(map(len, texts)) + ROW_OVERHEAD_BYTES * len(texts),
    )


class LumberjackSession:
    """One Lumberjack connection: the codec and what its windows become."""

    def __init__(self, settings: LumberjackListenerConfig, info: ConnectionInfo) -> None:
        self._settings = settings
        self._info = info
        self._codec = LumberjackServerConnection(
            settings_from(settings, LumberjackLimits), tag_fields=settings.tag_fields
        )
        self._error: RemoteProtocolError | None = None
        #: Events whose tag / host field held a string that cannot be stored,
        #: over the connection's life (each window's count is logged).
        self.invalid_tags = 0
        self.invalid_hosts = 0

    def greeting(self) -> bytes | None:
        return None

    def handshake_done(self) -> bool:
        return True  # Lumberjack has no handshake beyond TLS

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished frame (0 between frames).

        A frame, not a window, is the unit the request deadline times: a v1
        client may announce a window and send its events as they come (npm
        lumberjack-protocol), and a window's bytes are bounded by
        ``max_window_bytes`` anyway.
        """
        return self._codec.frame_bytes

    def pending_error(self) -> RemoteProtocolError | None:
        error, self._error = self._error, None
        return error

    def receive(self, data: bytes | bytearray, received_at_ns: int) -> list[Action]:
        windows = self._codec.receive_data(data)
        if windows:
            try:
                self._codec.receive_data(b"")  # surfaces a violation that followed them
            except RemoteProtocolError as error:
                self._error = error
        actions: list[Action] = []
        for window in windows:
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
                    window_block(window, self._settings, self._info, received_at_ns),
                    # Computed when sent (acks go out in window order after each
                    # commit); it keeps two numbers, not the window, alive.
                    ack=partial(self._codec.ack_bytes_for, highest, window.acks),
                    label=f"seq {highest}",
                    keepalive=self._codec.keepalive_bytes,
                )
            )
        return actions


def lumberjack_driver(settings: LumberjackListenerConfig, context: ServiceContext) -> StreamDriver:
    """The connection handler of one Lumberjack listener."""
    return StreamDriver(
        lambda info: LumberjackSession(settings, info),
        DriverSettings.from_listener(settings, keepalive_seconds=settings.keepalive_seconds),
        context.writer,
        context.lifecycle,
        log,
    )
