"""``appliance serve`` start-up failures: one clear line and exit code 1."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.support.cli import run_cli
from tests.support.service import ANY_ADMIN_PORT


def serve(config: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("serve", config=config)


def test_port_in_use_exits_1_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "c.toml"
        config.write_text(
            f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n{ANY_ADMIN_PORT}'
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
        f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n{ANY_ADMIN_PORT}[auth]\n'
        f'database_url = "sqlite:///{db}"\n'
        f'[[listeners]]\nbind = "127.0.0.1:0"\nsecurity = "users"\n'
    )
    result = serve(config)
    assert result.returncode == 1
    assert "appliance db upgrade" in result.stderr
    assert "Traceback" not in result.stderr
