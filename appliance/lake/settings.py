"""The group-commit writer's thresholds and limits (config ``[lake]``)."""

from __future__ import annotations

from dataclasses import dataclass

from appliance import defaults

__all__ = ["WriterSettings"]


@dataclass(frozen=True, slots=True)
class WriterSettings:
    """Thresholds and limits of the group-commit writer (config ``[lake]``)."""

    commit_max_rows: int = defaults.LAKE_COMMIT_MAX_ROWS
    commit_max_bytes: int = defaults.LAKE_COMMIT_MAX_BYTES
    commit_max_delay_seconds: float = defaults.LAKE_COMMIT_MAX_DELAY_SECONDS
    #: With a write-ahead log: seconds between commits from it (sooner at commit_max_bytes).
    commit_interval_seconds: float = defaults.LAKE_COMMIT_INTERVAL_SECONDS
    queue_blocks: int = defaults.LAKE_QUEUE_BLOCKS
    retry_initial_seconds: float = defaults.LAKE_RETRY_INITIAL_SECONDS
    retry_max_seconds: float = defaults.LAKE_RETRY_MAX_SECONDS
    dedupe_window_seconds: float = defaults.LAKE_DEDUPE_WINDOW_SECONDS
    dedupe_max_keys: int = defaults.LAKE_DEDUPE_MAX_KEYS
    lease_seconds: float = defaults.LAKE_LEASE_SECONDS
    #: Refuse new blocks while the table's filesystem is below the watermark
    #: (appliance/lake/diskguard.py); off unless asked for ([lake] turns it on).
    disk_guard: bool = False
    min_free_bytes: int = 0
    min_free_percent: float = 0.0
