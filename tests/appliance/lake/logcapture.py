"""Reading the structured log lines a lake test captured."""

from __future__ import annotations

from typing import Any

import pytest


def logged(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every captured log line named ``name`` (appliance.logs events)."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]
