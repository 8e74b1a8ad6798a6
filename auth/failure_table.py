"""Failed-authentication counts shared by every process of a node: one small file of fixed size.

With ``workers = N`` each worker process authenticates its own share of the
connections, and the kernel decides which: counts kept per process would
give a guesser N times the attempts. :class:`FailureTable` keeps the
:class:`~auth.ratelimit.Record` of every count in a file under the node's
state directory (``<state_dir>/auth/failures.table``, :func:`table_path`),
which every worker reaches whatever its own state directory is.

The file is a hash table of :data:`TABLE_SLOTS` records of 64 bytes (8 MiB),
created once and never grown: a key (kind, address group, username) is
hashed with BLAKE2b under a random salt kept in the file's header, so nobody
can choose names that crowd out another key, and neither usernames nor
addresses are stored in clear. A key may sit in one of
:data:`BUCKET_SLOTS` slots; a full bucket gives up its least recently
written record. Each transaction holds an exclusive ``flock`` on the file
for a few ``pread``/``pwrite`` calls of at most a bucket each: no mmap, so a
full disk or a damaged file is an ``OSError``, never a signal; nothing is
fsynced (after a reboot the monotonic clock starts again and the records
are stale: :meth:`~auth.ratelimit.Record.settle` drops them).

It must never become a denial of service itself. The lock is waited for at
most :data:`LOCK_WAIT_SECONDS`; when the file cannot be opened, locked, read
or written, :class:`SharedCounts` falls back to this process's memory for
:data:`FALLBACK_SECONDS` and logs ``auth.failure_table_unavailable``: the
limits then hold per process, as they did before the table existed. It
fails to the local limiter, neither closed (a stuck file would refuse every
login) nor open (no limit at all).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from auth.logs import get_logger
from auth.ratelimit import MemoryCounts, Record

__all__ = [
    "BUCKET_SLOTS",
    "FALLBACK_SECONDS",
    "LOCK_WAIT_SECONDS",
    "TABLE_FILE",
    "TABLE_SLOTS",
    "FailureTable",
    "FailureTableError",
    "SharedCounts",
    "table_path",
]

log = get_logger()

#: The file's name, under ``<state_dir>/auth``.
TABLE_FILE: Final = "failures.table"
#: Records the table holds (8 MiB of 64-byte slots): well beyond the keys of
#: every honest client of a node; under a flood of new keys the least recently
#: written of a bucket give way.
TABLE_SLOTS: Final = 131_072
#: Slots a key may occupy: bounds each look-up to one 512-byte read.
BUCKET_SLOTS: Final = 8
#: Longest wait for the file's lock, in seconds, before this process counts
#: in its own memory: a transaction holds it for microseconds, so only a
#: process stopped while holding it makes anyone wait this long.
LOCK_WAIT_SECONDS: Final = 0.02
#: Sleep between attempts to take the lock, in seconds.
LOCK_RETRY_SECONDS: Final = 0.001
#: Seconds this process counts in memory after the table failed, before it tries again.
FALLBACK_SECONDS: Final = 30.0

_MAGIC: Final = b"APLFAIL1"
_HEADER: Final = struct.Struct("<8sII16s")
_HEADER_BYTES: Final = 64
_SALT_BYTES: Final = 16
_DIGEST_BYTES: Final = 16
#: digest, failures, flags, last_failure, blocked_until, last_success, touched, reserved.
_SLOT: Final = struct.Struct("<16sIIddddd")
_USED: Final = 1
_KNOWN: Final = 2

_T = TypeVar("_T")


class FailureTableError(Exception):
    """The shared table cannot be used now; ``str()`` says why."""


def table_path(state_dir: Path) -> Path:
    """Where the table of the node whose own state directory is ``state_dir`` lives."""
    return state_dir / "auth" / TABLE_FILE


@dataclass(slots=True)
class _Slot:
    index: int
    digest: bytes
    used: bool
    record: Record


def _lock(fd: int) -> None:
    """Take the file's exclusive lock within :data:`LOCK_WAIT_SECONDS`.

    Raises:
        FailureTableError: another process holds it all that time.
    """
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise FailureTableError(f"its lock stayed taken for {LOCK_WAIT_SECONDS}s") from None
        time.sleep(LOCK_RETRY_SECONDS)


class FailureTable:
    """The node's shared table of counts, open in this process (see the module docstring).

    Thread-safe. Open it with :meth:`open`.
    """

    def __init__(self, path: Path, fd: int, salt: bytes, slots: int) -> None:
        self.path = path
        self._fd = fd
        self._salt = salt
        self._slots = slots
        self._buckets = slots // BUCKET_SLOTS
        # flock excludes other processes; threads of this one share its file.
        self._thread_lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, slots: int = TABLE_SLOTS) -> FailureTable:
        """Open the table at ``path``, creating (or re-creating a damaged) one under its lock.

        Raises:
            FailureTableError: it cannot be created, opened or locked.
        """
        if slots <= 0 or slots % BUCKET_SLOTS:
            raise ValueError(f"slots must be a positive multiple of {BUCKET_SLOTS}")
        size = _HEADER_BYTES + slots * _SLOT.size
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise FailureTableError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            _lock(fd)
            try:
                salt = cls._salt_of(fd, size, slots)
                if salt is None:
                    # New, or not a table of this layout: every process that
                    # uses it checked it under this lock, so none reads it now.
                    salt = os.urandom(_SALT_BYTES)
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, size)
                    header = _HEADER.pack(_MAGIC, slots, BUCKET_SLOTS, salt)
                    os.pwrite(fd, header.ljust(_HEADER_BYTES, b"\0"), 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            os.close(fd)
            raise FailureTableError(f"cannot prepare {path}: {exc.strerror or exc}") from None
        except FailureTableError as exc:
            os.close(fd)
            raise FailureTableError(f"cannot prepare {path}: {exc}") from None
        return cls(path, fd, salt, slots)

    @staticmethod
    def _salt_of(fd: int, size: int, slots: int) -> bytes | None:
        """The salt of a valid table of this layout in ``fd``; None for anything else."""
        if os.fstat(fd).st_size != size:
            return None
        header = os.pread(fd, _HEADER.size, 0)
        if len(header) != _HEADER.size:
            return None
        magic, stored_slots, bucket, salt = _HEADER.unpack(header)
        if magic != _MAGIC or stored_slots != slots or bucket != BUCKET_SLOTS:
            return None
        return bytes(salt)

    def close(self) -> None:
        """Close the file (its lock, if held, goes with it)."""
        with self._thread_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _digest(self, key: str) -> bytes:
        data = key.encode("utf-8", "surrogateescape")
        return hashlib.blake2b(data, key=self._salt, digest_size=_DIGEST_BYTES).digest()

    def _bucket_of(self, digest: bytes) -> int:
        return int.from_bytes(digest[:8], "little") % self._buckets

    def _read_bucket(self, bucket: int) -> list[_Slot]:
        first = bucket * BUCKET_SLOTS
        data = os.pread(self._fd, BUCKET_SLOTS * _SLOT.size, _HEADER_BYTES + first * _SLOT.size)
        if len(data) != BUCKET_SLOTS * _SLOT.size:
            raise FailureTableError(f"{self.path} is shorter than its header says")
        slots = []
        for i in range(BUCKET_SLOTS):
            digest, failures, flags, last_failure, blocked, success, touched, _ = _SLOT.unpack_from(
                data, i * _SLOT.size
            )
            known = bool(flags & _KNOWN)
            record = Record(failures, last_failure, blocked, success, touched, known)
            slots.append(_Slot(first + i, bytes(digest), bool(flags & _USED), record))
        return slots

    def _write(self, slot: _Slot) -> None:
        record = slot.record
        flags = (_USED if slot.used else 0) | (_KNOWN if record.known else 0)
        data = _SLOT.pack(
            slot.digest, record.failures, flags, record.last_failure,
            record.blocked_until, record.last_success, record.touched, 0.0,
        )  # fmt: skip
        written = os.pwrite(self._fd, data, _HEADER_BYTES + slot.index * _SLOT.size)
        if written != len(data):
            raise FailureTableError(f"short write to {self.path}")

    @staticmethod
    def _free_slot(bucket: list[_Slot], claimed: set[int], now: float) -> _Slot:
        """An unused slot of ``bucket``, else its least recently written (a stale one first)."""
        candidates = [slot for slot in bucket if slot.index not in claimed]
        for slot in candidates:
            if not slot.used:
                return slot

        def age(slot: _Slot) -> float:
            touched = slot.record.touched
            # Written "in the future": before a reboot; the oldest of all.
            return float("-inf") if not touched <= now else touched

        return min(candidates, key=age)

    def transact(self, keys: Sequence[str], change: Callable[[list[Record]], _T], now: float) -> _T:
        """Run ``change`` on the records of ``keys`` under the file's lock (:class:`CountStore`).

        Raises:
            FailureTableError: the file cannot be locked, read or written;
                ``change`` may have run (its result is then not used).
        """
        with self._thread_lock:
            if self._fd < 0:
                raise FailureTableError(f"{self.path} is closed")
            try:
                _lock(self._fd)
                try:
                    return self._transact(keys, change, now)
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError as exc:
                raise FailureTableError(f"{self.path}: {exc.strerror or exc}") from None

    def _transact(
        self, keys: Sequence[str], change: Callable[[list[Record]], _T], now: float
    ) -> _T:
        buckets: dict[int, list[_Slot]] = {}
        found: list[tuple[bytes, int, _Slot | None]] = []
        for key in keys:
            digest = self._digest(key)
            bucket = self._bucket_of(digest)
            if bucket not in buckets:
                buckets[bucket] = self._read_bucket(bucket)
            match = next(
                (s for s in buckets[bucket] if s.used and hmac.compare_digest(s.digest, digest)),
                None,
            )
            found.append((digest, bucket, match))
        records = [match.record if match else Record() for _, _, match in found]
        result = change(records)
        claimed = {match.index for _, _, match in found if match is not None}
        for (digest, bucket, match), record in zip(found, records, strict=True):
            if record.is_empty():
                if match is not None:
                    match.used = False
                    self._write(match)
                continue
            slot = match
            if slot is None:
                slot = self._free_slot(buckets[bucket], claimed, now)
                claimed.add(slot.index)
                slot.digest, slot.used = digest, True
            record.touched = now
            slot.record = record
            self._write(slot)
        return result


class SharedCounts:
    """The node's :class:`FailureTable`, or this process's memory while it cannot be used.

    Opens the table at the first transaction (or :meth:`open`, at start,
    from a worker thread); after a failure counts in memory for
    :data:`FALLBACK_SECONDS`, then tries the table again.
    """

    def __init__(self, path: Path, *, slots: int = TABLE_SLOTS) -> None:
        self.path = path
        self._slots = slots
        self._table: FailureTable | None = None
        self._retry_at: float | None = None
        self.memory = MemoryCounts()
        self._lock = threading.Lock()

    @property
    def shared(self) -> bool:
        """Whether the last transaction (or :meth:`open`) used the shared table."""
        return self._table is not None and self._retry_at is None

    def open(self, now: float | None = None) -> bool:
        """Open the table now if it is not open; whether it is usable."""
        return self._usable(time.monotonic() if now is None else now) is not None

    def _usable(self, now: float) -> FailureTable | None:
        with self._lock:
            if self._retry_at is not None and now < self._retry_at:
                return None
            self._retry_at = None
            if self._table is None:
                try:
                    self._table = FailureTable.open(self.path, self._slots)
                except FailureTableError as exc:
                    self._fall_back(now, str(exc))
            return self._table

    def _fall_back(self, now: float, reason: str) -> None:
        self._retry_at = now + FALLBACK_SECONDS
        log.warning(
            "auth.failure_table_unavailable", path=str(self.path), reason=reason,
            fallback="this process's memory", retry_in_seconds=str(FALLBACK_SECONDS),
        )  # fmt: skip

    def transact(self, keys: Sequence[str], change: Callable[[list[Record]], _T], now: float) -> _T:
        table = self._usable(now)
        if table is not None:
            try:
                return table.transact(keys, change, now)
            except FailureTableError as exc:
                with self._lock:
                    self._fall_back(now, str(exc))
        return self.memory.transact(keys, change, now)

    def close(self) -> None:
        """Close the table's file."""
        with self._lock:
            if self._table is not None:
                self._table.close()
                self._table = None
