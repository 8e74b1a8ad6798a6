"""Picking well-known fields out of JSON event records (tag, host) by dotted path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

__all__ = ["HOST_PATHS", "first_string", "paths"]

#: Where shippers put the host name: ECS ``host.name`` (Beats >= 6.3, Log
#: Courier's ECS mode), ``beat.hostname`` (older Beats), or a plain ``host``.
HOST_PATHS: Final[tuple[tuple[str, ...], ...]] = (("host", "name"), ("beat", "hostname"), ("host",))


def paths(dotted: Sequence[str]) -> list[tuple[str, ...]]:
    """``["@metadata.beat", "type"]`` as key paths."""
    return [tuple(field.split(".")) for field in dotted]


def _path(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def first_string(record: dict[str, Any], candidates: Sequence[tuple[str, ...]]) -> str | None:
    """The first non-empty string found at one of the key paths, else None."""
    for path in candidates:
        value = _path(record, path)
        if isinstance(value, str) and value:
            return value
    return None
