"""The rows of the Log Courier payload in progress, and what they cost in memory."""

from __future__ import annotations

import sys
from typing import Final, Literal

from appliance.blocks.errors import InvalidText
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES, check_text
from appliance.protocols.courier.events import PayloadReceived

__all__ = ["EVENT_OVERHEAD_BYTES"]

#: Memory counted per kept event besides its record text, in bytes: four list
#: slots (text, type, host, time; 8 bytes each, plus list growth slack) and an
#: int of epoch nanoseconds (36 bytes). The codec's own count of Python
#: memory, not the writer's per-row bytes (appliance/blocks/block.py).
EVENT_OVERHEAD_BYTES: Final = 80
#: Memory counted for a tag/host string kept once per payload besides the
#: string itself, in bytes: its slot in the payload's string table (a dict).
_STRING_TABLE_ENTRY_BYTES: Final = 64


class _Rows:
    """The kept rows of the payload in progress, and what they cost in memory."""

    __slots__ = (
        "checked_hosts",
        "checked_types",
        "hosts",
        "invalid_hosts",
        "invalid_types",
        "memory_bytes",
        "not_json",
        "records",
        "strings",
        "times_ns",
        "types",
    )

    def __init__(self) -> None:
        self.records: list[str] = []
        self.types: list[str | None] = []
        self.hosts: list[str | None] = []
        self.times_ns: list[int | None] = []
        #: Each distinct tag/host string once: 1,000 events of ``"type":"nginx"``
        #: share one str instead of holding 1,000 copies.
        self.strings: dict[str, str] = {}
        #: Tag and host values that passed their check in this payload (each
        #: its shared str): the fast loop checks a value the first time only.
        #: Their entries are counted with :attr:`strings`' (``shared``).
        self.checked_types: dict[str, str] = {}
        self.checked_hosts: dict[str, str] = {}
        self.not_json = 0
        self.invalid_types = 0
        self.invalid_hosts = 0
        self.memory_bytes = 0

    def shared(self, value: str) -> str:
        kept = self.strings.get(value)
        if kept is None:
            self.strings[value] = kept = value
            self.memory_bytes += sys.getsizeof(value) + _STRING_TABLE_ENTRY_BYTES
        return kept

    def add(self, text: str, type_: str | None, host: str | None, time_ns: int | None) -> None:
        self.records.append(text)
        self.types.append(type_)
        self.hosts.append(host)
        self.times_ns.append(time_ns)
        self.memory_bytes += sys.getsizeof(text) + EVENT_OVERHEAD_BYTES

    def payload(
        self, nonce: bytes, kind: Literal["JDAT", "EVNT"], digest: bytes = b""
    ) -> PayloadReceived:
        return PayloadReceived(
            nonce,
            kind,
            self.records,
            self.types,
            self.hosts,
            self.times_ns,
            not_json=self.not_json,
            invalid_types=self.invalid_types,
            invalid_hosts=self.invalid_hosts,
            memory_bytes=self.memory_bytes,
            content_digest=digest,
        )


def _string_field(rows: _Rows, value: str | None, what: Literal["type", "host"]) -> str | None:
    """``value`` when it is valid UTF-8 within its column's limit; else None, counted."""
    if value is None:
        return None
    try:
        check_text(value, what, MAX_TAG_BYTES if what == "type" else MAX_HOST_BYTES)
    except InvalidText:
        if what == "type":
            rows.invalid_types += 1
        else:
            rows.invalid_hosts += 1
        return None
    return rows.shared(value)
