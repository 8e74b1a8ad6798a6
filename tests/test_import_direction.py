"""Which package may import which (docs/architecture.md, "Import rules").

Read from the source with ``ast``, so a rule is checked without importing
anything: every ``import x`` and ``from x import y`` at any depth (also
inside functions, where a cycle likes to hide) counts. A relative import is
resolved against its module first.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in ``path`` (module ``module``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = (module or _module_name(path)).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # "from appliance import lake" imports appliance.lake
                yield node.lineno, f"{base}.{alias.name}"


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


#: (files, forbidden import prefixes, why)
RULES: list[Any] = [
    (
        "appliance/protocols",
        (
            "appliance.server",
            "appliance.lake",
            "appliance.commands",
            "appliance.rows.forward",
            "appliance.rows.lumberjack",
            "appliance.rows.courier",
            "appliance.rows.logjam",
            "appliance.rows.websocket",
            "auth",
            "trio",
            "socket",
            "pyarrow",
        ),
        "codecs hold no I/O and know nothing of storage, drivers, credentials or of how"
        " their events become rows (they may use the shared rows.block/records/fields/timefmt)",
    ),
    (
        "appliance/rows",
        ("appliance.server", "appliance.lake", "appliance.commands", "trio", "socket"),
        "the rows layer maps events to blocks; it neither stores nor serves them",
    ),
    (
        "appliance/lake",
        ("appliance.server", "appliance.commands"),
        "storage knows nothing of listeners or the CLI",
    ),
    (
        "appliance/wal",
        ("appliance.server", "appliance.commands"),
        "the write-ahead log knows nothing of listeners or the CLI",
    ),
    ("appliance/server", ("appliance.commands",), "the service never imports the CLI"),
    ("auth", ("appliance",), "auth is a library the appliance uses, not the other way"),
    ("pki", ("appliance",), "pki is a library the appliance uses, not the other way"),
    (
        "appliance/config.py",
        (
            "appliance.protocols",
            "appliance.lake",
            "appliance.server",
            "trio",
            "deltalake",
            "pyarrow",
            "sqlalchemy",
        ),
        "loading a config loads no protocol, storage or I/O stack (the CLI stays fast)",
    ),
]


def _files(where: str) -> list[Path]:
    path = ROOT / where
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


@pytest.mark.parametrize(
    ("where", "forbidden", "why"), RULES, ids=[getattr(r, "values", r)[0] for r in RULES]
)
def test_imports_point_the_right_way(where: str, forbidden: tuple[str, ...], why: str) -> None:
    files = _files(where)
    assert files, f"{where} has no Python files: the rule checks nothing"
    broken = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in _imports(path)
        if any(_within(module, prefix) for prefix in forbidden)
    ]
    assert not broken, f"{why}:\n" + "\n".join(broken)


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    # The rules must not pass for want of seeing an import.
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import trio\n    from ..lake import rows\n", encoding="utf-8")
    found = {module for _, module in _imports(sample, "appliance.protocols.sample")}
    assert "trio" in found
    assert "appliance.lake.rows" in found


#: The table operations of appliance/lake, one module per verb on a shared base, and
#: the lake modules each may use of them (docs/architecture.md, "Import rules").
LAKE_OPERATIONS: dict[str, frozenset[str]] = {
    "operations": frozenset(),
    "maintenance": frozenset({"operations"}),
    "retention": frozenset({"operations"}),
    "usage": frozenset({"operations"}),
    "table_requests": frozenset({"operations", "retention"}),
    "schedule": frozenset({"operations", "maintenance", "retention", "table_requests"}),
}


def test_the_lake_operations_import_only_downwards() -> None:
    broken = [
        f"appliance/lake/{name}.py:{line} imports {module}"
        for name, allowed in LAKE_OPERATIONS.items()
        for line, module in _imports(ROOT / "appliance" / "lake" / f"{name}.py")
        for other in LAKE_OPERATIONS.keys() - allowed - {name}
        if _within(module, f"appliance.lake.{other}")
    ]
    assert not broken, "the verbs build on operations.py, schedule.py on them:\n" + "\n".join(
        broken
    )
    importers = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _files("appliance")
        if path.name not in ("service.py", "schedule.py")
        for line, module in _imports(path)
        if _within(module, "appliance.lake.schedule")
    ]
    assert not importers, f"only the service runs the schedule: {importers}"


def test_no_private_name_crosses_a_lake_module() -> None:
    crossing = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("appliance/lake")
        for line, module in _imports(path)
        if _within(module, "appliance")
        and module.rsplit(".", 1)[-1].startswith("_")
        and not module.rsplit(".", 1)[-1].startswith("__")
    ]
    assert not crossing, "a name shared between modules is public:\n" + "\n".join(crossing)
