"""Lumberjack's mapping (appliance/rows/lumberjack.py): one window, one block."""

from __future__ import annotations

from appliance.protocols.lumberjack import Window
from appliance.rows.lumberjack import window_block


def test_a_window_is_one_block_with_the_listener_s_tag_as_default() -> None:
    window = Window(
        version=2, sequences=[1, 2], texts=['{"a":1}', "{}"], tags=[None, "filebeat"],
        hosts=["web1", None], times_ns=[None, 5],
    )  # fmt: skip
    block = window_block(window, tag="beats", source="CN=b", peer="p:1", received_at_ns=3)
    assert (block.protocol, block.source, block.peer, block.received_at_ns, block.batch_id) == (
        "lumberjack", "CN=b", "p:1", 3, None
    )  # fmt: skip
    assert block.tag == ["beats", "filebeat"]
    assert block.host == ["web1", None]
    assert (block.times_ns, block.records) == ([None, 5], ['{"a":1}', "{}"])


def test_a_value_all_events_share_is_given_once() -> None:
    window = Window(
        version=2, sequences=[1, 2, 3], texts=["{}"] * 3, tags=["filebeat"] * 3,
        hosts=[None] * 3, times_ns=[None] * 3,
    )  # fmt: skip
    block = window_block(window, tag="beats", source="CN=b", peer="p:1", received_at_ns=3)
    assert (block.tag, block.host) == ("filebeat", None)
    none_tags = Window(version=2, sequences=[1, 2], texts=["{}"] * 2, tags=[None, None],
                       hosts=["h", "h"], times_ns=[None] * 2)  # fmt: skip
    block = window_block(none_tags, tag="beats", source="CN=b", peer="p:1", received_at_ns=3)
    assert (block.tag, block.host) == ("beats", "h")
    # Tags that agree are one value; hosts that differ stay one per row.
    per_row = window_block(
        Window(version=2, sequences=[1, 2], texts=["{}"] * 2, tags=["beats", "beats"],
               hosts=["h", None], times_ns=[None] * 2),
        tag="beats", source="CN=b", peer="p:1", received_at_ns=3,
    )  # fmt: skip
    assert per_row.tag == "beats"
    assert per_row.host == ["h", None]
