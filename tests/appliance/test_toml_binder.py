"""The generic TOML binder: dataclasses from tables, errors at the file's line."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from appliance.toml_binder import Binder, BindError, Tagged


@dataclass(frozen=True)
class Animal:
    kind: str = "cat"
    name: str = ""


@dataclass(frozen=True)
class Cat(Animal):
    kind: Literal["cat"] = "cat"
    lives: int = 9


@dataclass(frozen=True)
class Dog(Animal):
    kind: Literal["dog"] = "dog"
    good: bool = True


@dataclass(frozen=True)
class Inner:
    ratio: float = 1.0
    home: Path | None = None

    def __post_init__(self) -> None:
        if self.ratio > 10:
            raise ValueError("ratio must be at most 10")


@dataclass(frozen=True)
class Outer:
    title: str = ""
    mood: Literal["calm", "loud"] = "calm"
    labels: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    pets: list[Animal] = field(default_factory=list)


def _binder(text: str) -> Binder:
    return Binder(
        text,
        "t.toml",
        tagged={Animal: Tagged("kind", "cat", {"cat": Cat, "dog": Dog})},
        checks={"name": lambda v: None if v.islower() else "must be lower case"},
    )


def bind(text: str) -> Any:
    return _binder(text).build(Outer, tomllib.loads(text))


def test_builds_nested_tables_lists_and_tagged_variants() -> None:
    outer = bind(
        'title = "x"\nmood = "loud"\ntags = ["a", "b"]\nlabels = { k = "v" }\n'
        '[inner]\nratio = 2.5\nhome = "/srv"\n'
        '[[pets]]\nname = "tom"\n[[pets]]\nkind = "dog"\nname = "rex"\ngood = false\n'
    )
    assert outer == Outer(
        title="x",
        mood="loud",
        labels={"k": "v"},
        tags=["a", "b"],
        inner=Inner(ratio=2.5, home=Path("/srv")),
        pets=[Cat(name="tom"), Dog(name="rex", good=False)],
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n", "t.toml:1: colour: unknown key (known keys: inner, labels, mood, pets,"),
        ('\nmood = "shy"\n', "t.toml:2: mood: must be one of 'calm', 'loud', not 'shy'"),
        ("[inner]\n\nratio = true\n", "t.toml:3: inner.ratio: must be a number"),
        ("[inner]\nratio = 0\n", "t.toml:2: inner.ratio: must be greater than 0"),
        ("[inner]\nratio = 11\n", "t.toml: inner: ratio must be at most 10"),
        ('tags = "a"\n', "t.toml:1: tags: must be an array"),
        ("labels = { k = 1 }\n", "t.toml:1: labels: must be a table of strings"),
        (
            '[[pets]]\nname = "a"\n[[pets]]\nkind = "fish"\n',
            "t.toml:4: pets[1].kind: unknown kind 'fish' (known: cat, dog)",
        ),
        ('[[pets]]\nkind = "dog"\nlives = 3\n', "t.toml:3: pets[0].lives: unknown key"),
        ('[[pets]]\nname = "Rex"\n', "t.toml:2: pets[0].name: must be lower case"),
    ],
)
def test_errors_name_the_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(BindError) as excinfo:
        bind(text)
    assert message in str(excinfo.value)


def test_where_formats_a_message_for_checks_made_after_building() -> None:
    binder = _binder('[[pets]]\nname = "a"\n[[pets]]\nname = "b"\n')
    assert binder.where(("pets", 1, "name"), "taken") == "t.toml:4: pets[1].name: taken"
