"""Coordinates a graceful stop: connections stop reading, then the writer drains.

Each connection's read loop runs inside :meth:`Lifecycle.reading`, and each
wait for bytes inside :meth:`Lifecycle.receiving`. On shutdown the service
calls :meth:`Lifecycle.stop_reading`, which cancels only the waits for bytes:
whatever a connection already read is still decoded and submitted. The
service then waits for :meth:`Lifecycle.wait_no_readers` before it closes the
writer's input, so everything read is committed and acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["Lifecycle"]


class Lifecycle:
    """The service's shutdown state, shared by every connection."""

    def __init__(self) -> None:
        self._receiving: set[trio.CancelScope] = set()
        self._readers = 0
        self._no_readers = trio.Event()
        self._no_readers.set()
        self.stopping = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a connection's read loop as running (it may still submit batches)."""
        if self._readers == 0:
            self._no_readers = trio.Event()
        self._readers += 1
        try:
            yield
        finally:
            self._readers -= 1
            if self._readers == 0:
                self._no_readers.set()

    @contextmanager
    def receiving(self) -> Iterator[trio.CancelScope]:
        """A wait for bytes that :meth:`stop_reading` cancels."""
        scope = trio.CancelScope()
        if self.stopping:
            scope.cancel()
        self._receiving.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._receiving.discard(scope)

    def stop_reading(self) -> None:
        """Cancel every wait for bytes, and any that starts from now on."""
        self.stopping = True
        for scope in list(self._receiving):
            scope.cancel()

    async def wait_no_readers(self) -> None:
        """Return once no read loop is running."""
        while self._readers:
            await self._no_readers.wait()
