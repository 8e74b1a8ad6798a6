"""Starts ``python -m appliance`` commands together, quickly (run as a script by a test).

``python cli_launcher.py OUT_DIR`` imports the CLI once, prints ``ready``,
then reads one JSON line per round from stdin: a list of argument lists.
For each it forks one process per command, so every process runs the
``appliance`` package's ``__main__`` (what ``python -m appliance`` runs)
without paying for the interpreter's start and the imports again. The
processes wait at one start line (a pipe whose closing releases them all at
once) so that the commands really run at the same moment. Once all have
ended it prints one JSON line: each command's exit code, stdout and stderr.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import appliance.cli
import appliance.commands.cert
import auth.database

_PRELOADED = (appliance.cli, appliance.commands.cert, auth.database)


def _child(args: list[str], gate: int, out: Path, err: Path) -> None:
    """In the forked process: wait at the start line, run the command, exit with its code."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.read(gate, 1)  # returns at EOF: when the launcher closes the line for everyone
    os.close(gate)
    sys.argv = ["appliance", *args]
    code: object = 0
    try:
        runpy.run_module("appliance", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def _round(commands: list[list[str]], directory: Path, number: int) -> list[dict[str, object]]:
    read_end, write_end = os.pipe()
    children: list[tuple[int, Path, Path]] = []
    for index, args in enumerate(commands):
        out = directory / f"{number}-{index}.out"
        err = directory / f"{number}-{index}.err"
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            _child(args, read_end, out, err)
        children.append((pid, out, err))
    os.close(read_end)
    os.close(write_end)  # the start line: every child's read returns now
    results: list[dict[str, object]] = []
    for pid, out, err in children:
        _, status = os.waitpid(pid, 0)
        results.append(
            {
                "code": os.waitstatus_to_exitcode(status),
                "stdout": out.read_text(),
                "stderr": err.read_text(),
            }
        )
    return results


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    print("ready", flush=True)
    for number, line in enumerate(sys.stdin):
        commands = json.loads(line)
        print(json.dumps(_round(commands, directory, number)), flush=True)


if __name__ == "__main__":
    main()
