"""The write-ahead log's limits and timings: one frozen dataclass, each default a named constant.

The defaults live in :mod:`appliance.defaults` (``WAL_*``), which the
``[wal]`` config section shares (docs/wal.md, "Limits"); so does the range
check, :func:`appliance.defaults.check_wal`. The two fixed limits that keep
the log from filling its own volume with committed bytes are here too:
:data:`SEGMENT_VOLUME_DIVISOR` (:func:`segment_bytes_for_volume`) and
:data:`COMMITTED_SEGMENT_REPLACE_BYTES`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final

from appliance import defaults

__all__ = [
    "COMMITTED_SEGMENT_REPLACE_BYTES",
    "DEFAULT_CACHE_BYTES",
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
    "SEGMENT_VOLUME_DIVISOR",
    "WalSettings",
    "segment_bytes_for_volume",
]

DEFAULT_SEGMENT_BYTES: Final = defaults.WAL_SEGMENT_BYTES
MIN_SEGMENT_BYTES: Final = defaults.WAL_MIN_SEGMENT_BYTES
DEFAULT_MAX_RECORD_BYTES: Final = defaults.WAL_MAX_RECORD_BYTES
DEFAULT_MAX_BYTES: Final = defaults.WAL_MAX_BYTES
DEFAULT_MAX_KEYS: Final = defaults.WAL_MAX_KEYS
DEFAULT_FLUSH_DELAY_SECONDS: Final = defaults.WAL_FLUSH_DELAY_SECONDS
MAX_FLUSH_DELAY_SECONDS: Final = defaults.WAL_MAX_FLUSH_DELAY_SECONDS
DEFAULT_FLUSH_BYTES: Final = defaults.WAL_FLUSH_BYTES
DEFAULT_GROUP_MAX_BYTES: Final = defaults.WAL_GROUP_MAX_BYTES
DEFAULT_FULL_WAIT_SECONDS: Final = defaults.WAL_FULL_WAIT_SECONDS
DEFAULT_CACHE_BYTES: Final = defaults.WAL_CACHE_BYTES

#: A segment is at most this fraction (1/N) of the total size of the volume
#: under the log: the volume must hold the active segment, the older ones
#: waiting for their commit, and the next one started beside them. A larger
#: ``segment_bytes`` is lowered at open (``wal.segment_bytes_lowered``): with
#: 64 MiB segments on a 32 MiB volume the first segment filled the volume
#: before it was ever closed, and nothing could be deleted.
SEGMENT_VOLUME_DIVISOR: Final = 4
#: A wholly committed active segment holding at least this many bytes is
#: replaced at the commit by an empty one at the same position (and deleted),
#: so committed bytes never sit on the volume waiting for the next rollover.
#: Below it a replacement would cost more (a file created and the directory
#: synced at every commit) than the space it frees.
COMMITTED_SEGMENT_REPLACE_BYTES: Final = 1024 * 1024


def segment_bytes_for_volume(segment_bytes: int, volume_bytes: int) -> int:
    """``segment_bytes``, lowered to a :data:`SEGMENT_VOLUME_DIVISOR`-th of the volume if larger.

    Never below :data:`MIN_SEGMENT_BYTES` (a volume that small holds no useful log anyway).
    """
    share = max(MIN_SEGMENT_BYTES, volume_bytes // SEGMENT_VOLUME_DIVISOR)
    return min(segment_bytes, share)


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
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def __post_init__(self) -> None:
        defaults.check_wal(**asdict(self))
