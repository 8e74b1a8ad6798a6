"""``${NAME}`` and ``${file:PATH}`` in the configuration's string values.

Secrets (the auth database's password, S3 keys) need not sit in the TOML
file: any string value may refer to an environment variable, ``${NAME}``,
or to a file's content, ``${file:/path}`` (for systemd credentials:
``${file:${CREDENTIALS_DIRECTORY}/db-password}`` with ``LoadCredential=``
in the unit). ``$${`` is a literal ``${``. docs/configuration.md,
"Secrets outside the file", has the rules; in short:

* a variable that is not set, a file that cannot be read, or a reference
  that is not closed is an error that names it (never its value);
* a file's content is used whole, less one trailing newline, and is at most
  :data:`MAX_FILE_BYTES`;
* a substituted value is not expanded again (a secret containing ``${`` is
  taken as it is);
* only values are expanded, never keys.

Pure: the environment and the file reader are the caller's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["MAX_FILE_BYTES", "Substitution", "SubstitutionError", "expand", "read_limited"]

#: Largest file a ``${file:...}`` reference may name (a password, a key, a URL).
MAX_FILE_BYTES: Final = 64 * 1024

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FILE_PREFIX: Final = "file:"


class SubstitutionError(ValueError):
    """A reference that cannot be expanded; the message names it, never a value."""


@dataclass(frozen=True, slots=True)
class Substitution:
    """Where part of a value came from: ``reference`` as written, and its kind."""

    reference: str
    kind: Literal["environment", "file"]


def _closing(text: str, start: int) -> int:
    """The index of the ``}`` that closes the ``${`` whose ``{`` is at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise SubstitutionError(f"'{text[start - 1 : start + 40]}' is not closed with '}}'")


def _variable(name: str, environ: Mapping[str, str]) -> str:
    if not _NAME.match(name):
        raise SubstitutionError(f"'${{{name}}}' is not a variable name (letters, digits, _)")
    value = environ.get(name)
    if value is None:
        raise SubstitutionError(f"environment variable {name} is not set")
    return value


def expand(
    value: str,
    environ: Mapping[str, str],
    read_file: Callable[[str], bytes],
) -> tuple[str, list[Substitution]]:
    """``value`` with its references replaced, and where each replacement came from.

    ``read_file(path)`` returns at most ``MAX_FILE_BYTES + 1`` bytes of the
    file (and raises OSError when it cannot).

    Raises:
        SubstitutionError: a variable not set, a file not readable or too
            large or not UTF-8, a malformed reference.
    """
    if "$" not in value:
        return value, []
    out: list[str] = []
    sources: list[Substitution] = []
    i = 0
    while i < len(value):
        if value.startswith("$${", i):
            out.append("${")
            i += 3
            continue
        if not value.startswith("${", i):
            out.append(value[i])
            i += 1
            continue
        end = _closing(value, i + 1)
        inner = value[i + 2 : end]
        reference = value[i : end + 1]
        if inner.startswith(_FILE_PREFIX):
            # The path may name variables (``${CREDENTIALS_DIRECTORY}``), not files.
            path, inner_sources = expand(inner[len(_FILE_PREFIX) :], environ, _no_files)
            out.append(_file(path, read_file))
            sources.extend(inner_sources)
            sources.append(Substitution(reference, "file"))
        else:
            out.append(_variable(inner, environ))
            sources.append(Substitution(reference, "environment"))
        i = end + 1
    return "".join(out), sources


def _no_files(path: str) -> bytes:
    raise SubstitutionError(f"a file reference cannot name another file ({path})")


def _file(path: str, read_file: Callable[[str], bytes]) -> str:
    if not path.startswith("/"):
        raise SubstitutionError(f"'${{file:{path}}}' needs an absolute path")
    try:
        raw = read_file(path)
    except OSError as exc:
        raise SubstitutionError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SubstitutionError(f"{path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SubstitutionError(f"{path} is not UTF-8 text") from None
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def read_limited(path: str) -> bytes:
    """At most ``MAX_FILE_BYTES + 1`` bytes of the file at ``path``."""
    with open(path, "rb") as handle:
        return handle.read(MAX_FILE_BYTES + 1)
