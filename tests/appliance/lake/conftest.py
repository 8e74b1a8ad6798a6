"""Shared fixtures of the lake tests: structured log lines captured at INFO."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def info_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog at INFO: the maintenance, retention and disk-guard lines."""
    with caplog.at_level(logging.INFO):
        yield caplog
