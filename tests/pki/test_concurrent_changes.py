"""Concurrent PKI changes all land: two ``cert issue-client`` and a ``cert revoke`` at once.

Without the PKI lock, each of the three read ``index.json``, changed it and
wrote it back, and the CRL was signed from whatever index was read: a
revocation reported as done was missing from the CRL and the index, and
issued certificates vanished from the index. Here three ``python -m
appliance cert ...`` processes start together, :data:`TRIALS` times.
``cli_launcher.py`` forks them from one process that has imported the CLI
already, and releases them at one start line: the three commands run at the
same moment, and a trial takes as long as the commands, not three
interpreter starts. The index starts with :data:`EARLIER_CERTIFICATES`
entries, as on an appliance that has issued certificates for a while: each
command then spends a few milliseconds between reading the index and
writing it, as it would in production, rather than a few microseconds that
two commands rarely share. After every trial, every revoked serial is on the
CRL (read back, its signature checked) and revoked in the index, and every
issued certificate is in the index. No check depends on how fast the
machine is.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Final

from cryptography import x509

from pki.authority import CertificateAuthority, PkiPaths
from pki.inventory import IssuedCert
from tests.support.cli import run_cli

#: How many times the three commands start together.
TRIALS: Final = 20
#: Certificates in the index before the trials (synthetic records: only the index reads them).
EARLIER_CERTIFICATES: Final = 1000
#: Seconds a round may take (a safety net against a hang, not a speed check).
ROUND_TIMEOUT_SECONDS: Final = 300

LAUNCHER: Final = Path(__file__).with_name("cli_launcher.py")
ISSUED: Final = re.compile(r"^issued client certificate ([0-9a-f]+) for ", re.MULTILINE)
REVOKED: Final = re.compile(r"^revoked ([0-9a-f]+) ", re.MULTILINE)


class Launcher:
    """``cli_launcher.py``: one round of commands at a time, started together."""

    def __init__(self, directory: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(LAUNCHER), str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n"

    def round(self, *commands: list[str]) -> list[str]:
        """Run ``commands`` together; each one's stdout (each must exit 0)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(list(commands)) + "\n")
        self.process.stdin.flush()
        results = json.loads(self.process.stdout.readline())
        for command, result in zip(commands, results, strict=True):
            assert result["code"] == 0, (command, result)
        return [str(result["stdout"]) for result in results]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=ROUND_TIMEOUT_SECONDS)


def index(pki: Path) -> dict[int, dict[str, object]]:
    data = json.loads((pki / "index.json").read_text())
    return {int(item["serial"], 16): item for item in data["certificates"]}


def crl_serials(ca: CertificateAuthority) -> set[int]:
    crl = ca.published_crl()  # read back, the CA's signature checked
    return {entry.serial_number for entry in crl}


def test_two_issuers_and_a_revoker_at_once_lose_nothing(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    init = run_cli("cert", "init", config=config, timeout=ROUND_TIMEOUT_SECONDS)
    assert init.returncode == 0, init.stderr
    pki = tmp_path / "state" / "pki"
    ca = CertificateAuthority(PkiPaths(pki))
    now = dt.datetime.now(dt.UTC)
    earlier = [
        IssuedCert(secrets.randbits(150), "client", f"CN=earlier-{i}", now, now).to_json()
        for i in range(EARLIER_CERTIFICATES)
    ]
    (pki / "index.json").write_text(json.dumps({"certificates": earlier}))
    victims = [ca.issue_client(f"victim-{trial}").certificate for trial in range(TRIALS)]
    out = tmp_path / "out"
    common = ["--config", str(config)]
    issued: set[int] = set()
    revoked: set[int] = set()
    launcher = Launcher(tmp_path / "rounds")
    try:
        for trial in range(TRIALS):
            outputs = launcher.round(
                ["cert", "issue-client", f"trial-{trial}-a", "--out", str(out), *common],
                ["cert", "issue-client", f"trial-{trial}-b", "--out", str(out), *common],
                ["cert", "revoke", f"victim-{trial}", "--reason", "keyCompromise", *common],
            )
            trial_issued = {int(m, 16) for text in outputs[:2] for m in ISSUED.findall(text)}
            trial_revoked = {int(m, 16) for m in REVOKED.findall(outputs[2])}
            assert len(trial_issued) == 2, outputs
            assert trial_revoked == {victims[trial].serial_number}, outputs[2]
            issued |= trial_issued
            revoked |= trial_revoked

            entries = index(pki)
            missing_from_crl = {f"{serial:x}" for serial in revoked - crl_serials(ca)}
            assert not missing_from_crl, f"trial {trial}: revoked, not on the CRL"
            not_revoked = {
                f"{s:x}" for s in revoked if not (entries.get(s) or {}).get("revoked_at")
            }
            assert not not_revoked, f"trial {trial}: revoked, not so in the index"
            missing_from_index = {f"{s:x}" for s in issued - entries.keys()}
            assert not missing_from_index, f"trial {trial}: issued, not in the index"
            victims_left = {f"{v.serial_number:x}" for v in victims} - {f"{s:x}" for s in entries}
            assert not victims_left, f"trial {trial}: certificates vanished from the index"
    finally:
        launcher.close()
    # Nothing but these changes: the CRL lists exactly what was revoked.
    assert crl_serials(ca) == revoked
    assert sorted(p.name for p in pki.iterdir() if p.name.endswith(".tmp")) == []
    for serial in issued:
        x509.load_pem_x509_certificate((pki / "issued" / f"{serial:x}.pem").read_bytes())
