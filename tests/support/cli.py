"""The real ``appliance`` command in a subprocess: one way to run it for the whole suite.

Every subprocess imports this checkout (``PYTHONPATH`` names it first), not
another one installed or named by the caller's environment, and reads no
``APPLIANCE_CONFIG`` of the developer's shell: a test passes ``config=`` or
sets the variable in ``env=``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

#: The checkout these tests belong to (the directory holding appliance/ and tests/).
CHECKOUT = Path(__file__).resolve().parents[2]
#: Seconds one command may take: a liveness bound for a busy machine, never a timing check.
CLI_TIMEOUT_SECONDS = 120.0


def cli_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess: this one, importing :data:`CHECKOUT`, plus ``env``."""
    environment = {k: v for k, v in os.environ.items() if k != "APPLIANCE_CONFIG"}
    inherited = [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [str(CHECKOUT), *(p for p in inherited if Path(p).resolve() != CHECKOUT)]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    environment["PYTHONUNBUFFERED"] = "1"
    environment.update(env or {})
    return environment


def cli_argv(
    args: Sequence[str], config: Path | str | None = None, python_options: Sequence[str] = ()
) -> list[str]:
    """``python -m appliance ARGS [--config CONFIG]``, with the interpreter running the tests.

    ``--config`` goes before a ``--`` in ``args`` (what follows it is
    arguments only: a Z85 key may begin with ``-``), else at the end. A
    command whose ``--`` stands between its arguments (``curve add NAME -- KEY``)
    takes ``--config`` in ``args``, before the first of them (argparse refuses
    ``NAME --config FILE -- KEY``).
    """
    argv = list(args)
    if config is not None:
        at = argv.index("--") if "--" in argv else len(argv)
        argv[at:at] = ["--config", str(config)]
    return [sys.executable, *python_options, "-m", "appliance", *argv]


def run_cli(
    *args: str,
    config: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdin: str | None = None,
    timeout: float = CLI_TIMEOUT_SECONDS,
    check: bool = False,
    python_options: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``appliance ARGS`` to its end; its exit code, stdout and stderr.

    ``check``: assert it exited 0 (the message holds its stderr).
    ``python_options``: interpreter options before ``-m`` (``-X importtime``).
    """
    done = subprocess.run(
        cli_argv(args, config, python_options),
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(env),
        timeout=timeout,
        check=False,
    )
    if check:
        assert done.returncode == 0, (
            f"appliance {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
        )
    return done


def start_cli(
    *args: str,
    config: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> CliProcess:
    """Start ``appliance ARGS`` (``status --watch``, ``tail``) and read its stdout as it comes.

    The command gets SIGINT as a terminal gives it (Ctrl-C ends it), whatever
    the suite inherited: a shell without job control starts its background
    jobs with SIGINT ignored, a child keeps that, and a test's Ctrl-C would
    then be lost (:func:`_default_sigint`).
    """
    process = subprocess.Popen(
        cli_argv(args, config),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=cli_env(env),
        preexec_fn=_default_sigint,
    )
    return CliProcess(process)


def _default_sigint() -> None:
    """In the child, before exec: SIGINT back to its default, so Python maps it to Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CliProcess:
    """A running ``appliance`` command whose output threads collect while the test waits."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._collect, args=(pipe, into), daemon=True)
            for pipe, into in ((process.stdout, self._stdout), (process.stderr, self._stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _collect(self, pipe: object, into: list[str]) -> None:
        assert pipe is not None
        for line in pipe:  # type: ignore[attr-defined]
            with self._changed:
                into.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def stdout(self) -> str:
        with self._changed:
            return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self._stderr)

    def wait_for_output(
        self, done: Callable[[str], bool], timeout: float = CLI_TIMEOUT_SECONDS
    ) -> str:
        """Wait until ``done(stdout so far)``; fail if the command exits or ``timeout`` passes.

        ``timeout`` is a liveness bound for a busy machine, not a measurement.
        """
        with self._changed:
            ok = self._changed.wait_for(
                lambda: done("".join(self._stdout)) or not self._readers[0].is_alive(),
                timeout,
            )
            out = "".join(self._stdout)
        if not done(out):
            when = "before its output ended" if ok else f"within {timeout}s"
            raise AssertionError(
                f"appliance did not print what the test waits for {when} "
                f"(exit {self.process.poll()}):\n{out[-2000:]}\n{self.stderr[-2000:]}"
            )
        return out

    def finish(self, timeout: float = CLI_TIMEOUT_SECONDS) -> subprocess.CompletedProcess[str]:
        """Wait for the command to exit (killed after ``timeout``); what it printed."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout)
        return subprocess.CompletedProcess(
            self.process.args, self.process.returncode, self.stdout, self.stderr
        )
