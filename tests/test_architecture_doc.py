"""docs/architecture.md lists every module of appliance/, auth/ and pki/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _modules() -> list[Path]:
    return sorted(p for top in ("appliance", "auth", "pki") for p in (ROOT / top).rglob("*.py"))


def test_every_module_is_listed_with_a_purpose() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [
        str(p.relative_to(ROOT)) for p in _modules() if f"`{p.relative_to(ROOT)}`" not in text
    ]
    assert not missing, f"add these to docs/architecture.md, Modules: {missing}"


def test_every_listed_module_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    listed = {
        line.split("`")[1]
        for line in text.splitlines()
        if line.startswith("| `") and line.split("`")[1].endswith(".py")
    }
    gone = sorted(name for name in listed if not (ROOT / name).is_file())
    assert not gone, f"docs/architecture.md lists modules that no longer exist: {gone}"


def test_every_module_says_its_purpose() -> None:
    silent = [
        str(p.relative_to(ROOT))
        for p in _modules()
        if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
    ]
    assert not silent, f"modules without a docstring: {silent}"
