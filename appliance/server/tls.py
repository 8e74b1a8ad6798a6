"""The listeners' TLS contexts: built from the config and the PKI, rebuilt on reload.

A reload (SIGHUP, ``appliance cert reload``, or a re-signed CRL) builds new
contexts and hands them to the listeners. New connections use them; open
connections keep the context they were made with, so nothing is dropped. A
reload that fails (a broken file) is logged and the old contexts stay.
"""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Mapping
from pathlib import Path

from cryptography import x509

from appliance.config import Config, ListenerConfig
from appliance.logs import get_logger
from appliance.server.listener import TcpService
from pki.authority import CertificateAuthority, PkiPaths
from pki.errors import PkiError
from pki.inventory import EXPIRY_WARNING_DAYS
from pki.tls import server_context

__all__ = ["TlsManager"]

log = get_logger("tls")


class TlsManager:
    """Owns the TLS material of one service."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.ca = CertificateAuthority(PkiPaths(config.pki_dir))
        self._contexts: dict[str, ssl.SSLContext] = {}

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
                self.ca.write_crl()
        ca_file = self.ca.paths.ca_cert.resolve()
        if created:
            log.info("pki.created", ca=str(ca_file))
        self._build()
        return ca_file

    def _build(self) -> None:
        contexts: dict[str, ssl.SSLContext] = {}
        for listener in self._config.listeners:
            if listener.tls:
                contexts[listener.name] = self._context(listener)
        self._contexts = contexts
        self.warn_expiring()

    def _context(self, listener: ListenerConfig) -> ssl.SSLContext:
        tls = self._config.tls
        cert = tls.cert_file or self.ca.paths.server_cert
        key = tls.key_file or self.ca.paths.server_key
        client_ca = tls.client_ca_file or self.ca.paths.ca_cert
        crl = tls.crl_file or (self.ca.paths.crl if self._own_client_ca else None)
        return server_context(
            cert, key, client_auth=listener.client_auth, client_ca=client_ca, crl=crl
        )

    def use_config(self, config: Config) -> None:
        """Take a re-read configuration (its ``[tls]`` files and listeners) for the next build."""
        self._config = config

    def context_for(self, listener: ListenerConfig) -> ssl.SSLContext | None:
        """The current context of ``listener`` (None for a plaintext listener)."""
        if not listener.tls:
            return None
        if listener.name not in self._contexts:
            self._build()
        return self._contexts[listener.name]

    def reload(self, services: Mapping[str, TcpService], reason: str) -> bool:
        """Rebuild every context and give it to the running listeners."""
        try:
            if self._own_client_ca and self.ca.exists and self.ca.crl_needs_refresh():
                self.ca.write_crl()
            self._build()
        except PkiError as exc:
            log.error("tls.reload_failed", reason=str(exc), trigger=reason)
            return False
        for name, service in services.items():
            if name in self._contexts:
                service.ssl_context = self._contexts[name]
        log.info("tls.reloaded", trigger=reason, listeners=",".join(sorted(self._contexts)))
        return True

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
