"""Go ``fluent-logger-golang`` (Debian's package) over TLS with ``RequestAck``, sync and async.

``scripts/go-interop-deps.sh`` installs ``golang-go`` and
``golang-github-fluent-fluent-logger-golang-dev`` when missing; the sender in
tests/interop/go/ is built once per session, offline, in GOPATH mode against
``/usr/share/gocode`` (Debian ships those sources without a ``go.mod``, so a
module ``replace`` cannot point at them). An install that fails fails these
tests; only an unreachable Debian archive skips them, with the reason.

The library's TLS (``FluentNetwork: "tls"``) builds a ``tls.Config`` holding
only ``InsecureSkipVerify``: it has no CA option. A verified connection
therefore trusts Go's system roots, which ``SSL_CERT_FILE`` points at the
appliance's CA; ``TlsInsecureSkipVerify`` is tested too, and so is the refusal
of an untrusted server certificate.

The sender exits 0 only when every ``Post`` returned nil (each one waited for
its ack in sync mode) and, in async mode, ``Close`` flushed the queue and the
result callback saw every event acked. The test then reads the Delta table:
every event exactly once, with its tag (``TagPrefix`` + "." + tag), its record
and its time: to the nanosecond with ``SubSecondPrecision`` (EventTime), else
the whole seconds the library sends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.service import ApplianceProcess, start_appliance

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
DEPS_SCRIPT = REPO / "scripts" / "go-interop-deps.sh"
SENDER_DIR = Path(__file__).parent / "go"
GOPATH = "/usr/share/gocode"
LIBRARY = Path(GOPATH) / "src/github.com/fluent/fluent-logger-golang/fluent"
COUNT = 25


def _go_env(cache: Path) -> dict[str, str]:
    """Offline GOPATH-mode build: Debian's sources, no module proxy, no fetching."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update(
        GO111MODULE="off",
        GOPATH=GOPATH,
        GOFLAGS="",
        GOPROXY="off",
        GOTOOLCHAIN="local",
        GOCACHE=str(cache),
        CGO_ENABLED="0",
    )
    return env


@pytest.fixture(scope="session")
def go_sender(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sender binary, built once per session (after installing what it needs)."""
    deps = subprocess.run(["bash", str(DEPS_SCRIPT)], capture_output=True, text=True, timeout=900)
    if deps.returncode == 2:
        reason = f"Go interop client unavailable: {deps.stderr.strip()[-500:]}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    if deps.returncode != 0:
        pytest.fail(f"{DEPS_SCRIPT.name} failed ({deps.returncode}):\n{deps.stderr}")
    go = shutil.which("go") or "/usr/lib/go/bin/go"
    out = tmp_path_factory.mktemp("go-sender")
    binary = out / "sender"
    build = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=SENDER_DIR, env=_go_env(out / "cache"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, f"go build failed:\n{build.stderr}"
    return binary


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApplianceProcess]:
    """One appliance with a TLS forward listener; each case uses its own tag prefix."""
    app = start_appliance(tmp_path_factory.mktemp("golang"), {"forward": ""})
    yield app
    app.stop()


def go_send(
    sender: Path, app: ApplianceProcess, prefix: str, *flags: str, roots: Path, count: int = COUNT
) -> subprocess.CompletedProcess[str]:
    """Run the sender with ``roots`` (a PEM file) as Go's only system roots."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env["SSL_CERT_FILE"] = str(roots)
    empty = roots.parent / "no-cert-dir"
    empty.mkdir(exist_ok=True)
    env["SSL_CERT_DIR"] = str(empty)
    return subprocess.run(
        [str(sender), "-port", str(app.ports["forward"]), "-tag-prefix", prefix,
         "-count", str(count), "-timeout", "60s", *flags],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def check_rows(
    app: ApplianceProcess, prefix: str, result: subprocess.CompletedProcess[str], subsecond: bool
) -> None:
    assert result.returncode == 0, result.stderr
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(sent) == COUNT
    rows = [r for r in app.rows() if str(r["tag"]).startswith(f"{prefix}.")]
    by_seq: dict[int, list[dict[str, object]]] = {}
    for row in rows:
        by_seq.setdefault(json.loads(str(row["record"]))["seq"], []).append(row)
    for event in sent:
        seq = event["record"]["seq"]
        matches = by_seq.get(seq, [])
        assert len(matches) == 1, f"seq {seq} arrived {len(matches)} times"
        (row,) = matches
        assert row["tag"] == f"{prefix}.{event['tag']}"
        assert json.loads(str(row["record"])) == event["record"]
        time_ns = event["time_ns"]
        expected = time_ns if subsecond else time_ns // 1_000_000_000 * 1_000_000_000
        assert row["event_time_ns"] == expected, (seq, row["event_time_ns"], time_ns)
        assert row["protocol"] == "forward"
        assert str(row["peer"]).startswith("127.0.0.1:")
    assert len(rows) == len(sent)


def test_library_is_the_debian_package_with_tls_and_ack(go_sender: Path) -> None:
    """Pins what the tests rely on in the packaged source, so an upgrade that changes it shows."""
    source = (LIBRARY / "fluent.go").read_text()
    version = (LIBRARY / "version.go").read_text()
    print(f"\nfluent-logger-golang {version.split('=')[-1].strip()} from {LIBRARY}")
    assert 'case "tls":' in source
    assert "TlsInsecureSkipVerify" in source
    assert "RequestAck" in source
    assert "SubSecondPrecision" in source


@pytest.mark.parametrize("subsecond", [True, False], ids=["eventtime", "seconds"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_go_logger_over_verified_tls_with_ack(
    go_sender: Path, shared_app: ApplianceProcess, mode: str, subsecond: bool
) -> None:
    prefix = f"go{mode}{'ns' if subsecond else 's'}"
    flags = ["-mode", mode] + (["-subsecond"] if subsecond else [])
    result = go_send(go_sender, shared_app, prefix, *flags, roots=shared_app.ca_file)
    check_rows(shared_app, prefix, result, subsecond)


@pytest.fixture
def other_ca(tmp_path: Path) -> Path:
    """A CA that did not sign the appliance's certificate."""
    import trustme

    path = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_go_logger_with_tls_insecure_skip_verify(
    go_sender: Path, shared_app: ApplianceProcess, other_ca: Path, mode: str
) -> None:
    prefix = f"goinsecure{mode}"
    result = go_send(
        go_sender, shared_app, prefix, "-mode", mode, "-subsecond", "-insecure", roots=other_ca
    )
    check_rows(shared_app, prefix, result, subsecond=True)


def test_go_logger_refuses_an_untrusted_certificate(
    go_sender: Path, shared_app: ApplianceProcess, other_ca: Path
) -> None:
    """Roots without the appliance's CA and no skip-verify: the client does not connect."""
    result = go_send(go_sender, shared_app, "gountrusted", "-mode", "sync", roots=other_ca, count=1)
    assert result.returncode == 2, result.stderr
    assert "x509: certificate signed by unknown authority" in result.stderr
    assert not [r for r in shared_app.rows() if str(r["tag"]).startswith("gountrusted.")]
