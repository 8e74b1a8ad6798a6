"""Event times written as text (RFC 3339, as Beats and Log Courier send ``@timestamp``)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Final

__all__ = ["rfc3339_ns"]

_RFC3339: Final = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9})\d*)?(Z|z|[+-]\d{2}:?\d{2})?\Z"
)


def rfc3339_ns(text: object) -> int | None:
    """Epoch nanoseconds of an RFC 3339 timestamp, or None when it is not one.

    Up to nine fraction digits are kept; a missing offset means UTC.
    """
    if not isinstance(text, str):
        return None
    match = _RFC3339.match(text)
    if match is None:
        return None
    date, clock, fraction, offset = match.groups()
    suffix = "+00:00" if offset in (None, "Z", "z") else offset
    try:
        when = dt.datetime.fromisoformat(f"{date}T{clock}{suffix}")
    except ValueError:
        return None
    nanos = int((fraction or "").ljust(9, "0"))
    seconds = int(when.timestamp())
    return seconds * 1_000_000_000 + nanos
