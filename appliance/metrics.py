"""The service's Prometheus metrics (docs/observability.md), on a registry of its own.

One :class:`Metrics` per running service, never prometheus-client's global
registry, so a process (a test) may run several services. Names follow the
Prometheus conventions: the ``appliance_`` prefix, ``_total`` on counters,
base units (seconds, bytes) in the name, and only bounded label values: a
listener's configured ``listener`` name and its ``protocol``, and short
reason classes chosen here (never a peer, a tag or a free-text reason).

The hot path binds labels once and takes no lock: a listener's
:class:`ListenerMetrics` holds plain numbers for its ``(listener,
protocol)`` pair (connections, requests, events, bytes, acks, the ack
latency histogram) that only the event loop's thread updates, and a
collector reads them into the registry at scrape time, on that same
thread. Counting a request is an add (about 0.1 µs, where a
prometheus-client child takes a lock: about 0.6 µs). Label look-ups happen
only on the rare paths (a refusal, a protocol error, an authentication),
through prometheus-client's thread-safe metrics.

``Metrics(enabled=False)`` (and :data:`NULL_METRICS`, the default of every
constructor that takes metrics) hands out :class:`_Noop` objects: drivers,
writers and tests that were built without metrics count nothing and cost
nothing. The service disables metrics when ``[admin]`` is disabled, since
nothing could read them.

Every family's name is a constant of :class:`MetricNames`, which ``appliance
status`` reads too. :class:`Instance` says which appliance a process is (node
id, state directory, pid, version, worker): ``/readyz`` serves it, and
``appliance_build_info`` carries its node id and worker as labels.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from appliance import __version__
from appliance.metric_names import MetricNames
from appliance.state_lock import held_state_dirs

__all__ = [
    "ACK_LATENCY_BUCKETS_SECONDS",
    "COMMIT_DURATION_BUCKETS_SECONDS",
    "NULL_LISTENER",
    "NULL_METRICS",
    "AuthResult",
    "Instance",
    "LakeMetrics",
    "ListenerMetrics",
    "MetricNames",
    "Metrics",
    "WalSample",
    "drop_reason_class",
    "protocol_error_class",
    "refusal_class",
    "tls_failure_class",
]

#: Upper bounds of the ack latency histogram, in seconds: the commit group's
#: delay (0.25 s by default) is the floor, a retried commit the tail.
ACK_LATENCY_BUCKETS_SECONDS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Upper bounds of the Delta commit duration histogram, in seconds.
COMMIT_DURATION_BUCKETS_SECONDS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

AuthResult = Literal["success", "failure", "throttled", "unavailable"]

# No ``*_created`` series beside every counter and histogram: they double the
# series and tell nothing that process_start_time_seconds does not.
disable_created_metrics()  # type: ignore[no-untyped-call]

# -- reason classes: free text in, one of a few words out -------------------------------
#
# Each table is data: (class, words); the first class with a word in the
# lower-cased reason wins, and a reason with none gets the default.

_TLS_FAILURE_CLASSES: Final = (
    ("timeout", ("no handshake within",)),
    ("plaintext", ("plaintext", "not a tls handshake", "http request")),
    ("certificate", ("certificate", "verify failed", "unknown ca")),
    ("closed", ("eof", "closed", "reset by peer", "broken pipe")),
)
_PROTOCOL_ERROR_CLASSES: Final = (
    ("compression", ("zlib", "gzip", "decompress", "compress", "snappy", "lz4")),
    ("limit", ("exceeds", "max_", "more than", "too many", "too large", "too long")),
    ("handshake", ("handshake", "helo", "ping", "shared key", "password", "hostname", "auth")),
    ("encoding", ("msgpack", "json", "utf-8", "utf8")),
)
_DROP_REASON_CLASSES: Final = (
    ("time_out_of_range", ("out of range",)),
    ("invalid_time", ("time is not",)),
    ("record_not_map", ("record is not",)),
    ("malformed_entry", ("entry is not",)),
)


def _classify(reason: str, table: Sequence[tuple[str, Sequence[str]]], default: str) -> str:
    text = reason.lower()
    for name, words in table:
        if any(word in text for word in words):
            return name
    return default


def tls_failure_class(reason: str) -> str:
    """``timeout``, ``plaintext``, ``certificate``, ``closed`` or ``protocol``."""
    return _classify(reason, _TLS_FAILURE_CLASSES, "protocol")


def protocol_error_class(reason: str) -> str:
    """``compression``, ``limit``, ``handshake``, ``encoding`` or ``malformed``."""
    return _classify(reason, _PROTOCOL_ERROR_CLASSES, "malformed")


def drop_reason_class(reason: str) -> str:
    """Why an event inside a valid request was dropped, as a label value."""
    return _classify(reason, _DROP_REASON_CLASSES, "invalid_event")


#: A refused batch's reason class, by how the writer's refusal begins
#: (appliance/lake/log_sink.py, appliance/lake/diskguard.py); the first match wins.
#: By prefix, not by word: the rest of a reason may quote what a client sent.
_REFUSAL_CLASSES: Final = (
    ("wal_full", "write-ahead log full"),
    ("disk_full", "write-ahead log: disk full"),
    ("wal_error", "write-ahead log"),
    ("disk_nearly_full", "disk nearly full"),
)


def refusal_class(reason: str) -> str:
    """Why the writer refused a batch: ``wal_full`` (the log at its cap past
    ``full_wait_seconds``), ``disk_full`` (the log's disk), ``wal_error`` (another
    failed append), ``disk_nearly_full`` (the table's disk guard) or
    ``unstorable`` (the batch's data, or a record over ``max_record_bytes``)."""
    for name, prefix in _REFUSAL_CLASSES:
        if reason.startswith(prefix):
            return name
    return "unstorable"


# -- what the instrumented code calls -----------------------------------------------------


class _Count(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Level(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...

    def set(self, value: float) -> None: ...

    def set_function(self, f: Callable[[], float]) -> None: ...


class _Observe(Protocol):
    def observe(self, amount: float) -> None: ...


class _Noop:
    """Every metric operation, doing nothing (metrics disabled)."""

    __slots__ = ()

    def labels(self, *values: str) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def set_function(self, f: Callable[[], float]) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_NOOP: Final = _Noop()


class _LoopCounter:
    """A counter (or gauge) only the event loop's thread touches: a plain number.

    No lock, so about a tenth of a prometheus-client child's cost; the
    registry reads it at scrape time (:class:`_ListenerCollector`), which is
    on the same thread.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value

    def set_function(self, f: Callable[[], float]) -> None:
        raise NotImplementedError("a loop counter holds its value")


class _LoopHistogram:
    """A histogram only the event loop's thread touches: per-bucket counts and a sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = [*bounds, math.inf]
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, observations <= le)`` pairs, as the exposition wants them."""
        pairs: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            total += count
            pairs.append(("+Inf" if math.isinf(bound) else repr(bound), float(total)))
        return pairs


#: The hot-path metrics of a listener: attribute, metric name, kind, help.
_LOOP_METRICS: Final = (
    ("connections_open", MetricNames.CONNECTIONS_OPEN, "gauge", "Connections open now."),
    ("connections_accepted", MetricNames.CONNECTIONS_ACCEPTED, "counter",
     "Connections accepted (under the connection caps)."),
    ("connections_failed", MetricNames.CONNECTIONS_FAILED, "counter",
     "Connections ended by an unexpected exception (a bug: see connection.failed)."),
    ("requests", MetricNames.REQUESTS, "counter",
     "Requests (forward requests, Lumberjack windows, Courier payloads, WebSocket "
     "messages, Logjam messages) handed to the writer."),
    ("events", MetricNames.EVENTS_RECEIVED, "counter", "Events handed to the writer."),
    ("received_bytes", MetricNames.RECEIVED_BYTES, "counter",
     "Bytes read from clients after TLS (WebSocket: message characters; Logjam: frames)."),
    ("acks", MetricNames.ACKS_SENT, "counter", "Acknowledgements sent after a commit."),
)  # fmt: skip
_ACK_LATENCY: Final = (
    MetricNames.ACK_LATENCY,
    "Seconds from receiving a request to sending its acknowledgement.",
)
_LABELS: Final = ("listener", "protocol")


class _ListenerCollector:
    """Reads every listener's loop counters into the registry at scrape time."""

    def __init__(self, listeners: dict[tuple[str, str], ListenerMetrics]) -> None:
        self._listeners = listeners

    def collect(self) -> Iterable[Metric]:
        listeners = [m for m in self._listeners.values() if m.counting]
        for attribute, name, kind, documentation in _LOOP_METRICS:
            family: Metric
            if kind == "gauge":
                family = GaugeMetricFamily(name, documentation, labels=_LABELS)
            else:
                family = CounterMetricFamily(name, documentation, labels=_LABELS)
            for metrics in listeners:
                counter = getattr(metrics, attribute)
                assert isinstance(counter, _LoopCounter)
                family.add_metric(list(metrics.labels), counter.value)
            yield family
        histogram = HistogramMetricFamily(*_ACK_LATENCY, labels=_LABELS)
        for metrics in listeners:
            latency = metrics.ack_latency
            assert isinstance(latency, _LoopHistogram)
            histogram.add_metric(list(metrics.labels), latency.cumulative(), latency.sum)
        yield histogram

    def describe(self) -> Iterable[Metric]:
        """The families' names, for the registry's duplicate check."""
        for _attribute, name, kind, documentation in _LOOP_METRICS:
            if kind == "gauge":
                yield GaugeMetricFamily(name, documentation, labels=_LABELS)
            else:
                yield CounterMetricFamily(name, documentation, labels=_LABELS)
        yield HistogramMetricFamily(*_ACK_LATENCY, labels=_LABELS)


class _Families:
    """The labelled families of the listeners' rare paths (thread-safe prometheus-client)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*_LABELS, *extra], registry=registry)

        self.connections_refused = counter(
            MetricNames.CONNECTIONS_REFUSED,
            "Connections closed at once over a cap (reason: max_connections, "
            "max_connections_per_address).",
            "reason",
        )
        self.tls_failures = counter(
            MetricNames.TLS_FAILURES,
            "TLS handshakes that failed (reason: timeout, plaintext, certificate, closed, "
            "protocol).",
            "reason",
        )
        self.events_dropped = counter(
            MetricNames.EVENTS_DROPPED,
            "Events of a valid request dropped as unusable, by reason class.",
            "reason",
        )
        self.protocol_errors = counter(
            MetricNames.PROTOCOL_ERRORS,
            "Requests or connections refused for a protocol violation (reason: compression, "
            "limit, handshake, encoding, malformed).",
            "reason",
        )
        self.batches_refused = counter(
            MetricNames.BATCHES_REFUSED,
            "Batches the writer refused, never acknowledged (reason: wal_full, disk_full, "
            "wal_error, disk_nearly_full, unstorable).",
            "reason",
        )
        self.auth = counter(
            MetricNames.AUTH_ATTEMPTS,
            "Authentications by mechanism (shared_key, users, token, curve) and result "
            "(success, failure, throttled, unavailable).",
            "mechanism",
            "result",
        )


class ListenerMetrics:
    """The metrics of one listener, its labels bound once.

    The attributes are what the hot path counts into: plain numbers that
    only the event loop's thread may touch (every driver counts them there;
    a session's ``receive`` that runs in a worker thread must not). The
    methods take a reason or mechanism, look the label up, and are
    thread-safe (rare paths only).
    """

    __slots__ = (
        "_families",
        "ack_latency",
        "acks",
        "connections_accepted",
        "connections_failed",
        "connections_open",
        "counting",
        "events",
        "labels",
        "received_bytes",
        "requests",
    )

    def __init__(self, families: _Families | None, listener: str, protocol: str) -> None:
        self._families = families
        self.labels = (listener, protocol)
        #: Whether anything is counted (False: every attribute is a no-op).
        self.counting = families is not None
        self.connections_open: _Level = _LoopCounter() if families else _NOOP
        self.connections_accepted: _Count = _LoopCounter() if families else _NOOP
        self.connections_failed: _Count = _LoopCounter() if families else _NOOP
        self.requests: _Count = _LoopCounter() if families else _NOOP
        self.events: _Count = _LoopCounter() if families else _NOOP
        self.received_bytes: _Count = _LoopCounter() if families else _NOOP
        self.acks: _Count = _LoopCounter() if families else _NOOP
        self.ack_latency: _Observe = (
            _LoopHistogram(ACK_LATENCY_BUCKETS_SECONDS) if families else _NOOP
        )

    def connection_refused(
        self,
        reason: Literal[
            "max_connections", "max_connections_per_address", "untrusted_proxy", "proxy_header"
        ],
    ) -> None:
        """A connection over a cap, closed at once."""
        if self._families is not None:
            self._families.connections_refused.labels(*self.labels, reason).inc()

    def tls_failure(self, reason: str) -> None:
        """A failed TLS handshake; ``reason`` is the log line's text."""
        if self._families is not None:
            self._families.tls_failures.labels(*self.labels, tls_failure_class(reason)).inc()

    def protocol_error(self, reason: str) -> None:
        """A protocol violation; ``reason`` is the codec's text."""
        if self._families is not None:
            label = protocol_error_class(reason)
            self._families.protocol_errors.labels(*self.labels, label).inc()

    def events_dropped(self, reason: str, count: int) -> None:
        """``count`` events dropped from a valid request; ``reason`` is the codec's text."""
        if self._families is not None:
            label = drop_reason_class(reason)
            self._families.events_dropped.labels(*self.labels, label).inc(count)

    def auth(self, mechanism: str, result: AuthResult) -> None:
        """One authentication attempt's outcome."""
        if self._families is not None:
            self._families.auth.labels(*self.labels, mechanism, result).inc()

    def batch_refused(self, reason: str) -> None:
        """A batch the writer refused (``BlockRefused``); ``reason`` is its text."""
        if self._families is not None:
            label = refusal_class(reason)
            self._families.batches_refused.labels(*self.labels, label).inc()


#: The metrics of a listener built without any (tests, tools): counts nothing.
NULL_LISTENER: Final = ListenerMetrics(None, "", "")


class LakeMetrics:
    """The writer's and the table's metrics (one table per service: no labels)."""

    __slots__ = (
        "batches_stored_elsewhere",
        "blocks_refused",
        "commit_conflicts",
        "commit_duration",
        "commit_failures_data",
        "commit_failures_storage",
        "commit_retrying",
        "commits",
        "committed_bytes",
        "committed_rows",
        "dedupe_committed",
        "dedupe_evicted",
        "dedupe_keys",
        "dedupe_logged",
        "dedupe_pending",
        "last_commit_age",
        "last_commit_time",
        "log_records_lost",
        "queue_blocks",
        "queue_capacity",
        "table_bytes",
        "table_files",
        "table_version",
    )

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.commits: _Count = _NOOP
        self.commit_duration: _Observe = _NOOP
        self.committed_rows: _Count = _NOOP
        self.committed_bytes: _Count = _NOOP
        self.commit_failures_storage: _Count = _NOOP
        self.commit_failures_data: _Count = _NOOP
        self.commit_retrying: _Level = _NOOP
        self.queue_blocks: _Level = _NOOP
        self.queue_capacity: _Level = _NOOP
        self.dedupe_committed: _Count = _NOOP
        self.dedupe_pending: _Count = _NOOP
        self.dedupe_logged: _Count = _NOOP
        self.log_records_lost: _Count = _NOOP
        self.blocks_refused: _Count = _NOOP
        self.commit_conflicts: _Count = _NOOP
        self.dedupe_keys: _Level = _NOOP
        self.dedupe_evicted: _Level = _NOOP
        self.batches_stored_elsewhere: _Count = _NOOP
        self.table_version: _Level = _NOOP
        self.last_commit_time: _Level = _NOOP
        self.last_commit_age: _Level = _NOOP
        self.table_files: _Level = _NOOP
        self.table_bytes: _Level = _NOOP
        if registry is None:
            return
        r = registry
        self.commits = Counter(
            MetricNames.LAKE_COMMITS, "Successful Delta commits of events.", registry=r
        )
        self.commit_duration = Histogram(
            MetricNames.LAKE_COMMIT_DURATION,
            "Seconds one successful Delta commit took (in its worker thread).",
            buckets=COMMIT_DURATION_BUCKETS_SECONDS,
            registry=r,
        )
        self.committed_rows = Counter(
            MetricNames.LAKE_COMMITTED_ROWS, "Rows in successful commits.", registry=r
        )
        self.committed_bytes = Counter(
            MetricNames.LAKE_COMMITTED_BYTES,
            "Bytes of Arrow data in successful commits (before Parquet compression).",
            registry=r,
        )
        failures = Counter(
            MetricNames.LAKE_COMMIT_FAILURES,
            "Failed commit attempts (kind: storage, retried after a backoff until it "
            "succeeds; data, the group retried block by block).",
            ["kind"],
            registry=r,
        )
        self.commit_failures_storage = failures.labels("storage")
        self.commit_failures_data = failures.labels("data")
        self.commit_retrying = Gauge(
            MetricNames.LAKE_COMMIT_RETRYING,
            "1 while a commit is failing and being retried (no acks meanwhile), else 0.",
            registry=r,
        )
        self.queue_blocks = Gauge(
            MetricNames.LAKE_QUEUE_BLOCKS,
            "Batches waiting between the connections and the writer.",
            registry=r,
        )
        self.queue_capacity = Gauge(
            MetricNames.LAKE_QUEUE_CAPACITY,
            "Batches that may wait before connections stop reading ([lake] queue_blocks).",
            registry=r,
        )
        dedupe = Counter(
            MetricNames.LAKE_DEDUPE_HITS,
            "Resent batches acknowledged again without a second write (state: committed; "
            "logged, in the write-ahead log; pending, its first copy not yet durable).",
            ["state"],
            registry=r,
        )
        self.dedupe_committed = dedupe.labels("committed")
        self.dedupe_logged = dedupe.labels("logged")
        self.dedupe_pending = dedupe.labels("pending")
        self.log_records_lost = Counter(
            MetricNames.WAL_RECORDS_UNSTORABLE,
            "Write-ahead log records (acknowledged) that could not be committed: "
            "wal.record_unstorable in the log says which.",
            registry=r,
        )
        self.blocks_refused = Counter(
            MetricNames.LAKE_BLOCKS_REFUSED,
            "Batches refused because their data cannot be stored (never acknowledged).",
            registry=r,
        )
        self.commit_conflicts = Counter(
            MetricNames.LAKE_COMMIT_CONFLICTS,
            "Commits that lost their table version to another writer's commit and were "
            "checked again against it before the next attempt.",
            registry=r,
        )
        self.dedupe_keys = Gauge(
            MetricNames.LAKE_DEDUPE_KEYS,
            "Batch ids the writer knows as stored (its own commits and other writers'), "
            "up to [lake] dedupe_max_keys.",
            registry=r,
        )
        self.dedupe_evicted = Gauge(
            MetricNames.LAKE_DEDUPE_EVICTED,
            "Batch ids pushed out by dedupe_max_keys before dedupe_window_seconds ended, "
            "since start: above 0, the dedupe window is shorter than configured.",
            registry=r,
        )
        self.batches_stored_elsewhere = Counter(
            MetricNames.LAKE_BATCHES_STORED_ELSEWHERE,
            "Batches left out of a commit because another writer's commit holds them "
            "(a client resent them there).",
            registry=r,
        )
        self.table_version = Gauge(
            MetricNames.LAKE_TABLE_VERSION, "The events table's version after the last commit.",
            registry=r,
        )  # fmt: skip
        self.last_commit_time = Gauge(
            MetricNames.LAKE_LAST_COMMIT_TIMESTAMP,
            "Unix time of the last successful commit (or lease renewal), 0 before the first.",
            registry=r,
        )
        self.last_commit_age = Gauge(
            MetricNames.LAKE_LAST_COMMIT_AGE,
            "Seconds since the last successful commit (or lease renewal, or the table's opening).",
            registry=r,
        )
        self.table_files = Gauge(
            MetricNames.LAKE_TABLE_FILES,
            "Live data files of the events table, as the last maintenance run counted them.",
            registry=r,
        )
        self.table_bytes = Gauge(
            MetricNames.LAKE_TABLE_BYTES,
            "Bytes of the live data files, as the last maintenance run counted them.",
            registry=r,
        )


@dataclass(frozen=True, slots=True)
class WalSample:
    """The write-ahead log's figures at one scrape (appliance/wal/log.py keeps them)."""

    #: Bytes of the segment files, and the cap on them ([wal] max_bytes).
    file_bytes: int
    max_bytes: int
    #: Bytes of durable records not yet committed to the table.
    uncommitted_bytes: int
    segments: int
    #: An append is waiting for room under the cap (backpressure).
    at_cap: bool
    appends: int
    #: Groups written, each with one fdatasync, and those that failed.
    syncs: int
    failed_syncs: int
    written_bytes: int
    cap_waits: int
    cap_refusals: int
    #: Seconds from each group's first append to its durability, summed over the groups.
    sync_wait_seconds: float
    #: What the cache of uncommitted records holds (their blocks' bytes, 256 bytes a record).
    cache_bytes: int
    #: Commit groups served from the cache, and those read back from the files and decoded.
    groups_from_cache: int
    groups_read_back: int
    #: Acknowledged records the log lost to damage found when it opened (``WalStats.records_lost``).
    records_lost: int = 0
    #: The committed position (where the oldest uncommitted record starts).
    committed: int = 0
    #: ``(LSN, receive time in Unix ns)`` of the oldest record in the log's cache
    #: (:attr:`~appliance.wal.log.WriteAheadLog.oldest_cached`), None when it is empty.
    oldest_cached: tuple[int, int] | None = None


class _WalCollector:
    """Reads the write-ahead log's figures at scrape time (on the event loop's thread).

    The oldest uncommitted record's age comes from its block's receive time,
    which only the log's cache keeps (the files hold no time): exact while
    that record is the cache's oldest, or was at an earlier scrape and is
    still the oldest uncommitted one (remembered by position); otherwise,
    when older records left the cache, the age of the oldest it holds (a
    lower bound); NaN with nothing to go by (``cache_bytes = 0``).
    """

    def __init__(
        self, sample: Callable[[], WalSample | None], clock: Callable[[], float] = time.time
    ) -> None:
        self._sample = sample
        self._clock = clock
        #: ``(committed position, receive time in ns)`` of the record seen there.
        self._oldest: tuple[int, int] | None = None

    def _oldest_age(self, found: WalSample) -> float:
        """Seconds since the oldest uncommitted record was received (0 with none)."""
        if found.uncommitted_bytes == 0:
            self._oldest = None
            return 0.0
        cached = found.oldest_cached
        if cached is not None and cached[0] == found.committed:
            self._oldest = (found.committed, cached[1])
        if self._oldest is not None and self._oldest[0] == found.committed:
            received_ns = self._oldest[1]
        elif cached is not None:
            received_ns = cached[1]  # older records left the cache: at least this old
        else:
            return math.nan
        return max(0.0, self._clock() - received_ns / 1e9)

    def collect(self) -> Iterable[Metric]:
        found = self._sample()
        if found is None:
            return
        n = MetricNames
        for name, doc, value in (
            (n.WAL_FILE_BYTES, "Bytes of the write-ahead log's segment files.",
             found.file_bytes),
            (n.WAL_MAX_BYTES, "The cap on them ([wal] max_bytes).", found.max_bytes),
            (n.WAL_UNCOMMITTED_BYTES,
             "Bytes of durable log records not yet committed to the table.",
             found.uncommitted_bytes),
            (n.WAL_OLDEST_UNCOMMITTED_AGE,
             "Seconds since the oldest uncommitted log record was received (0 with none; "
             "a lower bound once it left the log's cache, NaN with the cache off).",
             self._oldest_age(found)),
            (n.WAL_SEGMENTS, "Segment files of the log.", found.segments),
            (n.WAL_AT_CAP,
             "1 while an append waits for room under the cap (connections stop reading), else 0.",
             int(found.at_cap)),
            (n.WAL_CACHE_BYTES,
             "What the log's cache of decoded records holds, as [wal] cache_bytes counts it.",
             found.cache_bytes),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, count in (
            (n.WAL_APPENDS, "Records taken by the log (batches).", found.appends),
            (n.WAL_SYNCS, "Groups written, each with one fdatasync.", found.syncs),
            (n.WAL_FAILED_SYNCS,
             "Groups whose write or fdatasync failed (disk full, I/O error): not acked.",
             found.failed_syncs),
            (n.WAL_WRITTEN_BYTES, "Bytes of records made durable.", found.written_bytes),
            (n.WAL_CAP_WAITS, "Appends that waited for room under the cap.",
             found.cap_waits),
            (n.WAL_CAP_REFUSALS,
             "Appends refused after full_wait_seconds at the cap (connection closed).",
             found.cap_refusals),
            (n.WAL_SYNC_WAIT_SECONDS,
             "Seconds from each group's first append to its durability, summed (divide by syncs).",
             found.sync_wait_seconds),
            (n.WAL_GROUPS_FROM_CACHE,
             "Commit groups served from the cache: no read back, no decode.",
             found.groups_from_cache),
            (n.WAL_GROUPS_READ_BACK,
             "Commit groups read back from the files and decoded (replay, or a cache too small).",
             found.groups_read_back),
            (n.WAL_RECORDS_LOST,
             "Acknowledged records lost to damage the log found when it opened (at least this "
             "many): wal.tail_damaged, wal.record_damaged, wal.segment_damaged and wal.gap in "
             "the log say where.",
             found.records_lost),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=count)

    def describe(self) -> Iterable[Metric]:
        return []


class _WorkerSpreadCollector:
    """Every running worker's open connections at scrape time (the workers' shared counts)."""

    def __init__(self, spread: Callable[[], Sequence[int]]) -> None:
        self._spread = spread

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            MetricNames.WORKER_CONNECTIONS_OPEN,
            "Connections open in each running worker of this node (workers = N): "
            "how the accept gate spreads them.",
            labels=["worker"],
        )
        for index, count in enumerate(self._spread()):
            if count >= 0:  # a worker that is not running has no series
                family.add_metric([str(index)], count)
        yield family

    def describe(self) -> Iterable[Metric]:
        return []


class _MaintenanceFamilies:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            MetricNames.MAINTENANCE_RUNS,
            "Maintenance runs by operation (compact, checkpoint, vacuum) and result (ok, "
            "failed, skipped).",
            ["operation", "result"],
            registry=registry,
        )
        self.last = Gauge(
            MetricNames.MAINTENANCE_LAST_RUN,
            "Unix time the operation last finished (ok or failed).",
            ["operation"],
            registry=registry,
        )
        self.duration = Gauge(
            MetricNames.MAINTENANCE_LAST_DURATION,
            "Seconds the operation's last run took.",
            ["operation"],
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class Instance:
    """Which appliance answers: ``/readyz`` names it, ``appliance_build_info`` labels it.

    ``appliance status`` compares the state directory with its configuration's,
    so that an admin listener of another appliance on the same address is not
    taken for this one.
    """

    node_id: str
    #: Absolute; None when it cannot be told (several services in one process
    #: with ``ack = "commit"``: tests only).
    state_dir: str | None
    pid: int
    version: str
    #: Which worker of ``workers = N`` this process is (None: a single process).
    worker: int | None

    @classmethod
    def of(cls, node_id: str, wal_directory: Path | None) -> Instance:
        """This process's identity, for the service with node id ``node_id``.

        The state directory is the parent of the service's log
        (``<state_dir>/wal``) when it has one, else the one state directory
        whose lock this process holds. A worker's is ``<home>/workers/<k>``
        (:meth:`~appliance.config.Config.worker_state_dir`).
        """
        state_dir: Path | None = None
        if wal_directory is not None:
            state_dir = wal_directory.parent.resolve()
        else:
            held = held_state_dirs()
            state_dir = held[0] if len(held) == 1 else None
        worker = None
        if (
            state_dir is not None
            and state_dir.parent.name == "workers"
            and state_dir.name.isdigit()
        ):
            worker = int(state_dir.name)
        return cls(
            node_id, None if state_dir is None else str(state_dir), os.getpid(), __version__, worker
        )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        return {
            "node_id": self.node_id, "state_dir": self.state_dir, "pid": self.pid,
            "version": self.version, "worker": self.worker,
        }  # fmt: skip


class _BuildInfo:
    """``appliance_build_info``: 1, labelled with the version, the node id and the worker.

    The node id and worker are empty until :meth:`Metrics.identify` (and the
    worker stays empty for a single process): three labels of one value each,
    one series per process.
    """

    def __init__(self) -> None:
        self.instance: Instance | None = None

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            MetricNames.BUILD_INFO,
            "Always 1; the version, the node id and the worker (workers = N) as labels.",
            labels=("version", "node_id", "worker"),
        )

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        found = self.instance
        node_id = "" if found is None else found.node_id
        worker = "" if found is None or found.worker is None else str(found.worker)
        family.add_metric([__version__, node_id, worker], 1)
        yield family

    def describe(self) -> Iterable[Metric]:
        """The family's name, for the registry's duplicate check."""
        yield self._family()


class Metrics:
    """Every metric of one service, on its own registry.

    Args:
        enabled: False hands out no-op metrics (nothing counted, nothing served).
        process: add the default process, platform and garbage-collector collectors.
    """

    def __init__(self, *, enabled: bool = True, process: bool = True) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry()
        registry = self.registry if enabled else None
        self._families = _Families(self.registry) if enabled else None
        self._listeners: dict[tuple[str, str], ListenerMetrics] = {}
        if enabled:
            self.registry.register(_ListenerCollector(self._listeners))
        self.lake = LakeMetrics(registry)
        self._maintenance = _MaintenanceFamilies(self.registry) if enabled else None
        self._build_info = _BuildInfo()
        if not enabled:
            return
        self.registry.register(self._build_info)
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)

    def listener(self, name: str, protocol: str) -> ListenerMetrics:
        """The metrics of listener ``name`` (the same object for the same pair)."""
        key = (name, protocol)
        found = self._listeners.get(key)
        if found is None:
            found = self._listeners[key] = ListenerMetrics(self._families, name, protocol)
        return found

    def maintenance(
        self, operation: str, result: Literal["ok", "failed", "skipped"], *,
        finished_at: float, seconds: float,
    ) -> None:  # fmt: skip
        """One maintenance run (``finished_at``: Unix time; ``seconds``: how long it took)."""
        families = self._maintenance
        if families is None:
            return
        families.runs.labels(operation, result).inc()
        if result != "skipped":
            families.last.labels(operation).set(finished_at)
            families.duration.labels(operation).set(seconds)

    def identify(self, instance: Instance) -> None:
        """Label ``appliance_build_info`` with the node id and worker of ``instance``."""
        self._build_info.instance = instance

    def watch_wal(self, sample: Callable[[], WalSample | None]) -> None:
        """Serve the write-ahead log's figures, read by ``sample`` at each scrape (None: none)."""
        if self.enabled:
            self.registry.register(_WalCollector(sample))

    def watch_workers(self, spread: Callable[[], Sequence[int]]) -> None:
        """Serve every worker's open connections, read by ``spread`` at each scrape."""
        if self.enabled:
            self.registry.register(_WorkerSpreadCollector(spread))

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry in the text format the ``Accept`` header asks for, and its type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


#: The metrics of anything built without any: counts nothing.
NULL_METRICS: Final = Metrics(enabled=False, process=False)
