"""Every fuzz target's seed corpus runs through its target without atheris.

The seeds (fuzz/make_corpus.py) are valid exchanges of each protocol and the
hostile inputs a review of the codecs found; each runs through the target's ``run_one``:
the codec, the session's event-to-row mapping, ``check_block``,
``blocks_to_arrow`` and the live tail's rendering. Any exception other than
the peer's protocol error or a refused block fails the test, as it would
stop the fuzzer.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

import fuzz.harness as harness
from appliance.blocks.block import RowBlock
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.proxy import MAX_V2_PAYLOAD_BYTES, ProxyHeaderReader
from appliance.server.connection import Action, Arrival, Close
from appliance.server.transports.stream import ByteStreamSession

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
TARGETS = harness.TARGETS


def target(name: str) -> ModuleType:
    return importlib.import_module(f"fuzz.fuzz_{name}")


def seeds(name: str) -> list[Path]:
    return sorted((FUZZ_DIR / "corpus" / name).iterdir())


@pytest.mark.parametrize("name", TARGETS)
def test_seed_corpus_runs_through_its_target(name: str) -> None:
    files = seeds(name)
    assert len(files) >= 10, f"fuzz/corpus/{name} holds {len(files)} seeds: run fuzz/make_corpus.py"
    run_one = target(name).run_one
    for path in files:
        try:
            run_one(path.read_bytes())
        except Exception as exc:
            pytest.fail(f"fuzz/corpus/{name}/{path.name}: {type(exc).__name__}: {exc}")


@pytest.fixture
def rows_stored(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the rows every target's check_rows accepts."""
    counts = {"rows": 0}
    real = harness.check_rows

    def counting(block: RowBlock) -> bool:
        ok = real(block)
        counts["rows"] += block.rows if ok else 0
        return ok

    monkeypatch.setattr(harness, "check_rows", counting)
    for name in TARGETS:
        module = target(name)
        if hasattr(module, "check_rows"):
            monkeypatch.setattr(module, "check_rows", counting)
    return counts


@pytest.mark.parametrize(
    ("name", "seed", "rows"),
    [
        ("forward", "forward", 2),
        ("forward", "compressed-multi-member.split", 4),
        ("forward", "json-forward.bytewise", 3),
        # The handshake seeds pass the session's real PING check, then store rows.
        ("forward", "handshake-shared-key", 3),
        ("forward", "handshake-users.bytewise", 3),
        ("forward", "handshake-accept-any", 3),
        ("forward", "handshake-bad-digest", 0),
        ("forward", "hostile-tag-not-utf8", 0),
        ("lumberjack", "v2-window.split", 3),
        ("lumberjack", "v1-window.bytewise", 2),
        ("lumberjack", "hostile-timestamp-go-zero", 1),
        ("courier", "evnt.bytewise", 4),
        ("courier", "hostile-hello-9", 0),
        ("logjam", "router-request", 1),
        ("logjam", "zlib", 1),
        ("logjam", "router-ping", 0),
        ("websocket", "ingest", 3),
        ("websocket", "hostile-time-superscript", 0),
        # The write-ahead log: blocks decoded from records; a flipped body
        # loses its record only; bodies that are not blocks are refused.
        ("wal", "segment", 5),
        ("wal", "segment.split", 5),
        ("wal", "body-flip.recover", 3),
        ("wal", "header-flip", 3),
        ("wal", "not-blocks", 3),
    ],
)
def test_seeds_reach_the_rows(name: str, seed: str, rows: int, rows_stored: dict[str, int]) -> None:
    """The harness is not vacuous: valid seeds become rows, hostile ones none."""
    target(name).run_one((FUZZ_DIR / "corpus" / name / seed).read_bytes())
    assert rows_stored["rows"] == rows


class _Session(ByteStreamSession):
    """A session whose receive raises ``error``, or closes the connection without one."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.reads = 0

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return [Close("bad", b"x")]


def test_drive_takes_a_close_as_the_end_of_the_connection() -> None:
    session = _Session()
    harness.drive(session, [b"a", b"b"])
    assert session.reads == 1


def test_drive_lets_any_other_exception_through() -> None:
    with pytest.raises(KeyError):
        harness.drive(_Session(KeyError("bug")), [b"a"])


def test_check_rows_refuses_a_block_the_writer_would_refuse() -> None:
    block = RowBlock(
        protocol="forward", source="anonymous", peer=harness.PEER,
        received_at_ns=harness.RECEIVED_AT_NS, batch_id=None, tag="a\ud800", host=None,
        times_ns=[None], records=["{}"],
    )  # fmt: skip
    assert harness.check_rows(block) is False


@pytest.mark.parametrize(
    ("seed", "client"),
    [
        ("v1-spec-example", "192.168.0.1:56324"),
        ("v1-tcp6.bytewise", "[2001:db8::1]:40000"),
        ("v2-tcp4.split", "192.168.0.1:56324"),
        ("v2-crc32c", "[2001:db8::1]:40000"),
        ("v2-tlvs", "192.168.0.1:56324"),
        ("v2-local", None),
        ("v1-unknown", None),
        ("v1-leading-zero-port", "error"),
        ("v2-crc32c-wrong", "error"),
        ("small-limits-v2-tlvs", "error"),
        ("v2-truncated", "incomplete"),
    ],
)
def test_proxy_seeds_reach_a_header(seed: str, client: str | None) -> None:
    """The PROXY target is not vacuous: valid seeds name their client, hostile ones fail."""
    fuzz = harness.FuzzInput.parse((FUZZ_DIR / "corpus" / "proxy" / seed).read_bytes())
    small = fuzz.has(harness.SMALL_LIMITS)
    limit = target("proxy").SMALL_V2_PAYLOAD_BYTES if small else MAX_V2_PAYLOAD_BYTES
    reader = ProxyHeaderReader(max_v2_payload_bytes=limit)
    try:
        header = next((h for h in map(reader.receive, fuzz.reads()) if h is not None), None)
    except RemoteProtocolError:
        assert client == "error"
        return
    if header is None:
        assert client == "incomplete"
        return
    assert (str(header.source) if header.source else None) == client


@pytest.mark.parametrize(
    ("seed", "fast"),
    [
        ("plain", True),
        ("plain-gzip", True),
        ("nested", True),
        ("unicode", True),
        ("plain-small-limits", False),  # 20 events over a limit of 8: the violation
        ("timestamp-key", False),
        ("int-key", False),
        ("size-too-small", False),
    ],
)
def test_forward_fast_seeds_reach_both_paths(seed: str, fast: bool) -> None:
    """The differential target is not vacuous: its plain seeds take the fast path."""
    data = (FUZZ_DIR / "corpus" / "forward_fast" / seed).read_bytes()
    assert target("forward_fast").took_fast_path(data) is fast


def test_every_list_of_targets_names_the_same_targets() -> None:
    """harness.TARGETS, make_corpus's seeds, the Makefile's FUZZ_TARGETS and the modules agree."""
    from fuzz import make_corpus

    assert tuple(make_corpus.TARGETS) == TARGETS
    makefile = (FUZZ_DIR.parent / "Makefile").read_text(encoding="utf-8")
    (line,) = [ln for ln in makefile.splitlines() if ln.startswith("fuzz: FUZZ_TARGETS ?=")]
    assert tuple(line.split("?=", 1)[1].split()) == TARGETS
    assert sorted(p.stem.removeprefix("fuzz_") for p in FUZZ_DIR.glob("fuzz_*.py")) == sorted(
        TARGETS
    )
