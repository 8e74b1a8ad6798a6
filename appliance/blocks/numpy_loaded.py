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
    """numpy if this process has finished importing it, else None; never imports or waits.

    A numpy that another thread is still importing (pyarrow's load, in a
    worker thread) is in ``sys.modules`` half-built: its spec is marked
    ``_initializing`` until the import finishes (importlib's own test, in
    ``importlib._bootstrap._find_and_load``). Waiting for it with an import
    statement would block the event loop on the import lock for the rest of
    that import (about 0.1 s measured), so the stdlib path runs meanwhile.
    ``None`` in ``sys.modules`` (numpy hidden, as tests do) also means none.
    """
    module = sys.modules.get("numpy")
    if module is None:
        return None
    if getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module
