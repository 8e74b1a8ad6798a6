"""The write-ahead log's limits and timings: one frozen dataclass, each default a named constant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from appliance.wal.frame import HEADER_BYTES, MAX_RECORD_BYTES_LIMIT

__all__ = [
    "DEFAULT_FLUSH_BYTES",
    "DEFAULT_FLUSH_DELAY_SECONDS",
    "DEFAULT_FULL_WAIT_SECONDS",
    "DEFAULT_GROUP_MAX_BYTES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_KEYS",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "MAX_FLUSH_DELAY_SECONDS",
    "MIN_SEGMENT_BYTES",
    "WalSettings",
]

_MIB: Final = 1024 * 1024

#: A segment file is closed, and a new one started, before it would exceed
#: this many bytes (a record larger than this fills a segment alone).
DEFAULT_SEGMENT_BYTES: Final = 64 * _MIB
#: Smallest segment size accepted, in bytes (smaller ones only multiply files).
MIN_SEGMENT_BYTES: Final = 4096
#: Largest record, in bytes as stored (header, dedupe key and body). Larger than
#: the largest block any listener can produce with its default limits
#: (docs/limits.md: 64 MiB windows and decompressed requests, 128 MiB Courier payload memory).
DEFAULT_MAX_RECORD_BYTES: Final = 160 * _MIB
#: The log's size cap, in bytes of segment files: at the cap, appends wait
#: (backpressure) for the table to catch up instead of the log growing.
DEFAULT_MAX_BYTES: Final = 2048 * _MIB
#: Most records with a dedupe key the log holds uncommitted: each costs
#: memory (its key is kept for dedupe), so they are capped like bytes.
DEFAULT_MAX_KEYS: Final = 1_000_000
#: Longest an append waits for others to join its group before the fdatasync,
#: in seconds. Idle appends do not wait at all (docs/wal.md, "Group commit").
DEFAULT_FLUSH_DELAY_SECONDS: Final = 0.002
#: Upper bound on the configurable flush delay, in seconds: acks must stay "a few ms".
MAX_FLUSH_DELAY_SECONDS: Final = 0.05
#: Pending bytes that start a flush at once, without waiting for the delay.
DEFAULT_FLUSH_BYTES: Final = 1 * _MIB
#: Most bytes one flush writes before its fdatasync (one record larger than it goes alone):
#: a huge backlog is written in steps, so small appends behind it are not held long.
DEFAULT_GROUP_MAX_BYTES: Final = 16 * _MIB
#: Longest an append waits for room under the cap before it fails with ``WalFull``, in seconds.
DEFAULT_FULL_WAIT_SECONDS: Final = 30.0


@dataclass(frozen=True, slots=True)
class WalSettings:
    """Limits and timings of one write-ahead log (config ``[wal]``, docs/wal.md).

    Raises:
        ValueError: a value out of its range, or a cap too small for the
            log to make progress (``max_bytes`` must hold two full segments).
    """

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_bytes: int = DEFAULT_MAX_BYTES
    max_keys: int = DEFAULT_MAX_KEYS
    flush_delay_seconds: float = DEFAULT_FLUSH_DELAY_SECONDS
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    group_max_bytes: int = DEFAULT_GROUP_MAX_BYTES
    full_wait_seconds: float = DEFAULT_FULL_WAIT_SECONDS

    def __post_init__(self) -> None:
        if self.segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"wal segment_bytes must be at least {MIN_SEGMENT_BYTES}")
        if not HEADER_BYTES < self.max_record_bytes <= MAX_RECORD_BYTES_LIMIT:
            raise ValueError(
                f"wal max_record_bytes must be over {HEADER_BYTES} and at most "
                f"{MAX_RECORD_BYTES_LIMIT}"
            )
        # The active segment is never deleted, so after everything is
        # committed it may still hold one full segment: the cap must leave
        # room for another beside it, or appends could wait forever.
        largest_segment = max(self.segment_bytes, self.max_record_bytes)
        if self.max_bytes < 2 * largest_segment:
            raise ValueError(
                "wal max_bytes must be at least twice max(segment_bytes, max_record_bytes)"
            )
        if self.max_keys < 1:
            raise ValueError("wal max_keys must be at least 1")
        if not 0.0 <= self.flush_delay_seconds <= MAX_FLUSH_DELAY_SECONDS:
            raise ValueError(f"wal flush_delay_seconds must be within 0..{MAX_FLUSH_DELAY_SECONDS}")
        if self.flush_bytes < 1 or self.group_max_bytes < 1:
            raise ValueError("wal flush_bytes and group_max_bytes must be positive")
        if self.full_wait_seconds < 0:
            raise ValueError("wal full_wait_seconds must not be negative")
