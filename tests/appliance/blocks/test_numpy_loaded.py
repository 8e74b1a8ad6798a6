"""numpy only once it is fully imported: never an import, never a wait on another thread's."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import numpy
import pytest

from appliance.blocks.numpy_loaded import loaded_numpy


def test_a_numpy_imported_is_used() -> None:
    assert loaded_numpy() is numpy


def test_a_numpy_another_thread_is_still_importing_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    half = types.ModuleType("numpy")
    half.__spec__ = importlib.machinery.ModuleSpec("numpy", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]  # as importlib marks it
    monkeypatch.setitem(sys.modules, "numpy", half)
    assert loaded_numpy() is None
    half.__spec__._initializing = False  # type: ignore[attr-defined]
    assert loaded_numpy() is half


@pytest.mark.parametrize("entry", ["absent", "hidden"])
def test_no_numpy_is_none(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    if entry == "absent":
        monkeypatch.delitem(sys.modules, "numpy")
    else:
        monkeypatch.setitem(sys.modules, "numpy", None)
    assert loaded_numpy() is None
