"""appliance/protocols/bytescan.py: numpy's results are the stdlib's, byte for byte."""

from __future__ import annotations

import sys

import numpy  # noqa: F401  (loaded, as pyarrow loads it in the service: the vector path runs)
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.blocks.numpy_loaded import loaded_numpy
from appliance.protocols import bytescan
from appliance.protocols.bytescan import VECTOR_MIN_BYTES, brackets, xor_mask

#: Bytes around "{" (0x7B) and "[" (0x5B), and the ones that differ from them in one bit.
_NEAR = st.sampled_from(b'{[{[\x7a\x5a\x7c\x5c\x3b\x1b\xfb\xdb\x00\xff a"')
_BYTES = st.lists(_NEAR | st.integers(0, 255), max_size=3 * VECTOR_MIN_BYTES).map(bytes)
_TEXT = st.text(alphabet=st.sampled_from("{[]}az\"\\é\U0001f600\x7f{[") | st.characters(),
                max_size=3 * VECTOR_MIN_BYTES)  # fmt: skip


def _without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytescan, "loaded_numpy", lambda: None)


def test_numpy_is_used_only_once_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert loaded_numpy() is sys.modules["numpy"]
    monkeypatch.delitem(sys.modules, "numpy")
    assert loaded_numpy() is None  # and it did not import it
    assert "numpy" not in sys.modules


@given(data=_BYTES, key=st.binary(min_size=4, max_size=4))
def test_xor_mask_matches_the_stdlib(data: bytes, key: bytes) -> None:
    vector = bytearray(data)
    xor_mask(vector, key)
    with pytest.MonkeyPatch.context() as patch:
        _without_numpy(patch)
        plain = bytearray(data)
        xor_mask(plain, key)
    assert vector == plain == bytes(b ^ key[i % 4] for i, b in enumerate(data))


@given(data=_BYTES)
def test_brackets_of_bytes(data: bytes) -> None:
    with pytest.MonkeyPatch.context() as patch:
        _without_numpy(patch)
        plain = brackets(data)
    assert brackets(data) == plain == data.count(b"{") + data.count(b"[")


@given(text=_TEXT)
def test_brackets_of_text(text: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        _without_numpy(patch)
        plain = brackets(text)
    assert brackets(text) == plain == text.count("{") + text.count("[")


def test_brackets_of_a_long_ascii_text() -> None:
    text = ('{"a":[1,{"b":"[x{"}],"c":"' + "z" * VECTOR_MIN_BYTES + '"}') * 3
    assert brackets(text) == brackets(text.encode()) == 15
