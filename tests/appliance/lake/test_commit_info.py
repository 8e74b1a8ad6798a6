"""Batch digests in commitInfo: written and read back alike, and garbage names nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from appliance.blocks.identity import DIGEST_BYTES, batch_digest
from appliance.lake.commit_info import (
    COMMIT_APP_ID_KEY,
    COMMIT_INFO_KEY,
    COMMIT_SEQUENCE_KEY,
    commit_metadata,
    read_commit_info,
)

texts = st.text(max_size=40)


@given(st.lists(st.tuples(texts, texts, texts), max_size=50), texts, st.integers(0, 2**62))
def test_what_a_commit_writes_is_what_is_read_back(
    keys: list[tuple[str, str, str]], app_id: str, sequence: int
) -> None:
    digests = [batch_digest(key) for key in keys]
    named = read_commit_info(7, commit_metadata(digests, app_id, sequence))
    assert named.digests == tuple(digests)
    assert (named.app_id, named.sequence, named.version) == (app_id, sequence, 7)


def test_digests_tell_the_parts_apart() -> None:
    """Length prefixes: moving a character from one part to the next changes the digest."""
    assert batch_digest(("forward", "ab", "c")) != batch_digest(("forward", "a", "bc"))
    assert batch_digest(("forward", "a", "b")) != batch_digest(("lumberjack", "a", "b"))
    assert len(batch_digest(("forward", "a", "b"))) == DIGEST_BYTES


@given(
    st.dictionaries(
        st.sampled_from([COMMIT_INFO_KEY, COMMIT_APP_ID_KEY, COMMIT_SEQUENCE_KEY, "other"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(), st.lists(st.integers())),
    )
)
def test_any_commit_info_is_read_without_error(info: dict[str, Any]) -> None:
    named = read_commit_info(3, info)
    assert all(len(d) == DIGEST_BYTES for d in named.digests)
    assert named.app_id is None or isinstance(named.app_id, str)
    assert named.sequence is None or type(named.sequence) is int


def test_a_damaged_digest_list_names_no_batch() -> None:
    assert read_commit_info(1, {COMMIT_INFO_KEY: "not base64!"}).digests == ()
    assert read_commit_info(1, {COMMIT_INFO_KEY: "AAAA"}).digests == ()  # 3 bytes
    assert read_commit_info(1, {COMMIT_SEQUENCE_KEY: True}).sequence is None
