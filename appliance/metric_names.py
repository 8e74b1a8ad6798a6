"""The name of every metric family, in a module light enough for the CLI to import.

:mod:`appliance.metrics` defines the metrics with these names and re-exports
:class:`MetricNames`; ``appliance status`` reads a scrape with them. They live
apart from prometheus-client because the CLI imports every command at start
and must start fast (docs/architecture.md).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MetricNames"]


class MetricNames:
    """Every metric family's name as a scrape shows it (a counter's with ``_total``).

    The definitions in this module use these, and so does ``appliance
    status``: a renamed metric renames what status looks for, and status
    refuses a scrape that lacks a family it reads instead of showing 0 for
    it. prometheus-client takes a counter's name with or without ``_total``.
    """

    # listeners (labels listener, protocol)
    CONNECTIONS_OPEN: Final = "appliance_connections_open"
    CONNECTIONS_ACCEPTED: Final = "appliance_connections_accepted_total"
    CONNECTIONS_FAILED: Final = "appliance_connections_failed_total"
    REQUESTS: Final = "appliance_requests_total"
    EVENTS_RECEIVED: Final = "appliance_events_received_total"
    RECEIVED_BYTES: Final = "appliance_received_bytes_total"
    ACKS_SENT: Final = "appliance_acks_sent_total"
    ACK_LATENCY: Final = "appliance_ack_latency_seconds"
    CONNECTIONS_REFUSED: Final = "appliance_connections_refused_total"
    TLS_FAILURES: Final = "appliance_tls_handshake_failures_total"
    EVENTS_DROPPED: Final = "appliance_events_dropped_total"
    PROTOCOL_ERRORS: Final = "appliance_protocol_errors_total"
    BATCHES_REFUSED: Final = "appliance_batches_refused_total"
    AUTH_ATTEMPTS: Final = "appliance_auth_attempts_total"
    # workers = N (label worker): every worker's open connections, as each sees them
    WORKER_CONNECTIONS_OPEN: Final = "appliance_worker_connections_open"
    # the table and its writer
    LAKE_COMMITS: Final = "appliance_lake_commits_total"
    LAKE_COMMIT_DURATION: Final = "appliance_lake_commit_duration_seconds"
    LAKE_COMMITTED_ROWS: Final = "appliance_lake_committed_rows_total"
    LAKE_COMMITTED_BYTES: Final = "appliance_lake_committed_bytes_total"
    LAKE_COMMIT_FAILURES: Final = "appliance_lake_commit_failures_total"
    LAKE_COMMIT_RETRYING: Final = "appliance_lake_commit_retrying"
    LAKE_QUEUE_BLOCKS: Final = "appliance_lake_queue_blocks"
    LAKE_QUEUE_CAPACITY: Final = "appliance_lake_queue_capacity_blocks"
    LAKE_DEDUPE_HITS: Final = "appliance_lake_dedupe_hits_total"
    LAKE_BLOCKS_REFUSED: Final = "appliance_lake_blocks_refused_total"
    LAKE_COMMIT_CONFLICTS: Final = "appliance_lake_commit_conflicts_total"
    LAKE_DEDUPE_KEYS: Final = "appliance_lake_dedupe_keys"
    LAKE_DEDUPE_EVICTED: Final = "appliance_lake_dedupe_evicted"
    LAKE_BATCHES_STORED_ELSEWHERE: Final = "appliance_lake_batches_stored_elsewhere_total"
    LAKE_TABLE_VERSION: Final = "appliance_lake_table_version"
    LAKE_LAST_COMMIT_TIMESTAMP: Final = "appliance_lake_last_commit_timestamp_seconds"
    LAKE_LAST_COMMIT_AGE: Final = "appliance_lake_last_commit_age_seconds"
    LAKE_TABLE_FILES: Final = "appliance_lake_table_files"
    LAKE_TABLE_BYTES: Final = "appliance_lake_table_bytes"
    # the write-ahead log (ack = "wal"; records_unstorable is the writer's, always there)
    WAL_FILE_BYTES: Final = "appliance_wal_file_bytes"
    WAL_MAX_BYTES: Final = "appliance_wal_max_bytes"
    WAL_UNCOMMITTED_BYTES: Final = "appliance_wal_uncommitted_bytes"
    WAL_OLDEST_UNCOMMITTED_AGE: Final = "appliance_wal_oldest_uncommitted_age_seconds"
    WAL_SEGMENTS: Final = "appliance_wal_segments"
    WAL_AT_CAP: Final = "appliance_wal_at_cap"
    WAL_CACHE_BYTES: Final = "appliance_wal_cache_bytes"
    WAL_APPENDS: Final = "appliance_wal_appends_total"
    WAL_SYNCS: Final = "appliance_wal_syncs_total"
    WAL_FAILED_SYNCS: Final = "appliance_wal_failed_syncs_total"
    WAL_WRITTEN_BYTES: Final = "appliance_wal_written_bytes_total"
    WAL_CAP_WAITS: Final = "appliance_wal_cap_waits_total"
    WAL_CAP_REFUSALS: Final = "appliance_wal_cap_refusals_total"
    WAL_SYNC_WAIT_SECONDS: Final = "appliance_wal_sync_wait_seconds_total"
    WAL_GROUPS_FROM_CACHE: Final = "appliance_wal_groups_from_cache_total"
    WAL_GROUPS_READ_BACK: Final = "appliance_wal_groups_read_back_total"
    WAL_RECORDS_LOST: Final = "appliance_wal_records_lost_total"
    WAL_RECORDS_UNSTORABLE: Final = "appliance_wal_records_unstorable_total"
    # maintenance and the process
    MAINTENANCE_RUNS: Final = "appliance_maintenance_runs_total"
    MAINTENANCE_LAST_RUN: Final = "appliance_maintenance_last_run_timestamp_seconds"
    MAINTENANCE_LAST_DURATION: Final = "appliance_maintenance_last_duration_seconds"
    BUILD_INFO: Final = "appliance_build_info"
    #: prometheus-client's process collector (Linux only; status shows "-" without it).
    PROCESS_START_TIME: Final = "process_start_time_seconds"
    PROCESS_CPU_SECONDS: Final = "process_cpu_seconds_total"
    PROCESS_RESIDENT_MEMORY: Final = "process_resident_memory_bytes"
    PROCESS_OPEN_FDS: Final = "process_open_fds"
