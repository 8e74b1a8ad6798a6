"""Fuzz target: Log Courier, through ``CourierSession``.

Run: ``python fuzz/fuzz_courier.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; no flag bits of its own. Limits: the
listener's defaults, but 1 MiB decompressed and 2 MiB of rows per payload
(the default's ratio; a 64 KiB input could otherwise inflate to the 64 MiB
default); with ``SMALL_LIMITS`` 512-byte payloads, 2 KiB decompressed,
256-byte events, 4 events, 4 KiB of rows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.config import CourierListenerConfig
    from appliance.server.sessions.courier import CourierSession
    from fuzz.harness import SMALL_LIMITS, FuzzInput, connection_info, drive, fuzz_main

_DEFAULT: Final = CourierListenerConfig(
    max_decompressed_bytes=1024 * 1024, max_payload_memory_bytes=2 * 1024 * 1024
)
_SMALL: Final = CourierListenerConfig(
    max_payload_bytes=512,
    max_decompressed_bytes=2048,
    max_event_bytes=256,
    max_events=4,
    max_payload_memory_bytes=4096,
)


def run_one(data: bytes) -> None:
    """One input through the Log Courier session, its rows and Arrow (fuzz/harness.py)."""
    fuzz = FuzzInput.parse(data)
    settings = _SMALL if fuzz.has(SMALL_LIMITS) else _DEFAULT
    drive(CourierSession(settings, connection_info()), fuzz.reads())


if __name__ == "__main__":
    fuzz_main(run_one)
