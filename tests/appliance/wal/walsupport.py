"""Helpers shared by the write-ahead log tests: sample blocks, segment bytes, fdatasync spies."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from appliance.blocks.block import RowBlock
from appliance.blocks.identity import DedupeKey
from appliance.wal.blocks import encode_block
from appliance.wal.frame import KIND_ROW_BLOCK, encode_key, frame_header
from appliance.wal.segments import SEGMENT_SUFFIX

RECEIVED_AT_NS = 1_767_225_600 * 1_000_000_000


def sample_block(i: int = 0, events: int = 3, *, batch_id: str | None = "chunk") -> RowBlock:
    """A small forward-like block; ``batch_id`` gets ``-i`` appended."""
    records = [json.dumps({"message": f"event {i}.{n}", "n": n}) for n in range(events)]
    return RowBlock(
        protocol="forward",
        source="user1",
        peer="192.0.2.7:40000",
        received_at_ns=RECEIVED_AT_NS + i,
        batch_id=None if batch_id is None else f"{batch_id}-{i}",
        tag="app.access",
        host="client.example",
        times_ns=[RECEIVED_AT_NS + n if n % 2 else None for n in range(events)],
        records=records,
    )


def record_bytes(lsn: int, body: bytes, key: DedupeKey | None = None, rows: int = 1) -> bytes:
    """One record as it sits in a segment at position ``lsn``."""
    section = encode_key(key)
    return frame_header(lsn, KIND_ROW_BLOCK, section, rows, body) + section + body


def segment_bytes(bodies: list[bytes], base: int = 0) -> tuple[bytes, list[int]]:
    """A segment of ``bodies`` (keys ``("p", "s", "<i>")``), and each record's LSN."""
    out = bytearray()
    lsns = []
    for i, body in enumerate(bodies):
        lsns.append(base + len(out))
        out += record_bytes(base + len(out), body, ("p", "s", str(i)))
    return bytes(out), lsns


def block_bodies(count: int) -> list[bytes]:
    return [encode_block(sample_block(i)) for i in range(count)]


def segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))


@dataclass
class SyncSpy:
    """Records every pwrite (fd, offset, bytes) and fdatasync (fd), in order."""

    events: list[tuple[str, int, int, int]] = field(default_factory=list)

    def pwrites(self) -> Iterator[tuple[int, int, int]]:
        for kind, fd, offset, size in self.events:
            if kind == "pwrite":
                yield fd, offset, size

    @property
    def syncs(self) -> int:
        return sum(1 for e in self.events if e[0] == "fdatasync")


def install_sync_spy(monkeypatch: pytest.MonkeyPatch) -> SyncSpy:
    """Wrap os.pwrite and os.fdatasync (pytest's monkeypatch) to record their calls."""
    spy = SyncSpy()
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        n = real_pwrite(fd, data, offset)
        spy.events.append(("pwrite", fd, offset, n))
        return n

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        spy.events.append(("fdatasync", fd, 0, 0))

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return spy


def logged(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    """The fields of every structured log line named ``name``."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]
