"""The write-ahead log's segment files on disk: recovery, durable group appends, deletion, reads.

Blocking code, called from worker threads by appliance/wal/log.py (no trio
here). The directory holds files named ``<base>.wal``, ``base`` being the
20-digit log position of the file's first byte (appliance/wal/frame.py).
The last segment is the active one: appends go there, and it is never
deleted, so the log's next position survives a restart even when every
record is committed.

Durability: a group of records is written with ``pwrite`` at the segment's
verified end, then ``fdatasync``; only then are their LSNs returned. A new
segment's directory entry is made durable (``fsync`` of the directory) before
anything in it is reported durable. When a write or the fdatasync fails (disk
full, I/O error) the file is cut back to its verified end, so the log stays
valid and the next append starts afresh; if even the cut-back fails, the
segment is abandoned and the next append opens a new one at the same
position (recovery drops the abandoned bytes: they are superseded).

Recovery (:meth:`SegmentStore.open`, docs/wal.md "Recovery"): every segment
holding uncommitted records is scanned. In the last segment, damage ends the
log: the file is truncated there (a torn tail: the group being written when
the process or machine stopped), with a ``wal.tail_truncated`` log line.
In an older segment, damage cannot be a torn write (the segment was synced
before the next one was created): a record whose body fails its CRC is
skipped by its verified length, and a damaged header makes the rest of that
segment unreadable; both are logged as errors with the positions lost, and
the file is left as it is for inspection until it is committed and deleted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from appliance.lake.blocks import DedupeKey
from appliance.logs import get_logger
from appliance.wal.errors import WalCorrupt, WalWriteError
from appliance.wal.frame import (
    HEADER_BYTES,
    Frame,
    FrameScanner,
    ScanEnd,
    SkippedRecord,
    frame_header,
)

__all__ = [
    "READ_CHUNK_BYTES",
    "SEGMENT_SUFFIX",
    "Entry",
    "Recovery",
    "SegmentInfo",
    "SegmentStore",
    "Written",
    "segment_name",
]

log = get_logger("wal")

SEGMENT_SUFFIX: Final = ".wal"
_SEGMENT_NAME: Final = re.compile(r"^(\d{20})\.wal$")
#: Bytes read from a segment file at a time (recovery, replay, reads).
READ_CHUNK_BYTES: Final = 1024 * 1024
#: Mode of the log's directory and segment files (DESIGN §5: state files are private).
_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o600


def segment_name(base: int) -> str:
    """The file name of the segment whose first byte is at position ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Entry:
    """A record to append: its LSN is given when it is written."""

    kind: int
    key_section: bytes
    rows: int
    body: bytes

    @property
    def size(self) -> int:
        """Bytes the record takes on disk."""
        return HEADER_BYTES + len(self.key_section) + len(self.body)


@dataclass(frozen=True, slots=True)
class Written:
    """What one :meth:`SegmentStore.write_group` made durable: a prefix of its entries."""

    #: LSN of each entry written, in order (fewer than given when the segment filled up).
    lsns: list[int]
    #: The log's durable end after the write.
    end: int
    #: Bytes of all segment files after the write.
    total_bytes: int


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment as the store knows it (for status, tests and the cap)."""

    base: int
    #: Bytes of verified records: the readable range is ``[base, base + valid_bytes)``.
    valid_bytes: int
    #: Bytes of the file on disk (what counts toward the cap).
    file_bytes: int

    @property
    def end(self) -> int:
        """Position just past the segment's last verified record."""
        return self.base + self.valid_bytes

    @property
    def name(self) -> str:
        """The segment's file name."""
        return segment_name(self.base)


@dataclass(slots=True)
class Recovery:
    """What :meth:`SegmentStore.open` found."""

    #: The committed position actually used: the one given, moved up to a record boundary.
    committed: int
    #: Position just past the last durable record (where the next append goes).
    durable_end: int
    #: ``(lsn, key)`` of every uncommitted record with a dedupe key, in log order.
    keys: list[tuple[int, DedupeKey]] = field(default_factory=list)
    #: Uncommitted records found, and their bytes.
    records: int = 0
    record_bytes: int = 0
    #: Bytes cut off torn tails (and superseded bytes of abandoned segments).
    truncated_bytes: int = 0
    #: Uncommitted records lost to damage: skipped records, and position ranges unreadable.
    damaged_records: int = 0
    lost_ranges: list[tuple[int, int]] = field(default_factory=list)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:  # pwrite raises rather than write nothing; never loop forever
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        offset += written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class SegmentStore:
    """The segment files of one log directory. Use :meth:`open`.

    Thread use: :meth:`write_group` and :meth:`delete_committed` must not run
    at the same time (the trio layer runs both under one limiter); reads
    (:meth:`read`, :meth:`replay`) may run beside them.
    """

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._segments: list[SegmentInfo] = []
        self._lock = threading.Lock()
        self._fd = -1
        #: The active segment could not be cut back after a failed write: start a new one.
        self._abandoned = False
        self._end = 0

    # -- opening and recovery ------------------------------------------------

    @classmethod
    def open(
        cls, directory: Path, committed: int, segment_bytes: int
    ) -> tuple[SegmentStore, Recovery]:
        """Open (creating if needed) the log in ``directory`` and recover it.

        Args:
            directory: the log's directory (``<state_dir>/wal``).
            committed: the position the table says is committed (from its app
                transaction; 0 for a new table). Segments wholly before it are deleted.
            segment_bytes: size at which the active segment is closed.

        Raises:
            OSError: the directory or a segment cannot be read or written.
        """
        created = not directory.exists()
        directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        if created:
            _fsync_dir(directory.parent)
        store = cls(directory, segment_bytes)
        recovery = store._recover(committed)
        return store, recovery

    def _bases(self) -> list[int]:
        bases: list[int] = []
        for path in self.directory.iterdir():
            match = _SEGMENT_NAME.match(path.name)
            if match is None:
                log.warning("wal.unknown_file", directory=str(self.directory), file=path.name)
                continue
            bases.append(int(match.group(1)))
        return sorted(bases)

    def _recover(self, committed: int) -> Recovery:
        bases = self._bases()
        # Segments wholly before the committed position hold nothing to replay.
        while len(bases) > 1 and bases[1] <= committed:
            self._unlink(bases.pop(0))
        recovery = Recovery(committed=committed, durable_end=committed)
        for index, base in enumerate(bases):
            limit = bases[index + 1] if index + 1 < len(bases) else None
            self._segments.append(self._recover_segment(base, limit, recovery))
        self._settle_committed(recovery)
        last = self._segments[-1] if self._segments else None
        if last is None or last.end < recovery.committed:
            if last is not None:
                log.warning(
                    "wal.behind_table", directory=str(self.directory),
                    log_end=last.end, committed=recovery.committed,
                )  # fmt: skip
                for segment in self._segments:
                    self._unlink(segment.base)
                self._segments.clear()
            self._segments.append(self._create(recovery.committed))
        else:
            self._fd = os.open(self._path(last), os.O_RDWR | os.O_CLOEXEC)
        self._end = self._segments[-1].end
        recovery.durable_end = self._end
        log.info(
            "wal.open", directory=str(self.directory), segments=len(self._segments),
            committed=recovery.committed, end=self._end, records=recovery.records,
            uncommitted_bytes=recovery.record_bytes, keys=len(recovery.keys),
            truncated_bytes=recovery.truncated_bytes, damaged_records=recovery.damaged_records,
        )  # fmt: skip
        return recovery

    def _settle_committed(self, recovery: Recovery) -> None:
        """Move the committed position to a record boundary and note records lost before the log."""
        if self._segments and recovery.committed < self._segments[0].base:
            first = self._segments[0].base
            log.error(
                "wal.gap", directory=str(self.directory),
                lost_from=recovery.committed, lost_to=first, reason="log starts after committed",
            )  # fmt: skip
            recovery.lost_ranges.insert(0, (recovery.committed, first))
            recovery.committed = first

    def _scan_file(
        self, path: Path, base: int, limit: int | None
    ) -> Iterator[Frame | SkippedRecord | ScanEnd]:
        """Every record (and skipped record) of a segment file, then how its scan ended."""
        scanner = FrameScanner(base, limit=limit)
        with path.open("rb", buffering=0) as file:
            while not scanner.stopped:
                chunk = file.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                yield from scanner.feed(chunk)
        yield scanner.finish()

    def _recover_segment(self, base: int, limit: int | None, recovery: Recovery) -> SegmentInfo:
        path = self.directory / segment_name(base)
        file_bytes = path.stat().st_size
        end = ScanEnd(base, base, None)
        skipped: list[SkippedRecord] = []
        for item in self._scan_file(path, base, limit):
            if isinstance(item, ScanEnd):
                end = item
            elif isinstance(item, SkippedRecord):
                skipped.append(item)
            else:
                self._note_frame(item, recovery)
        for record in skipped:
            self._note_skipped(path, record, recovery)
        valid_bytes = end.damage_at - base
        if end.reason is not None:
            valid_bytes = self._handle_damage(path, base, limit, end, file_bytes, recovery)
        elif limit is not None and base + valid_bytes < limit:
            self._lost(path, base + valid_bytes, limit, "segment ends before the next", recovery)
        return SegmentInfo(base, valid_bytes, path.stat().st_size)

    def _note_frame(self, frame: Frame, recovery: Recovery) -> None:
        if frame.end <= recovery.committed:
            return
        if frame.lsn < recovery.committed:
            # The table's position falls inside this record: it was committed.
            log.warning("wal.committed_inside_record", lsn=frame.lsn, committed=recovery.committed)
            recovery.committed = frame.end
            return
        recovery.records += 1
        recovery.record_bytes += frame.size
        if frame.key is not None:
            recovery.keys.append((frame.lsn, frame.key))

    def _note_skipped(self, path: Path, record: SkippedRecord, recovery: Recovery) -> None:
        if record.end <= recovery.committed:
            return
        recovery.damaged_records += 1
        log.error(
            "wal.record_damaged", segment=path.name, lsn=record.lsn, bytes=record.size,
            reason=record.reason,
        )  # fmt: skip

    def _lost(self, path: Path, start: int, stop: int, reason: str, recovery: Recovery) -> None:
        if stop <= recovery.committed:
            return
        start = max(start, recovery.committed)
        recovery.lost_ranges.append((start, stop))
        log.error(
            "wal.segment_damaged", segment=path.name, lost_from=start, lost_to=stop, reason=reason
        )

    def _handle_damage(
        self,
        path: Path,
        base: int,
        limit: int | None,
        end: ScanEnd,
        file_bytes: int,
        recovery: Recovery,
    ) -> int:
        """Truncate a torn tail, or note an older segment's loss; returns the valid bytes."""
        offset = end.damage_at - base
        # The last segment's damage is the group being written when the
        # process stopped; an abandoned segment's damage starts exactly where
        # the next segment begins. Neither was ever acknowledged: cut it off.
        if limit is None or end.damage_at == limit:
            cut = file_bytes - offset
            with path.open("r+b", buffering=0) as file:
                os.ftruncate(file.fileno(), offset)
                os.fdatasync(file.fileno())
            recovery.truncated_bytes += cut
            log.warning(
                "wal.tail_truncated", segment=path.name, offset=offset, bytes=cut,
                reason=end.reason, lsn=end.damage_at,
            )  # fmt: skip
            return offset
        assert end.reason is not None
        self._lost(path, end.damage_at, limit, end.reason, recovery)
        return offset

    def _path(self, segment: SegmentInfo) -> Path:
        return self.directory / segment.name

    def _set_active(self, segment: SegmentInfo) -> None:
        """Replace the active segment's record (sizes change; it is frozen for readers)."""
        with self._lock:
            self._segments[-1] = segment

    def _create(self, base: int) -> SegmentInfo:
        """A new, empty segment at ``base``, its directory entry durable; it becomes active."""
        path = self.directory / segment_name(base)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        try:
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._abandoned = False
        return SegmentInfo(base, 0, 0)

    def _unlink(self, base: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / segment_name(base))

    # -- appending -----------------------------------------------------------

    @property
    def durable_end(self) -> int:
        """Position just past the last durable record."""
        return self._end

    @property
    def total_bytes(self) -> int:
        """Bytes of all segment files."""
        with self._lock:
            return sum(s.file_bytes for s in self._segments)

    def segments(self) -> list[SegmentInfo]:
        """The segments, oldest first (the last one is active)."""
        with self._lock:
            return list(self._segments)

    def _rotate(self) -> SegmentInfo:
        """Close the active segment and start one at the durable end.

        An abandoned segment holding nothing durable has the durable end as
        its name already: it is emptied and reused (its name is durable).
        On failure nothing changes: the next write tries again.
        """
        active = self._segments[-1]
        if active.valid_bytes == 0 and active.base == self._end:
            fd = os.open(self._path(active), os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC)
            os.close(self._fd)
            self._fd = fd
            self._abandoned = False
            emptied = SegmentInfo(active.base, 0, 0)
            self._set_active(emptied)
            return emptied
        segment = self._create(self._end)
        with self._lock:
            self._segments.append(segment)
        return segment

    def write_group(self, entries: Sequence[Entry]) -> Written:
        """Append a prefix of ``entries`` to the active segment and make it durable.

        The prefix is as many entries as fit in the active segment (at least
        one: a segment that cannot take the first entry is closed and a new
        one started). Nothing is returned, and nothing may be acked, until
        the fdatasync returned.

        Raises:
            WalWriteError: nothing of this call is durable (disk full, I/O
                error); the file was cut back to its verified end.
        """
        if not entries:
            return Written([], self._end, self.total_bytes)
        try:
            active = self._segments[-1]
            first = entries[0].size
            if self._abandoned or (
                active.valid_bytes and active.valid_bytes + first > self._segment_bytes
            ):
                active = self._rotate()
        except OSError as exc:
            raise WalWriteError(
                f"cannot start a new segment: {_os_reason(exc)}", exc.errno
            ) from exc
        room = max(self._segment_bytes - active.valid_bytes, first)
        parts: list[bytes] = []
        lsns: list[int] = []
        position = self._end
        used = 0
        for entry in entries:
            size = entry.size
            if used + size > room:
                break
            header = frame_header(position, entry.kind, entry.key_section, entry.rows, entry.body)
            parts += (header, entry.key_section, entry.body)
            lsns.append(position)
            position += size
            used += size
        data = b"".join(parts)
        try:
            _pwrite_all(self._fd, data, active.valid_bytes)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._cut_back(active, len(data), exc)
            raise WalWriteError(f"append failed: {_os_reason(exc)}", exc.errno) from exc
        valid_bytes = active.valid_bytes + len(data)
        with self._lock:
            self._segments[-1] = SegmentInfo(active.base, valid_bytes, valid_bytes)
            self._end = position
        return Written(lsns, position, self.total_bytes)

    def _cut_back(self, active: SegmentInfo, attempted: int, cause: OSError) -> None:
        """After a failed write: remove its bytes, so the log ends at its last durable record."""
        try:
            os.ftruncate(self._fd, active.valid_bytes)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._abandoned = True
            self._set_active(SegmentInfo(active.base, active.valid_bytes, active.end + attempted))
            log.error(
                "wal.cut_back_failed", segment=active.name, offset=active.valid_bytes,
                reason=_os_reason(exc), cause=_os_reason(cause),
            )  # fmt: skip
            return
        self._set_active(SegmentInfo(active.base, active.valid_bytes, active.valid_bytes))

    # -- committed segments --------------------------------------------------

    def delete_committed(self, committed: int) -> int:
        """Delete every segment but the active one whose records all end at or before ``committed``.

        Returns:
            Bytes of all segment files afterwards.
        """
        with self._lock:
            victims = [s for s in self._segments[:-1] if s.end <= committed]
        for segment in victims:
            try:
                os.unlink(self._path(segment))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("wal.delete_failed", segment=segment.name, reason=_os_reason(exc))
                continue
            with self._lock:
                self._segments.remove(segment)
            log.debug("wal.segment_deleted", segment=segment.name)
        return self.total_bytes

    # -- reading -------------------------------------------------------------

    def _snapshot(self, after: int, until: int | None = None) -> list[SegmentInfo]:
        """The segments holding records from ``after`` on, cut at ``until`` (a durable position)."""
        with self._lock:
            end = self._end if until is None else min(until, self._end)
            if after > end:
                raise ValueError(f"position {after} is past the durable end {end}")
            return [
                SegmentInfo(s.base, min(s.valid_bytes, end - s.base), s.file_bytes)
                for s in self._segments
                if s.end > after and s.base < end
            ]

    def _frames(self, segment: SegmentInfo, start: int) -> Iterator[Frame]:
        """The verified records of ``segment`` from the boundary ``start`` to its verified end."""
        scanner = FrameScanner(start, limit=segment.end)
        offset = start - segment.base
        with self._path(segment).open("rb", buffering=0) as file:
            while offset < segment.valid_bytes:
                chunk = os.pread(
                    file.fileno(), min(READ_CHUNK_BYTES, segment.valid_bytes - offset), offset
                )
                if not chunk:
                    raise WalCorrupt(f"{segment.name} is shorter than its verified records")
                offset += len(chunk)
                for item in scanner.feed(chunk):
                    if isinstance(item, Frame):
                        yield item
                if scanner.stopped:
                    break
        end = scanner.finish()
        if end.reason is not None:
            raise WalCorrupt(
                f"{segment.name} no longer verifies at position {end.damage_at}: {end.reason}"
            )

    def read(self, after: int, max_bytes: int, until: int | None = None) -> list[Frame]:
        """Durable records from the boundary ``after`` on, about ``max_bytes`` of them.

        Returns at least one record when there is any, and stops once the
        records returned reach ``max_bytes``, or at ``until`` (a record
        boundary: the durable end the caller knows of, since a write may have
        become durable in its thread before its appenders were told).
        ``after`` must be a record boundary (a record's LSN or end, or a segment's base).

        Raises:
            ValueError: ``after`` is past the durable end, or not a boundary.
            WalCorrupt: verified bytes no longer verify.
        """
        out: list[Frame] = []
        total = 0
        for segment in self._snapshot(after, until):
            start = max(after, segment.base)
            try:
                for frame in self._frames(segment, start):
                    out.append(frame)
                    total += frame.size
                    if total >= max_bytes:
                        return out
            except WalCorrupt:
                if start != segment.base and not out:
                    raise ValueError(f"position {after} is not a record boundary") from None
                raise
        return out

    def replay(self, after: int) -> Iterator[Frame]:
        """Every durable record whose LSN is at or after ``after``, in order.

        Unlike :meth:`read`, ``after`` may be any position: segments are
        scanned from their start.
        """
        for segment in self._snapshot(after):
            for frame in self._frames(segment, segment.base):
                if frame.lsn >= after:
                    yield frame

    def close(self) -> None:
        """Close the active segment's file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
