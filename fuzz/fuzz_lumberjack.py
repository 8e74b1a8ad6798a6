"""Fuzz target: Lumberjack v1/v2 (Beats), through ``LumberjackSession``.

Run: ``python fuzz/fuzz_lumberjack.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; no flag bits of its own. Limits: the
listener's defaults, but 1 MiB decompressed and 1 MiB per window (a 64 KiB
input could otherwise inflate to the 256 MiB default); with ``SMALL_LIMITS``
a window of 4 events, 512-byte frames, 2 KiB decompressed, 1 KiB per window.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.config import LumberjackListenerConfig
    from appliance.server.sessions.lumberjack import LumberjackSession
    from fuzz.harness import SMALL_LIMITS, FuzzInput, connection_info, drive, fuzz_main

_DEFAULT: Final = LumberjackListenerConfig(
    max_decompressed_bytes=1024 * 1024, max_window_bytes=1024 * 1024
)
_SMALL: Final = LumberjackListenerConfig(
    max_window_size=4, max_frame_bytes=512, max_decompressed_bytes=2048, max_window_bytes=1024
)


def run_one(data: bytes) -> None:
    """One input through the Lumberjack session, its rows and Arrow (fuzz/harness.py)."""
    fuzz = FuzzInput.parse(data)
    settings = _SMALL if fuzz.has(SMALL_LIMITS) else _DEFAULT
    drive(LumberjackSession(settings, connection_info()), fuzz.reads())


if __name__ == "__main__":
    fuzz_main(run_one)
