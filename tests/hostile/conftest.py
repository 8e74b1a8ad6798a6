"""One ``appliance serve`` per test module, with every listener (tests/hostile/support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hostile.support import HostileService


@pytest.fixture(scope="module")
def hostile_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileService]:
    service = HostileService(tmp_path_factory.mktemp("hostile"))
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def service(hostile_service: HostileService) -> HostileService:
    """The module's service; started again (fresh state) when an earlier test took it down."""
    hostile_service.ensure_running()
    return hostile_service
