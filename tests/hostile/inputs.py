"""Inputs every protocol with text times must treat alike (appliance/blocks/timefmt.py)."""

from __future__ import annotations

# -- times every protocol with text times must treat alike --------------------------

#: ``@timestamp`` / ``time`` values that name no instant int64 nanoseconds hold,
#: or are not ASCII RFC 3339 (appliance/blocks/timefmt.py, docs/table.md).
BAD_TIMESTAMPS: list[object] = [
    "2024-01-01T00:00:0\u00b2Z",  # superscript two: str.isdigit() says yes, int() says no
    "2024-01-01T00:00:0\u0663Z",  # Arabic-Indic three
    "2024-01-01T00:00:0\uff13Z",  # fullwidth three
    "\uff12\uff10\uff12\uff14-01-01T00:00:00Z",  # fullwidth year
    "2024-01-01T00:00:00.\uff11\uff12\uff13Z",  # fullwidth fraction
    "2024-01-01T00:00:00.123\u0663Z",
    "2024-01-01T0\u00b9:00:00+01:00",  # superscript one in the hour, slow path
    "2024-01-01T00:00:00+0\u00b2:00",  # in the offset
    "0001-01-01T00:00:00Z",  # Go's zero time
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:00:00-14:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999999+14:00",
    "9999-12-31T23:59:59.999999999-14:00",
    "2262-04-11T23:47:16.854775808Z",  # one ns past int64
    "1677-09-21T00:12:43.145224191Z",  # one ns before int64
    "2024-13-45T25:61:61Z",
    "2024-01-01T00:00:00." + "9" * 5000 + "Z",
    "",
]


def short_id(value: object) -> str:
    """A test id for a parameter: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: Times at the very ends of int64 nanoseconds: stored exactly.
EXTREME_TIMESTAMPS: list[tuple[str, int]] = [
    ("2262-04-11T23:47:16.854775807Z", 2**63 - 1),
    ("1677-09-21T00:12:43.145224192Z", -(2**63)),
    ("2262-04-12T09:47:16.854775807+10:00", 2**63 - 1),
]
