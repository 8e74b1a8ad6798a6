"""The batches a writer knows to be stored, for a window of time.

One index per writer, keyed by batch digest (:mod:`appliance.blocks.identity`):
the writer's own commits, the batches it found in the table at start, and
the batches other writers' commits named since. A resend whose digest is
here is acknowledged again without a second write, and a commit group
leaves such batches out.

Bounded twice: an entry older than ``window_seconds`` is forgotten at its
next look-up, and past ``max_keys`` the oldest go first. An entry costs
about 150 bytes (a 16-byte digest, its time and the dict's slot), so the
default million ids take about 150 MiB (docs/limits.md). Other writers'
batches count against the same cap, so on a busy fleet the window is the
shorter of ``window_seconds`` and ``max_keys`` divided by the fleet's batch
ids per second (docs/fleet.md); :attr:`StoredBatches.evicted` counts what
the cap pushed out early.

Pure code: the clock is the caller's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from appliance.blocks.identity import BatchDigest

__all__ = ["StoredBatches"]


class StoredBatches:
    """Digests of stored batches, each with the time it became known."""

    __slots__ = ("_entries", "evicted", "max_keys", "window_seconds")

    def __init__(self, window_seconds: float, max_keys: int) -> None:
        self.window_seconds = window_seconds
        self.max_keys = max_keys
        self._entries: OrderedDict[BatchDigest, float] = OrderedDict()
        #: Entries pushed out by ``max_keys`` before their window ended.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, digest: BatchDigest, now: float) -> None:
        """Remember ``digest`` as stored at ``now``."""
        entries = self._entries
        entries[digest] = now
        entries.move_to_end(digest)
        while len(entries) > self.max_keys:
            entries.popitem(last=False)
            self.evicted += 1

    def add_all(self, digests: Iterable[BatchDigest], now: float) -> None:
        """Remember every one of ``digests`` as stored at ``now``."""
        for digest in digests:
            self.add(digest, now)

    def contains(self, digest: BatchDigest, now: float) -> bool:
        """Whether ``digest`` is known as stored within the window before ``now``."""
        stamp = self._entries.get(digest)
        if stamp is None:
            return False
        if now - stamp > self.window_seconds:
            del self._entries[digest]
            return False
        return True
