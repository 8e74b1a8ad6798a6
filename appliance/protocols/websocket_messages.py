"""The WebSocket listener's messages, sans-IO: JSON text in, frozen values out (docs/websocket.md).

No sockets, no clock, no trio: the driver (:mod:`appliance.server.websocket_listener`)
passes message texts and times in, and sends the texts this module builds.
What a message becomes in the table, and the live tail's messages, are
:mod:`appliance.rows.websocket`'s.

Ingest (``/ingest``), one WebSocket message per batch::

    {"id": "b-1", "tag": "web.app", "events": [{"time": 1732270000.5, "record": {...}}, ...]}

* ``id`` is a non-empty string of printable characters, valid UTF-8 and at
  most :data:`~appliance.blocks.text.MAX_BATCH_ID_BYTES` bytes, or an
  integer in int64; its text is the batch id, so a message resent with the
  same id after it was committed is acked again without a second write
  (dedupe scope below);
* ``tag`` is a non-empty string, valid UTF-8, at most
  :data:`~appliance.blocks.text.MAX_TAG_BYTES` bytes;
* ``events`` is a list of at most ``max_events_per_message`` objects with a
  ``record`` object and an optional ``time``: epoch seconds (a number,
  fraction allowed), an RFC 3339 string, or absent/null for the receive time;
* other keys are ignored, so senders may add their own. The protocol has no
  ``host``: the column is always null.

Every rule above is checked here, and a violation refuses the whole message
with an error answer naming the field (``MessageError``; nothing of it is
written, the connection carries on). There are no per-event drops: a client
of this protocol can always be told exactly what was wrong.

Times (docs/table.md, "Times"): a string must be ASCII RFC 3339
(:func:`appliance.blocks.timefmt.rfc3339_ns`: no ``²`` or Arabic-Indic digits) and a
number must be finite; either must name an instant that int64 epoch
nanoseconds hold (1677-09-21 .. 2262-04-11, :func:`~appliance.blocks.timefmt.ns_in_range`).
A present time that breaks this refuses the message (``events[i].time: ...``):
it is never silently replaced, since the client can fix and resend it. Only
an absent or null time means "the receive time". A float keeps the
nanoseconds the binary value holds (whole seconds and the fraction are
converted apart, so no rounding of a 19-digit product).

Dedupe scope (docs/table.md#dedupe-scope, docs/websocket.md): the writer's key is
``("websocket", source, id)``, and ``source`` is the authenticated principal,
``token:<name>`` or the client certificate's subject (the WebSocket listener
admits no anonymous peer). It deliberately does not include the connection:
a client that lost its connection must be able to resend its unacked
messages on a new one and have the committed ones recognised. So ids must be
unique per principal within the writer's dedupe window, and clients that
share one token (every browser running the same web app) must use ids that
are unique across all of them: a UUID (v4 or v7), or a random per-client
prefix and a counter. Two clients of one token that both send ``"id": 1``
both get an ack, and only the first message is stored.

Work and memory per message (docs/security.md): a message is at most
``max_message_bytes`` (characters of a text message) and holds at most
``max_containers_per_message`` JSON objects and arrays, counted before parsing
as the ``{`` and ``[`` characters anywhere in it (inside strings too, so the
count is an upper bound; :func:`appliance.protocols.bytescan.brackets`).
Containers cost most per byte: about 80 bytes and a garbage-collector entry
for the 3 bytes of ``[],``; without the cap, 1 MiB of ``[[0]],`` held 37 MiB
and took 100 to 200 ms of parsing on the event loop. Every other JSON value
needs at least one byte and a separator, so a message of ``n`` bytes builds at
most about ``n / 2`` Python objects. With the default limits, parsing a 1 MiB
message peaks at under 30 times its size (measured: 26.5 for one-character
strings ``"a",``, 28.5 with the cap's worth of empty lists; 24 in resident
memory) and takes at most about 40 ms. All of it is freed when
:func:`parse_ingest` returns, and the driver parses on its event loop, one
message at a time. What stays is the records' JSON text, at most 4 times the
message (``1e15`` is written back as ``1000000000000000.0``), which the
writer's byte accounting counts. The JSON parser caps nesting at 1024 levels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlsplit

import orjson

from appliance import defaults
from appliance.blocks.block import RowBlock
from appliance.blocks.errors import InvalidText
from appliance.blocks.records import plain_records_json, record_json, records_json
from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES, check_text
from appliance.blocks.timecache import Rfc3339Cache
from appliance.blocks.timefmt import ns_in_range, rfc3339_ns
from appliance.protocols.bytescan import brackets
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.limits import require_at_least_one

__all__ = [
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
]

#: Longest tail filter value (tag prefix, protocol), in characters.
MAX_FILTER_CHARS: Final = 1024
#: The two endpoints.
INGEST_PATH: Final = "/ingest"
TAIL_PATH: Final = "/tail"
_NS_PER_SECOND: Final = 1_000_000_000
_BEARER: Final = "bearer "
#: The ``id`` integers taken: what int64 holds, like every other integer column.
_MIN_ID: Final = -(2**63)
_MAX_ID: Final = 2**63 - 1

#: The JSON parser. One name so that a test can put the stdlib's in its place,
#: which (unlike orjson) yields lone surrogates and NaN, to prove the checks
#: after parsing do not rely on the parser refusing them.
_json_loads = orjson.loads

MessageId = str | int


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Limits of one ingest message."""

    #: Largest message, in bytes (characters of a text message).
    max_message_bytes: int = defaults.WEBSOCKET_MAX_MESSAGE_BYTES
    #: Events in one message.
    max_events_per_message: int = defaults.WEBSOCKET_MAX_EVENTS_PER_MESSAGE
    #: JSON objects and arrays in one message (``{`` and ``[`` characters).
    max_containers_per_message: int = defaults.WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE

    def __post_init__(self) -> None:
        require_at_least_one(
            self, "max_message_bytes", "max_events_per_message", "max_containers_per_message"
        )


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


_ID_RULE: Final = (
    f"id: must be an integer or a non-empty string of printable characters, "
    f"valid UTF-8, at most {MAX_BATCH_ID_BYTES} bytes"
)


def _message_id(value: object) -> MessageId | None:
    """The message's id, or None when it breaks :data:`_ID_RULE`."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if _MIN_ID <= value <= _MAX_ID else None
    if not isinstance(value, str) or not value or not value.isprintable():
        return None
    # isprintable() already refuses lone surrogates (category Cs); check_text
    # also bounds the UTF-8 bytes, the unit of the batch_id column's limit.
    try:
        return check_text(value, "id", MAX_BATCH_ID_BYTES)
    except InvalidText:
        return None


def _tag(value: object, message_id: MessageId) -> str:
    if not isinstance(value, str) or not value:
        raise MessageError("tag: must be a non-empty string", message_id)
    try:
        return check_text(value, "tag", MAX_TAG_BYTES)
    except InvalidText as exc:
        raise MessageError(exc.reason, message_id) from None  # "tag is ..."


def _seconds_ns(value: int | float) -> int | None:
    """Epoch nanoseconds of epoch seconds ``value``; None when int64 ns cannot hold them."""
    if isinstance(value, int):
        ns = value * _NS_PER_SECOND
    else:
        if not math.isfinite(value):
            return None
        # Whole seconds and fraction apart: both steps are exact for a float
        # (value - floor(value) loses no bits), so the result is the float's
        # own instant to the nanosecond, not a 19-digit product's rounding.
        whole = math.floor(value)
        ns = whole * _NS_PER_SECOND + round((value - whole) * _NS_PER_SECOND)
    return ns if ns_in_range(ns) else None


def _time_ns(value: object, index: int, message_id: MessageId) -> int | None:
    """An event's time (module docstring, "Times"); None: the receive time."""
    if value is None:
        return None
    if isinstance(value, str):
        ns = rfc3339_ns(value)
        if ns is None:
            raise MessageError(
                f"events[{index}].time: not an RFC 3339 timestamp (ASCII digits) "
                "between 1677-09-21 and 2262-04-11",
                message_id,
            )
        return ns
    if isinstance(value, int | float) and not isinstance(value, bool):
        ns = _seconds_ns(value)
        if ns is None:
            raise MessageError(
                f"events[{index}].time: not finite epoch seconds between 1677-09-21 and 2262-04-11",
                message_id,
            )
        return ns
    raise MessageError(
        f"events[{index}].time: must be epoch seconds or an RFC 3339 string", message_id
    )


def parse_ingest(
    data: str | bytes, limits: MessageLimits, times: Rfc3339Cache | None = None
) -> IngestMessage:
    """Validate one ingest message.

    ``times``: the connection's cache of RFC 3339 prefixes (a fresh one when
    None); it changes no result, only what a time costs.

    Raises:
        MessageError: the message is refused; its ``reply`` is the error answer.
    """
    if len(data) > limits.max_message_bytes:
        raise MessageError(f"message larger than {limits.max_message_bytes} bytes")
    # Counted before parsing, so that the objects are never built (module docstring).
    if brackets(data) > limits.max_containers_per_message:
        raise MessageError(
            f"more than {limits.max_containers_per_message} JSON objects and arrays "
            "(counted as '{' and '[' characters)"
        )
    try:
        document = _json_loads(data)
    except orjson.JSONDecodeError as exc:
        raise MessageError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MessageError("a message must be a JSON object with id, tag and events")
    message_id = _message_id(document.get("id"))
    if message_id is None:
        raise MessageError(_ID_RULE)
    tag = _tag(document.get("tag"), message_id)
    events = document.get("events")
    if not isinstance(events, list):
        raise MessageError("events: must be a list", message_id)
    if len(events) > limits.max_events_per_message:
        raise MessageError(
            f"events: {len(events)} events, more than {limits.max_events_per_message}", message_id
        )
    fast = _events_fast(events, message_id, times or Rfc3339Cache())
    if fast is not None:
        return IngestMessage(message_id, tag, *fast)
    return IngestMessage(message_id, tag, *_events(events, message_id))


def _events(
    events: list[object], message_id: MessageId
) -> tuple[tuple[int | None, ...], tuple[str, ...]]:
    """The times and record texts of ``events``, event by event; raises at the first bad one."""
    times: list[int | None] = []
    records: list[str] = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise MessageError(f"events[{index}]: must be an object", message_id)
        record = event.get("record")
        if not isinstance(record, dict):
            raise MessageError(f"events[{index}].record: must be an object", message_id)
        times.append(_time_ns(event.get("time"), index, message_id))
        # record_json always returns valid UTF-8 (lone surrogates become
        # $binary, NaN null: appliance/blocks/records.py), whatever the parser gave.
        records.append(record_json(record))
    return tuple(times), tuple(records)


def _events_fast(
    events: list[object], message_id: MessageId, cache: Rfc3339Cache
) -> tuple[tuple[int | None, ...], tuple[str, ...]] | None:
    """What :func:`_events` returns, a pass per column instead of Python calls per event.

    None when an event or a record is not an object (:func:`_events` then
    names the first). The times are :func:`_time_ns`'s (the cache gives
    rfc3339_ns of every string; the rest, numbers and refusals included, go
    through :func:`_time_ns` in order, so the first bad time is refused
    with its own index), and the texts are record_json's
    (:func:`~appliance.blocks.records.plain_records_json`, else
    :func:`~appliance.blocks.records.records_json`).
    """
    try:
        records = [event["record"] for event in events]  # type: ignore[index]
    except (TypeError, KeyError):  # an event that is no object, or has no record
        return None
    if records and set(map(type, records)) != {dict}:  # a set of types: no Python call per record
        return None
    # Every event is a dict here: a list or str event raised TypeError above.
    values = [event.get("time") for event in events]  # type: ignore[attr-defined]
    times, complete = cache.column_ns(values)
    if not complete and None in times:
        for index, (value, ns) in enumerate(zip(values, times, strict=True)):
            if ns is None and value is not None:
                times[index] = _time_ns(value, index, message_id)
    # A JSON parser builds only what plain_records_json takes (text keys,
    # no bytes, extension values or datetimes), and orjson then writes it
    # without OPT_NON_STR_KEYS, which makes each dumps call about 1.7 times
    # slower (docs/performance.md, "The WebSocket pass"); records_json takes
    # the rest (a lone surrogate from a parser that yields one, nesting past
    # orjson's limit), with the same texts either way.
    texts = plain_records_json(records)
    if texts is None:
        texts = records_json(records)
    return tuple(times), tuple(texts)


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
    try:
        parts = urlsplit(target)
    except ValueError:
        # urlsplit refuses a bracketed host that is not an IP address
        # ("//[x]/ingest"), which h11 admits as a target: the client's fault.
        raise MessageError("the request target is not a valid URL") from None
    query = parse_qs(parts.query, keep_blank_values=True)
    tag = query.get("tag", [""])[-1]
    protocol = query.get("protocol", [""])[-1] or None
    for value in (tag, protocol or ""):
        if len(value) > MAX_FILTER_CHARS:
            raise MessageError(f"a filter value is longer than {MAX_FILTER_CHARS} characters")
    return parts.path, TailFilter(tag, protocol)


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
