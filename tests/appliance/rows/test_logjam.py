"""Logjam's mapping (appliance/rows/logjam.py): one data message, one row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from appliance.protocols.logjam import LogjamReceiver, pack_meta
from appliance.rows.logjam import message_block

APP_ENV = b"shop-production"
TOPIC = b"logs.shop.production"


def decoded(record: dict[str, Any], **meta_fields: Any) -> Any:
    frames = [APP_ENV, TOPIC, json.dumps(record).encode(), pack_meta(**meta_fields)]
    return LogjamReceiver().receive_pull(frames)


def test_message_block_maps_a_message_to_one_row() -> None:
    event = decoded({"host": "web1", "started_ms": 1795341600123, "n": 1},
                    created_ms=1795341600999, sequence=5, device=2)  # fmt: skip
    block = message_block(event, source="web1-key", peer="10.0.0.7", received_at_ns=17)
    assert (block.protocol, block.tag, block.host, block.source, block.peer) == (
        "logjam", "logs.shop.production", "web1", "web1-key", "10.0.0.7"
    )  # fmt: skip
    assert block.times_ns == [1795341600123 * 1_000_000]
    assert block.batch_id == event.batch_id
    assert json.loads(block.records[0]) == {
        "host": "web1", "started_ms": 1795341600123, "n": 1,
        "_logjam": {"app_env": "shop-production", "device": 2, "sequence": 5,
                    "created_ms": 1795341600999},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("record", "created_ms", "expected_ms"),
    [
        ({}, 1795341600999, 1795341600999),
        ({"started_ms": "1795341600123"}, 1795341600999, 1795341600999),
        ({"started_ms": True}, 1795341600999, 1795341600999),
        ({"started_ms": -5}, 1795341600999, 1795341600999),
        ({}, 0, None),
        ({}, 2**64 - 1, None),
        ({"started_ms": 2**62}, 0, None),
    ],
)
def test_event_time_is_started_ms_then_created_ms_then_receive_time(
    record: dict[str, Any], created_ms: int, expected_ms: int | None
) -> None:
    block = message_block(decoded(record, created_ms=created_ms), source="s", peer="",
                          received_at_ns=1)  # fmt: skip
    assert block.times_ns == [None if expected_ms is None else expected_ms * 1_000_000]


@pytest.mark.parametrize("host", [None, 7, "", ["a"]])
def test_host_only_when_a_string(host: Any) -> None:
    block = message_block(decoded({"host": host}), source="s", peer="", received_at_ns=1)
    assert block.host is None
