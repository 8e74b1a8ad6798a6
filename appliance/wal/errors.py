"""Every error the write-ahead log raises (one exceptions module, as the lake layer has)."""

from __future__ import annotations

import errno

__all__ = [
    "RecordDecodeError",
    "RecordTooLarge",
    "WalClosed",
    "WalCorrupt",
    "WalError",
    "WalFull",
    "WalWriteError",
]

#: errno values that mean "no room": the filesystem or the user's quota is full.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class WalError(Exception):
    """Base class of the write-ahead log's errors."""


class WalWriteError(WalError):
    """An append was not made durable (disk full, I/O error); nothing of it may be acked.

    The bytes written for the failed group were cut back, so the log stays
    valid; later appends are tried afresh (and succeed once space returns).
    """

    def __init__(self, reason: str, errno_value: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        #: The OS error number (``errno.ENOSPC``, ``errno.EIO``, ...), if one caused it.
        self.errno = errno_value

    @property
    def disk_full(self) -> bool:
        """True when the filesystem (or a quota) had no room."""
        return self.errno in _NO_SPACE


class WalFull(WalError):
    """The log is at its size cap (``max_bytes`` or ``max_keys``) and no room came in time.

    The table is not keeping up: nothing was appended, so nothing may be acked.
    """


class RecordTooLarge(WalError):
    """One record is larger than ``max_record_bytes``; it was not appended."""


class WalClosed(WalError):
    """The log is closed (shutdown) or its flusher stopped: the append was not made durable."""


class WalCorrupt(WalError):
    """The log holds bytes it never wrote where it had verified records (changed underneath).

    Recovery at open never raises it for damage it can explain (a torn tail,
    a damaged record): it truncates or skips and logs (docs/wal.md). A read
    raises it when a range that recovery verified no longer verifies.
    """


class RecordDecodeError(WalError):
    """A record's body is not a valid encoded block (appliance/wal/blocks.py)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
