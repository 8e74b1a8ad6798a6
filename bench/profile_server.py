"""Run ``appliance serve`` under cProfile in every Python thread; write the stats on exit.

Usage (what ``python -m bench.forward_bench --profile`` runs)::

    python -m bench.profile_server OUT_DIR [--timer cpu|wall] serve --config FILE

``python -m cProfile`` would profile the main thread only, but the appliance
builds Arrow tables and commits to Delta in trio worker threads. So every
thread started through :mod:`threading` gets a profiler of its own (via
:func:`threading.setprofile`), and on exit the runner writes
``OUT_DIR/main.prof`` (the trio event loop) and ``OUT_DIR/worker-N.prof``
(one per worker thread), all readable with :mod:`pstats`.

SIGTERM is fine: the appliance handles it itself and :func:`appliance.cli.main`
returns normally, after which the stats are written.

``--timer wall`` (the default) uses cProfile's own clock: least overhead, but
a wait (``epoll``, the GIL, a preempted thread) counts for the function that
waits. ``--timer cpu`` uses :func:`time.thread_time`, so each thread counts
its own CPU time only; each reading is a system call, so the overhead is much
higher and call-heavy functions look more expensive than they are.
Native threads that run no Python (deltalake's tokio runtime) are in neither;
``forward_bench.py`` reports their CPU from ``/proc``.
"""

from __future__ import annotations

import cProfile
import marshal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main() -> int:
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args.pop(0))
    timer = "wall"
    if args[:1] == ["--timer"]:
        timer = args[1]
        del args[:2]
    out.mkdir(parents=True, exist_ok=True)

    def new_profile() -> cProfile.Profile:
        if timer == "cpu":
            return cProfile.Profile(time.thread_time)
        return cProfile.Profile()

    workers: list[tuple[str, cProfile.Profile]] = []
    lock = threading.Lock()

    def start_in_thread(frame: Any, event: str, arg: Any) -> None:
        # Called once, on the thread's first event: swap in a real profiler.
        sys.setprofile(None)
        profile = new_profile()
        with lock:
            workers.append((threading.current_thread().name, profile))
        profile.enable()

    threading.setprofile(start_in_thread)
    from appliance.cli import main as cli_main

    main_profile = new_profile()
    main_profile.enable()
    try:
        code = cli_main(args)
    finally:
        main_profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        main_profile.dump_stats(out / "main.prof")
        with lock:
            for i, (name, profile) in enumerate(workers):
                # The thread may still be alive, idle in trio's thread cache.
                # dump_stats() would disable the profiler from this thread and
                # close the worker's unfinished calls (its idle wait) with
                # *this* thread's clock; a snapshot keeps the finished calls only.
                profile.snapshot_stats()
                with open(out / f"worker-{i}.prof", "wb") as f:
                    marshal.dump(profile.stats, f)  # type: ignore[attr-defined]
                (out / f"worker-{i}.name").write_text(name + "\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
