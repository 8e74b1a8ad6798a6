"""``appliance cert ...`` run as the real command against a state directory."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from pki.authority import CertificateAuthority, PkiPaths
from tests.support.cli import run_cli


@pytest.fixture
def cli(tmp_path: Path):
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n')

    def run(
        *args: str, stdin: str | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run_cli("cert", *args, config=config, stdin=stdin, check=ok)

    return run


def test_init_issue_list_revoke_crl(cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    print(cli("init").stdout)
    pki = tmp_path / "state" / "pki"
    assert (pki / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (pki / "server.key").stat().st_mode & 0o777 == 0o600

    issued = cli("issue-client", "web-01", "--org", "Acme", "--out", str(out), "--p12",
                 "--passphrase-stdin", stdin="correct horse\n")  # fmt: skip
    assert "issued client certificate" in issued.stdout
    for name, mode in [("web-01.key", 0o600), ("web-01.pem", 0o600), ("web-01.p12", 0o600)]:
        assert (out / name).stat().st_mode & 0o777 == mode
    key, cert, extra = pkcs12.load_key_and_certificates(
        (out / "web-01.p12").read_bytes(), b"correct horse"
    )
    assert key is not None
    assert cert is not None
    assert cert.subject.rfc4514_string() == "O=Acme,CN=web-01"
    assert len(extra) == 1  # the CA
    bundle = (out / "web-01.pem").read_text()
    assert bundle.index("PRIVATE KEY") < bundle.index("CERTIFICATE")
    assert "correct horse" not in issued.stdout + issued.stderr

    listed = json.loads(cli("list", "--json").stdout)
    assert {e["subject"]: e["status"] for e in listed}["O=Acme,CN=web-01"] == "valid"
    table = cli("list").stdout
    assert "O=Acme,CN=web-01" in table
    assert "serial" in table.splitlines()[0]

    revoked = cli("revoke", "web-01", "--reason", "keyCompromise")
    assert "revoked" in revoked.stdout
    assert "not running" in revoked.stdout
    shown = json.loads(cli("show", "web-01", "--json").stdout)
    assert shown["status"] == "revoked"
    assert shown["reason"] == "keyCompromise"
    crl = x509.load_pem_x509_crl((pki / "crl.pem").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None
    assert crl.is_signature_valid(
        x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes()).public_key()  # type: ignore[arg-type]
    )
    again = cli("revoke", "web-01", ok=False)
    assert again.returncode == 1
    assert "already revoked" in again.stderr


def test_short_passphrase_is_refused_and_nothing_is_written(cli, tmp_path: Path) -> None:
    cli("init")
    out = tmp_path / "out"
    result = cli("issue-client", "x", "--out", str(out), "--p12", "--passphrase-stdin",
                 stdin="short\n", ok=False)  # fmt: skip
    assert result.returncode == 1
    assert "at least 8" in result.stderr
    assert not out.exists()


def test_issue_server_and_rotate(cli, tmp_path: Path) -> None:
    cli("init", "--server-name", "ingest.example.net")
    paths = PkiPaths(tmp_path / "state" / "pki")
    first = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    names = first.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "ingest.example.net" in names.get_values_for_type(x509.DNSName)
    cli("rotate-server")
    second = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    assert second.serial_number != first.serial_number
    cli("issue-server", "node-2.example.net", "10.0.0.2", "--out", str(tmp_path / "n2"))
    cert = x509.load_pem_x509_certificate((tmp_path / "n2" / "node-2.example.net.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.2"]


def test_import_own_ca_refuses_mismatched_key(cli, tmp_path: Path) -> None:
    mine = CertificateAuthority(PkiPaths(tmp_path / "mine"))
    mine.create("Operator CA", key_type="rsa")
    other = CertificateAuthority(PkiPaths(tmp_path / "other"))
    other.create("Other")
    bad = cli("import", "--ca-cert", str(mine.paths.ca_cert), "--ca-key", str(other.paths.ca_key),
              ok=False)  # fmt: skip
    assert bad.returncode == 1
    assert "does not belong" in bad.stderr
    cli("import", "--ca-cert", str(mine.paths.ca_cert), "--ca-key", str(mine.paths.ca_key))
    imported = x509.load_pem_x509_certificate((tmp_path / "state" / "pki" / "ca.pem").read_bytes())
    assert imported.subject.rfc4514_string() == "CN=Operator CA"


def test_commands_without_a_ca_say_what_to_run(cli) -> None:
    result = cli("list", ok=False)
    assert result.returncode == 1
    assert "appliance cert init" in result.stderr


def test_revoke_and_rotate_reach_the_running_service_by_sighup(appliance, tmp_path: Path) -> None:
    import socket
    import ssl

    import msgpack

    app = appliance({"mtls": 'client_auth = "required"'})
    config = tmp_path / "appliance0.toml"

    def cert(*args: str) -> str:
        return run_cli("cert", *args, config=config, check=True).stdout

    cert("issue-client", "agent-7", "--out", str(tmp_path / "agent"))

    def exchange(chunk: str) -> tuple[object | None, int]:
        context = ssl.create_default_context(cafile=str(app.ca_file))
        context.load_cert_chain(
            tmp_path / "agent" / "agent-7.crt", tmp_path / "agent" / "agent-7.key"
        )
        raw = socket.create_connection(("127.0.0.1", app.ports["mtls"]), timeout=10)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            serial = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number
            try:
                tls.sendall(msgpack.packb(["t", msgpack.packb([1, {"a": 1}]), {"chunk": chunk}]))
                data = tls.recv(1024)
            except (ssl.SSLError, OSError):
                return None, serial
            return (msgpack.unpackb(data) if data else None), serial

    def reloads() -> int:
        return app.log().count("event=tls.reloaded trigger=SIGHUP")

    def wait_for_reload(count: int) -> None:
        import time

        deadline = time.monotonic() + 30
        while reloads() < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reloads() == count

    ack, first_serial = exchange("before")
    assert ack == {"ack": "before"}
    pid = app.process.pid
    # Exit 0 only once the service has confirmed its reload.
    assert f"the running service (pid {pid}) reloaded" in cert("rotate-server")
    wait_for_reload(1)
    ack, second_serial = exchange("after-rotate")
    assert ack == {"ack": "after-rotate"}
    assert second_serial != first_serial

    # A second `serve` on the same state directory (another port: the
    # listeners bind port 0) fails to start, and must leave the first one
    # reachable by the CLI.
    second = tmp_path / "second.toml"
    second.write_text(config.read_text(), encoding="utf-8")
    failed = run_cli("serve", config=second)
    assert failed.returncode != 0
    assert str(pid) in failed.stderr

    assert f"the running service (pid {pid}) reloaded" in cert("revoke", "agent-7")
    assert exchange("after-revoke")[0] is None  # confirmed means applied: no waiting
    wait_for_reload(2)


def _names(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {
        *san.get_values_for_type(x509.DNSName),
        *map(str, san.get_values_for_type(x509.IPAddress)),
    }


def test_rotate_server_adds_names_and_keeps_the_others(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n[tls]\nserver_names = ["from-config"]\n'
    )

    cert = functools.partial(run_cli, "cert", config=config, check=True)

    cert("init", "--server-name", "first.example")
    server = tmp_path / "state" / "pki" / "server.pem"
    assert {"from-config", "first.example", "localhost", "127.0.0.1"} <= _names(server)
    rotated = cert("rotate-server", "--server-name", "second.example")
    names = _names(server)
    assert {"from-config", "first.example", "second.example", "localhost"} <= names
    assert "second.example" in rotated.stdout  # "  names: ..."
    cert("rotate-server")
    assert _names(server) == names  # nothing is dropped by a rotation
    cert("rotate-server", "--reset-names")
    reset = _names(server)
    assert "from-config" in reset
    assert "first.example" not in reset
    assert "second.example" not in reset


def test_cert_changes_are_in_the_audit_log_and_list_marks_the_active_server_cert(
    cli, tmp_path: Path
) -> None:
    config = tmp_path / "appliance.toml"

    run = functools.partial(run_cli, config=config, check=True)

    # A fresh install: cert init creates the state, the CA and the auth database.
    assert not (tmp_path / "state").exists()
    cli("init")
    first = json.loads(cli("list", "--json").stdout)
    assert [(e["kind"], e["active"]) for e in first] == [("server", True)]
    cli("issue-client", "web-01", "--org", "Acme", "--out", str(tmp_path / "out"))
    client = json.loads(cli("show", "web-01", "--json").stdout)
    assert client["active"] is False
    cli("rotate-server")
    cli("revoke", "web-01", "--reason", "keyCompromise")

    listed = json.loads(cli("list", "--json").stdout)
    active = [e for e in listed if e["active"]]
    assert len(active) == 1
    assert active[0]["kind"] == "server"
    assert active[0]["serial"] != first[0]["serial"]
    table = cli("list")
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["serial", "kind", "subject", "expires", "status", "active", "reason"]
    active_rows = [row for row in rows if row.split()[0] == active[0]["serial"]]
    assert "yes" in active_rows[0].split()
    server_pem = tmp_path / "state" / "pki" / "server.pem"
    assert f"active server certificate: {server_pem}: serial {active[0]['serial']}" in table.stdout
    assert "auth database sqlite:///" in table.stderr  # which state it used

    audit = json.loads(run("audit", "list", "--json").stdout)
    entries = [(e["action"], e["target"], e["detail"]) for e in reversed(audit)]
    ca_subject = next(e for e in entries if e[0] == "cert.ca-create")[1]
    assert ca_subject.startswith("CN=Appliance CA")
    assert [e[0] for e in entries] == [
        "cert.ca-create",
        "cert.issue",
        "cert.issue",
        "cert.rotate-server",
        "cert.revoke",
    ]
    by_action = {action: (target, detail) for action, target, detail in entries[2:]}
    assert by_action["cert.issue"] == (
        "O=Acme,CN=web-01",
        f"serial={client['serial']} kind=client",
    )
    target, detail = by_action["cert.rotate-server"]
    assert target == "CN=localhost"
    assert detail.startswith(
        f"serial={active[0]['serial']} kind=server replaces={first[0]['serial']}"
    )
    assert by_action["cert.revoke"] == (
        "O=Acme,CN=web-01",
        f"serial={client['serial']} kind=client reason=keyCompromise",
    )
    assert all(e["actor"].startswith("cli:") for e in audit)
    table = run("audit", "list").stdout
    assert "cert.revoke" in table
    assert client["serial"] in table


def test_an_operators_server_certificate_is_the_active_one(cli, tmp_path: Path) -> None:
    cli("init")
    cli("issue-server", "ingest.example.net", "--out", str(tmp_path / "own"))
    config = tmp_path / "appliance.toml"
    own = tmp_path / "own"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\nworkers = 1\n[tls]\n'
        f'cert_file = "{own / "ingest.example.net.crt"}"\n'
        f'key_file = "{own / "ingest.example.net.key"}"\n'
    )
    listed = json.loads(cli("list", "--json").stdout)
    assert [e["subject"] for e in listed if e["active"]] == ["CN=ingest.example.net"]
    rotated = cli("rotate-server")
    assert "[tls] cert_file is set: the service presents" in rotated.stderr
