"""``appliance serve`` start-up failures: one clear line and exit code 1."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_port_in_use_exits_1_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "c.toml"
        config.write_text(
            f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n'
            f'[[listeners]]\nbind = "127.0.0.1:{port}"\n'
        )
        result = serve(config)
    assert result.returncode == 1
    # The message names the listener and the address.
    assert (
        f"appliance: listener 'forward' cannot bind 127.0.0.1:{port}: Address already in use"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_configured_auth_database_behind_the_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "auth.db"
    config = tmp_path / "c.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n[auth]\ndatabase_url = "sqlite:///{db}"\n'
        f'[[listeners]]\nbind = "127.0.0.1:{free_port()}"\nsecurity = "users"\n'
    )
    result = serve(config)
    assert result.returncode == 1
    assert "appliance db upgrade" in result.stderr
    assert "Traceback" not in result.stderr
