"""How the running service confirms a reload to the CLI: a status file in the state directory.

``appliance cert revoke|rotate-server|reload`` send SIGHUP to the process that
holds the state directory's lock; the service answers by rewriting
``<state_dir>/reload-status.json`` (atomically, 0600) with a generation
number that grows with every reload, whether it succeeded, what needs a
restart, and the number of the appliance CRL its TLS contexts check. The CLI
waits for a generation newer than the one it saw before the signal, so it
can say truthfully whether the running service reloaded, and, after ``cert
revoke``, whether it checks a CRL that lists the revocation.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["RELOAD_STATUS_FILE", "ReloadStatus", "read_status", "write_status"]

#: The file's name inside the state directory.
RELOAD_STATUS_FILE: Final = "reload-status.json"


@dataclass(frozen=True, slots=True)
class ReloadStatus:
    """The outcome of the running service's latest reload."""

    pid: int
    #: Grows by one with every reload (0: written at start, no reload yet).
    generation: int
    ok: bool
    #: What was reloaded, e.g. ["tls", "config"].
    applied: list[str] = field(default_factory=list)
    #: Config keys whose new values need a restart.
    restart_required: list[str] = field(default_factory=list)
    #: Why the reload failed, when it did.
    error: str | None = None
    #: The CRL number of the appliance CRL the TLS contexts check (for a
    #: supervisor: the lowest of its workers'); None when they check none of the
    #: appliance's CRLs (``[tls] client_ca_file`` set, or no CA yet).
    crl_number: int | None = None


def write_status(state_dir: Path, status: ReloadStatus) -> None:
    """Replace the status file atomically (write, fsync, rename)."""
    path = state_dir / RELOAD_STATUS_FILE
    tmp = path.with_name(f".{RELOAD_STATUS_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(asdict(status)).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_status(state_dir: Path) -> ReloadStatus | None:
    """The latest status, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((state_dir / RELOAD_STATUS_FILE).read_text(encoding="utf-8"))
        return ReloadStatus(
            pid=int(data["pid"]),
            generation=int(data["generation"]),
            ok=bool(data["ok"]),
            applied=[str(x) for x in data.get("applied", [])],
            restart_required=[str(x) for x in data.get("restart_required", [])],
            error=data.get("error"),
            crl_number=_optional_int(data.get("crl_number")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
