"""Instruments the appliance for atheris when a fuzz target runs as a script, and only then.

A target imports the code it fuzzes inside ``with instrumented(__name__):``
so that libFuzzer sees its coverage. Imported by the tests, or where atheris
is missing, the block is a plain import. This module imports nothing of the
appliance: whatever it imported would escape the instrumentation.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

try:
    import atheris
except ImportError:  # run_one works without it
    atheris = None

__all__ = ["instrumented"]


def instrumented(module_name: str) -> AbstractContextManager[object]:
    """Atheris' import instrumentation for ``appliance``, ``auth`` and ``fuzz`` when
    ``module_name`` is ``"__main__"`` (the target runs as a script) and atheris
    is installed; otherwise a context that does nothing."""
    if atheris is None or module_name != "__main__":
        return nullcontext()
    context: AbstractContextManager[object] = atheris.instrument_imports(
        include=["appliance", "auth", "fuzz"]
    )
    return context
