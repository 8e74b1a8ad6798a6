"""The default of every setting config shares with a codec or the lake, named once with its unit.

A codec's limits dataclass, the lake writer's settings and the maintenance
schedules take their defaults from here, and so do the matching keys of
:mod:`appliance.config`; neither side retypes a value, so the two cannot
disagree. This module imports nothing of the appliance: config loads it
without loading a codec, trio or deltalake (docs/decisions.md, 27).
A config section's keys are named as the fields of the dataclass they fill
(:func:`appliance.config.settings_from` copies them across).

Defaults only one side knows stay with it: a listener's deadlines and
``bind`` in config, a codec's wire constants in the codec. The pending-work
bounds of a connection are here because config and the answering loop
(:mod:`appliance.server.connection`) both need them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "COURIER_MAX_DECOMPRESSED_BYTES",
    "COURIER_MAX_EVENTS",
    "COURIER_MAX_EVENT_BYTES",
    "COURIER_MAX_PAYLOAD_BYTES",
    "COURIER_MAX_PAYLOAD_MEMORY_BYTES",
    "DECODE_BUDGET_BYTES",
    "DECODE_BUDGET_WAIT_SECONDS",
    "DISK_MIN_FREE_BYTES",
    "DISK_MIN_FREE_PERCENT",
    "FORWARD_MAX_DECOMPRESSED_BYTES",
    "FORWARD_MAX_EVENTS_PER_REQUEST",
    "FORWARD_MAX_REQUEST_BYTES",
    "FORWARD_SLICE_BYTES",
    "LAKE_ACK",
    "LAKE_COMMIT_INTERVAL_SECONDS",
    "LAKE_COMMIT_MAX_BYTES",
    "LAKE_COMMIT_MAX_DELAY_SECONDS",
    "LAKE_COMMIT_MAX_ROWS",
    "LAKE_DEDUPE_MAX_KEYS",
    "LAKE_DEDUPE_WINDOW_SECONDS",
    "LAKE_LEASE_SECONDS",
    "LAKE_QUEUE_BLOCKS",
    "LAKE_RETRY_INITIAL_SECONDS",
    "LAKE_RETRY_MAX_SECONDS",
    "LISTENER_MAX_PENDING_ACKS",
    "LISTENER_MAX_PENDING_BYTES",
    "LOGJAM_MAX_BODY_BYTES",
    "LOGJAM_MAX_DECOMPRESSED_BYTES",
    "LOGJAM_MAX_JSON_CONTAINERS",
    "LUMBERJACK_MAX_DECOMPRESSED_BYTES",
    "LUMBERJACK_MAX_FRAME_BYTES",
    "LUMBERJACK_MAX_WINDOW_BYTES",
    "LUMBERJACK_MAX_WINDOW_SIZE",
    "LUMBERJACK_TAG_FIELDS",
    "MAINTENANCE_CHECKPOINT_INTERVAL_SECONDS",
    "MAINTENANCE_COMPACT_INTERVAL_SECONDS",
    "MAINTENANCE_LEASE_SECONDS",
    "MAINTENANCE_TARGET_FILE_BYTES",
    "MAINTENANCE_VACUUM_INTERVAL_SECONDS",
    "MAX_WORKERS",
    "MIN_VACUUM_RETENTION_HOURS",
    "PROXY_HEADER_TIMEOUT_SECONDS",
    "RECORD_MAX_BYTES",
    "RECORD_MAX_VALUES",
    "RETENTION_INTERVAL_SECONDS",
    "SERVE_GC_THRESHOLDS",
    "SERVE_GC_YOUNG_INTERVAL_SECONDS",
    "VACUUM_RETENTION_HOURS",
    "WAL_CACHE_BYTES",
    "WAL_FLUSH_BYTES",
    "WAL_FLUSH_DELAY_SECONDS",
    "WAL_FULL_WAIT_SECONDS",
    "WAL_GROUP_MAX_BYTES",
    "WAL_MAX_BYTES",
    "WAL_MAX_FLUSH_DELAY_SECONDS",
    "WAL_MAX_KEYS",
    "WAL_MAX_RECORD_BYTES",
    "WAL_MAX_RECORD_BYTES_LIMIT",
    "WAL_MIN_SEGMENT_BYTES",
    "WAL_SEGMENT_BYTES",
    "WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE",
    "WEBSOCKET_MAX_EVENTS_PER_MESSAGE",
    "WEBSOCKET_MAX_MESSAGE_BYTES",
    "check_decode_budget",
    "check_retention",
    "check_wal",
    "forward_request_cost",
    "forward_stream_cost",
    "forward_worst_request_cost",
]

# -- the serving process (appliance/gc_policy.py) ----------------------------------------

#: Python's cyclic garbage collector thresholds while serving (gen0 allocations,
#: gen1 and gen2 collections), instead of (700, 10, 10). Decoding a chunk
#: builds thousands of containers that live until it becomes rows, so the
#: default ran young collections within every chunk; with these, and the
#: start-up objects frozen out of every collection, the forward bench did
#: 15% more events per CPU-second at the
#: same peak memory (bench/HISTORY.md, "2026-11-26, afternoon: third pass on forward throughput";
#: appliance/gc_policy.py).
SERVE_GC_THRESHOLDS: Final = (20_000, 10, 10)
#: Seconds between the young collections the service runs itself
#: (appliance/gc_policy.py): cyclic garbage, such as a closed TLS connection's
#: (about 40 KiB), waits at most this long instead of for 20,000 allocations.
SERVE_GC_YOUNG_INTERVAL_SECONDS: Final = 1.0

# -- a connection's waiting answers (appliance/server/pending.py) -----------------------

#: Bytes the blocks of one connection's waiting answers may hold before it stops
#: reading: the bound on pending work (npm @fluent-org/logger pipelines
#: thousands of one-event requests in Message mode). Larger than one full forward
#: request, so a client's window of large chunks keeps flowing.
LISTENER_MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
#: Answers one connection may have waiting, whatever their size: a guard
#: against floods of requests far smaller than their bookkeeping (512 bytes
#: each are charged; 4,096 of them hold 2 MiB).
LISTENER_MAX_PENDING_ACKS: Final = 4096


#: Seconds an accepted connection of a ``proxy_protocol`` listener has to deliver
#: its whole PROXY header (appliance/server/proxied.py). The spec (HAProxy's
#: doc/proxy-protocol.txt §2) asks "at least 3 seconds to cover a TCP retransmit".
PROXY_HEADER_TIMEOUT_SECONDS: Final = 5.0


# -- forward (appliance/protocols/forward/) --------------------------------------------

#: Largest request (one msgpack array, or one JSON value) accepted, in bytes.
#: Fluentd's default buffer chunk is 8 MiB and Fluent Bit's about 2 MiB.
FORWARD_MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
#: Largest decompressed ``entries`` of a CompressedPackedForward request (gzip
#: or zstd), in bytes.
FORWARD_MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
#: Most events one request may carry.
FORWARD_MAX_EVENTS_PER_REQUEST: Final = 250_000

# -- one event's record, whatever the protocol (docs/limits.md, "Records") --------------

#: Values one record may hold, counted while it is decoded: the elements of
#: its maps and arrays (a map's keys and values both). Shippers
#: send records of tens of values (a Kubernetes record about 40); Fluentd will
#: not buffer a record larger than its chunk (``chunk_limit_size``, 8 MB for
#: memory buffers) and Fluent Bit's in_forward takes requests of at most 6 MB
#: (``Buffer_Max_Size``), so a million values, at least 1 MiB even of one-byte
#: values and some 10 MiB of real ones, is far past anything they send.
RECORD_MAX_VALUES: Final = 1 << 20
#: Largest record stored, in bytes of its JSON text (UTF-8), and largest
#: record decoded, in bytes of its msgpack: twice Fluentd's default chunk
#: (8 MB), the largest record a shipper's defaults let through.
RECORD_MAX_BYTES: Final = 16 * 1024 * 1024

# -- decoding memory: one budget per process (appliance/server/decode_budget.py) -------

#: Bytes of memory the decodes in progress may claim together, across every
#: connection and listener of the process, each at its worst case (the cost
#: the codec reports before it builds anything: :func:`forward_request_cost`).
#: The packaged unit's ``MemoryHigh`` is 3 GiB: an idle service takes 0.3 to
#: 1 GiB, the write-ahead log's cache, a commit's Arrow tables and the
#: connections' pending batches a few hundred MiB more.
DECODE_BUDGET_BYTES: Final = 1024 * 1024 * 1024
#: Longest a connection waits for its decode's share of the budget, in seconds;
#: then it is closed with the reason, and its client resends. One decode takes
#: well under a second (a 64 MiB entries stream included), so only a flood of
#: large requests makes anyone wait this long.
DECODE_BUDGET_WAIT_SECONDS: Final = 30.0
#: An entries stream larger than this is decoded a slice of about this many
#: bytes at a time: each slice's records become their JSON text and are freed
#: before the next is decoded, so a stream's Python objects never exceed one
#: slice's (appliance/protocols/forward/connection.py, "Memory").
FORWARD_SLICE_BYTES: Final = 256 * 1024

# The forward codec's worst case, in bytes of memory per byte decoded. Measured
# (tests/appliance/protocols/test_forward_limits.py asserts them) on the shapes
# that cost most: chains of one-entry maps, arrays of empty maps, two-character
# strings, control characters escaped as six, a record made four bytes a
# character by one emoji.

#: Python objects and JSON text of a stream or request decoded whole: 120 for
#: the objects (one-entry maps), 16 for the fast path's copies, 24 for the text.
FORWARD_WHOLE_BYTES_PER_BYTE: Final = 160
#: Memory of a sliced stream's records as JSON text, per stream byte, beyond
#: each text's str header (counted per event): the codec refuses a stream
#: whose texts take more. Real records take 1 to 2; escapes of six characters
#: for a byte in a str of four bytes a character (one emoji makes it so) take 24.
FORWARD_TEXT_BYTES_PER_BYTE: Final = 6
#: Memory of one counted value at worst, plus one container's elements built
#: before its count is taken (a dict of one entry: 232 bytes for two values).
FORWARD_VALUE_BYTES: Final = 192
#: Per event of a sliced stream: its time, its text's header, list slots, and the
#: fast path's raw entry and tuple.
FORWARD_EVENT_BYTES: Final = 256
#: The smallest entry, ``[0, {}]``: what bounds the events of a stream by its bytes.
FORWARD_MIN_ENTRY_BYTES: Final = 3
#: A request's own copies while its outer array is decoded: the entries as a
#: str (surrogate-escaped, up to four bytes a byte) and as bytes again.
FORWARD_REQUEST_COPIES: Final = 6
#: Most output of gzip or zstd per input byte (deflate's ceiling; zstd is held
#: to it: ``ZSTD_MAX_EXPANSION``).
FORWARD_MAX_EXPANSION: Final = 1032
#: The JSON form (a request that starts with ``[``): ``json.loads`` builds at
#: most about 50 bytes per byte (chains of ``{"":...}``), its texts at most 4.
FORWARD_JSON_BYTES_PER_BYTE: Final = 56


def _record_worst() -> int:
    """One record at its limits: its values, and its JSON text as a str."""
    return FORWARD_VALUE_BYTES * RECORD_MAX_VALUES + 4 * RECORD_MAX_BYTES


def forward_stream_cost(stream_bytes: int, max_events: int) -> int:
    """Worst-case bytes of memory decoding a PackedForward entries stream takes.

    Up to :data:`FORWARD_SLICE_BYTES` the stream is decoded whole; a larger
    one a slice at a time, each slice's records kept only as their JSON text.
    """
    if stream_bytes <= FORWARD_SLICE_BYTES:
        return FORWARD_WHOLE_BYTES_PER_BYTE * stream_bytes
    events = min(max_events, stream_bytes // FORWARD_MIN_ENTRY_BYTES)
    return (
        FORWARD_WHOLE_BYTES_PER_BYTE * FORWARD_SLICE_BYTES
        + _record_worst()
        + FORWARD_TEXT_BYTES_PER_BYTE * stream_bytes
        + FORWARD_EVENT_BYTES * events
    )


def forward_request_cost(
    request_bytes: int,
    kind: str,
    *,
    max_decompressed_bytes: int,
    max_events: int,
) -> int:
    """Worst-case bytes of memory decoding one complete forward request takes.

    A pure function of sizes, what the codec reports before it decodes a
    request (the decode budget decides whether it may). ``kind``:
    ``"packed"`` (PackedForward, entries not compressed), ``"compressed"``
    (gzip or zstd entries: they are counted as decompressing to the most
    they can), ``"msgpack"`` (Message or Forward mode: its values are
    counted, at most :data:`RECORD_MAX_VALUES`), ``"json"`` (the JSON form),
    or ``"unknown"`` (the worst of the msgpack kinds).
    """
    r = request_bytes
    own = FORWARD_REQUEST_COPIES * r
    if kind == "packed":
        return own + forward_stream_cost(r, max_events)
    if kind == "compressed":
        out = min(max_decompressed_bytes, FORWARD_MAX_EXPANSION * r)
        return own + out + forward_stream_cost(out, max_events)
    if kind == "json":
        return FORWARD_JSON_BYTES_PER_BYTE * r
    whole = FORWARD_WHOLE_BYTES_PER_BYTE * r
    counted = (
        _record_worst()
        + 24 * r
        + FORWARD_EVENT_BYTES * min(max_events, r // FORWARD_MIN_ENTRY_BYTES)
    )
    msgpack_cost = own + min(whole, counted)
    if kind == "msgpack":
        return msgpack_cost
    kinds = ("packed", "compressed")
    return max(
        msgpack_cost,
        *(
            forward_request_cost(
                r, k, max_decompressed_bytes=max_decompressed_bytes, max_events=max_events
            )
            for k in kinds
        ),
    )


def forward_worst_request_cost(
    max_request_bytes: int, max_decompressed_bytes: int, max_events: int
) -> int:
    """The most any one request a forward listener with these limits takes (JSON form included)."""
    return max(
        forward_request_cost(
            max_request_bytes,
            "unknown",
            max_decompressed_bytes=max_decompressed_bytes,
            max_events=max_events,
        ),
        forward_request_cost(
            max_request_bytes,
            "json",
            max_decompressed_bytes=max_decompressed_bytes,
            max_events=max_events,
        ),
    )


def check_decode_budget(
    budget_bytes: int, max_request_bytes: int, max_decompressed_bytes: int, max_events: int
) -> None:
    """Refuse a decode budget that a forward listener's largest request could never fit.

    Raises:
        ValueError: naming the bytes needed and the keys that set them.
    """
    if budget_bytes < 1:
        raise ValueError("decode_budget_bytes must be positive")
    need = forward_worst_request_cost(max_request_bytes, max_decompressed_bytes, max_events)
    if need > budget_bytes:
        raise ValueError(
            f"decode_budget_bytes={budget_bytes} is less than the {need} bytes the largest "
            "request of a forward listener may take to decode (max_request_bytes, "
            "max_decompressed_bytes, max_events_per_request): raise decode_budget_bytes "
            "or lower those"
        )


# -- Lumberjack (appliance/protocols/lumberjack/) ---------------------------------------

#: Most events a client may announce in one window.
LUMBERJACK_MAX_WINDOW_SIZE: Final = 100_000
#: Largest frame, in bytes (a ``C`` frame's compressed payload; a ``J`` frame's
#: JSON; a ``D`` frame whole).
LUMBERJACK_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
#: Largest decompressed output of one ``C`` frame read off the wire, its nested
#: ``C`` frames' output included, in bytes.
LUMBERJACK_MAX_DECOMPRESSED_BYTES: Final = 256 * 1024 * 1024
#: Largest window, in bytes of its data frames as parsed (after decompression):
#: what an unfinished window may make the codec hold (without it, 100 KB of
#: compressed frames held 200 MiB with no such limit).
LUMBERJACK_MAX_WINDOW_BYTES: Final = 64 * 1024 * 1024
#: The record fields whose value is the tag, first non-empty string wins.
LUMBERJACK_TAG_FIELDS: Final = ("@metadata.beat", "type")

# -- Log Courier (appliance/protocols/courier/) -----------------------------------------

#: Largest JDAT body (nonce + compressed events), and largest EVNT nonce +
#: compressed stream, in bytes. The Go receiver's limit (``protocoljdat.go``).
COURIER_MAX_PAYLOAD_BYTES: Final = 10 * 1024 * 1024
#: Largest decompressed payload (length prefixes included), in bytes.
COURIER_MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
#: Largest single event, in bytes of JSON. Log Courier's own "max line bytes"
#: is 1 MiB; JSON escaping and fields go a little over.
COURIER_MAX_EVENT_BYTES: Final = 2 * 1024 * 1024
#: Most events one payload may carry. Log Courier spools 1,024 events by
#: default; empty events cost 4 bytes of zlib output each, so this bounds the
#: work and per-event memory of a payload of tiny events, which the byte
#: limits alone do not (64 MiB of 4-byte events would be 16 million rows).
COURIER_MAX_EVENTS: Final = 250_000
#: Most memory the kept rows of one payload may hold, in bytes (Python
#: objects, as the codec counts them in ``PayloadReceived.memory_bytes``):
#: twice the decompressed cap. Real payloads stay near 1.2x their decompressed
#: size (Log Courier spools at most 10 MiB); this cuts off what a hostile
#: payload makes of the decompressed cap (JSON escapes that grow when
#: re-encoded, a 4-bytes-per-character string, millions of tiny events).
COURIER_MAX_PAYLOAD_MEMORY_BYTES: Final = 128 * 1024 * 1024

# -- Logjam (appliance/protocols/logjam.py) ---------------------------------------------

#: Largest body frame accepted, as sent (compressed), in bytes.
LOGJAM_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
#: Largest body after decompression, in bytes. logjam-tools gives up at 64 MiB
#: (``max_buffer_size`` in src/logjam-util.c at HEAD); the appliance's default is
#: half that, which bounds a decoded message's memory (the codec's docstring).
LOGJAM_MAX_DECOMPRESSED_BYTES: Final = 32 * 1024 * 1024
#: Most ``{`` and ``[`` bytes in a decompressed body (a count). Each becomes a
#: Python dict or list of 56 to 200 bytes from 2 bytes of JSON (``{},``), the
#: worst amplification of parsing; real requests hold one list per log line.
LOGJAM_MAX_JSON_CONTAINERS: Final = 256 * 1024

# -- WebSocket ingest (appliance/protocols/websocket_messages.py) ---------------------

#: Largest message, in bytes (characters of a text message).
WEBSOCKET_MAX_MESSAGE_BYTES: Final = 1024 * 1024
#: Events in one message.
WEBSOCKET_MAX_EVENTS_PER_MESSAGE: Final = 10_000
#: JSON objects and arrays in one message (counted as ``{`` and ``[``
#: characters, strings included). A message of 10,000 events needs 20,002
#: (the message, its list, each event and record): the rest leaves room for
#: seven nested objects or arrays in every record of a full message.
WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE: Final = 100_000

# -- the lake writer (appliance/lake/writer.py) -----------------------------------------

#: Rows in one commit before it is sealed.
LAKE_COMMIT_MAX_ROWS: Final = 100_000
#: Approximate bytes of records in one commit before it is sealed.
LAKE_COMMIT_MAX_BYTES: Final = 64 * 1024 * 1024
#: Seconds a commit group stays open before it is sealed (the ack latency floor).
LAKE_COMMIT_MAX_DELAY_SECONDS: Final = 0.25
#: When a batch is acknowledged: "wal" once its append to the write-ahead log
#: is durable (docs/wal.md), "commit" once its rows are in a Delta commit.
LAKE_ACK: Final = "wal"
#: With ``ack = "wal"``: seconds between commits from the log to the table
#: (sooner once ``commit_max_bytes`` of records wait). Rows become visible
#: in the table, and to the live tail, within about this long.
LAKE_COMMIT_INTERVAL_SECONDS: Final = 5.0
#: Blocks that may wait between the connections and the collector.
LAKE_QUEUE_BLOCKS: Final = 64
#: First and largest wait between retries of a failed commit, in seconds.
LAKE_RETRY_INITIAL_SECONDS: Final = 0.5
LAKE_RETRY_MAX_SECONDS: Final = 30.0
#: How long, and how many, committed batch ids are remembered for dedupe.
LAKE_DEDUPE_WINDOW_SECONDS: Final = 3600.0
LAKE_DEDUPE_MAX_KEYS: Final = 1_000_000
#: Seconds a writer's claim on its app id lasts without a commit; an idle
#: writer renews it (a commit of no rows) every third of it.
LAKE_LEASE_SECONDS: Final = 120.0

#: Most worker processes one appliance runs (``workers``): one per core of a large machine.
MAX_WORKERS: Final = 64

# -- the write-ahead log (appliance/wal/, docs/wal.md) -----------------------------------

_MIB: Final = 1024 * 1024
#: A segment file is closed, and a new one started, before it would exceed
#: this many bytes (a record larger than this fills a segment alone).
WAL_SEGMENT_BYTES: Final = 64 * _MIB
#: Smallest segment size accepted, in bytes (smaller ones only multiply files).
WAL_MIN_SEGMENT_BYTES: Final = 4096
#: Largest record, in bytes as stored (header, dedupe key and body). Larger than
#: the largest block any listener can produce with its default limits
#: (docs/limits.md: 64 MiB windows and decompressed requests, 128 MiB Courier payload memory).
WAL_MAX_RECORD_BYTES: Final = 160 * _MIB
#: The largest record the format accepts, in bytes: a scan trusts a verified
#: header's length up to this, so no configured ``max_record_bytes`` may exceed it.
WAL_MAX_RECORD_BYTES_LIMIT: Final = 1024 * _MIB
#: The log's size cap, in bytes of segment files: at the cap, appends wait
#: (backpressure) for the table to catch up instead of the log growing.
WAL_MAX_BYTES: Final = 2048 * _MIB
#: Most records with a dedupe key the log holds uncommitted: each costs
#: memory (its key is kept for dedupe), so they are capped like bytes.
WAL_MAX_KEYS: Final = 1_000_000
#: Longest an append waits for others to join its group before the fdatasync,
#: in seconds. Idle appends do not wait at all (docs/wal.md, "Group commit").
WAL_FLUSH_DELAY_SECONDS: Final = 0.002
#: Upper bound on the configurable flush delay, in seconds: acks must stay "a few ms".
WAL_MAX_FLUSH_DELAY_SECONDS: Final = 0.05
#: Pending bytes that start a flush at once, without waiting for the delay.
WAL_FLUSH_BYTES: Final = 1 * _MIB
#: Most bytes one flush writes before its fdatasync (one record larger than it goes alone):
#: a huge backlog is written in steps, so small appends behind it are not held long.
WAL_GROUP_MAX_BYTES: Final = 16 * _MIB
#: Longest an append waits for room under the cap before it fails, in seconds.
WAL_FULL_WAIT_SECONDS: Final = 30.0
#: Bytes of memory for uncommitted records' decoded batches, which the log keeps
#: so the writer commits them without reading and decoding them back
#: (docs/wal.md, "The cache"). Each record counts its block's ``nbytes`` (its
#: Python objects) and 256 bytes of entry. Half full, it starts a commit: at full
#: load (about 280 bytes an event) a commit every ~240,000 events. 0: off.
WAL_CACHE_BYTES: Final = 128 * _MIB

# -- the disk guard (appliance/lake/diskguard.py) ---------------------------------------

#: Free bytes the table's filesystem keeps: below it, new batches are refused.
DISK_MIN_FREE_BYTES: Final = 1024**3
#: Free share of the filesystem, in percent, it keeps likewise (the larger watermark wins).
DISK_MIN_FREE_PERCENT: Final = 5.0

# -- maintenance and retention (appliance/lake/maintenance.py, retention.py) -----------

#: Seconds between compactions in the service.
MAINTENANCE_COMPACT_INTERVAL_SECONDS: Final = 3600.0
#: Seconds between explicit checkpoints (plus expired-log cleanup) in the service.
MAINTENANCE_CHECKPOINT_INTERVAL_SECONDS: Final = 3600.0
#: Seconds between vacuums in the service.
MAINTENANCE_VACUUM_INTERVAL_SECONDS: Final = 86_400.0
#: Size compaction aims for, per file, in bytes.
MAINTENANCE_TARGET_FILE_BYTES: Final = 128 * 1024 * 1024
#: Seconds one node's claim of the maintenance lease of a shared table keeps the
#: other nodes from maintaining it (appliance/lake/lease.py): far above clock skew.
MAINTENANCE_LEASE_SECONDS: Final = 600.0
#: Hours a file replaced by compaction is kept before vacuum may delete it.
VACUUM_RETENTION_HOURS: Final = 168
#: The floor under vacuum retention, in hours; lower needs an explicit override.
#: It matches Delta's default ``delta.deletedFileRetentionDuration`` (one week).
MIN_VACUUM_RETENTION_HOURS: Final = 168
#: Seconds between retention rounds in the service.
RETENTION_INTERVAL_SECONDS: Final = 3600.0


def check_retention(
    retention_hours: int,
    *,
    allow_short: bool = False,
    override: str = "allow_short_vacuum_retention = true",
) -> None:
    """Refuse a vacuum retention under the floor unless explicitly allowed.

    Config checks ``[maintenance]`` with it, and vacuum and ``appliance
    table vacuum`` check their argument: one rule, one message.

    Raises:
        ValueError: the retention is negative, or below
            :data:`MIN_VACUUM_RETENTION_HOURS` without ``allow_short``
            (the message names ``override``).
    """
    if retention_hours < 0:
        raise ValueError("vacuum retention cannot be negative")
    if retention_hours < MIN_VACUUM_RETENTION_HOURS and not allow_short:
        raise ValueError(
            f"vacuum retention of {retention_hours} h is below the floor of "
            f"{MIN_VACUUM_RETENTION_HOURS} h: readers, time travel and the derived-table "
            f"jobs may still need those files (override: {override})"
        )


def check_wal(
    *,
    segment_bytes: int,
    max_record_bytes: int,
    max_bytes: int,
    max_keys: int,
    flush_delay_seconds: float,
    flush_bytes: int,
    group_max_bytes: int,
    full_wait_seconds: float,
    cache_bytes: int,
) -> None:
    """Refuse write-ahead log settings out of range (``[wal]`` and ``WalSettings`` alike).

    Raises:
        ValueError: naming the key: a value out of its range, or a cap too
            small for the log to make progress (``max_bytes`` must hold two
            full segments).
    """
    if segment_bytes < WAL_MIN_SEGMENT_BYTES:
        raise ValueError(f"wal segment_bytes must be at least {WAL_MIN_SEGMENT_BYTES}")
    if not WAL_MIN_SEGMENT_BYTES <= max_record_bytes <= WAL_MAX_RECORD_BYTES_LIMIT:
        raise ValueError(
            f"wal max_record_bytes must be within {WAL_MIN_SEGMENT_BYTES}.."
            f"{WAL_MAX_RECORD_BYTES_LIMIT}"
        )
    # The active segment is replaced once committed only past a threshold
    # (docs/wal.md, "A small volume"), so after everything is committed it may
    # still hold nearly one full segment: the cap must leave room for another
    # beside it, or appends could wait forever.
    if max_bytes < 2 * max(segment_bytes, max_record_bytes):
        raise ValueError(
            "wal max_bytes must be at least twice max(segment_bytes, max_record_bytes)"
        )
    if max_keys < 1:
        raise ValueError("wal max_keys must be at least 1")
    if not 0.0 <= flush_delay_seconds <= WAL_MAX_FLUSH_DELAY_SECONDS:
        raise ValueError(f"wal flush_delay_seconds must be within 0..{WAL_MAX_FLUSH_DELAY_SECONDS}")
    if flush_bytes < 1 or group_max_bytes < 1:
        raise ValueError("wal flush_bytes and group_max_bytes must be positive")
    if full_wait_seconds < 0:
        raise ValueError("wal full_wait_seconds must not be negative")
    if cache_bytes < 0:
        raise ValueError("wal cache_bytes must not be negative")
