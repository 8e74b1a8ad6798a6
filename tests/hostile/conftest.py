"""One ``appliance serve`` per test module, with every listener (tests/hostile/service.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hostile.limits import MIB, RSS_GROWTH, RSS_GROWTH_BOUND_BYTES
from tests.hostile.service import HostileService


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The largest peak-RSS growths of the service measured by hostile tests."""
    if not RSS_GROWTH:
        return
    terminalreporter.section("hostile: service peak RSS growth per test")
    bound = RSS_GROWTH_BOUND_BYTES / MIB
    for test, growth in sorted(RSS_GROWTH.items(), key=lambda kv: -kv[1])[:8]:
        terminalreporter.write_line(f"{growth / MIB:7.1f} MiB (bound {bound:.0f})  {test}")
