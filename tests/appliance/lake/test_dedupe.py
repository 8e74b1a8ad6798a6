"""The stored-batches index: a window in time and a cap in entries."""

from __future__ import annotations

from appliance.lake.dedupe import StoredBatches


def test_an_entry_is_forgotten_after_the_window() -> None:
    stored = StoredBatches(window_seconds=10, max_keys=100)
    stored.add(b"a" * 16, now=0.0)
    assert stored.contains(b"a" * 16, now=10.0)
    assert not stored.contains(b"a" * 16, now=10.5)
    assert len(stored) == 0


def test_past_the_cap_the_oldest_go_first() -> None:
    stored = StoredBatches(window_seconds=100, max_keys=2)
    stored.add_all([b"a", b"b", b"c"], now=1.0)
    assert not stored.contains(b"a", 1.0)
    assert stored.contains(b"b", 1.0)
    assert stored.contains(b"c", 1.0)


def test_adding_again_renews_an_entry() -> None:
    stored = StoredBatches(window_seconds=10, max_keys=2)
    stored.add(b"a", now=0.0)
    stored.add(b"b", now=1.0)
    stored.add(b"a", now=2.0)  # renewed: now the newest
    stored.add(b"c", now=3.0)  # evicts b, not a
    assert stored.contains(b"a", 3.0)
    assert not stored.contains(b"b", 3.0)
