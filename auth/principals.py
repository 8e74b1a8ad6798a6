"""The names principals go by, and the names no user, token or CURVE key may take.

A batch's ``source`` (and so its dedupe scope, and what the audit log says
of it) is its sender's principal name: a forward user's name, a CURVE key's
name, ``token:<name>`` for a WebSocket token, a client certificate's subject
(RFC 4514: ``CN=shipper-1,O=...``), or ``anonymous`` (whose dedupe scope is
``anonymous@<address>``). The audit log adds its own actors: ``cli:<os
user>`` and ``unauthenticated:<address>``. These share one namespace, so a
user named ``token:ci`` or ``CN=shipper-1`` would share another principal's
dedupe scope, and an audit line could not tell them apart:
:func:`check_principal_name` refuses every name that could be read as
another kind's, whatever its case.

A failed handshake's claimed username is not a principal: its audit entry's
actor is :func:`unauthenticated_actor`, and the claimed name is kept apart,
escaped by :func:`escape_claimed`.
"""

from __future__ import annotations

from typing import Final

from auth.errors import InvalidValueError
from auth.tablestore import check_name

__all__ = [
    "RESERVED_NAMES",
    "RESERVED_PREFIXES",
    "check_principal_name",
    "escape_claimed",
    "unauthenticated_actor",
]

#: Names of principals of another kind: the scope of anonymous peers.
RESERVED_NAMES: Final = frozenset({"anonymous"})
#: Prefixes of the names other principals and audit actors go by.
RESERVED_PREFIXES: Final = ("anonymous@", "token:", "cli:", "unauthenticated:")
#: The character every certificate subject holds (``CN=...``) and no other name needs.
_SUBJECT_MARK: Final = "="


def check_principal_name(what: str, name: str) -> str:
    """``name`` as given, if a ``what`` (user, token, CURVE key) may take it.

    Raises:
        InvalidValueError: not a valid name (:func:`auth.tablestore.check_name`),
            or one that mimics another kind of principal.
    """
    check_name(what, name)
    folded = name.casefold()
    reserved = folded in RESERVED_NAMES or folded.startswith(RESERVED_PREFIXES)
    if reserved or _SUBJECT_MARK in name:
        kinds = (
            "'anonymous', names starting with "
            + ", ".join(repr(p) for p in RESERVED_PREFIXES)
            + f", and names holding {_SUBJECT_MARK!r} (certificate subjects)"
        )
        raise InvalidValueError(
            f"the {what} name {name!r} is reserved: it could be taken for another kind of "
            f"principal in the rows' source and the audit log (reserved: {kinds})"
        )
    return name


def unauthenticated_actor(address: str) -> str:
    """The audit actor of a failed authentication from ``address``: nobody proven."""
    return f"unauthenticated:{address}"


def _escaped(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_claimed(text: str) -> str:
    """A name a client claimed, as the audit log keeps it: backslashes and controls escaped.

    Escaping the backslash too makes the text unambiguous: a client cannot
    send ``\\x0a`` to pass for an escaped newline.
    """
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(_escaped(ord(char)))
    return "".join(out)
