"""docs/limits.md holds every configurable key with the default the code has."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from appliance.config import Config, ForwardListenerConfig, LakeConfig, LumberjackListenerConfig
from appliance.config_reference import BEGIN, END, reference_tables, render_into

LIMITS = Path(__file__).parents[2] / "docs" / "limits.md"


def test_the_limits_page_is_rendered_from_the_current_code() -> None:
    text = LIMITS.read_text(encoding="utf-8")
    assert render_into(text) == text, (
        "docs/limits.md is out of date: run python -m appliance.config_reference docs/limits.md"
    )


def test_every_key_appears_with_its_default() -> None:
    tables = reference_tables()
    for cls in (ForwardListenerConfig, LumberjackListenerConfig, LakeConfig):
        for field in dataclasses.fields(cls):
            if field.name == "protocol":
                continue
            assert f"| `{field.name}` |" in tables, field.name
    assert "| `max_connections_per_address` | 64 |" in tables
    assert "| `request_timeout_seconds` | 60 |" in tables
    assert f"| `shutdown_timeout_seconds` | {Config().shutdown_timeout_seconds:g} |" in tables


def test_a_changed_default_is_caught() -> None:
    text = LIMITS.read_text(encoding="utf-8")
    stale = text.replace(
        "| `max_connections_per_address` | 64 |", "| `max_connections_per_address` | 65 |"
    )
    assert stale != text
    assert render_into(stale) != stale
    assert BEGIN in text
    assert END in text
