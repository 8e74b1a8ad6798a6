"""Coordinates a graceful stop: connections stop reading, then the writer drains.

Each connection's read loop runs inside :meth:`Lifecycle.reading`. On
shutdown the service calls :meth:`Lifecycle.stop_reading`, which cancels every
read loop (no new batches), then waits for :meth:`Lifecycle.wait_no_readers`
before closing the writer's input, so that what was already read is
committed and acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["Lifecycle"]


class Lifecycle:
    """The service's shutdown state, shared by every connection."""

    def __init__(self) -> None:
        self._readers: set[trio.CancelScope] = set()
        self._no_readers = trio.Event()
        self._no_readers.set()
        self.stopping = False

    @contextmanager
    def reading(self) -> Iterator[trio.CancelScope]:
        """Run a read loop that :meth:`stop_reading` can cancel."""
        scope = trio.CancelScope()
        if self.stopping:
            scope.cancel()
        self._readers.add(scope)
        self._no_readers = trio.Event() if len(self._readers) == 1 else self._no_readers
        try:
            with scope:
                yield scope
        finally:
            self._readers.discard(scope)
            if not self._readers:
                self._no_readers.set()

    def stop_reading(self) -> None:
        """Cancel every read loop, and any that starts from now on."""
        self.stopping = True
        for scope in list(self._readers):
            scope.cancel()

    async def wait_no_readers(self) -> None:
        """Return once no read loop is running."""
        while self._readers:
            await self._no_readers.wait()
