"""Regression tests for the inputs that once took the appliance down.

Two kinds, one test each:

* ``hostile/...``: the hostile inputs a review of the codecs found,
  reproduced against 65b6c94 by hand, kept as seeds in
  ``fuzz/corpus/<target>/hostile-*``. Each now ends
  its own connection (or falls back per field) and stores what the test says.
* ``found/...``: every input the fuzzer reported, kept in
  ``fuzz/crashes/<target>/`` (fuzz/README.md lists each with the codec and
  the traceback it gave). Each must now run through its target without an
  escaping exception.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import fuzz.harness as harness
from appliance.blocks.block import RowBlock
from appliance.protocols.websocket_messages import MessageError, parse_target

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
TARGETS = harness.TARGETS

#: The review's hostile inputs: (target, seed) -> rows stored.
HOSTILE: dict[tuple[str, str], int] = {
    # forward: a str tag that is not UTF-8, lone surrogates in the JSON form,
    # a tag over MAX_TAG_BYTES, an empty chunk: refused, nothing stored.
    ("forward", "hostile-tag-not-utf8"): 0,
    ("forward", "hostile-json-tag-surrogate"): 0,
    ("forward", "hostile-json-chunk-surrogate"): 0,
    ("forward", "hostile-tag-long"): 0,
    ("forward", "hostile-chunk-empty"): 0,
    # forward: an entries stream that cannot be read whole is not acked or stored.
    ("forward", "hostile-gzip-unlabelled"): 0,
    ("forward", "hostile-entries-truncated"): 0,
    ("forward", "hostile-entries-invalid-byte"): 0,
    # forward with security: a PING then more than MAX_PING_BYTES in one read;
    # a PING hostname that is not UTF-8.
    ("forward", "hostile-ping-then-flood"): 0,
    ("forward", "hostile-ping-host-not-utf8"): 0,
    # Lumberjack: '²' and Go's zero time in @timestamp (stored, receive time);
    # a long tag field (stored, listener's tag); W 0 and empty C frames in a C frame.
    ("lumberjack", "hostile-timestamp-superscript"): 1,
    ("lumberjack", "hostile-timestamp-go-zero"): 1,
    ("lumberjack", "hostile-tag-long"): 1,
    ("lumberjack", "hostile-host-surrogate"): 0,
    ("lumberjack", "hostile-w0-in-c"): 0,
    ("lumberjack", "hostile-empty-nested-c"): 0,
    # Log Courier: HELO bodies of 9 and 19 bytes; odd @timestamp digits;
    # lone surrogates in type and host (stored with the fallbacks).
    ("courier", "hostile-hello-9"): 0,
    ("courier", "hostile-hello-19"): 0,
    ("courier", "hostile-timestamp-odd"): 3,
    ("courier", "hostile-type-host-surrogate"): 1,
    # Logjam: a lone-surrogate or long host (stored, null host); an app-env
    # that is not UTF-8 (400).
    ("logjam", "hostile-host-surrogate"): 1,
    ("logjam", "hostile-host-long"): 1,
    ("logjam", "hostile-app-env-not-utf8"): 0,
    # WebSocket: the shared time parser ('²', Go's zero time), lone surrogates.
    ("websocket", "hostile-time-superscript"): 0,
    ("websocket", "hostile-time-go-zero"): 0,
    ("websocket", "hostile-surrogates"): 0,
}


#: Findings not fixed yet (fuzz/README.md, "Findings"): input file -> the finding.
#: strict xfail: once the codec is fixed the test passes, and this entry must go.
OPEN: dict[str, str] = {}
_W1 = (
    "finding W1 (fixed in 63c575b): websocket_messages.parse_target let "
    "urlsplit's ValueError escape for a bracketed host that is not an IP address"
)
_REASONS = {"W1": _W1}


def found_crashes() -> list[object]:
    """The fuzzer's crash inputs kept in fuzz/crashes/<target>/ (one test each)."""
    found: list[object] = []
    for name in TARGETS:
        directory = FUZZ_DIR / "crashes" / name
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            open_finding = OPEN.get(path.name)
            marks = (
                [pytest.mark.xfail(raises=ValueError, strict=True, reason=_REASONS[open_finding])]
                if open_finding
                else []
            )
            found.append(pytest.param(name, path, marks=marks, id=f"found/{name}/{path.name}"))
    return found


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> list[RowBlock]:
    """The blocks every target's check_rows accepts."""
    blocks: list[RowBlock] = []
    real = harness.check_rows

    def keeping(block: RowBlock) -> bool:
        ok = real(block)
        if ok:
            blocks.append(block)
        return ok

    monkeypatch.setattr(harness, "check_rows", keeping)
    for name in TARGETS:
        module = importlib.import_module(f"fuzz.fuzz_{name}")
        if hasattr(module, "check_rows"):
            monkeypatch.setattr(module, "check_rows", keeping)
    return blocks


def run(name: str, path: Path) -> None:
    importlib.import_module(f"fuzz.fuzz_{name}").run_one(path.read_bytes())


@pytest.mark.parametrize(
    ("name", "seed", "rows"),
    [(name, seed, rows) for (name, seed), rows in HOSTILE.items()],
    ids=[f"hostile/{name}/{seed}" for name, seed in HOSTILE],
)
def test_hostile_input(name: str, seed: str, rows: int, stored: list[RowBlock]) -> None:
    run(name, FUZZ_DIR / "corpus" / name / seed)
    assert sum(b.rows for b in stored) == rows


def test_hostile_times_fall_back_to_the_receive_time(stored: list[RowBlock]) -> None:
    run("lumberjack", FUZZ_DIR / "corpus/lumberjack/hostile-timestamp-superscript")
    run("lumberjack", FUZZ_DIR / "corpus/lumberjack/hostile-timestamp-go-zero")
    run("courier", FUZZ_DIR / "corpus/courier/hostile-timestamp-odd")
    assert [list(b.times_ns) for b in stored] == [[None], [None], [None, None, None]]


def test_hostile_bad_fields_fall_back_per_field(stored: list[RowBlock]) -> None:
    run("lumberjack", FUZZ_DIR / "corpus/lumberjack/hostile-tag-long")
    run("courier", FUZZ_DIR / "corpus/courier/hostile-type-host-surrogate")
    run("logjam", FUZZ_DIR / "corpus/logjam/hostile-host-surrogate")
    lumberjack, courier, logjam = stored
    assert (lumberjack.tag, lumberjack.host) == ("lumberjack", None)
    assert (courier.tag, courier.host) == ("courier", None)
    assert logjam.host is None


@pytest.mark.parametrize(("name", "path"), found_crashes())
def test_fuzzer_finding(name: str, path: Path) -> None:
    run(name, path)


@pytest.mark.parametrize("target", ["//[x]/ingest", "http://[::1/tail", "//[0,2]/tail?tag=a"])
def test_w1_a_request_target_with_a_bad_bracketed_host_is_a_400(target: str) -> None:
    """h11 admits these targets (visible ASCII); the answer must be a 400, not a crash."""
    with pytest.raises(MessageError):
        parse_target(target)
