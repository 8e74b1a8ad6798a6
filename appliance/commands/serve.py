"""``appliance serve``: run the service, and turn a start-up failure into one line and exit 1.

trio and the service's modules (gc_policy too: it imports trio) load only
when the command runs, so that the CLI starts fast (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from typing import TYPE_CHECKING

from appliance.blocks.errors import BlockRefused
from appliance.commands.common import Subparsers, load
from appliance.lake.errors import LakeError
from appliance.logs import configure, get_logger
from appliance.state_lock import StateLocked
from auth.errors import AuthError
from pki.errors import PkiError

if TYPE_CHECKING:
    from appliance.server.spread import WorkerShare

__all__ = ["add_parser"]

log = get_logger("cli")


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _worker_signals() -> None:
    """A worker stops when asked, once, and drains; no signal ends it undrained.

    Ctrl-C reaches every process of the terminal's group, and systemd
    signals the whole cgroup besides the supervisor's own SIGTERM: a worker
    ignores SIGINT (the supervisor stops it), ignores SIGHUP outside the
    service's own handling (a reload that reaches it while it starts or
    drains), and a SIGTERM outside that handling (during the start, or a
    second one, also one trio passes on when its receiver closes) only asks
    the service to stop (:func:`appliance.service.request_stop`). These are
    the handlers trio's signal receiver restores when it closes.
    """
    from appliance.service import request_stop

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: request_stop())


def _serve(args: argparse.Namespace) -> int:
    import trio

    from appliance import gc_policy
    from appliance.node import worker_config
    from appliance.service import serve
    from appliance.serving_imports import keep_out

    config = load(args.config)
    configure(config.log.level, config.log.format, worker=args.worker)
    supervisor: int | None = None
    share: WorkerShare | None = None
    if args.worker is not None:
        # Started by the supervisor (workers = N): run as its worker ``args.worker``.
        if not 0 <= args.worker < config.worker_count:
            auto = " (auto)" if config.workers == "auto" else ""
            print(f"appliance: --worker {args.worker}: the config has workers = "
                  f"{config.worker_count}{auto}", file=sys.stderr)  # fmt: skip
            return 2
        if args.supervisor is None:
            print("appliance: --worker needs --supervisor PID (the supervisor starts workers)",
                  file=sys.stderr)  # fmt: skip
            return 2
        config = worker_config(config, args.worker)
        supervisor = args.supervisor
        if args.shared is not None:
            from appliance.server import spread

            try:
                share = spread.WorkerShare.parse(args.shared, args.worker)
            except (ValueError, OSError) as exc:
                print(f"appliance: {exc}", file=sys.stderr)
                return 2
        _worker_signals()
    gc_policy.tune()
    # Process-wide from here on: pandas and pyspark cannot be imported (the
    # module says why). Nothing before this line needs either.
    keep_out()
    failures: list[str] = []
    try:
        if config.worker_count > 1:
            from appliance.supervisor import supervise

            trio.run(supervise, config)
        else:
            trio.run(functools.partial(serve, config, supervisor=supervisor, share=share))
    except* (OSError, LakeError, BlockRefused, AuthError, PkiError, StateLocked) as group:
        # Start-up failures an operator can fix: a port in use, an unreadable
        # table, an auth database behind the code's schema (the message names
        # "appliance db upgrade"), a broken certificate. Inside trio's
        # nurseries they arrive as an exception group.
        failures = [str(exc) for exc in _leaves(group)]
    for failure in failures:
        log.error("service.failed", reason=failure)
        print(f"appliance: {failure}", file=sys.stderr)
    if failures:
        return 1
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``serve`` to the CLI."""
    serve = commands.add_parser(
        "serve", help="run the service (embedded default without a file)", parents=[common]
    )
    # Set by the supervisor for the processes it starts (workers = N); not for operators.
    serve.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor", type=int, default=None, help=argparse.SUPPRESS)
    # The descriptors a worker inherits (appliance/server/spread.py, WorkerShare.spec).
    serve.add_argument("--shared", default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)
