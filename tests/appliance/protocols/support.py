"""What the codec tests share: feeding reads, the violation that ends a codec's events,
and hypothesis strategies for JSON events of Beats-like shippers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

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


def json_values(names: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """JSON values a fast path must read as the general path does: ints past 64 bits,
    floats, and nested objects keyed by ``names``."""
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    return st.recursive(
        scalars | names,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(names, inner, max_size=2),
        max_leaves=5,
    )


def json_events(
    fields: Sequence[str], stamps: st.SearchStrategy[str], names: st.SearchStrategy[str]
) -> st.SearchStrategy[dict[str, Any]]:
    """Event objects of up to five of ``fields``: any JSON value, a time, or a small object
    with ``name``/``hostname``/``type``/``beat`` (where shippers nest a host or tag)."""
    value = json_values(names)
    return st.dictionaries(
        st.sampled_from(list(fields)),
        value
        | stamps
        | st.fixed_dictionaries(
            {}, optional={"beat": value, "name": value, "hostname": value, "type": value}
        ),
        max_size=5,
    )
