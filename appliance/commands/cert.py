"""``appliance cert ...``: the CA, server and client certificates, revocation, reload.

Every change (CA created or imported, certificate issued, revoked, server
certificate rotated or imported) is written to the audit log in the auth
database, with the certificate's subject and serial; the database is opened
(and, the embedded default in an existing state directory, created) before
anything changes, so a change is never made without its audit entry.

``revoke``, ``rotate-server``, ``crl``, ``import`` and ``reload`` then ask
the running service to reload (:mod:`appliance.commands.reload`) and exit 1
unless it confirms (after a CRL change: that every process of it checks the
new CRL); with no service running, the change is on disk and applies at the
next start (exit 0, except ``reload``, which had nothing to do).

``revoke`` says "revoked" only once it has read the new CRL back, checked
the CA's signature on it and found the serial on it. Certificate names are
checked before anything is written (:mod:`pki.names`), so ``issue-client
NAME --out DIR`` writes in ``DIR`` and nowhere else.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509

from appliance.commands.auth_common import admin, open_auth
from appliance.commands.common import Subparsers, fail, print_json, print_table
from appliance.commands.reload import RELOAD_CONFIRM_TIMEOUT_SECONDS, request_reload
from appliance.commands.state import require_state_dir
from appliance.config import Config
from pki.authority import (
    CLIENT_VALIDITY_DAYS,
    REVOCATION_REASONS,
    SERVER_VALIDITY_DAYS,
    CertificateAuthority,
    PkiPaths,
    crl_number,
)
from pki.bundle import pem_bundle, pkcs12_bundle
from pki.errors import PkiError
from pki.files import write_private, write_public
from pki.inventory import IssuedCert, status
from pki.names import check_client_name, check_server_names

if TYPE_CHECKING:
    from auth.audit import AuditLog

__all__ = ["active_server_certificate", "add_parser", "reload_service", "server_names"]


def _ca(config: Config) -> CertificateAuthority:
    return CertificateAuthority(PkiPaths(config.pki_dir))


def _existing_ca(config: Config) -> CertificateAuthority:
    require_state_dir(config)
    ca = _ca(config)
    if not ca.exists:
        raise PkiError(f"no CA in {config.pki_dir.absolute()}: run 'appliance cert init' first")
    return ca


# -- audit -------------------------------------------------------------------------------


@contextmanager
def _audit_log(config: Config) -> Iterator[AuditLog]:
    """The auth database's audit log, opened before a change (created if it must be)."""
    with open_auth(config, create=True) as db:
        yield db.audit


def _serial(cert: x509.Certificate) -> str:
    return f"{cert.serial_number:x}"


def _record(
    store: AuditLog, action: str, cert: x509.Certificate | IssuedCert, **detail: str
) -> None:
    """An audit entry ``action`` on ``cert``: its subject as the target, its serial in detail."""
    if isinstance(cert, IssuedCert):
        subject, serial = cert.subject, cert.serial_hex
    else:
        subject, serial = cert.subject.rfc4514_string(), _serial(cert)
    text = " ".join([f"serial={serial}", *(f"{k}={v}" for k, v in detail.items() if v)])
    store.record_audit(action, subject, actor=admin(), detail=text)


# -- the service ---------------------------------------------------------------------------


def reload_service(
    config: Config, timeout: float, *, required: bool = False, crl: int | None = None
) -> int:
    """Have the running service reload; prints what happened and returns the exit code.

    Args:
        required: there must be a running service (``cert reload``); otherwise
            "not running" is fine: the change applies at its next start.
        crl: the number of the CRL the command wrote, which the service must
            confirm it checks.
    """
    outcome = request_reload(config.state_dir, timeout=timeout, crl_number=crl)
    if outcome.confirmed:
        print(outcome.message)
        return 0
    if outcome.outcome == "not-running" and not required:
        print(outcome.message)
        return 0
    if outcome.outcome == "not-running":
        return fail(
            f"no service holds the state directory {config.state_dir.absolute()}: "
            "nothing to reload (is it running with another state_dir or config?)"
        )
    return fail(outcome.message)


def active_server_certificate(config: Config) -> Path:
    """The server certificate file the service presents (``[tls] cert_file`` or the generated)."""
    return config.tls.cert_file or PkiPaths(config.pki_dir).server_cert


def _active_serial(config: Config) -> int | None:
    try:
        return x509.load_pem_x509_certificate(
            active_server_certificate(config).read_bytes()
        ).serial_number
    except (OSError, ValueError):
        return None


def server_names(
    config: Config, ca: CertificateAuthority, extra: list[str], reset: bool
) -> list[str]:
    """The names of a new server certificate: the current one's, ``[tls] server_names``, ``extra``.

    Nothing is dropped unless ``reset``: then the current certificate's names are
    left out (the defaults of :meth:`CertificateAuthority.rotate_server` stay).
    """
    names: list[str] = []
    if not reset:
        try:
            current = x509.load_pem_x509_certificate(ca.paths.server_cert.read_bytes())
            san = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names += [str(n) for n in san.get_values_for_type(x509.DNSName)]
            names += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        except (OSError, ValueError, x509.ExtensionNotFound):
            pass
    names += config.tls.server_names
    names += extra
    return list(dict.fromkeys(names))


def _warn_if_not_presented(config: Config) -> None:
    if config.tls.cert_file is not None:
        print(
            f"appliance: note: [tls] cert_file is set: the service presents "
            f"{config.tls.cert_file}, not the generated server certificate",
            file=sys.stderr,
        )


# -- commands ------------------------------------------------------------------------------


def _row(entry: IssuedCert, active: int | None) -> list[str]:
    return [
        entry.serial_hex,
        entry.kind,
        entry.subject,
        entry.not_after.strftime("%Y-%m-%d"),
        status(entry),
        "yes" if entry.serial == active else "",
        entry.reason or "",
    ]


def _list(args: argparse.Namespace, config: Config) -> int:
    entries = _existing_ca(config).inventory.entries()
    active = _active_serial(config)
    if args.json:
        print_json(
            [{**e.to_json(), "status": status(e), "active": e.serial == active} for e in entries]
        )
        return 0
    print_table(
        ["serial", "kind", "subject", "expires", "status", "active", "reason"],
        [_row(e, active) for e in entries],
    )
    path = active_server_certificate(config)
    if active is None:
        print(f"active server certificate: {path}: missing or unreadable")
    elif not any(e.serial == active for e in entries):
        print(f"active server certificate: {path}: serial {active:x}, not issued by this CA")
    else:
        print(f"active server certificate: {path}: serial {active:x}")
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
    active = entry.serial == _active_serial(config)
    if args.json:
        print_json({**entry.to_json(), "status": status(entry), "active": active})
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
            ["active", f"yes: {active_server_certificate(config)}" if active else "no"],
            ["revoked at", entry.revoked_at.isoformat() if entry.revoked_at else ""],
            ["reason", entry.reason or ""],
            ["file", str(pem)],
        ],
    )
    return 0


def _create_state_dir(config: Config) -> None:
    """``cert init`` and ``cert import`` set up a PKI: they may create the state directory."""
    if not config.state_dir.exists():
        config.state_dir.mkdir(parents=True, mode=0o750)


def _init(args: argparse.Namespace, config: Config) -> int:
    _create_state_dir(config)
    ca = _ca(config)
    with _audit_log(config) as audit:
        if not ca.exists:
            ca.create(args.name, key_type=args.key_type)
            _record(audit, "cert.ca-create", ca.certificate(), kind="ca")
            print(f"created CA {ca.paths.ca_cert}")
        else:
            print(f"CA already present: {ca.paths.ca_cert}")
        if not ca.paths.server_cert.exists():
            names = server_names(config, ca, args.server_name or [], reset=True)
            issued = ca.rotate_server(names, key_type=args.key_type)
            _record(audit, "cert.issue", issued.certificate, kind="server", active="yes")
            print(
                f"issued server certificate {_serial(issued.certificate)}: {ca.paths.server_cert}"
            )
    return 0


def _issue_server(args: argparse.Namespace, config: Config) -> int:
    check_server_names(args.names)  # the first names the files in --out
    ca = _existing_ca(config)
    with _audit_log(config) as audit:
        issued = ca.issue_server(args.names, days=args.days, key_type=args.key_type)
        out = Path(args.out)
        stem = args.names[0]
        chain = issued.cert_pem() + ca.paths.ca_cert.read_bytes()
        write_public(out / f"{stem}.crt", chain)
        write_private(out / f"{stem}.key", issued.key_pem())
        _record(audit, "cert.issue", issued.certificate, kind="server")
    print(f"issued server certificate {_serial(issued.certificate)}")
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
    check_client_name(args.name)  # it names the files in --out: never a path of its own
    ca = _existing_ca(config)
    passphrase = _passphrase(args) if args.p12 else None
    with _audit_log(config) as audit:
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
            files[f"{args.name}.p12"] = (
                pkcs12_bundle(issued, ca_cert, args.name, passphrase),
                True,
            )
        for name, (data, private) in files.items():
            (write_private if private else write_public)(out / name, data)
        _record(audit, "cert.issue", issued.certificate, kind="client")
    print(f"issued client certificate {_serial(issued.certificate)} for {args.name}")
    for name, (_, private) in files.items():
        print(f"  {out / name}{' (0600)' if private else ''}")
    print(f"  CA to verify the server: {ca.paths.ca_cert}")
    return 0


def _revoke(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    with _audit_log(config) as audit:
        entry = ca.revoke(ca.inventory.find(args.ref).serial, args.reason)
        _record(audit, "cert.revoke", entry, kind=entry.kind, reason=entry.reason or "")
    # Only what is read back counts: the CRL on disk, signed by the CA, listing the serial.
    number = ca.confirm_revoked(entry.serial)
    print(f"revoked {entry.serial_hex} ({entry.subject}), reason {entry.reason}")
    print(f"CRL number {number} lists it: {ca.paths.crl}")
    return reload_service(config, args.reload_timeout, crl=number)


def _crl(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    crl = ca.write_crl()
    count = len(list(crl))
    number = crl_number(crl)
    print(f"CRL number {number} with {count} revoked certificate(s): {ca.paths.crl}")
    if args.out:
        write_public(Path(args.out), ca.paths.crl.read_bytes())
        print(f"copied to {args.out}")
    return reload_service(config, args.reload_timeout, crl=number)


def _import(args: argparse.Namespace, config: Config) -> int:
    if bool(args.ca_cert) != bool(args.ca_key) or bool(args.server_cert) != bool(args.server_key):
        raise PkiError("give a certificate together with its key")
    if not (args.ca_cert or args.server_cert):
        raise PkiError("nothing to import: use --ca-cert/--ca-key or --server-cert/--server-key")
    _create_state_dir(config)
    ca = _ca(config)
    number: int | None = None
    with _audit_log(config) as audit:
        if args.ca_cert:
            ca.import_ca(Path(args.ca_cert).read_bytes(), Path(args.ca_key).read_bytes())
            _record(audit, "cert.import", ca.certificate(), kind="ca")
            print(f"imported CA into {ca.paths.ca_cert}")
            number = crl_number(ca.published_crl())  # the new CA's CRL, which clients meet
        if args.server_cert:
            ca.import_server(
                Path(args.server_cert).read_bytes(), Path(args.server_key).read_bytes()
            )
            leaf = x509.load_pem_x509_certificate(ca.paths.server_cert.read_bytes())
            _record(audit, "cert.import", leaf, kind="server", active="yes")
            print(f"imported server certificate into {ca.paths.server_cert}")
            _warn_if_not_presented(config)
    return reload_service(config, args.reload_timeout, crl=number)


def _rotate_server(args: argparse.Namespace, config: Config) -> int:
    ca = _existing_ca(config)
    names = server_names(config, ca, args.server_name or [], reset=args.reset_names)
    try:
        previous: int | None = x509.load_pem_x509_certificate(
            ca.paths.server_cert.read_bytes()
        ).serial_number
    except (OSError, ValueError):
        previous = None
    with _audit_log(config) as audit:
        issued = ca.rotate_server(names, key_type=args.key_type)
        san = issued.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        all_names = [str(n) for n in san.value.get_values_for_type(x509.DNSName)]
        all_names += [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]
        _record(
            audit,
            "cert.rotate-server",
            issued.certificate,
            kind="server",
            replaces=f"{previous:x}" if previous is not None else "",
            names=",".join(all_names),
        )
    print(f"new server certificate {_serial(issued.certificate)}: {ca.paths.server_cert}")
    print(f"  names: {', '.join(all_names)}")
    _warn_if_not_presented(config)
    return reload_service(config, args.reload_timeout)


def _reload(args: argparse.Namespace, config: Config) -> int:
    return reload_service(config, args.reload_timeout, required=True)


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
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
    init.add_argument(
        "--server-name", action="append", help="a name besides [tls] server_names (repeatable)"
    )
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

    def reload_timeout(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--reload-timeout",
            type=float,
            default=RELOAD_CONFIRM_TIMEOUT_SECONDS,
            metavar="SECONDS",
            help="how long to wait for the running service to confirm its reload "
            f"(default {RELOAD_CONFIRM_TIMEOUT_SECONDS:g})",
        )

    revoke = add("revoke", _revoke, "revoke a certificate and re-sign the CRL")
    revoke.add_argument("ref", metavar="SERIAL|NAME")
    revoke.add_argument("--reason", choices=sorted(REVOCATION_REASONS), default="unspecified")
    reload_timeout(revoke)

    crl = add("crl", _crl, "re-sign the CRL")
    crl.add_argument("--out", help="also copy the CRL here")
    reload_timeout(crl)

    imp = add("import", _import, "use your own CA or server certificate")
    imp.add_argument("--ca-cert")
    imp.add_argument("--ca-key")
    imp.add_argument("--server-cert", help="chain, leaf first")
    imp.add_argument("--server-key")
    reload_timeout(imp)

    rotate = add("rotate-server", _rotate_server, "issue a new active server certificate")
    rotate.add_argument(
        "--server-name",
        action="append",
        help="a name to add (repeatable); the current certificate's names and "
        "[tls] server_names are kept",
    )
    rotate.add_argument(
        "--reset-names",
        action="store_true",
        help="drop the names only the current certificate has (keep the defaults, "
        "[tls] server_names and --server-name)",
    )
    key_type(rotate)
    reload_timeout(rotate)

    reload = add("reload", _reload, "make the running service reload and confirm it")
    reload_timeout(reload)
