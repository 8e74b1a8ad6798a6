"""The write-ahead log's limits and timings: one frozen dataclass, each default a named constant.

The defaults live in :mod:`appliance.defaults` (``WAL_*``), which the
``[wal]`` config section shares (docs/wal.md, "Limits"); so does the range
check, :func:`appliance.defaults.check_wal`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final

from appliance import defaults

__all__ = [
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
    "WalSettings",
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
