"""Event times as RFC 3339 text and as epoch nanoseconds, both ways.

Parsing (:func:`rfc3339_ns`) reads the ``@timestamp`` Beats and Log Courier
send and the WebSocket ``time`` strings; formatting (:func:`rfc3339_text`),
its inverse, writes the live tail's ``time``.

When parsing, only ASCII digits count (``str.isdigit()`` and the ``\\d`` of a ``str`` regex
also accept ``²`` or Arabic-Indic digits, which ``int()`` then refuses), and
only instants that int64 epoch nanoseconds hold (1677-09-21 to 2262-04-11,
the range of the ``event_time_ns`` column) are times: anything else is "no
usable time", which the rows layer replaces by the receive time
(docs/table.md, "Times").
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Final

__all__ = ["MAX_TIME_NS", "MIN_TIME_NS", "ns_in_range", "rfc3339_ns", "rfc3339_text"]

#: The instants the ``event_time_ns`` column (int64 nanoseconds) can hold.
MIN_TIME_NS: Final = -(2**63)
MAX_TIME_NS: Final = 2**63 - 1
#: The longest text taken for a time: 35 characters hold any RFC 3339 form
#: with nine fraction digits; extra fraction digits are tolerated up to here.
_MAX_TEXT: Final = 64
_NS_PER_SECOND: Final = 1_000_000_000
_SECONDS_PER_DAY: Final = 86_400

_RFC3339: Final = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.([0-9]{1,9})[0-9]*)?(Z|z|[+-][0-9]{2}:?[0-9]{2})?\Z",
    re.ASCII,
)


def ns_in_range(ns: int) -> bool:
    """Whether ``ns`` fits the int64 nanoseconds of the ``event_time_ns`` column."""
    return MIN_TIME_NS <= ns <= MAX_TIME_NS


def rfc3339_ns(text: object) -> int | None:
    """Epoch nanoseconds of an RFC 3339 timestamp, or None when it is not a usable one.

    Up to nine fraction digits are kept; a missing offset means UTC. None for
    anything that is not ASCII RFC 3339 text, and for instants outside
    :data:`MIN_TIME_NS` .. :data:`MAX_TIME_NS` (Go's zero time, year 1).
    """
    if not isinstance(text, str) or len(text) > _MAX_TEXT or not text.isascii():
        return None
    # Fast path for what Beats send: "2026-11-22T10:00:07.123Z" (UTC, "Z").
    n = len(text)
    if 20 <= n <= 30 and text[-1] == "Z" and text[10] == "T" and (n == 20 or text[19] == "."):
        fraction = text[20:-1]
        if fraction.isdigit() or not fraction:  # ASCII: checked above
            seconds = _epoch_seconds(text[:10], text[11:19], None)
            if seconds is not None and text[4] == "-" and text[13] == ":":
                ns = seconds * 1_000_000_000 + (int(fraction.ljust(9, "0")) if fraction else 0)
                return ns if ns_in_range(ns) else None
    match = _RFC3339.match(text)
    if match is None:
        return None
    date, clock, fraction, offset = match.groups()
    seconds = _epoch_seconds(date, clock, offset)
    if seconds is None:
        return None
    ns = seconds * 1_000_000_000 + (int(fraction.ljust(9, "0")) if fraction else 0)
    return ns if ns_in_range(ns) else None


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(date: str, clock: str, offset: str | None) -> int | None:
    # Events of one batch share their second: caching it makes the parse cheap.
    suffix = "+00:00" if offset in (None, "Z", "z") else offset
    try:
        return int(dt.datetime.fromisoformat(f"{date}T{clock}{suffix}").timestamp())
    except (ValueError, OverflowError):
        # OverflowError: an offset that moves year 1 or 9999 off the calendar.
        return None


def rfc3339_text(ns: int) -> str:
    """RFC 3339 UTC text of epoch nanoseconds, with nine fraction digits.

    The inverse of :func:`rfc3339_ns` over the int64 range
    (``rfc3339_ns(rfc3339_text(ns)) == ns``).
    """
    seconds, nanos = divmod(ns, _NS_PER_SECOND)
    days, rest = divmod(seconds, _SECONDS_PER_DAY)
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
