"""Which certificate names the PKI accepts: checked before anything is signed or written.

A client certificate's name is its common name, the ``source`` of its
events, and the stem of the files ``cert issue-client NAME --out DIR``
writes; a server certificate's first name is its common name and the stem of
``cert issue-server``'s files. So a name must be safe as a file name on its
own: a short run of letters, digits and ``. _ - @``, starting with a letter or
digit, never ``..`` and never a path separator, so that ``DIR/NAME.key`` is in
``DIR``. Server names are DNS names (a ``*.`` wildcard first label allowed)
or IP addresses without a scope.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

from pki.errors import PkiError

__all__ = [
    "MAX_COMMON_NAME_CHARS",
    "MAX_DNS_NAME_CHARS",
    "check_client_name",
    "check_server_name",
    "check_server_names",
]

#: Longest common name, in characters: X.509's upper bound (RFC 5280, ub-common-name).
MAX_COMMON_NAME_CHARS: Final = 64
#: Longest DNS name, in characters (RFC 1035, without the final dot).
MAX_DNS_NAME_CHARS: Final = 253

_CLIENT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
# A DNS label; "_" is allowed because some hosts' names have one (a certificate for
# them still works with clients that match names leniently).
_DNS_LABEL: Final = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_client_name(name: str) -> str:
    """``name`` when it may name a client certificate and its files.

    Raises:
        PkiError: it is empty, too long, or has a character outside the set.
    """
    if not 1 <= len(name) <= MAX_COMMON_NAME_CHARS:
        raise PkiError(
            f"certificate name {name!r}: must have 1 to {MAX_COMMON_NAME_CHARS} characters"
        )
    if _CLIENT_NAME.fullmatch(name) is None or ".." in name:
        raise PkiError(
            f"certificate name {name!r}: use letters, digits and '.', '_', '-', '@', "
            "starting with a letter or digit, without '..' (it names files too)"
        )
    return name


def check_server_name(name: str) -> str:
    """``name`` when it is a DNS name or an IP address a server certificate may carry.

    Raises:
        PkiError: it is neither.
    """
    if "%" not in name:  # a scoped IPv6 address ("fe80::1%eth0") means nothing to a peer
        try:
            ipaddress.ip_address(name)
            return name
        except ValueError:
            pass
    labels = name.split(".")
    if labels[0] == "*" and len(labels) > 2:
        labels = labels[1:]
    if (
        not 1 <= len(name) <= MAX_DNS_NAME_CHARS
        or ".." in name
        or not all(_DNS_LABEL.fullmatch(label) for label in labels)
    ):
        raise PkiError(
            f"server name {name!r}: not an IP address or a DNS name (labels of letters, "
            f"digits, '-' and '_', at most {MAX_DNS_NAME_CHARS} characters, '*.' first "
            "for a wildcard)"
        )
    return name


def check_server_names(names: list[str]) -> list[str]:
    """``names`` when each is a server name and the first can be the common name.

    Raises:
        PkiError: there is none, one is not a server name, or the first is too long.
    """
    if not names:
        raise PkiError("a server certificate needs at least one name")
    for name in names:
        check_server_name(name)
    if len(names[0]) > MAX_COMMON_NAME_CHARS:
        raise PkiError(
            f"server name {names[0]!r}: the first name becomes the common name and the "
            f"files' name: at most {MAX_COMMON_NAME_CHARS} characters"
        )
    return names
