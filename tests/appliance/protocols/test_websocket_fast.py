"""parse_ingest's column-at-a-time events (``_events_fast``) against the event-by-event loop.

The fast path must give the same message for every input the loop takes and
the same refusal (reason and id) for every input it refuses
(appliance/protocols/websocket_messages.py, ``_events_fast``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.blocks.timecache import Rfc3339Cache
from appliance.protocols import websocket_messages
from appliance.protocols.websocket_messages import (
    IngestMessage,
    MessageError,
    MessageLimits,
    parse_ingest,
)

LIMITS = MessageLimits(max_message_bytes=1_000_000, max_events_per_message=50)

_STAMPS = st.sampled_from(
    [
        "2026-11-22T10:00:07.123Z",
        "2026-11-22T10:00:07Z",
        "2026-11-22T10:00:07.Z",
        "2026-11-22T10:00:07.1234567891Z",
        "2026-02-30T10:00:07.5Z",
        "2262-04-11T23:47:16.854775808Z",
        "1677-09-21T00:12:43.145224192Z",
        "2026-11-22t10:00:07Z",
        "2026-11-22T10:00:07+02:00",
        "2026-11-22T10:00:0²Z",
        "",
        "yesterday",
    ]
)
_TIMES = (
    _STAMPS
    | st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False,
    allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)  # fmt: skip
_EVENT = (
    st.fixed_dictionaries(
        {}, optional={"time": _TIMES, "record": _JSON | st.dictionaries(st.text(max_size=5), _JSON)}
    )
    | _JSON
)


def _general(text: str, monkeypatch: pytest.MonkeyPatch) -> IngestMessage | tuple[str, object]:
    with monkeypatch.context() as patch:
        patch.setattr(websocket_messages, "_events_fast", lambda *args: None)
        return _outcome(text, None)


def _outcome(text: str, cache: Rfc3339Cache | None) -> IngestMessage | tuple[str, object]:
    try:
        return parse_ingest(text, LIMITS, cache)
    except MessageError as exc:
        return exc.reason, exc.message_id


@settings(max_examples=600, deadline=None)
@given(st.lists(_EVENT, max_size=8), st.booleans())
def test_the_fast_path_gives_the_general_path_s_message_or_refusal(
    events: list[Any], warm: bool
) -> None:
    text = json.dumps({"id": "m", "tag": "t", "events": events})
    cache = Rfc3339Cache()
    if warm:
        _outcome(text, cache)  # the second parse reads the cache
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = _general(text, monkeypatch)
    assert _outcome(text, cache) == expected


def test_a_bad_time_after_good_ones_is_refused_with_its_index() -> None:
    events = [{"time": 1.5, "record": {}}, {"time": "2026-11-22T10:00:07Z", "record": {}},
              {"time": "never", "record": {}}]  # fmt: skip
    text = json.dumps({"id": "m", "tag": "t", "events": events})
    with pytest.raises(MessageError, match=r"events\[2\]\.time"):
        parse_ingest(text, LIMITS, Rfc3339Cache())


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("parser", ["orjson", "stdlib"])
@pytest.mark.parametrize(
    "record",
    [
        '{"a":1}',
        '{"k\u00e9y":"v\u00e4lue","n":[1,2.5,-0.0,1e300,true,null]}',
        '{"big":18446744073709551615}',  # uint64: orjson writes it back as is
        '{"bigger":18446744073709551616}',  # past 64 bits
        '{"lone":"\\ud800"}',  # stdlib's parser yields a lone surrogate
        '{"nan":NaN,"inf":-Infinity}',  # stdlib's parser yields them; JSON has none
        '{"a":"\\u0000\\"\\\\"}',
        _nested(250),
        _nested(260),  # past orjson's limit for writing, within its parser's
    ],
)
def test_records_orjson_writes_without_options_keep_the_general_path_s_texts(
    record: str, parser: str
) -> None:
    text = (
        '{"id":"m","tag":"t","events":['
        + ",".join([f'{{"record":{record}}}', '{"record":{"b":2}}'] * 5)
        + "]}"
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        if parser == "stdlib":
            monkeypatch.setattr(websocket_messages, "_json_loads", json.loads)
        expected = _general(text, monkeypatch)
        assert _outcome(text, Rfc3339Cache()) == expected
