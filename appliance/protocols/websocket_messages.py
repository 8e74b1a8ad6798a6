"""The WebSocket listener's messages, sans-IO: JSON text in, frozen values out (docs/websocket.md).

No sockets, no clock, no trio: the driver (:mod:`appliance.server.websocket_driver`)
passes message texts and times in, and sends the texts this module builds.

Ingest (``/ingest``), one WebSocket message per batch::

    {"id": "b-1", "tag": "web.app", "events": [{"time": 1732270000.5, "record": {...}}, ...]}

* ``id`` is a non-empty string or an integer; its text is the batch id, so a
  message resent with the same id after it was committed is acked again
  without a second write;
* ``tag`` is a non-empty string;
* ``events`` is a list of objects with a ``record`` object and an optional
  ``time``: epoch seconds (a number, fraction allowed), an RFC 3339 string,
  or absent/null for the receive time;
* other keys are ignored, so senders may add their own.

Answers: ``{"ack": id}`` once the events are committed; ``{"error": reason,
"id": id}`` (``id`` null when the message had none that could be read) when
nothing was written. Tail (``/tail``): one ``{"time": ..., "tag": ..., "record":
{...}, ...}`` per committed event, and ``{"dropped": n}`` when the client fell
behind and ``n`` events were left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlsplit

import orjson

from appliance.lake.rows import RowBlock
from appliance.protocols.errors import RemoteProtocolError
from appliance.records import record_json
from appliance.timefmt import rfc3339_ns

__all__ = [
    "DEFAULT_MAX_EVENTS_PER_MESSAGE",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "INGEST_PATH",
    "TAIL_PATH",
    "IngestMessage",
    "MessageError",
    "MessageLimits",
    "MessageRate",
    "TailFilter",
    "ack_json",
    "bearer_token",
    "dropped_json",
    "error_json",
    "origin_allowed",
    "parse_ingest",
    "parse_target",
    "tail_events_json",
]

#: Largest message, in bytes (characters of a text message).
DEFAULT_MAX_MESSAGE_BYTES: Final = 1024 * 1024
#: Events in one message.
DEFAULT_MAX_EVENTS_PER_MESSAGE: Final = 10_000
#: Longest ``id`` text, in characters.
MAX_ID_CHARS: Final = 256
#: Longest ``tag``, in characters.
MAX_TAG_CHARS: Final = 1024
#: Longest tail filter value (tag prefix, protocol), in characters.
MAX_FILTER_CHARS: Final = 1024
#: The two endpoints.
INGEST_PATH: Final = "/ingest"
TAIL_PATH: Final = "/tail"
#: Per-row overhead added to the record bytes when sizing a block for the writer.
_ROW_OVERHEAD_BYTES: Final = 96
_NS_PER_SECOND: Final = 1_000_000_000
#: Event times beyond signed 64-bit nanoseconds (year 2262) cannot be stored.
_MAX_TIME_NS: Final = 2**63 - 1
_BEARER: Final = "bearer "

MessageId = str | int


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Limits of one ingest message."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_events_per_message: int = DEFAULT_MAX_EVENTS_PER_MESSAGE


class MessageError(RemoteProtocolError):
    """A message that is refused: nothing of it is written; answer :attr:`reply`."""

    def __init__(self, reason: str, message_id: MessageId | None = None) -> None:
        super().__init__(reason, reply=error_json(reason, message_id).encode())
        #: The message's id when it could be read, else None.
        self.message_id = message_id


@dataclass(frozen=True, slots=True)
class IngestMessage:
    """One valid ingest message, its records already JSON text."""

    id: MessageId
    tag: str
    #: Epoch nanoseconds per event; None: the receive time.
    times_ns: tuple[int | None, ...]
    records: tuple[str, ...]

    @property
    def batch_id(self) -> str:
        """The writer's dedupe id: the text of ``id``."""
        return str(self.id)

    @property
    def nbytes(self) -> int:
        """Approximate memory of the rows, for the writer's byte limits."""
        return sum(map(len, self.records)) + _ROW_OVERHEAD_BYTES * len(self.records)

    def block(self, *, source: str, peer: str, received_at_ns: int) -> RowBlock:
        """The rows of this message (DESIGN §3 column meanings; no host)."""
        return RowBlock(
            protocol="websocket",
            source=source,
            peer=peer,
            received_at_ns=received_at_ns,
            batch_id=self.batch_id,
            tag=self.tag,
            host=None,
            times_ns=self.times_ns,
            records=self.records,
            nbytes=self.nbytes,
        )


def _message_id(value: object) -> MessageId | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return value
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable():
        return value
    return None


def _time_ns(value: object, index: int, message_id: MessageId) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        ns = rfc3339_ns(value)
        if ns is None:
            raise MessageError(f"events[{index}].time: not an RFC 3339 timestamp", message_id)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise MessageError(f"events[{index}].time: not a finite number", message_id)
        if abs(value) > _MAX_TIME_NS // _NS_PER_SECOND:
            raise MessageError(f"events[{index}].time: out of range", message_id)
        ns = value * _NS_PER_SECOND if isinstance(value, int) else round(value * _NS_PER_SECOND)
    else:
        raise MessageError(
            f"events[{index}].time: must be epoch seconds or an RFC 3339 string", message_id
        )
    if not -_MAX_TIME_NS <= ns <= _MAX_TIME_NS:
        raise MessageError(f"events[{index}].time: out of range", message_id)
    return ns


def parse_ingest(data: str | bytes, limits: MessageLimits) -> IngestMessage:
    """Validate one ingest message.

    Raises:
        MessageError: the message is refused; its ``reply`` is the error answer.
    """
    if len(data) > limits.max_message_bytes:
        raise MessageError(f"message larger than {limits.max_message_bytes} bytes")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MessageError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MessageError("a message must be a JSON object with id, tag and events")
    message_id = _message_id(document.get("id"))
    if message_id is None:
        raise MessageError(
            f"id: must be a non-empty string of at most {MAX_ID_CHARS} printable characters "
            "or an integer"
        )
    tag = document.get("tag")
    if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_CHARS:
        raise MessageError(
            f"tag: must be a non-empty string of at most {MAX_TAG_CHARS} characters", message_id
        )
    events = document.get("events")
    if not isinstance(events, list):
        raise MessageError("events: must be a list", message_id)
    if len(events) > limits.max_events_per_message:
        raise MessageError(
            f"events: {len(events)} events, more than {limits.max_events_per_message}", message_id
        )
    times: list[int | None] = []
    records: list[str] = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise MessageError(f"events[{index}]: must be an object", message_id)
        record = event.get("record")
        if not isinstance(record, dict):
            raise MessageError(f"events[{index}].record: must be an object", message_id)
        times.append(_time_ns(event.get("time"), index, message_id))
        records.append(record_json(record))
    return IngestMessage(message_id, tag, tuple(times), tuple(records))


# -- answers ------------------------------------------------------------------------


def ack_json(message_id: MessageId) -> str:
    """``{"ack": id}``: the message's events are committed."""
    return orjson.dumps({"ack": message_id}).decode()


def error_json(reason: str, message_id: MessageId | None = None) -> str:
    """``{"error": reason, "id": id}``: nothing of the message was written."""
    return orjson.dumps({"error": reason, "id": message_id}).decode()


def dropped_json(count: int) -> str:
    """``{"dropped": n}``: the tail client fell behind and ``n`` events were left out."""
    return orjson.dumps({"dropped": count}).decode()


# -- handshake ----------------------------------------------------------------------


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None when there is none."""
    for name, value in headers:
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            if text[: len(_BEARER)].lower() == _BEARER:
                return text[len(_BEARER) :].strip() or None
    return None


def header(headers: Iterable[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    """The first value of header ``wanted`` (lowercase name), or None."""
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("latin-1").strip()
    return None


def origin_allowed(origin: str | None, allowed: Sequence[str]) -> bool:
    """Whether a request with this Origin header may connect.

    No Origin header: not a browser, nothing to check (authentication still
    applies). A browser always sends one: it must be in ``allowed`` (or
    ``allowed`` holds ``"*"``); an empty list admits no browser.
    """
    if origin is None:
        return True
    if "*" in allowed:
        return True
    return origin.rstrip("/").lower() in {a.rstrip("/").lower() for a in allowed}


@dataclass(frozen=True, slots=True)
class TailFilter:
    """Which committed events a tail connection receives."""

    #: Events whose tag starts with this ("" for all).
    tag_prefix: str = ""
    #: Events of this protocol only (None for all).
    protocol: str | None = None

    def rows(self, block: RowBlock) -> list[int]:
        """Indexes of ``block``'s rows that pass the filter."""
        if self.protocol is not None and block.protocol != self.protocol:
            return []
        if isinstance(block.tag, str):
            return list(range(block.rows)) if block.tag.startswith(self.tag_prefix) else []
        prefix = self.tag_prefix
        return [i for i, tag in enumerate(block.tag) if tag.startswith(prefix)]


def parse_target(target: str) -> tuple[str, TailFilter]:
    """The path of a request target and its tail filter (``?tag=PREFIX&protocol=P``).

    Raises:
        MessageError: a filter value that is too long.
    """
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    tag = query.get("tag", [""])[-1]
    protocol = query.get("protocol", [""])[-1] or None
    for value in (tag, protocol or ""):
        if len(value) > MAX_FILTER_CHARS:
            raise MessageError(f"a filter value is longer than {MAX_FILTER_CHARS} characters")
    return parts.path, TailFilter(tag, protocol)


def _iso_ns(ns: int) -> str:
    """RFC 3339 UTC text of epoch nanoseconds, with nine fraction digits."""
    seconds, nanos = divmod(ns, _NS_PER_SECOND)
    days, rest = divmod(seconds, 86_400)
    # Civil date from days since 1970-01-01 (Howard Hinnant's algorithm):
    # valid over the whole int64 nanosecond range, unlike datetime's year 1..9999.
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{nanos:09d}Z"


def tail_events_json(block: RowBlock, rows: Sequence[int]) -> list[str]:
    """One tail message per row index of ``block`` (the record embedded as JSON, not text)."""
    out: list[str] = []
    for i in rows:
        time_ns = block.times_ns[i]
        if time_ns is None:
            time_ns = block.received_at_ns
        tag = block.tag if isinstance(block.tag, str) else block.tag[i]
        host = block.host if block.host is None or isinstance(block.host, str) else block.host[i]
        document = {
            "time": _iso_ns(time_ns),
            "time_ns": time_ns,
            "protocol": block.protocol,
            "tag": tag,
            "source": block.source,
            "peer": block.peer,
            "host": host,
            "batch_id": block.batch_id,
            "record": orjson.Fragment(block.records[i]),
        }
        out.append(orjson.dumps(document).decode())
    return out


class MessageRate:
    """Messages per second of one connection: a token bucket fed with the caller's clock.

    A burst of ``per_second`` messages passes at once; after that one more
    passes every ``1 / per_second`` seconds.
    """

    __slots__ = ("_allowance", "_last", "_per_second")

    def __init__(self, per_second: int, now: float) -> None:
        self._per_second = float(per_second)
        self._allowance = float(per_second)
        self._last = now

    def allow(self, now: float) -> bool:
        """Whether a message arriving at ``now`` (seconds) is within the rate."""
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._allowance = min(self._per_second, self._allowance + elapsed * self._per_second)
        if self._allowance < 1.0:
            return False
        self._allowance -= 1.0
        return True
