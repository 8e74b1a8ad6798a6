"""Many RFC 3339 times at once, as :func:`appliance.blocks.timefmt.rfc3339_ns` reads each one.

A Beats window or a WebSocket message holds hundreds of ``@timestamp`` /
``time`` strings that share their second (``2026-11-22T10:00:07.123Z``):
:class:`Rfc3339Cache` parses the date and clock of that common UTC shape
once and adds the fraction, and sends every other value through
:func:`~appliance.blocks.timefmt.rfc3339_ns` itself. The result is always
``rfc3339_ns(value)`` (tests/appliance/rows/test_timecache.py holds it to
that with hypothesis), so the rules of docs/table.md, "Times" (ASCII
digits, int64 nanoseconds) are the same on both paths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import repeat
from operator import add, itemgetter, mul
from typing import Any, Final, cast

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
        uniform = self._uniform(values)
        if uniform is not None:
            return uniform
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
