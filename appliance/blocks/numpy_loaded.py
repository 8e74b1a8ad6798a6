"""numpy when this process has already imported it, without importing it.

pyarrow imports numpy, and the service loads pyarrow in a worker thread as
soon as the first rows are submitted (docs/performance.md, "Idle memory").
Importing numpy for the column work of a codec would put tens of MiB into
every idle process and, on the event loop, up to a second of import in front
of the first message; so that work uses numpy only once it is there, and
the stdlib before (appliance/protocols/bytescan.py,
appliance/blocks/timecache.py; each holds both paths to one result).
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["loaded_numpy"]


def loaded_numpy() -> ModuleType | None:
    """numpy if this process has imported it, else None; never imports it."""
    if "numpy" not in sys.modules:
        return None
    # The import statement, not sys.modules, so that a numpy another thread is
    # still importing is waited for (the import lock) rather than used half-built.
    import numpy

    return numpy
