"""What every benchmark shares: the tree, the machine, the server, the clients' bytes, the window.

The benchmarks run from the repository root as ``python -m bench.NAME``; the
servers they start run this tree (:func:`tree_env`). The TLS protocol
benchmarks (``forward_bench``, ``lumberjack_bench``, ``courier_bench``) start
``python -m appliance serve`` with a fresh state directory
(:func:`start_server`, :func:`stop_server`), drive it from client threads that
keep requests in flight (:func:`pipelined`) over a measured window
(:func:`run_tls_case`, :func:`run_window`), read CPU and memory from
``/proc`` and check the table (:func:`table_counts`); ``lumberjack_bench`` and
``courier_bench`` are each a :class:`SizedBench` that :func:`run_bench` runs.
``fairness_bench`` uses the server, the clients' framing and ``/proc``;
``logjam_bench`` runs its own server process (:func:`bench_module`) with the
``/proc`` readers and the table check; ``websocket_bench`` is a
:class:`SizedBench` for ``/ingest`` and then runs the service in-process for
its tail cases, as ``metrics_overhead`` does, on requests built here;
``codec_micro`` times with :func:`best_rate`. Each benchmark keeps its own
workload and report.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import importlib.metadata
import json
import os
import platform
import re
import resource
import selectors
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import msgpack

#: The source tree the benchmarks sit in: what they measure.
ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: What ``appliance serve`` prints once it listens; the rest of the line is a path.
READY_LINE = b"CA certificate for clients:"
#: ``appliance serve`` of this tree (run with :func:`tree_env`).
APPLIANCE_SERVE = (sys.executable, "-m", "appliance", "serve")

#: One live thread: its OS name and its CPU seconds so far.
ThreadSample = dict[int, tuple[str, float]]
#: What one case of a benchmark found (each benchmark has its own dataclass).
Result = TypeVar("Result")


# -- the tree ------------------------------------------------------------------


def tree_env(root: Path = ROOT) -> dict[str, str]:
    """This environment with the tree ``root`` (this one by default) first on ``PYTHONPATH``.

    A subprocess started with it runs that tree's ``appliance`` and ``bench``,
    whatever the venv's editable install points at.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def bench_module(name: str) -> list[str]:
    """The command line that runs ``bench/NAME.py`` as a module (with :func:`tree_env`)."""
    return [sys.executable, "-m", f"bench.{name}"]


# -- machine -------------------------------------------------------------------


@contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """Run the block in this process on ``core`` (when not None), then as before."""
    previous = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def pin_cores(no_pin: bool) -> tuple[tuple[int | None, int | None], str, int]:
    """(server core, generator core), what was done and the usable cores before it.

    This process moves to the generator core; nothing is pinned with
    ``no_pin`` or on fewer than 2 usable cores.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if no_pin or len(cpus) < 2:
        pinning = "not pinned" + (" (fewer than 2 cores)" if len(cpus) < 2 else "")
        return (None, None), pinning, len(cpus)
    os.sched_setaffinity(0, {cpus[1]})
    pinning = f"server pinned to core {cpus[0]}, load generator to core {cpus[1]}"
    return (cpus[0], cpus[1]), pinning, len(cpus)


def cpu_reference_ms(core: int | None) -> float:
    """Milliseconds for ``sum(range(10**6))`` on ``core``: a rough speed yardstick."""
    with pinned(core):
        best = float("inf")
        for _ in range(15):
            start = time.perf_counter()
            sum(range(10**6))
            best = min(best, time.perf_counter() - start)
        return best * 1000


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def memory_gib() -> str:
    mem_kb = 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return f"{mem_kb / 1024 / 1024:.1f} GiB"


def package_versions(names: Sequence[str]) -> str:
    versions = []
    for name in names:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return ", ".join(versions)


def git_commit(root: Path = ROOT) -> str:
    """``git describe`` of the tree ``root`` (the benchmarks' own by default), or ``unknown``."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return commit or "unknown"


def machine_info(
    usable: int, packages: Sequence[str], extra: dict[str, str] | None = None
) -> dict[str, str]:
    """What the results were measured on; ``extra`` comes right after ``openssl``."""
    return {
        "cpus": f"{os.cpu_count()} (usable: {usable})",
        "cpu": cpu_model(),
        "memory": memory_gib(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "openssl": ssl.OPENSSL_VERSION,
        **(extra or {}),
        "libraries": package_versions(packages),
        "commit": git_commit(),
    }


def command_line() -> str:
    """How this benchmark was started: ``python -m bench.NAME ARGS``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    started = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return " ".join([Path(sys.executable).name, *started, *sys.argv[1:]])


def print_header(title: str, info: dict[str, str], pinning: str, core: int | None) -> None:
    """Add the speed yardstick of the server core to ``info`` and print it all."""
    info["speed"] = f"sum(range(10**6)) takes {cpu_reference_ms(core):.1f} ms on the server core"
    print(f"# {title}")
    print(f"command: {command_line()}")
    for key, value in info.items():
        print(f"{key}: {value}")
    print(f"pinning: {pinning}")


def add_arguments(parser: argparse.ArgumentParser, default_cases: str, cases_help: str) -> None:
    """``--cases`` (``cases_help``) and the options every TLS benchmark takes."""
    parser.add_argument("--cases", default=default_cases, help=cases_help)
    parser.add_argument(
        "--connections", type=int, default=4, help="TLS connections of a case that names none (4)"
    )
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds (8)")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds (1.5)")
    parser.add_argument("--commit-delay", type=float, default=0.25, help="[lake] max delay")
    parser.add_argument("--commit-max-rows", type=int, default=100_000, help="[lake] max rows")
    parser.add_argument(
        "--ceiling-seconds", type=float, default=0.4, help="per ceiling run, best of 3 (0.4)"
    )
    parser.add_argument(
        "--no-commit-ceiling", action="store_true", help="skip the in-process Delta commit ceiling"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and generator")
    parser.add_argument("--keep", action="store_true", help="keep the state directories")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--server-tree",
        type=Path,
        default=ROOT,
        help="run the server of this source tree (a checkout of another commit) with this"
        " tree's clients: a same-run A/B of two commits (default: this tree)",
    )


# -- in-process ceilings -------------------------------------------------------


def best_rate(fn: Callable[[], int], seconds: float, repeats: int = 3) -> float:
    """Best events/s of ``fn`` (which returns the events it handled) over ``repeats`` runs.

    Each run lasts at least ``seconds``. The best run is the one least disturbed
    by neighbours on a shared machine.
    """
    fn()  # warm up
    best = 0.0
    for _ in range(repeats):
        events = 0
        start = time.perf_counter()
        while True:
            events += fn()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, events / elapsed)
    return best


def commit_rate(build: Callable[[], Any], seconds: float, prefix: str) -> float:
    """Best events/s of ``build`` (an Arrow table) plus its Delta commit, in a temporary table."""
    from appliance.lake.table import EventsTable

    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        table = EventsTable(str(Path(tmp) / "events"))
        table.open_or_create()
        version = [0]

        def commit() -> int:
            data = build()
            version[0] += 1
            table.commit(data, "bench-ceiling", version[0])
            return int(data.num_rows)

        return best_rate(commit, seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def block_ceilings(
    decode: Callable[[], list[Any]],
    events: Callable[[Any], int],
    to_block: Callable[[Any, int], Any],
    seconds: float,
    with_commit: bool,
    prefix: str,
) -> dict[str, float]:
    """Rates of the codec (``decode``), then each decoded item ``to_block`` (given the time
    in ns), then ``blocks_to_arrow``, then (``with_commit``) the Delta commit too."""
    from appliance.lake.arrow import blocks_to_arrow

    def codec() -> int:
        return sum(events(item) for item in decode())

    def blocks() -> list[Any]:
        now = time.time_ns()
        return [to_block(item, now) for item in decode()]

    def rows() -> int:
        return sum(b.rows for b in blocks())

    def arrow() -> int:
        return int(blocks_to_arrow(blocks()).num_rows)

    result = {"codec": best_rate(codec, seconds), "rows": best_rate(rows, seconds)}
    result["arrow"] = best_rate(arrow, seconds)
    if with_commit:
        result["commit"] = commit_rate(lambda: blocks_to_arrow(blocks()), seconds, prefix)
    return result


# -- /proc ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat_cpu_seconds(stat: str) -> float:
    """utime + stime from the text of a ``/proc/.../stat`` file."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads, dead ones included)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return _stat_cpu_seconds(f.read())


def thread_cpu_seconds(pid: int) -> ThreadSample:
    """CPU seconds of each live thread of ``pid``, with its OS thread name."""
    out: ThreadSample = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        out[int(tid)] = (comm, _stat_cpu_seconds(raw))
    return out


def thread_kind(pid: int, tid: int, comm: str, jemalloc: bool) -> str:
    if tid == pid:
        return "main (trio loop)"
    if comm.startswith("tokio"):
        return "tokio (deltalake)"
    if jemalloc and comm.startswith("jemalloc"):
        return "jemalloc"
    # trio.to_thread workers take the name of their job (truncated to 15).
    return "python worker threads"


def thread_groups(pid: int, before: ThreadSample, after: ThreadSample) -> dict[str, float]:
    """CPU seconds of each live thread between two samples, grouped by thread kind."""
    groups: dict[str, float] = collections.defaultdict(float)
    for tid, (comm, cpu) in after.items():
        groups[thread_kind(pid, tid, comm, jemalloc=True)] += cpu - before.get(tid, (comm, 0.0))[1]
    return dict(groups)


def thread_totals(pid: int, sample: ThreadSample) -> dict[str, float]:
    """CPU seconds so far of the threads in ``sample``, grouped by kind (jemalloc not apart)."""
    groups: dict[str, float] = collections.defaultdict(float)
    for tid, (comm, cpu) in sample.items():
        groups[thread_kind(pid, tid, comm, jemalloc=False)] += cpu
    return dict(groups)


def system_cpu_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat", encoding="utf-8") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def vm_hwm_mb(pid: int, missing: float = float("nan")) -> float:
    """Peak RSS of ``pid`` in MB, or ``missing`` (a zombie has none)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return missing


# -- server --------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    port: int
    ca_file: Path
    log_path: Path

    @property
    def pids(self) -> list[int]:
        """This process and its children (a supervisor's workers, ``workers = N``)."""
        return [self.proc.pid, *child_pids(self.proc.pid)]

    def kill(self) -> None:
        """SIGKILL the server and its children; returns once the server is reaped."""
        for pid in child_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def child_pids(pid: int) -> list[int]:
    """The children of ``pid``, started by any of its threads ([] once it is gone).

    From Linux's ``/proc/<pid>/task/<tid>/children`` of every thread: trio
    starts a child from a worker thread, which is then its parent task.
    """
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "children").read_text(encoding="ascii")
        except OSError:
            continue
        children += [int(field) for field in text.split()]
    return sorted(children)


def start_server(
    state_dir: Path,
    args: argparse.Namespace,
    listener: str,
    core: int | None,
    *,
    command: Sequence[str] = APPLIANCE_SERVE,
    preamble: str = "",
    lake: str = "",
    cores: int = 1,
) -> Server:
    """``command --config FILE`` in ``state_dir``, pinned to ``core``, once it is ready.

    ``command`` runs with this tree first on ``PYTHONPATH`` (:func:`tree_env`).
    The config has the state directory, then ``preamble``, the ``[lake]``
    settings of ``args`` (``commit_delay``, ``commit_max_rows``) and ``lake``
    (more ``[lake]`` lines), and one
    ``[[listeners]]`` entry: ``listener`` (TOML lines) bound to a free port.
    The server's stderr goes to ``state_dir/server.log``. ``cores``: how
    many cores, from ``core`` on, the server (and its children) may use.
    """
    port = free_port()
    config = state_dir / "bench.toml"
    config.write_text(
        f'state_dir = "{state_dir / "var"}"\n'
        f"{preamble}"
        "[lake]\n"
        f"commit_max_delay_seconds = {args.commit_delay}\n"
        f"commit_max_rows = {args.commit_max_rows}\n"
        f"{lake}"
        "[[listeners]]\n"
        f"{listener}"
        f'bind = "127.0.0.1:{port}"\n',
        encoding="utf-8",
    )

    allowed: set[int] | None = None
    if core is not None:
        cpus = sorted(os.sched_getaffinity(0) | {core})
        start = cpus.index(core)
        allowed = {cpus[(start + k) % len(cpus)] for k in range(cores)}

    def pin() -> None:
        if allowed is not None:
            os.sched_setaffinity(0, allowed)

    server_tree: Path = getattr(args, "server_tree", ROOT)
    if server_tree != ROOT:
        print(f"server tree: {server_tree} ({git_commit(server_tree)})", flush=True)
    log_path = state_dir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, "--config", str(config)],
            stdout=subprocess.PIPE, stderr=log, preexec_fn=pin, cwd=state_dir,
            env=tree_env(server_tree),
        )  # fmt: skip
    server = Server(proc, state_dir, port, Path(), log_path)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    buffer = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while READY_LINE not in buffer or not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"server did not become ready:\n{server.log_tail()}")
            if sel.select(timeout=min(left, 0.5)):
                buffer += os.read(proc.stdout.fileno(), 4096)
    line = next(x for x in buffer.decode().splitlines() if READY_LINE.decode() in x)
    server.ca_file = Path(line.split(":", 1)[1].strip())
    return server


def stop_server(server: Server, timeout: float = 120) -> tuple[int, dict[str, str]]:
    """SIGTERM, wait, and the fields of its ``service.stopped`` log line(s).

    A supervisor (``workers = N``) stops its workers itself; their
    ``commits`` are summed.
    """
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.kill()
        code = server.proc.returncode
    if server.proc.stdout is not None:
        server.proc.stdout.close()
    stopped: dict[str, str] = {}
    commits = 0
    for line in server.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "event=service.stopped" in line:
            stopped = dict(re.findall(r"(\w+)=(\S+)", line))
            commits += (
                int(stopped.get("commits", "0")) if stopped.get("commits", "").isdigit() else 0
            )
    if stopped:
        stopped["commits"] = str(commits)
    return code, stopped


def table_counts(path: Path) -> tuple[int, int]:
    """Rows and distinct batch ids in the table, read from its data files."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table(columns=["batch_id"])
    return table.num_rows, int(pc.count_distinct(table.column("batch_id")).as_py())


def discard_state(state_dir: Path, keep: bool) -> None:
    if keep:
        print(f"  state kept in {state_dir}")
    else:
        shutil.rmtree(state_dir, ignore_errors=True)


# -- what the clients send -----------------------------------------------------

#: Log Courier's frame header: the message type and the body's length.
COURIER_HEADER = struct.Struct(">4sI")
#: A Log Courier HELO as the Go client sends it (32-byte body, protocol flags 0).
COURIER_HELO = COURIER_HEADER.pack(b"HELO", 32) + (
    bytes(4) + struct.pack(">III", 2, 10, 0) + b"BNCH" + bytes(12)
)


def packed_forward(tag: str, entries: Sequence[Any], chunk: str) -> bytes:
    """A PackedForward request of ``entries`` (``[time, record]``) with an ack ``chunk``."""
    stream = b"".join(msgpack.packb(entry) for entry in entries)
    return bytes(msgpack.packb([tag, stream, {"chunk": chunk, "size": len(entries)}]))


def event_timestamp(i: int) -> str:
    """An RFC 3339 time (ms, UTC) for the ``i``-th event of a workload: spread over an hour."""
    return f"2026-11-22T10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"


def padded_json(event: dict[str, Any], filler: str, target: int) -> bytes:
    """``event`` as compact JSON of about ``target`` bytes: its ``message`` is cut from ``filler``.

    ``filler`` is repeated 8 times before it is cut.
    """
    base = len(json.dumps(event, separators=(",", ":")))
    event["message"] = (filler * 8)[: max(0, target - base)]
    return json.dumps(event, separators=(",", ":")).encode()


def lumberjack_frames(payloads: Sequence[bytes]) -> bytes:
    """Lumberjack v2 ``2J`` frames of ``payloads``, numbered from 1 as Beats number them."""
    return b"".join(
        b"2J" + struct.pack(">II", seq, len(p)) + p for seq, p in enumerate(payloads, 1)
    )


def lumberjack_window(payloads: Sequence[bytes], level: int = 3) -> bytes:
    """A ``2W`` window of ``payloads`` in one ``2C`` frame (zlib ``level``, Beats' default 3)."""
    compressed = zlib.compress(lumberjack_frames(payloads), level)
    return (
        b"2W"
        + struct.pack(">I", len(payloads))
        + b"2C"
        + struct.pack(">I", len(compressed))
        + compressed
    )


def courier_events(payloads: Sequence[bytes]) -> bytes:
    """Log Courier's event stream: each JSON event behind its 4-byte length."""
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def courier_jdat(nonce: bytes, compressed: bytes) -> bytes:
    """A JDAT message: the 16-byte ``nonce``, then the zlib-compressed event stream."""
    return COURIER_HEADER.pack(b"JDAT", len(nonce) + len(compressed)) + nonce + compressed


# -- load and window -----------------------------------------------------------


@dataclasses.dataclass
class ConnectionResult:
    """What one client thread saw: when each ack came, how long it took, the keepalives."""

    ack_times: list[float] = dataclasses.field(default_factory=list)
    latencies: list[float] = dataclasses.field(default_factory=list)
    #: Answers that acknowledged nothing (the server's keepalives while a commit runs).
    keepalives: int = 0
    error: BaseException | None = None
    #: The client's TCP port: which worker took the connection (the server logs the peer).
    local_port: int = 0


def tls_context(ca_file: Path) -> ssl.SSLContext:
    """A client TLS context that trusts the server's CA (``ca_file``) and checks its name."""
    return ssl.create_default_context(cafile=str(ca_file))


def tls_connect(context: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    """A TLS connection to the local server (name ``localhost``), no Nagle, 120 s timeout."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=60)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tls = context.wrap_socket(raw, server_hostname="localhost")
    tls.settimeout(120)
    return tls


def receive(tls: ssl.SSLSocket) -> bytes:
    """Some bytes from the server; :class:`ConnectionError` when it has closed."""
    data = tls.recv(65536)
    if not data:
        raise ConnectionError("the server closed the connection")
    return data


class Pipeline(Protocol):
    """One protocol client of :func:`pipelined`: its requests and how it reads the answers."""

    def handshake(self, tls: ssl.SSLSocket) -> None:
        """What the client does once connected, before its first request."""

    def request(self) -> tuple[Any, bytes]:
        """The next request: what its ack must carry, and its bytes."""

    def answers(self, tls: ssl.SSLSocket) -> list[Any]:
        """The answers read from ``tls`` (it reads at least once)."""

    def acknowledges(self, answer: Any, expected: Any) -> bool:
        """True: ``answer`` acks the oldest request; False: a keepalive; else it raises."""


def pipelined(
    context: ssl.SSLContext,
    start: threading.Event,
    stop_at: list[float],
    *,
    port: int,
    in_flight: int,
    client: Pipeline,
    result: ConnectionResult,
) -> None:
    """One sender (a :data:`Sender`): up to ``in_flight`` requests unacked, acks in order.

    It sends until ``stop_at[0]`` passes, then waits for every ack; a failure
    goes into ``result.error``.
    """
    try:
        with tls_connect(context, port) as tls:
            result.local_port = tls.getsockname()[1]
            client.handshake(tls)
            sent: collections.deque[tuple[Any, float]] = collections.deque()
            start.wait()
            while True:
                while len(sent) < in_flight and time.perf_counter() < stop_at[0]:
                    expected, data = client.request()
                    sent.append((expected, time.perf_counter()))
                    tls.sendall(data)
                if not sent:
                    break
                for answer in client.answers(tls):
                    if not client.acknowledges(answer, sent[0][0]):
                        result.keepalives += 1
                        continue
                    now = time.perf_counter()
                    _, sent_at = sent.popleft()
                    result.ack_times.append(now)
                    result.latencies.append(now - sent_at)
    except BaseException as exc:
        result.error = exc


#: One client thread's work: ``(context, start, stop_at)``. It connects with
#: ``context`` (which trusts the server's CA), waits for ``start``, sends until
#: ``time.perf_counter()`` passes ``stop_at[0]``, then waits for what is unacked.
Sender = Callable[[ssl.SSLContext, threading.Event, list[float]], None]


@dataclasses.dataclass
class Window:
    """The measured window of a case and what the server and the machine did in it."""

    pid: int
    start: float
    end: float
    server_cpu: float
    generator_cpu: float
    system_busy: float
    steal: float
    threads_before: ThreadSample
    threads_after: ThreadSample
    server_peak_rss_mb: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def latencies(self, results: Sequence[ConnectionResult]) -> list[float]:
        """Sorted latencies of the acks that came inside the window."""
        return sorted(
            lat
            for r in results
            for t, lat in zip(r.ack_times, r.latencies, strict=True)
            if self.start <= t <= self.end
        )

    @property
    def other_cpu(self) -> float:
        """CPU of every other process in the window (py-spy included when it samples)."""
        return self.system_busy - self.server_cpu - self.generator_cpu

    def threads_by_kind(self) -> dict[str, float]:
        """Server CPU by thread kind, per live thread (see :func:`thread_groups`)."""
        return thread_groups(self.pid, self.threads_before, self.threads_after)

    def thread_totals_delta(self) -> dict[str, float]:
        """Server CPU by thread kind, the difference of the two grouped totals."""
        before = thread_totals(self.pid, self.threads_before)
        after = thread_totals(self.pid, self.threads_after)
        return {k: v - before.get(k, 0.0) for k, v in after.items()}

    def metrics(self, events: int, latencies: list[float]) -> dict[str, float]:
        """The rates every case reports, given the events and sorted latencies in the window."""
        seconds = self.seconds
        return {
            "events_per_second": events / seconds,
            "p50_ms": quantile(latencies, 0.50) * 1000,
            "p99_ms": quantile(latencies, 0.99) * 1000,
            "server_cpu_pct": 100 * self.server_cpu / seconds,
            "events_per_server_cpu_second": (
                events / self.server_cpu if self.server_cpu else float("nan")
            ),
            "generator_cpu_pct": 100 * self.generator_cpu / seconds,
            "other_cpu_pct": max(0.0, 100 * self.other_cpu / seconds),
            "server_peak_rss_mb": self.server_peak_rss_mb,
        }


def run_window(
    server: Server,
    senders: Sequence[Sender],
    results: Sequence[ConnectionResult],
    warmup: float,
    duration: float,
    start_sampler: Callable[[], subprocess.Popen[bytes]] | None = None,
) -> Window:
    """Run ``senders`` (one thread each) through warm-up and window, and measure the window.

    ``start_sampler`` starts a profiler at the window's start; it gets SIGINT at
    its end. On any failure the server is killed and its log tail printed.
    """
    pids = server.pids
    # Threads are sampled in one process: the server, or a supervisor's first worker.
    pid = pids[1] if len(pids) > 1 else pids[0]
    sampler: subprocess.Popen[bytes] | None = None
    try:
        context = tls_context(server.ca_file)
        start = threading.Event()
        stop_at = [float("inf")]
        threads = [
            threading.Thread(
                target=send, args=(context, start, stop_at), name=f"conn-{i}", daemon=True
            )
            for i, send in enumerate(senders)
        ]
        for t in threads:
            t.start()
        time.sleep(0.2)  # let the TLS handshakes finish
        window_start = time.perf_counter() + warmup
        window_end = window_start + duration
        stop_at[0] = window_end
        start.set()
        time.sleep(max(0.0, window_start - time.perf_counter()))
        if start_sampler is not None:
            sampler = start_sampler()
        cpu0, threads0 = sum(map(proc_cpu_seconds, pids)), thread_cpu_seconds(pid)
        gen0 = resource.getrusage(resource.RUSAGE_SELF)
        sys0 = system_cpu_seconds()
        w0 = time.perf_counter()
        time.sleep(max(0.0, window_end - time.perf_counter()))
        w1 = time.perf_counter()
        cpu1, threads1 = sum(map(proc_cpu_seconds, pids)), thread_cpu_seconds(pid)
        gen1 = resource.getrusage(resource.RUSAGE_SELF)
        sys1 = system_cpu_seconds()
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            sampler.wait(timeout=120)
        for t in threads:
            t.join(timeout=300)
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"load generator failed: {errors[0]!r}") from errors[0]
        peak_rss = sum(map(vm_hwm_mb, pids))
    except BaseException:
        if sampler is not None and sampler.poll() is None:
            sampler.kill()
        server.kill()
        print(server.log_tail(), file=sys.stderr)
        raise
    return Window(
        pid=pid,
        start=w0,
        end=w1,
        server_cpu=cpu1 - cpu0,
        generator_cpu=(gen1.ru_utime + gen1.ru_stime) - (gen0.ru_utime + gen0.ru_stime),
        system_busy=sys1[0] - sys0[0],
        steal=sys1[1] - sys0[1],
        threads_before=threads0,
        threads_after=threads1,
        server_peak_rss_mb=peak_rss,
    )


@dataclasses.dataclass
class CaseRun:
    """One case of a TLS benchmark: its window, what the clients saw, what the table holds."""

    window: Window
    results: list[ConnectionResult]
    #: Sorted latencies of the acks inside the window.
    latencies: list[float]
    server_exit: int
    #: The server's commit count from its ``service.stopped`` line ("?" when missing).
    commits: str
    table_rows: int
    table_batches: int
    #: Connections each worker accepted (``workers = N``: the accept gate's spread,
    #: appliance/server/spread.py); empty for a single process.
    connections_by_worker: dict[int, int] = dataclasses.field(default_factory=dict)
    #: The worker that accepted each client port (empty for a single process).
    workers_by_port: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def acked(self) -> int:
        """Requests acknowledged, in the window and after it."""
        return sum(len(r.ack_times) for r in self.results)

    @property
    def keepalives(self) -> int:
        return sum(r.keepalives for r in self.results)

    def measured(self, events_per_request: int) -> dict[str, Any]:
        """The fields every case result shares: the window's rates, CPU and memory, the exit."""
        return {
            "seconds": self.window.seconds,
            **self.window.metrics(len(self.latencies) * events_per_request, self.latencies),
            "server_threads": self.window.thread_totals_delta(),
            "commits": self.commits,
            "server_exit": self.server_exit,
        }


def run_tls_case(
    args: argparse.Namespace,
    state_prefix: str,
    start: Callable[[Path], Server],
    clients: Sequence[Pipeline],
    in_flight: int,
    start_sampler: Callable[[int], subprocess.Popen[bytes]] | None = None,
) -> CaseRun:
    """One case: a fresh state directory and server, one :func:`pipelined` sender per client,
    the window, the stop and the table's rows and batch ids.

    ``start`` starts the server in the state directory; ``start_sampler``
    (given the server's pid) starts a profiler at the window's start.
    """
    state_dir = Path(tempfile.mkdtemp(prefix=state_prefix))
    server = start(state_dir)
    results = [ConnectionResult() for _ in clients]
    senders = [
        functools.partial(pipelined, port=server.port, in_flight=in_flight, client=c, result=r)
        for c, r in zip(clients, results, strict=True)
    ]
    sampler = None if start_sampler is None else functools.partial(start_sampler, server.proc.pid)
    window = run_window(server, senders, results, args.warmup, args.duration, sampler)
    code, stopped = stop_server(server)
    spread = connections_by_worker(server.log_path)
    ports = workers_by_port(server.log_path)
    table_rows, table_batches = table_counts(state_dir / "var" / "lake" / "events")
    discard_state(state_dir, args.keep)
    return CaseRun(
        window,
        list(results),
        window.latencies(results),
        code,
        stopped.get("commits", "?"),
        table_rows,
        table_batches,
        spread,
        ports,
    )


def connections_by_worker(log_path: Path) -> dict[int, int]:
    """Connections each worker logged (``connection.open ... worker=k``); {} for one process."""
    counts: dict[int, int] = {}
    text = log_path.read_text(encoding="utf-8", errors="replace")
    for worker in re.findall(r"event=connection\.open worker=(\d+)", text):
        counts[int(worker)] = counts.get(int(worker), 0) + 1
    return dict(sorted(counts.items()))


def workers_by_port(log_path: Path) -> dict[int, int]:
    """The worker that accepted each client port, from ``connection.open ... peer=H:P ...
    worker=k`` ({} for one process, whose lines name no worker)."""
    workers: dict[int, int] = {}
    text = log_path.read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        if "event=connection.open" not in line:
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        port = fields.get("peer", "").rpartition(":")[2]
        if port.isdigit() and fields.get("worker", "").isdigit():
            workers[int(port)] = int(fields["worker"])
    return workers


#: Width of a time slot in the latency breakdown's timeline of the slowest acks.
TAIL_SLOT_SECONDS = 0.25


def latency_breakdown(
    window: Window, results: Sequence[ConnectionResult], workers: dict[int, int]
) -> str:
    """Each connection's latency distribution in the window, then when the slowest acks came.

    The slowest 1% of the window's acks (at or above its p99), counted per
    :data:`TAIL_SLOT_SECONDS` slot of the window and per connection: a tail
    that a few slots hold is a stall of the server (a commit, a pause), one
    spread over the window is the rate's own variance.
    """
    every = window.latencies(results)
    if not every:
        return "    no acks in the window"
    p99 = quantile(every, 0.99)
    lines = [f"    latency by connection (ms; window p99 {p99 * 1000:.1f}):"]
    slots = max(1, int(window.seconds / TAIL_SLOT_SECONDS + 0.5))
    timeline = [0] * slots
    for index, r in enumerate(results):
        inside = [
            (t, lat)
            for t, lat in zip(r.ack_times, r.latencies, strict=True)
            if window.start <= t <= window.end
        ]
        lat = sorted(x for _, x in inside)
        if not lat:
            continue
        worker = workers.get(r.local_port)
        where = "" if worker is None else f" worker {worker}"
        tail = 0
        for t, x in inside:
            if x >= p99:
                tail += 1
                timeline[min(slots - 1, int((t - window.start) / TAIL_SLOT_SECONDS))] += 1
        lines.append(
            f"      conn {index}{where}: {len(lat)} acks, p50 {quantile(lat, 0.5) * 1000:.1f} "
            f"p90 {quantile(lat, 0.9) * 1000:.1f} p99 {quantile(lat, 0.99) * 1000:.1f} "
            f"max {lat[-1] * 1000:.1f}, {tail} at or above the window's p99"
        )
    lines.append(
        f"    acks at or above the p99 per {TAIL_SLOT_SECONDS:g} s of the window: "
        + " ".join(map(str, timeline))
    )
    return "\n".join(lines)


def latency_dump(
    path: Path, window: Window, results: Sequence[ConnectionResult], workers: dict[int, int]
) -> None:
    """Every ack's time and latency by connection, as JSON (``time.time()`` = perf + offset)."""
    path.write_text(
        json.dumps({
            "window": [window.start, window.end],
            "wall_offset": time.time() - time.perf_counter(),
            "connections": [
                {"port": r.local_port, "worker": workers.get(r.local_port),
                 "ack_times": r.ack_times, "latencies": r.latencies}
                for r in results
            ],
        }),
        encoding="utf-8",
    )  # fmt: skip


# -- a benchmark's cases -------------------------------------------------------


def run_cases(
    args: argparse.Namespace,
    in_flight: int,
    ceilings_of: Callable[[int], tuple[dict[str, float], str]],
    announce: Callable[[int, int, int], str],
    run: Callable[[int, int, int], Result],
    report: Callable[[Result], None],
) -> tuple[dict[int, dict[str, float]], list[Result]]:
    """Run and report every case of ``--cases``: ``SIZE[:IN_FLIGHT[:CONNECTIONS]]``.

    The in-process ceilings of each size are measured once, before its first
    case: ``ceilings_of(size)`` returns them and the line that shows them.
    Each case is announced (``announce(size, in_flight, connections)``), run
    and reported. Returns the ceilings by size and the case results.
    """
    ceilings: dict[int, dict[str, float]] = {}
    results: list[Result] = []
    for size, flight, connections in parse_cases(args.cases, in_flight, args.connections):
        if size not in ceilings:
            ceilings[size], line = ceilings_of(size)
            print(line, flush=True)
        print(announce(size, flight, connections), flush=True)
        results.append(run(size, flight, connections))
        report(results[-1])
    return ceilings, results


@dataclasses.dataclass(frozen=True)
class SizedBench(Generic[Result]):
    """A TLS protocol benchmark whose cases are ``SIZE[:IN_FLIGHT[:CONNECTIONS]]``.

    :func:`run_bench` prints the machine and ``settings(args)``, runs every
    case (:func:`run_cases`), prints ``table(results)`` and writes the JSON.
    A result has a boolean ``ok``: the table holds what was acknowledged.
    """

    title: str
    #: Libraries whose versions the header names.
    packages: Sequence[str]
    #: Requests in flight of a case that names none.
    in_flight: int
    settings: Callable[[argparse.Namespace], str]
    #: ``(size, args)`` -> the workload whose in-process ceilings are measured.
    workload: Callable[[int, argparse.Namespace], Any]
    #: ``(workload, seconds, server core, with_commit)`` -> the ceilings (events/s by stage).
    measure: Callable[[Any, float, int | None, bool], dict[str, float]]
    #: ``(size, workload)`` -> what the line before the ceilings says about it.
    describe: Callable[[int, Any], str]
    #: ``(size, in_flight, connections)`` -> the line that announces a case.
    announce: Callable[[int, int, int], str]
    #: ``(size, in_flight, connections, args, server core)`` -> the case's result.
    run: Callable[[int, int, int, argparse.Namespace, int | None], Result]
    report: Callable[[Result], None]
    table: Callable[[list[Result]], str]
    #: More lines for the header, after ``openssl``.
    info: dict[str, str] = dataclasses.field(default_factory=dict)


def run_bench(bench: SizedBench[Any], args: argparse.Namespace) -> int:
    """Run ``bench`` with the options of :func:`add_arguments`; 1 when a case's table is wrong."""
    (core, _), pinning, usable = pin_cores(args.no_pin)
    info = machine_info(usable, bench.packages, bench.info)
    print_header(bench.title, info, pinning, core)
    print(bench.settings(args))

    def ceilings_of(size: int) -> tuple[dict[str, float], str]:
        workload = bench.workload(size, args)
        found = bench.measure(workload, args.ceiling_seconds, core, not args.no_commit_ceiling)
        line = f"\n{bench.describe(size, workload)}; in-process ceilings on one core (events/s): "
        return found, line + fmt_ceilings(found)

    ceilings, results = run_cases(
        args,
        bench.in_flight,
        ceilings_of,
        bench.announce,
        lambda size, in_flight, connections: bench.run(size, in_flight, connections, args, core),
        bench.report,
    )
    print("\n" + bench.table(results))
    write_json(args.json, machine=info, pinning=pinning, ceilings=ceilings, cases=results)
    return 0 if all(r.ok for r in results) else 1


# -- reporting -----------------------------------------------------------------


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value == value else "n/a"


def fmt_threads(groups: dict[str, float]) -> str:
    """``kind 1.23s, ...``, the busiest first."""
    return ", ".join(f"{k} {v:.2f}s" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]))


def write_json(path: Path | None, **sections: Any) -> None:
    """The results as one JSON object of ``sections`` (dataclasses as dicts), when asked."""
    if path is None:
        return
    data = {
        key: [dataclasses.asdict(v) for v in value]
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0])
        else value
        for key, value in sections.items()
    }
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def fmt_ceilings(ceilings: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt_rate(v)}" for k, v in ceilings.items())


def cpu_lines(r: Any) -> str:
    """The two report lines on CPU and memory of a case result with the common fields."""
    return (
        f"    server CPU {r.server_cpu_pct:.0f}% of a core "
        f"({fmt_rate(r.events_per_server_cpu_second)} events per CPU-second), generator CPU "
        f"{r.generator_cpu_pct:.0f}%, other processes {r.other_cpu_pct:.0f}%, "
        f"server peak RSS {r.server_peak_rss_mb:.0f} MB, commits {r.commits}\n"
        f"    server CPU by thread over {r.seconds:.1f}s: {fmt_threads(r.server_threads)}\n"
    )


#: A column of a results table: its heading, its alignment (``---:`` right) and a result's cell.
Column = tuple[str, str, Callable[[Any], str]]

#: The columns every results table ends with (a result has the fields of :meth:`Window.metrics`).
RESULT_COLUMNS: tuple[Column, ...] = (
    ("p50 ms", "---:", lambda r: f"{r.p50_ms:.0f}"),
    ("p99 ms", "---:", lambda r: f"{r.p99_ms:.0f}"),
    ("server CPU", "---:", lambda r: f"{r.server_cpu_pct:.0f}%"),
    ("events/server CPU-s", "---:", lambda r: fmt_rate(r.events_per_server_cpu_second)),
    ("other CPU", "---:", lambda r: f"{r.other_cpu_pct:.0f}%"),
    ("peak RSS MB", "---:", lambda r: f"{r.server_peak_rss_mb:.0f}"),
    ("check", "---", lambda r: "OK" if r.ok else "MISMATCH"),
)


def results_table(results: Sequence[Any], columns: Sequence[Column]) -> str:
    """A markdown table of ``results``: a row each, ``columns`` then :data:`RESULT_COLUMNS`."""
    every = [*columns, *RESULT_COLUMNS]
    lines = [
        "| " + " | ".join(heading for heading, _, _ in every) + " |",
        "|" + "|".join(align for _, align, _ in every) + "|",
    ]
    lines += ["| " + " | ".join(cell(r) for _, _, cell in every) + " |" for r in results]
    return "\n".join(lines)


def parse_cases(text: str, in_flight: int, connections: int) -> list[tuple[int, int, int]]:
    """``SIZE[:IN_FLIGHT[:CONNECTIONS]]`` items -> (size, in flight, connections)."""
    cases = []
    for item in text.split(","):
        parts = [int(p) for p in item.strip().split(":")]
        size, flight, conns = (parts + [in_flight, connections][len(parts) - 1 :])[:3]
        cases.append((size, flight, conns))
    return cases
