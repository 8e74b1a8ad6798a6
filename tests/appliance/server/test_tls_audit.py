"""Refused client certificates reach the audit log, within a budget an attacker cannot pass."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from appliance.server.listener import ConnectionInfo
from appliance.server.tls_audit import (
    MAX_ENTRIES_PER_MINUTE,
    QUEUE_ENTRIES,
    TlsRefusalAudit,
    is_certificate_refusal,
)


def test_only_certificate_refusals_count() -> None:
    assert is_certificate_refusal("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    assert is_certificate_refusal("certificate verify failed: certificate revoked")
    assert is_certificate_refusal("peer did not return a certificate")
    assert not is_certificate_refusal("[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert not is_certificate_refusal("peer closed during handshake")


async def _until(condition: object) -> None:
    """Checkpoint until ``condition()`` holds (the writer runs in a thread; the clock is mocked)."""
    import time

    give_up = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up
        await trio.sleep(0)


@pytest.mark.trio
async def test_entries_are_written_up_to_the_per_minute_budget(
    mock_clock: trio.testing.MockClock,
) -> None:
    written: list[tuple[ConnectionInfo, str]] = []
    audit = TlsRefusalAudit(lambda *entry: written.append(entry), trio.CapacityLimiter(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(audit.run)
        for i in range(MAX_ENTRIES_PER_MINUTE + 40):
            audit.note(ConnectionInfo("mtls", f"10.0.0.{i % 250}", 1, True), "certificate revoked")
        audit.note(
            ConnectionInfo("mtls", "10.0.0.1", 1, True), "wrong version number"
        )  # not about a certificate
        await _until(lambda: len(written) >= MAX_ENTRIES_PER_MINUTE)
        await trio.testing.wait_all_tasks_blocked()
        assert len(written) == MAX_ENTRIES_PER_MINUTE
        assert audit.dropped == 40
        mock_clock.jump(60)  # a new minute, a new budget
        audit.note(ConnectionInfo("mtls", "10.0.0.9", 1, True), "unknown ca")
        await _until(lambda: len(written) == MAX_ENTRIES_PER_MINUTE + 1)
        nursery.cancel_scope.cancel()
    assert QUEUE_ENTRIES >= MAX_ENTRIES_PER_MINUTE
