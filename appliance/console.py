"""Output for operators: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["print_json", "print_table"]


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None
) -> None:
    """Print rows under headers, columns aligned; an empty table says so."""
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for number, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
        if number == 0:
            print("  ".join("-" * w for w in widths), file=out)


def print_json(value: Any, out: TextIO | None = None) -> None:
    """Print a JSON document for scripts."""
    out = out or sys.stdout
    print(json.dumps(value, indent=2, default=str), file=out)
