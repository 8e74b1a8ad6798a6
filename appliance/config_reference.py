"""The configuration reference, rendered from the config dataclasses themselves.

Every key's default comes from the code, and its meaning from the ``#:``
comment above the field, so ``docs/limits.md`` (which embeds these tables
between markers) cannot drift from what the service does: a test renders
them again and compares.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any, Final

from appliance.config import (
    AdminConfig,
    Config,
    CourierListenerConfig,
    ForwardListenerConfig,
    LakeConfig,
    ListenerConfig,
    LogjamListenerConfig,
    LumberjackListenerConfig,
    WalConfig,
    WebSocketListenerConfig,
)

__all__ = ["BEGIN", "END", "reference_tables", "render_into"]

BEGIN: Final = "<!-- BEGIN generated: appliance.config_reference -->"
END: Final = "<!-- END generated: appliance.config_reference -->"

_FIELD: Final = re.compile(r"^\s+(\w+): .+?(?:=|$)")


def _comments(cls: type) -> dict[str, str]:
    """``#:`` comments above each field, per class of the MRO (nearest wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        pending: list[str] = []
        for line in inspect.getsource(klass).splitlines():
            stripped = line.strip()
            if stripped.startswith("#:"):
                pending.append(stripped[2:].strip())
                continue
            match = _FIELD.match(line)
            if match and pending:
                found[match.group(1)] = " ".join(pending)
            if not stripped.startswith("#"):
                pending = []
    return found


def _default(field: dataclasses.Field[Any], instance: object) -> str:
    value = getattr(instance, field.name)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | dict | Path):
        return f"`{value!s}`" if not isinstance(value, list) or value else "`[]`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _table(cls: type, skip: frozenset[str] = frozenset()) -> list[str]:
    comments = _comments(cls)
    instance = cls()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(instance):
        if field.name in skip:
            continue
        meaning = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | {_default(field, instance)} | {meaning} |")
    return rows


_COMMON: Final = frozenset(f.name for f in dataclasses.fields(ListenerConfig))


def reference_tables() -> str:
    """The generated part of docs/limits.md: every key with its default and meaning."""
    sections: list[tuple[str, type, frozenset[str]]] = [
        ("Every TCP listener (`[[listeners]]`)", ListenerConfig, frozenset({"protocol"})),
        ('`protocol = "forward"`', ForwardListenerConfig, _COMMON - {"name", "bind"}),
        ('`protocol = "lumberjack"`', LumberjackListenerConfig, _COMMON - {"name", "bind"}),
        ('`protocol = "courier"`', CourierListenerConfig, _COMMON - {"name", "bind"}),
        (
            '`protocol = "logjam"` (ZeroMQ: the TCP keys above do not apply)',
            LogjamListenerConfig,
            _COMMON - {"name", "bind", "tls"},
        ),
        ('`protocol = "websocket"`', WebSocketListenerConfig, _COMMON - {"name", "bind"}),
        ("`[lake]`", LakeConfig, frozenset()),
        ("`[wal]`", WalConfig, frozenset()),
        ("`[admin]`", AdminConfig, frozenset()),
    ]
    lines: list[str] = []
    for title, cls, skip in sections:
        lines += [f"### {title}", "", *_table(cls, skip), ""]
    top = [
        f
        for f in dataclasses.fields(Config)
        if f.name in ("shutdown_timeout_seconds", "decode_budget_bytes")
    ]
    lines += ["### Top level", "", "| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {_default(f, Config())} | {_comments(Config).get(f.name, '')} |"
              for f in top]  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def render_into(text: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` rendered anew."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{reference_tables()}\n{END}{tail}"


if __name__ == "__main__":  # python -m appliance.config_reference docs/limits.md
    import sys

    target = Path(sys.argv[1])
    target.write_text(render_into(target.read_text(encoding="utf-8")), encoding="utf-8")
