"""Many RFC 3339 times at once, as :func:`appliance.blocks.timefmt.rfc3339_ns` reads each one.

A Beats window or a WebSocket message holds hundreds of ``@timestamp`` /
``time`` strings that share their second (``2026-11-22T10:00:07.123Z``):
:class:`Rfc3339Cache` parses the date and clock of that common UTC shape
once and adds the fraction, and sends every other value through
:func:`~appliance.blocks.timefmt.rfc3339_ns` itself. The result is always
``rfc3339_ns(value)`` (tests/appliance/rows/test_timecache.py holds it to
that with hypothesis), so the rules of docs/table.md, "Times" (ASCII
digits, int64 nanoseconds) are the same on both paths.

When every value has one length and that shape, and the process has numpy
(:mod:`appliance.blocks.numpy_loaded`), the whole column is read as a byte
matrix instead (``_vector_ns``: the column in about half the dict path's time for
1,000 distinct seconds); any value it is not sure of sends the column back
to the dict path, so the result is the same.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import re
from collections.abc import Sequence
from itertools import repeat
from operator import add, itemgetter, mul
from typing import Any, Final, cast

from appliance.blocks.numpy_loaded import loaded_numpy
from appliance.blocks.timefmt import MAX_TIME_NS, rfc3339_ns

__all__ = ["CACHED_SECONDS", "Rfc3339Cache"]

#: Distinct date-and-clock prefixes one cache keeps; it starts afresh when full.
CACHED_SECONDS: Final = 4096
#: The prefix whose instant is cached: ASCII digits only (``re.ASCII`` and
#: ``[0-9]``), so both of rfc3339_ns's paths read it alike.
#: Fewer values than this are read one by one (the column checks are not worth it).
_MIN_UNIFORM: Final = 8
#: A prefix not looked up yet (None is "not a cacheable instant").
_UNSEEN: Final[Any] = object()
_PREFIX_OF: Final = itemgetter(slice(0, 19))
#: Three ASCII fraction digits -> their nanoseconds (1,000 entries).
_MILLISECONDS_NS: Final = {f"{ms:03d}": ms * 1_000_000 for ms in range(1000)}
_PREFIX: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}", re.ASCII)
#: Whole seconds whose every fraction is an int64 nanosecond (2262-04-11T23:47:15
#: and 1677-09-21T00:12:44 are the last inside); other seconds take the dict path.
_VECTOR_SECONDS: Final = (-(2**63) // 1_000_000_000 + 1, (2**63 - 1) // 1_000_000_000 - 1)


class Rfc3339Cache:
    """``rfc3339_ns`` of many values, the date and clock of ``YYYY-MM-DDTHH:MM:SS[.f]Z`` cached.

    Not shared between threads: each connection (codec, session) keeps its own.
    """

    __slots__ = ("_seconds",)

    def __init__(self) -> None:
        #: Date-and-clock prefix -> its instant in epoch ns (None: not a cacheable one).
        self._seconds: dict[str, int | None] = {}

    def _prefix_ns(self, prefix: str) -> int | None:
        # Only a strict ASCII prefix is cached as an instant: for it,
        # rfc3339_ns(prefix + fraction + "Z") is the prefix's whole seconds
        # plus the fraction (appliance/blocks/timefmt.py, its UTC fast path).
        ns = rfc3339_ns(prefix + "Z") if _PREFIX.fullmatch(prefix) else None
        if len(self._seconds) >= CACHED_SECONDS:
            self._seconds.clear()
        self._seconds[prefix] = ns
        return ns

    def times_ns(self, values: Sequence[object]) -> list[int | None]:
        """``[rfc3339_ns(v) for v in values]``, the common shape without a parse each."""
        return self.column_ns(values)[0]

    def column_ns(self, values: Sequence[object]) -> tuple[list[int | None], bool]:
        """:meth:`times_ns` of ``values``, and True when it is known to hold no None.

        True when the column was read at once (every value a time); False
        says nothing, so a caller that needs to know looks (``None in``).
        """
        uniform = self._uniform(values)
        if uniform is not None:
            return uniform, True
        return self._each_ns(values), False

    def _each_ns(self, values: Sequence[object]) -> list[int | None]:
        seconds = self._seconds
        out: list[int | None] = []
        append = out.append
        for value in values:
            if type(value) is str and 20 <= len(value) <= 30 and value[-1] == "Z":
                n = len(value)
                fraction = value[20:-1]
                if (n == 20 or value[19] == ".") and (
                    not fraction or (fraction.isascii() and fraction.isdigit())
                ):
                    prefix = value[:19]
                    try:
                        ns = seconds[prefix]
                    except KeyError:
                        ns = self._prefix_ns(prefix)
                    if ns is not None:
                        if fraction:
                            ns += int(fraction.ljust(9, "0"))
                        # ns >= the prefix's instant >= MIN_TIME_NS already.
                        append(ns if ns <= MAX_TIME_NS else None)
                        continue
            append(rfc3339_ns(value))
        return out

    def _uniform(self, values: Sequence[object]) -> list[int | None] | None:
        """The times of ``values`` when all are the cached shape with one length, else None.

        A window's ``@timestamp`` strings usually are (Beats writes
        milliseconds): the checks then run over all of them at once, in C
        (``"".join``, strided slices, ``map``), not once per value in Python.
        None whenever a value is not that shape, or a prefix or a sum is not
        a time: :meth:`times_ns` then takes them one by one.
        """
        count = len(values)
        if count < _MIN_UNIFORM or set(map(type, values)) != {str}:
            return None
        texts = cast("Sequence[str]", values)
        lengths = set(map(len, texts))
        if len(lengths) != 1:
            return None
        (size,) = lengths
        if not 20 <= size <= 30:
            return None
        joined = "".join(texts)
        if not joined.isascii() or joined[size - 1 :: size] != "Z" * count:
            return None
        digits = size - 21  # fraction digits: "...SS.fffZ"; none for "...SSZ" and "...SS.Z"
        if size > 20:
            if joined[19::size] != "." * count:
                return None
            if digits and not "".join(joined[20 + k :: size] for k in range(digits)).isdigit():
                return None
        numpy = loaded_numpy()
        if numpy is not None:
            vector = _vector_ns(numpy, joined, count, size, digits)
            if vector is not None:
                return vector
        seconds = self._seconds
        prefixes = list(map(_PREFIX_OF, texts))
        found = list(map(seconds.get, prefixes, repeat(_UNSEEN, count)))
        if _UNSEEN in found:
            for index, ns in enumerate(found):
                if ns is _UNSEEN:
                    found[index] = self._prefix_ns(prefixes[index])
        if None in found:
            return None
        if digits <= 0:
            return found
        fractions = map(itemgetter(slice(20, size - 1)), texts)
        if digits == 3:
            # Milliseconds, what Beats write: a table look-up, not an int() parse each.
            fraction_ns = map(_MILLISECONDS_NS.__getitem__, fractions)
        else:
            fraction_ns = map(mul, map(int, fractions), repeat(10 ** (9 - digits), count))
        ns_list: list[int] = list(map(add, found, fraction_ns))
        # Each is >= its prefix's instant >= MIN_TIME_NS; only the top can overflow.
        if max(ns_list) > MAX_TIME_NS:
            return None
        return cast("list[int | None]", ns_list)


#: The years the vector path reads; a value outside them takes the dict path.
_FIRST_YEAR: Final = 1677
_LAST_YEAR: Final = 2262
#: ``YYYY-MM-DDTHH:MM:SS`` minus this byte by byte is 0-9 at a digit and 0 at a separator.
_HEAD: Final = b"0000-00-00T00:00:00"
_HEAD_LIMIT: Final = bytes(9 if c == ord("0") else 0 for c in _HEAD)
#: The columns of the tens and of the ones of its two-digit fields:
#: century, year of it, month, day, hour, minute, second.
_TENS: Final = [0, 2, 5, 8, 11, 14, 17]
_ONES: Final = [1, 3, 6, 9, 12, 15, 18]
#: Each field's lowest and highest value from the month on (month, day, hour,
#: minute, second; the day's real bound is its month's).
_FIELD_LOW: Final = [1, 1, 0, 0, 0]
_FIELD_HIGH: Final = [12, 31, 23, 59, 59]


@functools.cache
def _tables(numpy: Any) -> dict[str, Any]:
    """The vector path's constants as arrays, made once: per month of _FIRST_YEAR ..
    _LAST_YEAR its first day (days since 1970-01-01, from ``datetime.date``) and its days."""
    np = numpy
    first, days = [], []
    epoch = dt.date(1970, 1, 1).toordinal()
    for year in range(_FIRST_YEAR, _LAST_YEAR + 1):
        for month in range(1, 13):
            first.append(dt.date(year, month, 1).toordinal() - epoch)
            days.append(calendar.monthrange(year, month)[1])
    return {
        "head": np.frombuffer(_HEAD, np.uint8),
        "head_limit": np.frombuffer(_HEAD_LIMIT, np.uint8),
        "tens": np.asarray(_TENS),
        "ones": np.asarray(_ONES),
        "low": np.asarray(_FIELD_LOW, np.int64),
        "high": np.asarray(_FIELD_HIGH, np.int64),
        "first_day": np.asarray(first, np.int64),
        "month_days": np.asarray(days, np.int64),
    }


def _vector_ns(
    numpy: Any, joined: str, count: int, size: int, digits: int
) -> list[int | None] | None:
    """The instants of ``count`` values of ``size`` characters joined, in numpy, or None.

    The caller has checked the shape after the clock (``.``, fraction digits,
    ``Z``) and that ``joined`` is ASCII. None, for the dict path to decide,
    whenever anything is not plainly valid: a separator or digit out of
    place, a field out of its range (what ``datetime.fromisoformat`` refuses:
    month 13, February 30, hour 24, second 60), a year outside 1677 .. 2262,
    or a second too near an end of int64 nanoseconds. What remains is the
    calendar's arithmetic (each month's first day from ``datetime.date``),
    which is ``rfc3339_ns``'s result for such a value.
    """
    np = numpy
    table = _tables(np)
    rows = np.frombuffer(joined.encode("ascii"), np.uint8).reshape(count, size)
    head = rows[:, :19] - table["head"]  # uint8: a byte below its template's wraps to > 9
    if (head > table["head_limit"]).any():
        return None
    figures = head.astype(np.int64)
    pairs = figures[:, table["tens"]] * 10 + figures[:, table["ones"]]
    year = pairs[:, 0] * 100 + pairs[:, 1]
    fields = pairs[:, 2:]
    if (
        year.min() < _FIRST_YEAR
        or year.max() > _LAST_YEAR
        or (fields < table["low"]).any()
        or (fields > table["high"]).any()
    ):
        return None
    month = (year - _FIRST_YEAR) * 12 + (fields[:, 0] - 1)
    day = fields[:, 1]
    if (day > table["month_days"][month]).any():
        return None
    whole = (table["first_day"][month] + day - 1) * 86_400 + fields[:, 2] * 3600
    whole += fields[:, 3] * 60 + fields[:, 4]
    low, high = _VECTOR_SECONDS
    if whole.min() < low or whole.max() > high:
        return None
    ns = whole * 1_000_000_000
    # The fraction's digits (checked by the caller), each times its place.
    for place in range(max(digits, 0)):
        ns += (rows[:, 20 + place] - ord("0")).astype(np.int64) * 10 ** (8 - place)
    return cast("list[int | None]", ns.tolist())
