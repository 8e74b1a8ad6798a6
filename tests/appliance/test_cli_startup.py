"""The CLI starts fast: admin commands load none of the heavy modules (docs/architecture.md).

Each command runs as ``python -X importtime -m appliance ...`` in a
subprocess, against a throwaway state directory, and the modules it imported
are read from that output: none of :data:`HEAVY` may be among them, and a
command that only parses its arguments (or checks a config file) loads no
database library either. The total import time measured is printed, never
asserted: it depends on the machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.cli import run_cli

#: Top-level modules no admin command below may load: the table, Spark and
#: serving stacks. Each costs tens to hundreds of milliseconds of CPU at import
#: (pandas ~450, pyarrow ~200, numpy ~135, trio ~110, pyspark ~100,
#: prometheus_client ~60, deltalake ~50 without pyarrow, msgspec ~25 on one
#: machine: ``python -c "import X"``); polars is here in case it comes.
HEAVY = (
    "pyarrow",
    "deltalake",
    "pandas",
    "pyspark",
    "numpy",
    "trio",
    "polars",
    "msgspec",
    "prometheus_client",
)

#: What opening the auth database loads (SQLAlchemy ~200 ms; the embedded
#: database's in-place upgrade runs alembic, whose env imports every auth
#: module, auth.curve and with it zmq): not for a command that opens none.
DATABASE = ("sqlalchemy", "alembic", "zmq")

#: ``import time: self [us] | cumulative | imported package`` (indented by depth).
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)$")


def _imports(stderr: str) -> tuple[list[tuple[int, str]], float]:
    """The (depth, module) an ``-X importtime`` run imported, in its order, and the total in ms."""
    modules: list[tuple[int, str]] = []
    total_us = 0
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if match:
            total_us += int(match[1])
            modules.append((len(match[2]), match[3]))
    return modules, total_us / 1000


def _chain(modules: list[tuple[int, str]], index: int) -> str:
    """Who imported ``modules[index]``: importtime prints a module after what it imported."""
    depth, name = modules[index]
    chain = [name]
    for outer_depth, outer in modules[index + 1 :]:
        if outer_depth < depth:
            chain.append(outer)
            depth = outer_depth
    return " < ".join(chain)


def _first_under(names: list[str], top: str) -> int:
    return next(i for i, name in enumerate(names) if name.startswith(f"{top}."))


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config whose state directory has an auth database and a CA (to list something)."""
    root = tmp_path_factory.mktemp("startup")
    (root / "state").mkdir()
    config = root / "appliance.toml"
    config.write_text(f'state_dir = "{root / "state"}"\n', encoding="utf-8")
    for setup in (["db", "upgrade"], ["cert", "init"]):
        done = run_cli(*setup, cwd=root, env={"APPLIANCE_CONFIG": str(config)})
        assert done.returncode == 0, done.stderr
    return config


#: The commands checked; those that open no database must not load its libraries either.
COMMANDS = [
    (["--help"], HEAVY + DATABASE),
    (["user", "list", "--help"], HEAVY + DATABASE),
    (["config", "check", "FILE"], HEAVY + DATABASE),
    (["user", "list"], HEAVY),
    (["key", "list"], HEAVY),
    (["token", "list"], HEAVY),
    (["db", "current"], HEAVY),
    (["cert", "list"], HEAVY),
]


@pytest.mark.parametrize(
    ("command", "forbidden"), [pytest.param(*case, id=" ".join(case[0])) for case in COMMANDS]
)
def test_admin_commands_load_no_heavy_module(
    command: list[str], forbidden: tuple[str, ...], config_file: Path
) -> None:
    args = [str(config_file) if arg == "FILE" else arg for arg in command]
    done = run_cli(
        *args,
        cwd=config_file.parent,
        env={"APPLIANCE_CONFIG": str(config_file)},
        python_options=["-X", "importtime"],
    )
    assert done.returncode == 0, done.stderr
    modules, total_ms = _imports(done.stderr)
    names = [name for _, name in modules]
    assert "appliance.cli" in names, "no -X importtime output read"
    print(f"appliance {' '.join(args)}: {total_ms:.0f} ms of imports, {len(names)} modules")
    loaded = sorted({name.split(".")[0] for name in names} & set(forbidden))
    # Each through what imported it: the package's own line (after its submodules').
    found = [names.index(top) if top in names else _first_under(names, top) for top in loaded]
    assert not loaded, f"appliance {' '.join(args)} imported " + "; ".join(
        _chain(modules, index) for index in found
    )


def test_the_parser_names_every_derived_table() -> None:
    """The CLI's parser takes the derived tables' names from the light catalog, not the jobs."""
    from appliance.spark.catalog import DERIVED_TABLES
    from appliance.spark.jobs import JOBS

    assert tuple(JOBS) == DERIVED_TABLES
