"""Builds frozen dataclasses from parsed TOML, checking every key, with errors at the file's line.

Generic: it knows dataclass fields and their type hints (bool, int, float,
str, Path, Literal, ``X | None``, ``int | Literal[...]``, list, ``dict[str, str]`` and nested
dataclasses), not what they mean. What is particular to one file comes in as
arguments: :class:`Tagged` picks the subclass of a table by one of its keys
(``[[listeners]]`` by ``protocol``), and ``checks`` validates strings by key
name (every ``bind``), and ``expand`` rewrites every string value before it
is checked (``${NAME}`` references, appliance/config_env.py), recording
where each part came from in :attr:`Binder.substitutions`. A value a
dataclass refuses in ``__post_init__`` (``ValueError``) is reported at its
table.

Numbers must be greater than 0: every number of the configuration is a size,
a count or a duration.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from appliance.config_env import Substitution, SubstitutionError

__all__ = ["BindError", "Binder", "KeyPath", "Tagged"]

#: Where a value sits: section and key names, and indexes into arrays of tables.
KeyPath = tuple[str | int, ...]


class BindError(Exception):
    """A TOML value that does not fit its field; ``str()`` names the file, line and key."""


@dataclass(frozen=True, slots=True)
class Tagged:
    """A base dataclass whose tables pick their subclass by one key's value.

    ``key``'s value names the class in ``classes``; a table without the key
    is ``default``.
    """

    key: str
    default: str
    classes: Mapping[str, type[Any]]


def _line_of(text: str, path: KeyPath) -> int | None:
    """The line that sets ``path`` (section names, array index, key), if found."""
    *sections, key = path
    header = ".".join(str(s) for s in sections if isinstance(s, str))
    index = next((s for s in sections if isinstance(s, int)), 0)
    seen = -1
    current = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("["):
            name = line.strip("[] ")
            current = name
            if line.startswith("[[") and name == header:
                seen += 1
            continue
        if current != header or (line.startswith("#")):
            continue
        if sections and isinstance(sections[-1], int) and seen != index:
            continue
        if isinstance(key, str) and line.split("=", 1)[0].strip().strip('"') == key:
            return number
    if sections:
        return _line_of_header(text, header)
    return None


def _line_of_header(text: str, header: str) -> int | None:
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip().strip("[] ") == header and raw.strip().startswith("["):
            return number
    return None


class Binder:
    """Builds dataclasses from the parsed tables of one TOML text.

    Args:
        text: the TOML text (to find the line of a key in errors).
        source: what errors call the file (its path).
        tagged: base dataclass -> how its tables choose their subclass.
        checks: key name -> a check of its string value (a message, or None when fine).
        expand: rewrites each string value (references to the environment or
            files), returning it and where its parts came from.
    """

    def __init__(
        self,
        text: str,
        source: str,
        *,
        tagged: Mapping[type[Any], Tagged] | None = None,
        checks: Mapping[str, Callable[[str], str | None]] | None = None,
        expand: Callable[[str], tuple[str, list[Substitution]]] | None = None,
    ) -> None:
        self.text = text
        self.source = source
        self._tagged = dict(tagged or {})
        self._checks = dict(checks or {})
        self._expand = expand
        #: (dotted key, where a part of its value came from), in the file's order.
        self.substitutions: list[tuple[str, Substitution]] = []

    def dotted(self, path: KeyPath) -> str:
        """``path`` as written in messages: ``listeners[0].bind``."""
        return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")

    def _expanded(self, value: Any, path: KeyPath) -> Any:
        if self._expand is None or not isinstance(value, str):
            return value
        try:
            text, sources = self._expand(value)
        except SubstitutionError as exc:
            raise self.error(path, str(exc)) from None
        self.substitutions.extend((self.dotted(path), source) for source in sources)
        return text

    def where(self, path: KeyPath, message: str) -> str:
        """``message`` prefixed with the file, the line of ``path`` and its dotted name."""
        dotted = self.dotted(path)
        line = _line_of(self.text, path) if path else None
        at = f"{self.source}:{line}" if line else self.source
        return f"{at}: {dotted}: {message}"

    def error(self, path: KeyPath, message: str) -> BindError:
        """The error for ``path`` (see :meth:`where`)."""
        return BindError(self.where(path, message))

    def build(self, cls: type[Any], data: Any, path: KeyPath = ()) -> Any:
        """An instance of the dataclass ``cls`` from the table ``data`` at ``path``.

        Raises:
            BindError: an unknown key, a value of the wrong type, or one ``cls`` refuses.
        """
        if not isinstance(data, dict):
            raise self.error(path, "must be a table")
        tagged = self._tagged.get(cls)
        if tagged is not None:
            cls = self._variant(tagged, data, path)
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise self.error((*path, key), f"unknown key (known keys: {known})")
        values = {key: self._value(hints[key], value, (*path, key)) for key, value in data.items()}
        try:
            return cls(**values)
        except ValueError as exc:
            raise self.error(path, str(exc)) from None

    def _variant(self, tagged: Tagged, data: dict[str, Any], path: KeyPath) -> type[Any]:
        name = data.get(tagged.key, tagged.default)
        cls = tagged.classes.get(name)
        if cls is None:
            known = ", ".join(sorted(tagged.classes))
            raise self.error((*path, tagged.key), f"unknown {tagged.key} {name!r} (known: {known})")
        return cls

    def _value(self, hint: Any, value: Any, path: KeyPath) -> Any:
        value = self._expanded(value, path)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (types.UnionType, typing.Union):
            non_none = [a for a in args if a is not type(None)]
            if len(non_none) > 1:
                return self._either(non_none, value, path)
            return self._value(non_none[0], value, path)
        if origin is Literal:
            if value not in args:
                choices = ", ".join(repr(a) for a in args)
                raise self.error(path, f"must be one of {choices}, not {value!r}")
            return value
        if origin is list:
            if not isinstance(value, list):
                raise self.error(path, "must be an array")
            return [self._value(args[0], item, (*path, i)) for i, item in enumerate(value)]
        if origin is dict:
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise self.error(path, "must be a table of strings")
            return {k: self._expanded(v, (*path, k)) for k, v in value.items()}
        if dataclasses.is_dataclass(hint):
            return self.build(hint, value, path)  # type: ignore[arg-type]
        return self._scalar(hint, value, path)

    def _either(self, hints: list[Any], value: Any, path: KeyPath) -> Any:
        """A value of ``int | Literal["auto"]`` and the like: a string goes to the text choice.

        A string is bound by the hint that takes text (a Literal of strings,
        str, Path), anything else by the others; should that fail, the error
        names every choice for a string (``workers = "many"``), else the
        chosen hint's own (``workers = 0``: must be greater than 0).
        """
        text = isinstance(value, str)
        chosen = [hint for hint in hints if _takes_text(hint) == text]
        try:
            return self._value(chosen[0] if chosen else hints[0], value, path)
        except BindError:
            if not text:
                raise
            choices = " or ".join(_describe(hint) for hint in hints)
            raise self.error(path, f"must be {choices}, not {value!r}") from None

    def _scalar(self, hint: Any, value: Any, path: KeyPath) -> Any:
        if hint is bool:
            if not isinstance(value, bool):
                raise self.error(path, "must be true or false")
            return value
        if hint is int or hint is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.error(path, "must be a number")
            if hint is int and not isinstance(value, int):
                raise self.error(path, "must be a whole number")
            if value <= 0:
                raise self.error(path, "must be greater than 0")
            return hint(value)
        if hint is str:
            if not isinstance(value, str):
                raise self.error(path, "must be a string")
            check = self._checks.get(str(path[-1]))
            problem = check(value) if check is not None else None
            if problem is not None:
                raise self.error(path, problem)
            return value
        if hint is Path:
            if not isinstance(value, str) or not value:
                raise self.error(path, "must be a path")
            return Path(value)
        raise self.error(path, f"unsupported setting type {hint}")


def _takes_text(hint: Any) -> bool:
    """Whether a TOML string is a value of ``hint``."""
    if typing.get_origin(hint) is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(hint))
    return hint is str or hint is Path


def _describe(hint: Any) -> str:
    """``hint`` in an error message: ``'auto'``, ``a whole number``."""
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(arg) for arg in typing.get_args(hint))
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}
    return names.get(hint, "a path" if hint is Path else str(hint))
