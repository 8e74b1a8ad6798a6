"""The WebSocket ingest session: each message parsed, mapped to its rows, answered in order.

Parsing and the answers' JSON are the sans-IO
:mod:`appliance.protocols.websocket_messages`; ordering, acks after commit
and backpressure are the answering loop's. A message is answered
``{"ack": id}`` once the commit that holds it succeeded, and
``{"error": reason, "id": id}`` when it was refused and nothing of it
written: invalid JSON, a bad field, too many events, a tag outside the
token's prefixes, over ``max_messages_per_second``, or a block the writer
refused (at submit or at commit). A refused message does not end the
connection: the next message is independent of it.

Dedupe scope: a message's batch id is its ``id``, deduplicated per
``source`` (the principal ``token:<name>`` or the certificate subject, not
the connection), so a resend on a new connection is recognised.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from appliance.blocks.errors import BlockRefused
from appliance.blocks.timecache import Rfc3339Cache
from appliance.config import WebSocketListenerConfig, settings_from
from appliance.logs import get_logger
from appliance.protocols.websocket_messages import (
    MessageError,
    MessageId,
    MessageLimits,
    MessageRate,
    ack_json,
    error_json,
    parse_ingest,
)
from appliance.rows.websocket import ingest_block
from appliance.server.connection import Action, Arrival, Reply, SessionDefaults, Submit
from appliance.server.listener import ConnectionInfo

if TYPE_CHECKING:
    from auth.records import TokenGrant

__all__ = ["IngestSession"]

log = get_logger("websocket")


class IngestSession(SessionDefaults[str]):
    """One ``/ingest`` connection: its messages and what they become.

    Args:
        settings: the listener's configuration.
        info: the connection (its peer and metrics).
        source: the authenticated principal, the rows' ``source``.
        grant: the bearer token's grant (its tag prefixes), None for a certificate.
        now: trio's clock at the start (the message rate's bucket starts full).
    """

    def __init__(
        self,
        settings: WebSocketListenerConfig,
        info: ConnectionInfo,
        *,
        source: str,
        grant: TokenGrant | None,
        now: float,
    ) -> None:
        self._settings = settings
        self._limits = settings_from(settings, MessageLimits)
        self._info = info
        self._source = source
        self._grant = grant
        self._rate = MessageRate(settings.max_messages_per_second, now)
        #: The connection's RFC 3339 prefixes (appliance/blocks/timecache.py), bounded.
        self._times = Rfc3339Cache()

    def decode_bytes(self, data: str | bytes) -> int:
        """The message's length (messages are at most ``max_message_bytes``)."""
        return len(data)

    def receive(self, data: str | bytes, arrival: Arrival) -> list[Action[str]]:
        """The message's Submit, or the Reply that refuses it."""
        if not self._rate.allow(arrival.clock):
            reason = f"more than {self._settings.max_messages_per_second} messages per second"
            self._info.metrics.protocol_error(reason)
            return [self._refused(MessageError(reason))]
        try:
            message = parse_ingest(data, self._limits, self._times)
        except MessageError as exc:
            self._info.metrics.protocol_error(exc.reason)
            return [self._refused(exc)]
        grant = self._grant
        if grant is not None and not grant.allows_tag(message.tag):
            reason = f"tag {message.tag!r} is outside the token's tag prefixes"
            self._info.metrics.protocol_error("tag outside the token's prefixes")
            return [self._refused(MessageError(reason, message.id))]
        block = ingest_block(
            message, source=self._source, peer=self._info.peer, received_at_ns=arrival.time_ns
        )
        return [
            Submit(
                block,
                ack=ack_json(message.id),
                label=str(message.id),
                # Checked at submit before it joined a commit group (no other
                # batch is affected), or refused at its commit.
                refused=partial(self._not_stored, message.id),
            )
        ]

    def _not_stored(self, message_id: MessageId, exc: BlockRefused) -> str:
        return self._refused(MessageError(f"not stored: {exc.reason}", message_id)).data

    def _refused(self, error: MessageError) -> Reply[str]:
        log.warning("websocket.message_refused", peer=self._info.peer, id=error.message_id,
                    reason=error.reason)  # fmt: skip
        return Reply(error_json(error.reason, error.message_id))
