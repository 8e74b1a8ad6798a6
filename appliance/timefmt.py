"""Event times written as text (RFC 3339, as Beats and Log Courier send ``@timestamp``)."""

from __future__ import annotations

import datetime as dt
import functools
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
    # Fast path for what Beats send: "2026-11-22T10:00:07.123Z" (UTC, "Z").
    n = len(text)
    if 20 <= n <= 30 and text[-1] == "Z" and text[10] == "T" and (n == 20 or text[19] == "."):
        fraction = text[20:-1]
        if fraction.isdigit() or not fraction:
            seconds = _epoch_seconds(text[:10], text[11:19], None)
            if seconds is not None and text[4] == "-" and text[13] == ":":
                return seconds * 1_000_000_000 + (int(fraction.ljust(9, "0")) if fraction else 0)
    match = _RFC3339.match(text)
    if match is None:
        return None
    date, clock, fraction, offset = match.groups()
    seconds = _epoch_seconds(date, clock, offset)
    if seconds is None:
        return None
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    return seconds * 1_000_000_000 + nanos


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(date: str, clock: str, offset: str | None) -> int | None:
    # Events of one batch share their second: caching it makes the parse cheap.
    suffix = "+00:00" if offset in (None, "Z", "z") else offset
    try:
        return int(dt.datetime.fromisoformat(f"{date}T{clock}{suffix}").timestamp())
    except ValueError:
        return None
