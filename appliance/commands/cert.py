"""``appliance cert ...``: the CA, server and client certificates, revocation, reload."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import os
import signal
import sys
from pathlib import Path

from appliance.config import Config
from appliance.console import print_json, print_table
from pki.authority import (
    CLIENT_VALIDITY_DAYS,
    REVOCATION_REASONS,
    SERVER_VALIDITY_DAYS,
    CertificateAuthority,
    PkiPaths,
)
from pki.bundle import pem_bundle, pkcs12_bundle
from pki.errors import PkiError
from pki.files import write_private, write_public
from pki.inventory import IssuedCert, status

__all__ = ["add_parser", "signal_reload"]


def _ca(config: Config) -> CertificateAuthority:
    return CertificateAuthority(PkiPaths(config.pki_dir))


def _existing_ca(config: Config) -> CertificateAuthority:
    ca = _ca(config)
    if not ca.exists:
        raise PkiError(f"no CA in {config.pki_dir}: run 'appliance cert init' first")
    return ca


def signal_reload(config: Config) -> str:
    """Ask the running service to reload its certificates (SIGHUP); says what happened."""
    path = config.state_dir / "appliance.pid"
    try:
        pid = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return "the service is not running; the change applies when it starts"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if b"appliance" not in cmdline:
        return (
            f"stale pid file {path} (process {pid} is not the appliance); change applies at start"
        )
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return "the service is not running; the change applies when it starts"
    return f"the running service (pid {pid}) reloads its certificates"


def _row(entry: IssuedCert) -> list[str]:
    return [
        entry.serial_hex,
        entry.kind,
        entry.subject,
        entry.not_after.strftime("%Y-%m-%d"),
        status(entry),
        entry.reason or "",
    ]


def _list(args: argparse.Namespace, config: Config) -> int:
    entries = _existing_ca(config).inventory.entries()
    if args.json:
        print_json([{**e.to_json(), "status": status(e)} for e in entries])
        return 0
    print_table(
        ["serial", "kind", "subject", "expires", "status", "reason"], [_row(e) for e in entries]
    )
    expiring = [e for e in entries if status(e) == "expiring"]
    for entry in expiring:
        days = (entry.not_after - dt.datetime.now(dt.UTC)).days
        print(
            f"warning: {entry.subject} ({entry.serial_hex}) expires in {days} days", file=sys.stderr
        )
    return 0


def _show(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    entry = ca.inventory.find(args.ref)
    if args.json:
        print_json({**entry.to_json(), "status": status(entry)})
        return 0
    pem = ca.paths.issued / f"{entry.serial_hex}.pem"
    print_table(
        ["field", "value"],
        [
            ["serial", entry.serial_hex],
            ["kind", entry.kind],
            ["subject", entry.subject],
            ["not before", entry.not_before.isoformat()],
            ["not after", entry.not_after.isoformat()],
            ["status", status(entry)],
            ["revoked at", entry.revoked_at.isoformat() if entry.revoked_at else ""],
            ["reason", entry.reason or ""],
            ["file", str(pem)],
        ],
    )
    return 0


def _init(args: argparse.Namespace, config: Config) -> int:
    ca = _ca(config)
    if not ca.exists:
        ca.create(args.name, key_type=args.key_type)
        print(f"created CA {ca.paths.ca_cert}")
    else:
        print(f"CA already present: {ca.paths.ca_cert}")
    if not ca.paths.server_cert.exists():
        issued = ca.rotate_server(
            args.server_name or config.tls.server_names, key_type=args.key_type
        )
        serial = f"{issued.certificate.serial_number:x}"
        print(f"issued server certificate {serial}: {ca.paths.server_cert}")
    return 0


def _issue_server(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    issued = ca.issue_server(args.names, days=args.days, key_type=args.key_type)
    out = Path(args.out)
    stem = args.names[0]
    chain = issued.cert_pem() + ca.paths.ca_cert.read_bytes()
    write_public(out / f"{stem}.crt", chain)
    write_private(out / f"{stem}.key", issued.key_pem())
    print(f"issued server certificate {issued.certificate.serial_number:x}")
    print(f"  chain: {out / f'{stem}.crt'}\n  key:   {out / f'{stem}.key'} (0600)")
    return 0


def _passphrase(args: argparse.Namespace) -> bytes:
    if args.passphrase_stdin:
        value = sys.stdin.readline().rstrip("\n")
    else:
        value = getpass.getpass("PKCS#12 passphrase: ")
        if value != getpass.getpass("again: "):
            raise PkiError("the passphrases differ")
    if len(value) < 8:
        raise PkiError("the PKCS#12 passphrase needs at least 8 characters")
    return value.encode()


def _issue_client(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    passphrase = _passphrase(args) if args.p12 else None
    issued = ca.issue_client(
        args.name, organization=args.org, days=args.days, key_type=args.key_type
    )
    out = Path(args.out)
    ca_cert = ca.certificate()
    files = {
        f"{args.name}.crt": (issued.cert_pem() + ca.paths.ca_cert.read_bytes(), False),
        f"{args.name}.key": (issued.key_pem(), True),
        f"{args.name}.pem": (pem_bundle(issued, ca_cert), True),
    }
    if passphrase is not None:
        files[f"{args.name}.p12"] = (pkcs12_bundle(issued, ca_cert, args.name, passphrase), True)
    for name, (data, private) in files.items():
        (write_private if private else write_public)(out / name, data)
    print(f"issued client certificate {issued.certificate.serial_number:x} for {args.name}")
    for name, (_, private) in files.items():
        print(f"  {out / name}{' (0600)' if private else ''}")
    print(f"  CA to verify the server: {ca.paths.ca_cert}")
    return 0


def _revoke(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    entry = ca.revoke(ca.inventory.find(args.ref).serial, args.reason)
    print(f"revoked {entry.serial_hex} ({entry.subject}), reason {entry.reason}")
    print(signal_reload(config))
    return 0


def _crl(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    crl = ca.write_crl()
    count = len(list(crl))
    print(f"CRL with {count} revoked certificate(s): {ca.paths.crl}")
    if args.out:
        write_public(Path(args.out), ca.paths.crl.read_bytes())
        print(f"copied to {args.out}")
    print(signal_reload(config))
    return 0


def _import(args: argparse.Namespace, config: Config) -> int:
    ca = _ca(config)
    if bool(args.ca_cert) != bool(args.ca_key) or bool(args.server_cert) != bool(args.server_key):
        raise PkiError("give a certificate together with its key")
    if not (args.ca_cert or args.server_cert):
        raise PkiError("nothing to import: use --ca-cert/--ca-key or --server-cert/--server-key")
    if args.ca_cert:
        ca.import_ca(Path(args.ca_cert).read_bytes(), Path(args.ca_key).read_bytes())
        print(f"imported CA into {ca.paths.ca_cert}")
    if args.server_cert:
        ca.import_server(Path(args.server_cert).read_bytes(), Path(args.server_key).read_bytes())
        print(f"imported server certificate into {ca.paths.server_cert}")
    print(signal_reload(config))
    return 0


def _rotate_server(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    names = args.server_name or config.tls.server_names
    issued = ca.rotate_server(names, key_type=args.key_type)
    print(f"new server certificate {issued.certificate.serial_number:x}: {ca.paths.server_cert}")
    print(signal_reload(config))
    return 0


def _reload(args: argparse.Namespace, config: Config) -> int:
    print(signal_reload(config))
    return 0


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``cert`` and its subcommands to the CLI."""
    cert = commands.add_parser("cert", help="the CA, server and client certificates")
    sub = cert.add_subparsers(dest="cert_command", required=True, metavar="COMMAND")

    def add(name: str, func: object, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text, parents=[common])
        parser.set_defaults(func=func)
        return parser

    def key_type(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--key-type",
            choices=["ec", "rsa"],
            default="ec",
            help="ECDSA P-256 (default) or RSA 3072",
        )

    init = add("init", _init, "create the CA and a server certificate if missing")
    init.add_argument("--name", help="the CA's common name")
    init.add_argument("--server-name", action="append", help="extra server name (repeatable)")
    key_type(init)

    server = add("issue-server", _issue_server, "issue a server certificate into a directory")
    server.add_argument("names", nargs="+", metavar="NAME", help="DNS names or IPs; first is CN")
    server.add_argument("--days", type=int, default=SERVER_VALIDITY_DAYS)
    server.add_argument("--out", default=".", help="output directory (default: .)")
    key_type(server)

    client = add("issue-client", _issue_client, "issue a client certificate (PEM, PKCS#12)")
    client.add_argument("name", metavar="NAME", help="common name; becomes the events' source")
    client.add_argument("--org", help="organization name")
    client.add_argument("--days", type=int, default=CLIENT_VALIDITY_DAYS)
    client.add_argument("--out", default=".", help="output directory (default: .)")
    client.add_argument(
        "--p12", action="store_true", help="also write NAME.p12 (asks a passphrase)"
    )
    client.add_argument(
        "--passphrase-stdin",
        action="store_true",
        help="read the PKCS#12 passphrase from stdin, not a prompt",
    )
    key_type(client)

    listing = add("list", _list, "list issued certificates")
    listing.add_argument("--json", action="store_true")
    show = add("show", _show, "show one certificate")
    show.add_argument("ref", metavar="SERIAL|NAME")
    show.add_argument("--json", action="store_true")

    revoke = add("revoke", _revoke, "revoke a certificate and re-sign the CRL")
    revoke.add_argument("ref", metavar="SERIAL|NAME")
    revoke.add_argument("--reason", choices=sorted(REVOCATION_REASONS), default="unspecified")

    crl = add("crl", _crl, "re-sign the CRL")
    crl.add_argument("--out", help="also copy the CRL here")

    imp = add("import", _import, "use your own CA or server certificate")
    imp.add_argument("--ca-cert")
    imp.add_argument("--ca-key")
    imp.add_argument("--server-cert", help="chain, leaf first")
    imp.add_argument("--server-key")

    rotate = add("rotate-server", _rotate_server, "issue a new active server certificate")
    rotate.add_argument("--server-name", action="append", help="extra server name (repeatable)")
    key_type(rotate)

    add("reload", _reload, "make the running service reload certificates and CRL")
