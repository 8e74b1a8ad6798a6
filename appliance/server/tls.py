"""The listeners' TLS contexts: built from the config and the PKI, rebuilt on reload.

A reload (SIGHUP, ``appliance cert reload``, or a re-signed CRL) builds new
contexts and hands them to the listeners. New connections use them; open
connections keep the context they were made with, so nothing is dropped for
a new server certificate. The CRL the contexts were built with is kept too
(:meth:`TlsManager.certificate_revocation`): an open connection whose client
certificate is on it is closed (:mod:`appliance.server.revocation`). A
reload that fails (a broken file) is logged and the old contexts and CRL stay.

The admin listener, when it serves HTTPS, gets its new context from the same
reload (:meth:`TlsManager.attach_admin`). The files are read under the PKI
lock (:mod:`pki.lock`), so a reload never reads half of a change (a new key
next to the old certificate) and knows the number of the CRL it loaded
(:attr:`TlsManager.crl_number`), which the reload status reports so that
``cert revoke`` can confirm the revocation is in force.
"""

from __future__ import annotations

import datetime as dt
import re
import ssl
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Final

from cryptography import x509

from appliance.config import Config, ListenerConfig
from appliance.logs import get_logger
from appliance.server.listener import TcpService
from pki.authority import CertificateAuthority, PkiPaths, crl_number
from pki.errors import PkiError
from pki.inventory import EXPIRY_WARNING_DAYS
from pki.lock import PKI_LOCK_WAIT_SECONDS
from pki.tls import server_context

__all__ = ["TlsManager"]

log = get_logger("tls")

#: Longest a reload (in the event loop) waits for a CLI's PKI change to finish, in
#: seconds. A change holds the PKI lock for milliseconds; past this the reload
#: fails, says why, and the listeners keep their contexts.
RELOAD_LOCK_WAIT_SECONDS: Final = 2.0

#: One CRL of a PEM file (a file may hold the CRLs of several issuers, as OpenSSL reads it).
_PEM_CRL: Final = re.compile(rb"-----BEGIN X509 CRL-----.+?-----END X509 CRL-----", re.DOTALL)


def _load_crls(path: Path) -> list[x509.CertificateRevocationList]:
    """Every CRL in a PEM file.

    Raises:
        PkiError: the file cannot be read or holds a broken CRL.
    """
    try:
        data = path.read_bytes()
        return [x509.load_pem_x509_crl(block) for block in _PEM_CRL.findall(data)]
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot read the CRL {path}: {exc}") from None


def _revocation_reason(entry: x509.RevokedCertificate) -> str:
    try:
        reason = entry.extensions.get_extension_for_class(x509.CRLReason).value.reason
    except x509.ExtensionNotFound:
        return "certificate revoked"
    return f"certificate revoked ({reason.value})"


class TlsManager:
    """Owns the TLS material of one service."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.ca = CertificateAuthority(PkiPaths(config.pki_dir))
        self._contexts: dict[str, ssl.SSLContext] = {}
        #: The admin listener, when it serves TLS (:meth:`attach_admin`).
        self._admin: TcpService | None = None
        #: The CRL number of the appliance CRL the contexts check (None: they check none).
        self.crl_number: int | None = None
        #: The CRLs the contexts were built with (none without client authentication).
        self._crls: list[x509.CertificateRevocationList] = []

    @property
    def _generated_server(self) -> bool:
        return not (self._config.tls.cert_file and self._config.tls.key_file)

    @property
    def _own_client_ca(self) -> bool:
        return self._config.tls.client_ca_file is None

    def _needs_ca(self) -> bool:
        tls_listeners = [lc for lc in self._config.listeners if lc.tls]
        if not tls_listeners:
            return False
        uses_client_auth = any(lc.client_auth != "off" for lc in tls_listeners)
        return self._generated_server or (uses_client_auth and self._own_client_ca)

    def prepare(self) -> Path | None:
        """Create the CA, server certificate and CRL on first start; returns the CA path."""
        if not self._needs_ca():
            return None
        names = self._config.tls.server_names
        if self._generated_server:
            created = self.ca.ensure(names)
        else:
            created = not self.ca.exists
            if created:
                self.ca.create()
            elif self.ca.crl_needs_refresh():
                self.ca.refresh_crl()  # checked again under the PKI lock: signed once
        ca_file = self.ca.paths.ca_cert.resolve()
        if created:
            log.info("pki.created", ca=str(ca_file))
        self._rebuild(PKI_LOCK_WAIT_SECONDS)  # at start, before the loop serves anything
        return ca_file

    def _build(self) -> None:
        contexts: dict[str, ssl.SSLContext] = {}
        for listener in self._config.listeners:
            if listener.tls:
                contexts[listener.name] = self._context(listener)
        crl = self._crl_file()
        checks_clients = any(lc.tls and lc.client_auth != "off" for lc in self._config.listeners)
        crls = _load_crls(crl) if crl is not None and checks_clients else []
        self._contexts, self._crls = contexts, crls
        self.warn_expiring()

    def _crl_file(self) -> Path | None:
        return self._config.tls.crl_file or (self.ca.paths.crl if self._own_client_ca else None)

    def _context(self, listener: ListenerConfig) -> ssl.SSLContext:
        tls = self._config.tls
        cert = tls.cert_file or self.ca.paths.server_cert
        key = tls.key_file or self.ca.paths.server_key
        client_ca = tls.client_ca_file or self.ca.paths.ca_cert
        return server_context(
            cert, key, client_auth=listener.client_auth, client_ca=client_ca, crl=self._crl_file()
        )

    def certificate_revocation(self, certificate: x509.Certificate) -> str | None:
        """Why the CRL in force revokes ``certificate`` (a verified client's), or None.

        The CRL is the one the listeners' contexts check at the handshake,
        replaced by each reload that builds them; a CRL applies to the
        certificates of its issuer only, as in OpenSSL's check.
        """
        for crl in self._crls:
            if crl.issuer != certificate.issuer:
                continue
            entry = crl.get_revoked_certificate_by_serial_number(certificate.serial_number)
            if entry is not None:
                return _revocation_reason(entry)
        return None

    def use_config(self, config: Config) -> None:
        """Take a re-read configuration (its ``[tls]`` files and listeners) for the next build."""
        self._config = config

    def context_for(self, listener: ListenerConfig) -> ssl.SSLContext | None:
        """The current context of ``listener`` (None for a plaintext listener)."""
        if not listener.tls:
            return None
        if listener.name not in self._contexts:
            self._rebuild()
        return self._contexts[listener.name]

    def reload(self, services: Mapping[str, TcpService], reason: str) -> bool:
        """Rebuild every context and give it to the running listeners and the admin listener."""
        try:
            if self._own_client_ca and self.ca.exists and self.ca.crl_needs_refresh():
                # Checked again and signed under the PKI lock: never over a CLI's newer CRL.
                self.ca.refresh_crl(RELOAD_LOCK_WAIT_SECONDS)
            admin = self._rebuild()
        except (PkiError, OSError) as exc:
            log.error("tls.reload_failed", reason=str(exc), trigger=reason)
            return False
        for name, service in services.items():
            if name in self._contexts:
                service.ssl_context = self._contexts[name]
        names = sorted(self._contexts)
        if self._admin is not None and admin is not None:
            self._admin.ssl_context = admin
            names.append("admin")
        log.info(
            "tls.reloaded", trigger=reason, listeners=",".join(names), crl_number=self.crl_number
        )
        return True

    def _reading(self, wait: float) -> AbstractContextManager[None]:
        """The PKI lock while the files are read, when any of them is the appliance's.

        So a reload never reads half of a change (a new key next to the old
        certificate), and the CRL number read is the one of the CRL loaded.
        """
        uses_pki = self._generated_server or self._own_client_ca
        if uses_pki and self.ca.paths.directory.is_dir():
            return self.ca.locked(wait)
        return nullcontext()

    def _loaded_crl_number(self) -> int | None:
        # Only the appliance's own CRL has numbers this CA gave (an operator's
        # [tls] crl_file or client CA is checked instead of it).
        uses_own_crl = self._own_client_ca and self._config.tls.crl_file is None
        if not uses_own_crl or not self.ca.exists:
            return None
        try:
            return crl_number(x509.load_pem_x509_crl(self.ca.paths.crl.read_bytes()))
        except (OSError, ValueError):
            return None

    def _rebuild(self, wait: float = RELOAD_LOCK_WAIT_SECONDS) -> ssl.SSLContext | None:
        """Build every context under the PKI lock; returns the admin listener's, if attached.

        ``wait``: how long to wait for the lock (a reload runs in the event loop).

        Raises:
            PkiError: a file is missing or broken, or the PKI lock stayed taken.
        """
        with self._reading(wait):
            number = self._loaded_crl_number()
            self._build()
            admin = self.admin_context() if self._admin is not None else None
        self.crl_number = number
        return admin

    def admin_context(self) -> ssl.SSLContext:
        """The admin listener's context: the ``[tls]`` server certificate, or the generated one.

        Raises:
            PkiError: a file is missing or unreadable.
        """
        tls = self._config.tls
        if tls.cert_file is not None and tls.key_file is not None:
            return server_context(tls.cert_file, tls.key_file)
        return server_context(self.ca.paths.server_cert, self.ca.paths.server_key)

    def attach_admin(self, service: TcpService) -> None:
        """Give the admin listener ``service`` the server certificate anew on every reload."""
        self._admin = service

    def warn_expiring(self) -> None:
        """Log a warning for each certificate in use that expires within 30 days."""
        now = dt.datetime.now(dt.UTC)
        files: dict[str, Path] = {
            "server": self._config.tls.cert_file or self.ca.paths.server_cert,
        }
        if self.ca.paths.ca_cert.exists():
            files["ca"] = self.ca.paths.ca_cert
        for role, path in files.items():
            try:
                cert = x509.load_pem_x509_certificate(path.read_bytes())
            except (OSError, ValueError):
                continue
            left = cert.not_valid_after_utc - now
            if left <= dt.timedelta(days=EXPIRY_WARNING_DAYS):
                log.warning(
                    "certificate.expiring",
                    role=role,
                    subject=cert.subject.rfc4514_string(),
                    not_after=cert.not_valid_after_utc.isoformat(),
                    days_left=max(left.days, 0),
                )
