"""The PKI's one exception type."""

from __future__ import annotations


class PkiError(Exception):
    """A PKI operation failed; ``str()`` says why, and never contains key material."""
