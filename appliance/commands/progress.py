"""Progress of long table commands: a bar on a terminal, plain lines otherwise.

The operations (deltalake's compaction, delete, vacuum) are single calls
that report nothing while they run, so progress is counted in steps (read
the files, delete, done) and the bar shows the elapsed time of the current
step, redrawn by a small thread. Everything goes to stderr: stdout stays
the report (or ``--json``).
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Final, TextIO

__all__ = ["BAR_WIDTH", "REDRAW_SECONDS", "ProgressReporter"]

#: Characters of the bar on a terminal.
BAR_WIDTH: Final = 24
#: Seconds between redraws of the elapsed time on a terminal.
REDRAW_SECONDS: Final = 0.2


class ProgressReporter:
    """A :data:`appliance.lake.operations.Progress` for the CLI.

    Use as a context manager; call it with ``(step, steps, what)``.

    Args:
        operation: the command's name, at the start of every line.
        out: where to write (stderr by default).
        tty: draw a bar (default: when ``out`` is a terminal).
        enabled: False shows nothing (``--json``, ``--quiet``).
    """

    def __init__(
        self,
        operation: str,
        out: TextIO | None = None,
        *,
        tty: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.operation = operation
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.enabled = enabled
        self._lock = threading.Lock()
        self._state = (0, 1, "starting")
        self._started = time.monotonic()
        self._step_started = self._started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def __enter__(self) -> ProgressReporter:
        if self.enabled and self.tty:
            self._thread = threading.Thread(target=self._redraw_loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            with self._lock:
                self._draw()
                self.out.write("\n")
                self.out.flush()

    def __call__(self, step: int, steps: int, what: str) -> None:
        """Report that step ``step`` of ``steps`` (``what``) begins; the last one is "done"."""
        if not self.enabled:
            return
        with self._lock:
            self._state = (step, steps, what)
            self._step_started = time.monotonic()
            if self.tty:
                self._draw()
            else:
                elapsed = time.monotonic() - self._started
                print(
                    f"{self.operation}: [{step}/{steps}] {what} ({elapsed:.1f}s)",
                    file=self.out,
                    flush=True,
                )

    def _redraw_loop(self) -> None:
        while not self._stop.wait(REDRAW_SECONDS):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        step, steps, what = self._state
        filled = BAR_WIDTH * min(step, steps) // max(steps, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        elapsed = time.monotonic() - self._started
        line = f"{self.operation} [{bar}] {step}/{steps} {what} {elapsed:.1f}s"
        padding = " " * max(self._width - len(line), 0)
        self._width = len(line)
        self.out.write(f"\r{line}{padding}")
        self.out.flush()
