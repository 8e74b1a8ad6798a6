"""What the codec tests share: feeding reads, and the violation that ends a codec's events."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from appliance.protocols.errors import ProtocolViolation

E = TypeVar("E")


def feed_reads(receive: Callable[[bytes], Sequence[E]], reads: Iterable[bytes]) -> list[E]:
    """The events of ``reads`` fed in order, up to and with a violation (nothing after it)."""
    events: list[E] = []
    for read in reads:
        events += receive(read)
        if events and isinstance(events[-1], ProtocolViolation):
            break
    return events


def violation(events: Sequence[object], match: str | None = None) -> ProtocolViolation:
    """The violation that ends ``events`` (whose reason matches the regex ``match``)."""
    assert events, "no events, no violation"
    last = events[-1]
    assert isinstance(last, ProtocolViolation), f"the events end with {last!r}, not a violation"
    if match is not None:
        assert re.search(match, last.reason), (match, last.reason)
    return last


def refused(events: Sequence[object]) -> bool:
    """Whether ``events`` end with a violation."""
    return bool(events) and isinstance(events[-1], ProtocolViolation)
