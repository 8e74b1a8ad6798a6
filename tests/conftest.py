"""The suite's shared fixtures; the helpers behind them are in tests/support/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.service import ApplianceProcess, start_appliance

#: Fixtures of their own modules, registered once for the whole session.
pytest_plugins = ["tests.postgres", "tests.s3server"]


@pytest.fixture
def appliance(tmp_path: Path) -> Iterator[Callable[..., ApplianceProcess]]:
    """A factory: ``appliance({name: toml_body})`` starts the service with those listeners."""
    started: list[ApplianceProcess] = []

    def start(listeners: dict[str, str], extra: str = "") -> ApplianceProcess:
        app = start_appliance(tmp_path, listeners, extra, index=len(started))
        started.append(app)
        return app

    yield start
    for app in started:
        app.stop()
