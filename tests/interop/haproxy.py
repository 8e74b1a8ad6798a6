"""A real HAProxy (Debian's package) in TCP mode before loopback backends, for PROXY protocol tests.

``scripts/haproxy-deps.sh`` installs ``haproxy`` when it is missing (as
root, like the PostgreSQL and Go test dependencies); :func:`ensure_haproxy`
runs it once per session and skips only when the Debian archive cannot be
reached. :func:`start_haproxy` writes an ``haproxy.cfg`` with one frontend on
a free loopback port and one backend that balances (round robin by default)
over a :class:`Balancer`'s backend ports, each ``server`` line carrying the
PROXY protocol option chosen (:data:`SEND_PROXY`); then it starts
``haproxy -db -f haproxy.cfg`` (foreground, no daemon) as a subprocess,
logging to ``haproxy.log`` beside the config, and waits until the frontend
port is in the kernel's LISTEN table (read from ``/proc/net/tcp``, so the
wait itself never opens a connection a backend would see). The
:class:`HAProxy` it returns stops haproxy at the end of a ``with`` block::

    with start_haproxy(tmp_path / "haproxy", Balancer([port_a, port_b])) as proxy:
        ...  # clients connect to proxy.host:proxy.port

TCP mode relays bytes untouched: TLS passes through to the backend, which
sees the PROXY header first and the client's ClientHello right after it.
Without ``check`` HAProxy makes no health checks, so every connection a
backend receives is a relayed client; with ``check`` it probes each server
every :data:`CHECK_INTERVAL_MS` ms with a connection that carries a v2
``LOCAL`` header (or a v1 line of HAProxy's own addresses) and nothing else.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import pytest

from tests.support.ports import free_port
from tests.support.service import stop_process

REPO: Final = Path(__file__).resolve().parents[2]
DEPS_SCRIPT: Final = REPO / "scripts" / "haproxy-deps.sh"
#: Seconds HAProxy has to start listening.
START_TIMEOUT_SECONDS: Final = 15.0
#: Seconds a stopping HAProxy has before it is killed.
STOP_TIMEOUT_SECONDS: Final = 10.0
#: Milliseconds between health checks with ``check``.
CHECK_INTERVAL_MS: Final = 500

SendProxy = Literal["v1", "v2", "v2-crc32c", "none"]
#: The ``server`` line option for each choice (HAProxy's configuration manual,
#: "send-proxy", "send-proxy-v2", "proxy-v2-options").
SEND_PROXY: Final[dict[SendProxy, str]] = {
    "v1": "send-proxy",
    "v2": "send-proxy-v2",
    "v2-crc32c": "send-proxy-v2 proxy-v2-options crc32c",
    "none": "",
}
#: The kernel's TCP state code for LISTEN in /proc/net/tcp.
_TCP_LISTEN: Final = "0A"


@functools.cache
def _install() -> tuple[int, str, str]:
    deps = subprocess.run(["bash", str(DEPS_SCRIPT)], capture_output=True, text=True, timeout=900)
    return deps.returncode, deps.stdout.strip(), deps.stderr.strip()


def ensure_haproxy() -> str:
    """Install HAProxy if missing (once per session); its version line.

    Skips the calling test only when the Debian archive is unreachable (exit
    2); any other failure fails it.
    """
    code, out, err = _install()
    if code == 2:
        reason = f"HAProxy unavailable: {err[-500:]}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    if code != 0:
        pytest.fail(f"{DEPS_SCRIPT.name} failed ({code}):\n{err}")
    return out


def haproxy_binary() -> str:
    """The haproxy executable (Debian installs it in /usr/sbin)."""
    found = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(found).exists():
        raise FileNotFoundError("haproxy is not installed: call ensure_haproxy() first")
    return found


@dataclass(frozen=True)
class Balancer:
    """What HAProxy balances: the backend ports, and how it talks to them."""

    backend_ports: Sequence[int]
    #: The PROXY protocol version the ``server`` lines send (:data:`SEND_PROXY`).
    send_proxy: SendProxy = "v2"
    #: Health checks every :data:`CHECK_INTERVAL_MS` ms.
    check: bool = False
    balance: str = "roundrobin"
    host: str = "127.0.0.1"
    #: A failed connect to a server is retried on another one (``option redispatch``):
    #: a dead backend costs its clients a reconnect, not an error.
    redispatch: bool = False

    def config(self, frontend_port: int) -> str:
        """The text of an haproxy.cfg: TCP mode, one frontend, one backend of every port."""
        option = SEND_PROXY[self.send_proxy]
        checks = f" check inter {CHECK_INTERVAL_MS}" if self.check else ""
        redispatch = "    retries 3\n    option redispatch\n" if self.redispatch else ""
        servers = "\n".join(
            f"    server s{i} {self.host}:{port} {option}{checks}".rstrip()
            for i, port in enumerate(self.backend_ports)
        )
        return f"""\
global
    log stderr format raw local0 info
    maxconn 512
    nbthread 1

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 5s
    timeout client 10m
    timeout server 10m

frontend fe
    bind {self.host}:{frontend_port}
    default_backend be

backend be
    balance {self.balance}
{redispatch}{servers}
"""


def _listening(port: int) -> bool:
    """Whether a socket listens on ``port`` (any address), from /proc/net/tcp{,6}."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == _TCP_LISTEN:
                return True
    return False


@dataclass
class HAProxy:
    """A running haproxy: the port clients connect to, and its files."""

    process: subprocess.Popen[bytes]
    #: The frontend's port on ``host``.
    port: int
    host: str
    config_path: Path
    log_path: Path

    def log(self) -> str:
        """What haproxy wrote (one tcplog line per finished connection, alerts)."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """Stop haproxy (SIGTERM: close everything now); its exit status."""
        return stop_process(self.process, STOP_TIMEOUT_SECONDS)

    def __enter__(self) -> HAProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_haproxy(directory: Path, balancer: Balancer) -> HAProxy:
    """Write ``directory/haproxy.cfg``, start haproxy in the foreground, wait until it listens.

    The result is a context manager that stops haproxy on the way out.

    Raises:
        RuntimeError: the configuration is refused, haproxy exits, or it does
            not listen within :data:`START_TIMEOUT_SECONDS` (its log attached).
    """
    binary = haproxy_binary()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "haproxy.cfg"
    config.write_text(balancer.config(port))
    checked = subprocess.run(
        [binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True
    )
    if checked.returncode != 0:
        raise RuntimeError(f"haproxy refused {config}:\n{checked.stdout}{checked.stderr}")
    log_path = directory / "haproxy.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [binary, "-db", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    proxy = HAProxy(process, port, balancer.host, config, log_path)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _listening(port):
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited with {process.returncode}:\n{proxy.log()}")
        if time.monotonic() > deadline:
            proxy.stop()
            raise RuntimeError(
                f"haproxy not listening within {START_TIMEOUT_SECONDS}s:\n{proxy.log()}"
            )
        time.sleep(0.05)
    return proxy
