"""Property test: random appends, failed appends, commits and crashes against a model of the log.

The model is the list of acknowledged records (LSN, body, key) and the
committed position. After every step the store must replay exactly the
acknowledged records after the committed position, in order. A crash closes
the store, may leave a torn write (random bytes, or a cut record) at the end
of the last segment, and reopens it from the committed position: nothing
acknowledged may be lost, and nothing may appear that was never appended. A
record whose append failed may come back after a crash only when its write
had completed but its cut-back failed (it was never acked: at-least-once).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from appliance.wal.errors import WalWriteError
from appliance.wal.frame import KIND_ROW_BLOCK, encode_key
from appliance.wal.segments import Entry, SegmentStore

from .walsupport import record_bytes, segment_files

SEGMENT = 2048

Key = tuple[str, str, str] | None


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="walmodel"))
        self.store, _ = SegmentStore.open(self.directory, 0, SEGMENT)
        self.acked: list[tuple[int, bytes, Key]] = []
        self.committed = 0
        self.counter = 0
        #: Bodies of failed appends that may come back after a crash.
        self.maybe: set[bytes] = set()

    def _entry(self, size: int, keyed: bool) -> tuple[Entry, Key]:
        self.counter += 1
        body = self.counter.to_bytes(4, "big") * (1 + size // 4)
        key: Key = ("p", "s", str(self.counter)) if keyed else None
        return Entry(KIND_ROW_BLOCK, encode_key(key), 1, body), key

    @rule(
        sizes=st.lists(st.integers(0, 1200), min_size=1, max_size=5),
        keyed=st.booleans(),
    )
    def append(self, sizes: list[int], keyed: bool) -> None:
        made = [self._entry(size, keyed) for size in sizes]
        done = 0
        while done < len(made):
            written = self.store.write_group([e for e, _ in made[done:]])
            assert written.lsns, "a write must make progress"
            for lsn, (entry, key) in zip(written.lsns, made[done:], strict=False):
                self.acked.append((lsn, entry.body, key))
            done += len(written.lsns)
        assert self.store.durable_end == self.acked[-1][0] + made[-1][0].size

    @rule(
        size=st.integers(0, 1200),
        failing=st.sampled_from(["pwrite", "fdatasync"]),
        cut_back_fails=st.booleans(),
    )
    def failed_append(self, size: int, failing: str, cut_back_fails: bool) -> None:
        entry, _ = self._entry(size, keyed=True)
        error = OSError(errno.ENOSPC, "No space left on device")
        end = self.store.durable_end
        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(os, failing, side_effect=error))
            if cut_back_fails:
                stack.enter_context(mock.patch.object(os, "ftruncate", side_effect=error))
            with pytest.raises(WalWriteError):
                self.store.write_group([entry])
        assert self.store.durable_end == end
        if failing == "fdatasync" and cut_back_fails:
            self.maybe.add(entry.body)

    @precondition(lambda self: any(lsn >= self.committed for lsn, _, _ in self.acked))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        # The committed position is a record's end: the next record's LSN or the durable end.
        boundaries = [lsn for lsn, _, _ in self.acked if lsn > self.committed]
        boundaries.append(self.store.durable_end)
        self.committed = data.draw(st.sampled_from(boundaries))
        self.store.delete_committed(self.committed)
        for info in self.store.segments()[:-1]:
            assert info.end > self.committed, "a committed segment was kept"

    @rule(
        tail=st.one_of(
            st.just(b""),
            st.binary(min_size=1, max_size=80),
            st.integers(1, 60).map(lambda n: record_bytes(0, b"torn" * 20)[:n]),
        )
    )
    def crash(self, tail: bytes) -> None:
        self.store.close()
        last = segment_files(self.directory)[-1]
        with last.open("ab") as file:
            file.write(tail)
        self.store, recovery = SegmentStore.open(self.directory, self.committed, SEGMENT)
        assert not recovery.lost_ranges
        assert recovery.damaged_records == 0
        replayed = [(f.lsn, f.body, f.key) for f in self.store.replay(self.committed)]
        expected = [r for r in self.acked if r[0] >= self.committed]
        assert [r for r in replayed if r[1] not in self.maybe] == expected
        # Records that came back are in the log now: the model takes them in.
        self.acked = [r for r in self.acked if r[0] < self.committed] + replayed
        self.maybe.clear()

    @invariant()
    def replay_matches_the_model(self) -> None:
        replayed = [(f.lsn, f.body, f.key) for f in self.store.replay(self.committed)]
        assert replayed == [r for r in self.acked if r[0] >= self.committed]

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


LogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_log_against_model = LogMachine.TestCase
