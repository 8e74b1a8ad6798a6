"""PyPI ``fluent-logger`` (Message mode) against a plaintext listener on loopback.

The Python client has no TLS, so this test configures a plaintext listener
explicitly, as an operator would have to (plaintext only when a listener
says so: docs/decisions.md#tls-unless-a-listener-says-otherwise).
"""

from __future__ import annotations

import json
import time

import pytest
from fluent import sender

pytestmark = pytest.mark.interop


def test_python_fluent_logger_events_arrive_once_with_nanoseconds(appliance) -> None:
    app = appliance({"plain": "tls = false"})
    logger = sender.FluentSender(
        "py", host="127.0.0.1", port=app.ports["plain"], nanosecond_precision=True
    )
    sent = []
    try:
        for i in range(20):
            ns = time.time_ns() - i * 1001
            record = {"seq": i, "msg": f"hello {i} ünïcødé", "nested": {"a": [1, 2]}}
            when = sender.EventTime.from_unix_nano(ns)
            assert logger.emit_with_time(f"app{i % 2}", when, record), logger.last_error
            sent.append((i, f"py.app{i % 2}", ns, record))
    finally:
        logger.close()
    # Message mode has no ack: wait until the rows are committed, then stop.
    deadline = time.monotonic() + 30
    while len(app.rows()) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert app.stop() == 0
    rows = app.rows()
    by_seq = {}
    for row in rows:
        record = json.loads(row["record"])
        by_seq.setdefault(record["seq"], []).append((row, record))
    assert sorted(by_seq) == list(range(20))
    for seq, tag, ns, record in sent:
        ((row, got),) = by_seq[seq]  # exactly once
        assert got == record
        assert row["tag"] == tag
        assert row["event_time_ns"] == ns
        assert row["protocol"] == "forward"
        assert row["peer"].startswith("127.0.0.1:")
