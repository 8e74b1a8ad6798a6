"""The disk guard: refuse new batches before the table's filesystem is full (docs/maintenance.md).

A log store that fills its disk fails at a commit, with batches already in
flight and other files on that filesystem (the state directory, the auth
database) failing with it. The guard refuses new batches *before* that:
while the free space of the filesystem holding the ``events`` table is below
a watermark, :meth:`LakeWriter.submit` raises
:class:`~appliance.blocks.errors.BlockRefused` with the reason ``disk nearly
full: ...``, so the batch is not acknowledged and each protocol tells its
client in its own way (a WebSocket error answer, a Logjam ``400``, a closed
forward or Lumberjack connection). Batches already accepted still commit: the
watermark is the headroom they need. Once space is freed (vacuum after an
expire, an operator deleting files), the next check lets batches in again.

The watermark is the larger of ``min_free_bytes`` and ``min_free_percent``
of the filesystem's size. ``statvfs`` is cheap, but it runs on the event
loop for every batch, so its answer is kept for :data:`CHECK_INTERVAL_SECONDS`.

Only a local table has a filesystem to ask: for object storage (``s3://``,
``gs://``, ``az://``, ...) there is no free-space figure, and the store's own
quota errors surface as failed commits (retried, never acknowledged), so the
guard is off there and says so once in the log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from appliance.blocks.errors import BlockRefused
from appliance.logs import get_logger

__all__ = [
    "CHECK_INTERVAL_SECONDS",
    "DiskGuard",
    "DiskSpace",
    "disk_space",
    "local_path",
]

log = get_logger("diskguard")

#: Seconds one ``statvfs`` answer is used before the next (checked at most this often).
CHECK_INTERVAL_SECONDS: Final = 0.25


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """Size and free space of one filesystem, in bytes."""

    total: int
    free: int

    def watermark(self, min_free_bytes: int, min_free_percent: float) -> int:
        """The free bytes to keep: the larger of the two settings."""
        return max(min_free_bytes, int(self.total * min_free_percent / 100))


def local_path(uri: str) -> str | None:
    """The directory of a local table (``/path`` or ``file:///path``); None for object storage."""
    if uri.startswith("file://"):
        return uri.removeprefix("file://") or "/"
    if "://" in uri:
        return None
    return uri


def disk_space(path: str) -> DiskSpace:
    """``statvfs`` of the filesystem holding ``path`` (its nearest existing ancestor).

    ``free`` counts the blocks an unprivileged process may use (``f_bavail``):
    the service does not run as root, and root's reserve is not its to spend.
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    return DiskSpace(total=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


class DiskGuard:
    """The watermark check for one table directory.

    Args:
        path: the table's local directory.
        min_free_bytes: keep at least this many bytes free.
        min_free_percent: keep at least this share of the filesystem free.
        clock: monotonic seconds (tests pass their own).
        measure: reads the filesystem's space (tests pass their own).
    """

    def __init__(
        self,
        path: str,
        min_free_bytes: int,
        min_free_percent: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        measure: Callable[[str], DiskSpace] = disk_space,
    ) -> None:
        if min_free_bytes < 0:
            raise ValueError("min_free_bytes cannot be negative")
        if not 0 <= min_free_percent < 100:
            raise ValueError("min_free_percent must be at least 0 and below 100")
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.min_free_percent = min_free_percent
        self._clock = clock
        self._measure = measure
        self._checked_at = -float("inf")
        #: Why batches are refused now; None while there is space.
        self.reason: str | None = None
        #: The last measurement (None before the first check).
        self.space: DiskSpace | None = None
        #: How many batches the guard refused (for logs and tests).
        self.refused = 0

    @classmethod
    def for_table(cls, uri: str, min_free_bytes: int, min_free_percent: float) -> DiskGuard | None:
        """A guard for the table at ``uri``, or None for object storage (logged once)."""
        path = local_path(uri)
        if path is None:
            log.info(
                "disk_guard.off", table=uri,
                reason="object storage has no free-space figure; its quota errors fail commits",
            )  # fmt: skip
            return None
        return cls(path, min_free_bytes, min_free_percent)

    def refusal(self) -> str | None:
        """Why a new batch must be refused now (``disk nearly full: ...``), or None.

        Measures at most once per :data:`CHECK_INTERVAL_SECONDS`; logs when the
        state changes. A failing ``statvfs`` does not refuse (the commit will
        say what is wrong).
        """
        now = self._clock()
        if now - self._checked_at < CHECK_INTERVAL_SECONDS:
            return self.reason
        self._checked_at = now
        try:
            space = self._measure(self.path)
        except OSError as exc:
            log.warning("disk_guard.check_failed", path=self.path, reason=str(exc))
            return self.reason
        self.space = space
        watermark = space.watermark(self.min_free_bytes, self.min_free_percent)
        if space.free < watermark:
            if self.reason is None:
                log.warning(
                    "disk_guard.refusing", path=self.path, free_bytes=space.free,
                    total_bytes=space.total, watermark_bytes=watermark,
                    advice="expire or erase old data and vacuum, or add space",
                )  # fmt: skip
            self.reason = self._why(space, watermark)
        elif self.reason is not None:
            log.info(
                "disk_guard.resumed", path=self.path, free_bytes=space.free,
                watermark_bytes=watermark, refused_batches=self.refused,
            )  # fmt: skip
            self.reason = None
        return self.reason

    def _why(self, space: DiskSpace, watermark: int) -> str:
        """The refusal, naming the setting that sets the watermark and what to do."""
        settings = (
            f"[lake] min_free_bytes = {self.min_free_bytes}, "
            f"min_free_percent = {self.min_free_percent:g}"
        )
        if space.total <= watermark:
            # No amount of clean-up helps: the setting does not fit this disk.
            return (
                f"disk nearly full: the table's filesystem holds {_gib(space.total)} in all, "
                f"not more than the watermark of {_gib(watermark)} ({settings}): lower "
                "min_free_bytes or min_free_percent, or put the table on a larger filesystem"
            )
        return (
            f"disk nearly full: {_gib(space.free)} free on the table's filesystem, "
            f"below the watermark of {_gib(watermark)} ({settings}): expire or erase "
            "old data and vacuum, or add space"
        )

    def check(self) -> None:
        """Raise :class:`BlockRefused` while the filesystem is below its watermark."""
        reason = self.refusal()
        if reason is not None:
            self.refused += 1
            raise BlockRefused(reason)
