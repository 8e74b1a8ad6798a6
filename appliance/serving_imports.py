"""Libraries kept out of the serving process: only the CLI needs them.

pyarrow imports pandas the first time ``pa.array`` runs, only to ask whether
its argument is a pandas object: in pyarrow 26.0.1, ``array`` calls
``_is_array_like`` (``array.pxi`` line 67), which calls
``pandas_api._have_pandas_internal()`` (``pandas-shim.pxi`` line 120), which
imports pandas when it is installed
(https://github.com/apache/arrow/blob/apache-arrow-26.0.1/python/pyarrow/pandas-shim.pxi).
The serving process never hands pyarrow a pandas object, and pandas would
stay loaded for the life of a worker (about 45 MB of RSS after its first
commit). pyspark is the CLI's (``appliance sql``, ``appliance spark``).
:func:`keep_out` makes their import fail in this process, as if they were
not installed, which pyarrow handles (docs/performance.md#idle-memory).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Final

__all__ = ["KEPT_OUT", "keep_out"]

#: Top-level packages the serving process never imports.
KEPT_OUT: Final = frozenset({"pandas", "pyspark"})


class _KeptOut:
    """A meta path finder that refuses :data:`KEPT_OUT` as not installed."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in KEPT_OUT:
            raise ModuleNotFoundError(
                f"No module named {name!r}: kept out of the serving process", name=name
            )
        return None


def keep_out() -> None:
    """Make an import of :data:`KEPT_OUT` fail in this process from now on (idempotent)."""
    if not any(finder is _KeptOut for finder in sys.meta_path):
        sys.meta_path.insert(0, _KeptOut)
