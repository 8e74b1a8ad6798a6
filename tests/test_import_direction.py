"""Which package may import which, and that no imports go round in a cycle.

The rules are docs/architecture.md#import-rules. Read from the source with
``ast``, so a rule is checked without importing anything: every ``import x``
and ``from x import y`` at any depth (also inside functions and under
``if TYPE_CHECKING:``, where a cycle likes to hide) counts. A relative import
is resolved against its module first.

The cycle finder (Tarjan's strongly connected components) runs twice: over
the modules of appliance/, auth/ and pki/, and over appliance's packages
(``appliance.<subpackage or top-level module>``, with ``auth`` and ``pki`` one
node each). Run this file as a script to print both:
``PYTHONPATH=$PWD .venv/bin/python tests/test_import_direction.py``.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
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
            "appliance.wal",
            "appliance.commands",
            "appliance.rows",
            "auth",
            "trio",
            "socket",
            "pyarrow",
        ),
        "codecs hold no I/O and know nothing of storage, drivers, credentials or of how"
        " their events become rows (what they share with the rows layer is appliance.blocks)",
    ),
    (
        "appliance/rows",
        (
            "appliance.server",
            "appliance.lake",
            "appliance.wal",
            "appliance.commands",
            "trio",
            "socket",
        ),
        "the rows layer maps events to blocks; it neither stores nor serves them",
    ),
    (
        "appliance/lake",
        ("appliance.server", "appliance.commands"),
        "storage knows nothing of listeners or the CLI",
    ),
    (
        "appliance/wal",
        ("appliance.server", "appliance.commands", "appliance.lake"),
        "the write-ahead log knows nothing of listeners or the CLI, and is below the lake"
        " (what it shares with the lake, a block's checks and identity, is appliance.blocks)",
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


# -- Cycles ------------------------------------------------------------------------
#: The packages whose modules the cycle finder reads.
CYCLE_ROOTS: tuple[str, ...] = ("appliance", "auth", "pki")

#: An import edge: importing module -> imported module -> where (``file:line``).
Graph = dict[str, dict[str, str]]


def _module_graph(roots: tuple[str, ...] = CYCLE_ROOTS, root: Path = ROOT) -> Graph:
    """Which module of ``roots`` imports which, with the first line that does.

    An imported name resolves to the deepest module of ``roots`` it lies in:
    ``from appliance.blocks.checks import check_block`` imports
    ``appliance.blocks.checks``, ``from appliance import lake`` imports
    ``appliance.lake``. Importing a module is not counted as importing its
    package's ``__init__`` too (Python runs it first, but counting it would make
    every ``__init__`` that imports one of its own modules a cycle); what an
    ``__init__`` itself imports is counted, like any module's imports.
    """
    paths = {
        _module_name(path, root): path
        for top in roots
        for path in sorted((root / top).rglob("*.py"))
    }
    graph: Graph = {module: {} for module in paths}
    for module, path in paths.items():
        for line, imported in _imports(path, module):
            target = imported
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module and target not in graph[module]:
                graph[module][target] = f"{path.relative_to(root)}:{line}"
    return graph


def _package_of(module: str) -> str:
    """The package-level node of a module: ``appliance.<subpackage or top-level module>``.

    ``auth`` and ``pki`` are one node each (each is one package).
    """
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "appliance" else parts[0]


def _package_graph(modules: Graph) -> Graph:
    """:func:`_module_graph` with each module replaced by its package-level node."""
    graph: Graph = {}
    for module, targets in modules.items():
        edges = graph.setdefault(_package_of(module), {})
        for target, where in targets.items():
            package = _package_of(target)
            graph.setdefault(package, {})
            if package != _package_of(module):
                edges.setdefault(package, where)
    return graph


def _strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node, each sorted.

    Iterative (no recursion limit), in the order of the nodes' names.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _a_cycle(graph: Graph, component: list[str]) -> list[str]:
    """The shortest cycle through the component's first node (a breadth-first search)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target not in members:
                    continue
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def _describe(graph: Graph, components: list[list[str]]) -> str:
    """Each component, and one cycle in it with the import line of each step."""
    lines = []
    for component in components:
        lines.append(f"cycle among {', '.join(component)}:")
        cycle = _a_cycle(graph, component)
        lines += [f"  {a} -> {b}  ({graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return "\n".join(lines)


def test_no_package_cycle() -> None:
    graph = _package_graph(_module_graph())
    cycles = _strongly_connected(graph)
    assert not cycles, "packages that import each other (docs/architecture.md#import-rules):\n" + (
        _describe(graph, cycles)
    )


def test_no_module_cycle() -> None:
    graph = _module_graph()
    cycles = _strongly_connected(graph)
    assert not cycles, "modules that import each other:\n" + _describe(graph, cycles)


def test_the_cycle_finder_finds_hidden_cycles(tmp_path: Path) -> None:
    # A cycle closed by an import inside a function, by a relative import and by
    # "from package import module" must be found, or the two tests above pass idly.
    files = {
        "appliance/__init__.py": "",
        "appliance/lake/__init__.py": "",
        "appliance/lake/a.py": "from appliance.wal import b\n",
        "appliance/wal/__init__.py": "",
        "appliance/wal/b.py": "def f():\n    from ..lake.a import x\n",
        "appliance/rows/__init__.py": "",
        "appliance/rows/c.py": "import appliance.rows.d\n",
        "appliance/rows/d.py": "",
        "auth/__init__.py": "",
        "pki/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    modules = _module_graph(root=tmp_path)
    assert _strongly_connected(modules) == [["appliance.lake.a", "appliance.wal.b"]]
    packages = _package_graph(modules)
    assert _strongly_connected(packages) == [["appliance.lake", "appliance.wal"]]
    assert _describe(packages, _strongly_connected(packages)) == (
        "cycle among appliance.lake, appliance.wal:\n"
        "  appliance.lake -> appliance.wal  (appliance/lake/a.py:1)\n"
        "  appliance.wal -> appliance.lake  (appliance/wal/b.py:2)"
    )


#: The block vocabulary: the one package every layer of the data's path uses.
LEAF = "appliance.blocks"


def test_the_block_vocabulary_is_a_leaf() -> None:
    """appliance/blocks imports nothing else of appliance, and no I/O or storage stack."""
    outside = ("trio", "socket", "pyarrow", "deltalake", "zmq")
    files = _files("appliance/blocks")
    assert files, "appliance/blocks has no Python files: the rule checks nothing"
    broken = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in _imports(path)
        if (_within(module, "appliance") and not _within(module, LEAF))
        or any(_within(module, name) for name in outside)
    ]
    assert not broken, (
        "appliance/blocks is below every package that uses it"
        " (docs/architecture.md#import-rules):\n" + "\n".join(broken)
    )


if __name__ == "__main__":
    _modules = _module_graph()
    _packages = _package_graph(_modules)
    print("package-level cycles:")
    print(_describe(_packages, _strongly_connected(_packages)) or "  none")
    print("module-level cycles:")
    print(_describe(_modules, _strongly_connected(_modules)) or "  none")
