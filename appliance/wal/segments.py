"""The write-ahead log's segment files on disk: recovery, durable group appends, deletion, reads.

Blocking code, called from worker threads by appliance/wal/log.py (no trio
here). The directory holds files named ``<base>.wal``, ``base`` being the
20-digit log position of the file's first byte (appliance/wal/frame.py).
The last segment is the active one: appends go there. The directory always
holds a durable file named at the log's next position, so that position
survives a restart even when every record is committed: the active segment
is only ever deleted after a new one, empty and named at the durable end,
was created and its directory entry synced.

The log never locks its own volume with committed bytes: ``segment_bytes``
is lowered at open to a quarter of the volume's total size
(:func:`~appliance.wal.settings.segment_bytes_for_volume`), so segments
roll over and committed ones are deleted; a wholly committed active segment
of :data:`~appliance.wal.settings.COMMITTED_SEGMENT_REPLACE_BYTES` or more is
replaced at the commit; and an append that finds the disk full while the
active segment holds only committed records replaces it and tries once more.

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
log: the file is truncated there. When what is cut off can be the group that
was being written when the process or machine stopped (no whole, CRC-valid
record in it, and no more bytes than one group can hold), it was never acked:
a ``wal.tail_truncated`` warning. Otherwise acknowledged records were lost:
a ``wal.tail_damaged`` error. In an older segment, damage cannot be a torn
write (the segment was synced before the next one was created): a record
whose body fails its CRC is skipped by its verified length, and a damaged
header makes the rest of that segment unreadable; both are logged as errors
with the positions lost, and the file is left as it is for inspection until
it is committed and deleted. Every acknowledged record lost is counted in
:attr:`Recovery.records_lost` (a lower bound where the damage hides how many
records a range held).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from appliance.blocks.identity import DedupeKey
from appliance.logs import get_logger
from appliance.wal.errors import WalCorrupt, WalWriteError
from appliance.wal.frame import (
    HEADER_BYTES,
    MAGIC,
    Frame,
    FrameScanner,
    ScanEnd,
    SkippedRecord,
    frame_header,
    header_at,
)
from appliance.wal.settings import (
    COMMITTED_SEGMENT_REPLACE_BYTES,
    DEFAULT_GROUP_MAX_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    segment_bytes_for_volume,
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
#: Mode of the log's directory and segment files: state files are private to the service.
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
    #: Acknowledged records lost to damage, all kinds together (skipped records, unreadable
    #: ranges, a damaged tail that was more than a torn write): at least this many.
    records_lost: int = 0
    #: The segment size in use: ``segment_bytes``, or less on a small volume.
    segment_bytes: int = 0


@dataclass(slots=True)
class _Survey:
    """What a range of bytes the scan gave up on held (:meth:`SegmentStore._survey`)."""

    #: Records whose header verified at their position (whole or not).
    headers: int = 0
    #: Of those, records whose key section and body verified too: whole, CRC-valid
    #: records, which a torn write cannot leave behind damage.
    whole: int = 0
    #: Stretches that no verified header covers: each held at least one record.
    stretches: int = 0

    @property
    def records(self) -> int:
        """Records the range held, at least."""
        return self.headers + self.stretches


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


def _fit_segment_bytes(directory: Path, segment_bytes: int) -> int:
    """``segment_bytes``, lowered (and logged) when too large for the volume under ``directory``.

    The rule is :func:`~appliance.wal.settings.segment_bytes_for_volume`: a
    quarter of the volume's total size. A volume whose size cannot be read
    keeps the setting.
    """
    try:
        stat = os.statvfs(directory)
    except OSError as exc:
        log.warning("wal.volume_unknown", directory=str(directory), reason=_os_reason(exc))
        return segment_bytes
    volume_bytes = stat.f_blocks * stat.f_frsize
    fitted = segment_bytes_for_volume(segment_bytes, volume_bytes)
    if fitted < segment_bytes:
        log.warning(
            "wal.segment_bytes_lowered", directory=str(directory), configured=segment_bytes,
            segment_bytes=fitted, volume_bytes=volume_bytes,
            rule="at most a quarter of the volume's total size",
        )  # fmt: skip
    return fitted


def _next_magic(fd: int, base: int, position: int, readable: int, stop: int) -> int:
    """The first position at or after ``position`` where the record magic starts; else ``stop``."""
    overlap = len(MAGIC) - 1
    while position + len(MAGIC) <= readable:
        chunk = os.pread(fd, min(READ_CHUNK_BYTES, readable - position), position - base)
        if len(chunk) < len(MAGIC):
            break
        found = chunk.find(MAGIC)
        if found >= 0:
            return position + found
        # The magic may straddle two reads: keep its first bytes for the next.
        position += len(chunk) - overlap
    return stop


class SegmentStore:
    """The segment files of one log directory. Use :meth:`open`.

    Thread use: :meth:`write_group` and :meth:`delete_committed` must not run
    at the same time (the trio layer runs both under one limiter); reads
    (:meth:`read`, :meth:`replay`) may run beside them.
    """

    def __init__(
        self,
        directory: Path,
        segment_bytes: int,
        *,
        group_max_bytes: int = DEFAULT_GROUP_MAX_BYTES,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.directory = directory
        self._segment_bytes = segment_bytes
        #: The most bytes one torn write can leave at the tail (a group, or one
        #: record larger than a group): what recovery may cut off as never acked.
        self._group_max_bytes = group_max_bytes
        self._max_record_bytes = max_record_bytes
        self._segments: list[SegmentInfo] = []
        self._lock = threading.Lock()
        self._fd = -1
        #: The active segment could not be cut back after a failed write: start a new one.
        self._abandoned = False
        self._end = 0
        #: The position the table holds everything before (:meth:`delete_committed`).
        self._committed = 0

    # -- opening and recovery ------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        committed: int,
        segment_bytes: int,
        *,
        group_max_bytes: int = DEFAULT_GROUP_MAX_BYTES,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> tuple[SegmentStore, Recovery]:
        """Open (creating if needed) the log in ``directory`` and recover it.

        Args:
            directory: the log's directory (``<state_dir>/wal``).
            committed: the position the table says is committed (from its app
                transaction; 0 for a new table). Segments wholly before it are deleted.
            segment_bytes: size at which the active segment is closed; lowered to
                a quarter of the volume under ``directory`` when larger
                (``wal.segment_bytes_lowered``; :attr:`Recovery.segment_bytes` says).
            group_max_bytes: the most bytes one group write takes.
            max_record_bytes: the largest record. With ``group_max_bytes``, the
                most a torn write can leave at the tail: cutting off more loses acked records.

        Raises:
            OSError: the directory or a segment cannot be read or written.
        """
        created = not directory.exists()
        directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        if created:
            _fsync_dir(directory.parent)
        store = cls(
            directory, _fit_segment_bytes(directory, segment_bytes),
            group_max_bytes=group_max_bytes, max_record_bytes=max_record_bytes,
        )  # fmt: skip
        recovery = store._recover(committed)
        return store, recovery

    @property
    def segment_bytes(self) -> int:
        """The segment size in use (``segment_bytes``, lowered on a small volume)."""
        return self._segment_bytes

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
        recovery = Recovery(
            committed=committed, durable_end=committed, segment_bytes=self._segment_bytes
        )
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
        self._committed = recovery.committed
        recovery.durable_end = self._end
        # A log stopped with everything committed may hold a large active
        # segment of committed records (one written before this rule, or a
        # commit whose replacement failed): free it now, not at the next commit.
        self._replace_committed_active()
        log.info(
            "wal.open", directory=str(self.directory), segments=len(self._segments),
            committed=recovery.committed, end=self._end, records=recovery.records,
            uncommitted_bytes=recovery.record_bytes, keys=len(recovery.keys),
            truncated_bytes=recovery.truncated_bytes, damaged_records=recovery.damaged_records,
            records_lost=recovery.records_lost, segment_bytes=self._segment_bytes,
        )  # fmt: skip
        return recovery

    def _settle_committed(self, recovery: Recovery) -> None:
        """Move the committed position to a record boundary and note records lost before the log."""
        if self._segments and recovery.committed < self._segments[0].base:
            first = self._segments[0]
            # The range held at least one record (the table's position is a
            # record boundary), which is all that can be known of it: its files are gone.
            log.error(
                "wal.gap", directory=str(self.directory), next_segment=first.name,
                lost_from=recovery.committed, lost_to=first.base, records=1,
                reason="log starts after committed",
            )  # fmt: skip
            recovery.lost_ranges.insert(0, (recovery.committed, first.base))
            recovery.records_lost += 1
            recovery.committed = first.base

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
        recovery.records_lost += 1
        log.error(
            "wal.record_damaged", segment=path.name, lsn=record.lsn, bytes=record.size,
            lost_from=record.lsn, lost_to=record.end, records=1, reason=record.reason,
        )  # fmt: skip

    def _lost(self, path: Path, start: int, stop: int, reason: str, recovery: Recovery) -> None:
        """Note an unreadable range of an older segment: acked records lost, counted and logged."""
        if stop <= recovery.committed:
            return
        start = max(start, recovery.committed)
        survey = self._survey(path, start, stop)
        recovery.lost_ranges.append((start, stop))
        recovery.records_lost += survey.records
        log.error(
            "wal.segment_damaged", segment=path.name, lost_from=start, lost_to=stop,
            records=survey.records, whole_records=survey.whole, reason=reason,
        )  # fmt: skip

    def _handle_damage(
        self,
        path: Path,
        base: int,
        limit: int | None,
        end: ScanEnd,
        file_bytes: int,
        recovery: Recovery,
    ) -> int:
        """Truncate a torn tail, or note a loss of acked records; returns the valid bytes."""
        assert end.reason is not None
        offset = end.damage_at - base
        if limit is not None and end.damage_at != limit:
            # An older segment: it was synced before the next one was
            # created, so its damage is no torn write. Left for inspection.
            self._lost(path, end.damage_at, limit, end.reason, recovery)
            return offset
        file_end = base + file_bytes
        # What the table holds is not lost, whatever the bytes look like.
        start = max(end.damage_at, recovery.committed)
        survey = _Survey()
        acked = False
        # An abandoned segment's damage starts exactly where the next segment
        # begins (limit): bytes of a failed write, superseded, never acked.
        if limit is None and start < file_end:
            survey = self._survey(path, start, file_end)
            torn_limit = self._torn_limit(path, base, end.damage_at)
            acked = survey.whole > 0 or file_end - start > torn_limit
        with path.open("r+b", buffering=0) as file:
            os.ftruncate(file.fileno(), offset)
            os.fdatasync(file.fileno())
        cut = file_bytes - offset
        recovery.truncated_bytes += cut
        if not acked:
            # The group being written when the process or machine stopped
            # (its fdatasync never returned): no record of it was acked.
            log.warning(
                "wal.tail_truncated", segment=path.name, offset=offset, bytes=cut,
                reason=end.reason, lsn=end.damage_at,
            )  # fmt: skip
            return offset
        # More than a torn write: whole records after the damage, or more
        # bytes than one group. They were synced, so acked; they are gone.
        recovery.lost_ranges.append((start, file_end))
        recovery.records_lost += survey.records
        log.error(
            "wal.tail_damaged", segment=path.name, lost_from=start, lost_to=file_end,
            records=survey.records, whole_records=survey.whole, offset=offset, bytes=cut,
            reason=end.reason,
        )  # fmt: skip
        return offset

    def _torn_limit(self, path: Path, base: int, position: int) -> int:
        """The most bytes from ``position`` to the file's end that one torn group can explain.

        A group is at most ``group_max_bytes``, or one record larger than
        that alone. When the header at ``position`` verified, that record's
        size is known; otherwise it may be as large as ``max_record_bytes``.
        """
        with path.open("rb", buffering=0) as file:
            head = os.pread(file.fileno(), HEADER_BYTES, position - base)
        header = header_at(head, position)
        largest = self._max_record_bytes if header is None else header.size
        return max(self._group_max_bytes, largest)

    def _survey(self, path: Path, start: int, stop: int) -> _Survey:
        """Count the records in ``[start, stop)`` of a segment, which the scan gave up on.

        Looks for headers that verify at their own position (magic, header
        CRC, LSN == position) and checks their bodies' CRC; a record found is
        stepped over by its length, and each stretch between records counts
        as one record (it held at least one). Only counts, for the log line
        and the metric: nothing found here is ever replayed, since the bytes
        after a damaged header may be a peer's text shaped like a record.
        Bytes beyond the file's end (a segment cut short) are one stretch.
        """
        survey = _Survey()
        base = int(path.name[: -len(SEGMENT_SUFFIX)])
        with path.open("rb", buffering=0) as file:
            fd = file.fileno()
            readable = min(stop, base + os.fstat(fd).st_size)
            position = start
            in_stretch = False
            while position < stop:
                found = self._record_at(fd, base, position, readable)
                if found is not None:
                    size, whole = found
                    survey.headers += 1
                    survey.whole += whole
                    position += size
                    in_stretch = False
                    continue
                if not in_stretch:
                    survey.stretches += 1
                    in_stretch = True
                position = _next_magic(fd, base, position + 1, readable, stop)
        return survey

    @staticmethod
    def _record_at(fd: int, base: int, position: int, readable: int) -> tuple[int, bool] | None:
        """A record whose header verifies at ``position``: its bytes up to ``readable``, whole."""
        if position + HEADER_BYTES > readable:
            return None
        header = header_at(os.pread(fd, HEADER_BYTES, position - base), position)
        if header is None:
            return None
        if position + header.size > readable:
            return readable - position, False
        crc = 0
        at = position + HEADER_BYTES
        while at < position + header.size:
            chunk = os.pread(fd, min(READ_CHUNK_BYTES, position + header.size - at), at - base)
            if not chunk:
                return readable - position, False
            crc = zlib.crc32(chunk, crc)
            at += len(chunk)
        return header.size, crc == header.body_crc

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
        The old segment is deleted at once when the table holds all of it
        (only now: the new one, named at the next position, is durable).
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
        if active.end <= self._committed:
            self._delete(active)
        return segment

    def _replace_committed_active(self) -> bool:
        """Replace a wholly committed active segment of the replacement size or more.

        Returns whether it was replaced. A failure is logged, not raised: the
        segment stays, and the next commit, rollover or full disk tries again.
        """
        active = self._segments[-1]
        if active.file_bytes < COMMITTED_SEGMENT_REPLACE_BYTES or active.end > self._committed:
            return False
        try:
            self._rotate()
        except OSError as exc:
            log.warning("wal.replace_failed", segment=active.name, reason=_os_reason(exc))
            return False
        log.debug("wal.segment_replaced", segment=active.name, bytes=active.file_bytes)
        return True

    def write_group(self, entries: Sequence[Entry]) -> Written:
        """Append a prefix of ``entries`` to the active segment and make it durable.

        The prefix is as many entries as fit in the active segment (at least
        one: a segment that cannot take the first entry is closed and a new
        one started). Nothing is returned, and nothing may be acked, until
        the fdatasync returned. When the disk is full and the active segment
        holds only committed records, it is replaced by an empty one (freeing
        its bytes) and the write is tried once more.

        Raises:
            WalWriteError: nothing of this call is durable (disk full, I/O
                error); the file was cut back to its verified end.
        """
        if not entries:
            return Written([], self._end, self.total_bytes)
        try:
            return self._write_group(entries)
        except WalWriteError as exc:
            active = self._segments[-1]
            if not exc.disk_full or active.file_bytes == 0 or active.end > self._committed:
                raise
            try:
                self._rotate()
            except OSError as rotate_exc:
                log.warning(
                    "wal.replace_failed", segment=active.name, reason=_os_reason(rotate_exc)
                )
                raise exc from None
            log.info(
                "wal.segment_replaced", segment=active.name, bytes=active.file_bytes,
                reason="disk full",
            )  # fmt: skip
        return self._write_group(entries)

    def _write_group(self, entries: Sequence[Entry]) -> Written:
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
            file_bytes = active.valid_bytes + attempted
            self._set_active(SegmentInfo(active.base, active.valid_bytes, file_bytes))
            log.error(
                "wal.cut_back_failed", segment=active.name, offset=active.valid_bytes,
                reason=_os_reason(exc), cause=_os_reason(cause),
            )  # fmt: skip
            return
        self._set_active(SegmentInfo(active.base, active.valid_bytes, active.valid_bytes))

    # -- committed segments --------------------------------------------------

    def delete_committed(self, committed: int) -> int:
        """Free what the table holds: the segments whose records all end at or before ``committed``.

        Older segments are deleted; the active one, when wholly committed and
        of :data:`~appliance.wal.settings.COMMITTED_SEGMENT_REPLACE_BYTES` or
        more, is replaced by an empty one at the same position and deleted.

        Returns:
            Bytes of all segment files afterwards.
        """
        self._committed = max(self._committed, committed)
        with self._lock:
            victims = [s for s in self._segments[:-1] if s.end <= committed]
        for segment in victims:
            self._delete(segment)
        self._replace_committed_active()
        return self.total_bytes

    def _delete(self, segment: SegmentInfo) -> None:
        """Delete a segment that is not the active one (a failure is logged and left for later)."""
        try:
            os.unlink(self._path(segment))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("wal.delete_failed", segment=segment.name, reason=_os_reason(exc))
            return
        with self._lock:
            self._segments.remove(segment)
        log.debug("wal.segment_deleted", segment=segment.name)

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
