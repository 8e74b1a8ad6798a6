"""Log Courier's mapping (appliance/rows/courier.py): one payload, one block."""

from __future__ import annotations

from appliance.protocols.courier import PayloadReceived
from appliance.rows.courier import payload_block

NONCE = bytes(range(16))


def payload(types: list[str | None], hosts: list[str | None]) -> PayloadReceived:
    n = len(types)
    return PayloadReceived(NONCE, "JDAT", ["{}"] * n, types, hosts, [None] * n,
                           content_digest=b"\x01" * 8)  # fmt: skip


def test_columns_the_same_for_every_row_are_given_once() -> None:
    block = payload_block(payload([None, None], [None, None]), tag="courier", source="s",
                          peer="p", received_at_ns=1)  # fmt: skip
    assert (block.protocol, block.tag, block.host, block.rows) == ("courier", "courier", None, 2)
    assert block.batch_id == NONCE.hex() + ":" + "01" * 8


def test_event_types_are_tags_and_the_listener_s_tag_fills_in() -> None:
    block = payload_block(payload(["nginx", None], ["web1", None]), tag="courier", source="s",
                          peer="p", received_at_ns=1)  # fmt: skip
    assert block.tag == ["nginx", "courier"]
    assert block.host == ["web1", None]
