"""A stand-in for ``appliance serve`` as the reload protocol sees it (run as a script).

``python fake_service.py STATE_DIR MODE`` holds ``STATE_DIR``'s lock like the
service, writes the start status (generation 0), prints ``ready``, and
answers each SIGHUP as MODE says, until stdin closes:

* ``ok``: a successful reload (generation + 1);
* ``restart``: a successful reload with a key that needs a restart;
* ``fail``: a failed reload with an error;
* ``silent``: no answer at all (a hung or old service);
* ``nostatus``: no start status either (a service still starting);
* ``oldcrl``: a successful reload that keeps the CRL it read at start.

Like the service, each status names the CRL number it "loaded": the one in
``STATE_DIR/pki/crl.pem`` when it answers (at start, for ``oldcrl``).

Every SIGHUP received is appended to ``STATE_DIR/hups`` for the test to count.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from cryptography import x509

from appliance.reload_status import ReloadStatus, write_status
from appliance.state_lock import StateLock
from pki.authority import crl_number


def loaded_crl(state: Path) -> int | None:
    try:
        return crl_number(x509.load_pem_x509_crl((state / "pki" / "crl.pem").read_bytes()))
    except (OSError, ValueError):
        return None


def main() -> None:
    state = Path(sys.argv[1])
    mode = sys.argv[2]
    lock = StateLock(state)
    generation = 0
    at_start = loaded_crl(state)

    def on_hup(signum: int, frame: FrameType | None) -> None:
        nonlocal generation
        with (state / "hups").open("a") as hups:
            hups.write("HUP\n")
        if mode in ("silent", "nostatus"):
            return
        generation += 1
        if mode == "fail":
            status = ReloadStatus(
                os.getpid(), generation, False, error="cannot build the TLS context: bad key"
            )
        elif mode == "restart":
            status = ReloadStatus(
                os.getpid(), generation, True, ["tls"], restart_required=["listeners[0].bind"],
                crl_number=loaded_crl(state),
            )  # fmt: skip
        else:
            crl = at_start if mode == "oldcrl" else loaded_crl(state)
            status = ReloadStatus(os.getpid(), generation, True, ["tls", "config"], crl_number=crl)
        write_status(state, status)

    signal.signal(signal.SIGHUP, on_hup)
    if mode != "nostatus":
        write_status(state, ReloadStatus(os.getpid(), 0, True, crl_number=at_start))
    print("ready", flush=True)
    sys.stdin.read()
    lock.release()


if __name__ == "__main__":
    main()
