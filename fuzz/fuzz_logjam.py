"""Fuzz target: Logjam (ZeroMQ frame lists), through ``LogjamReceiver`` and ``message_block``.

Run: ``python fuzz/fuzz_logjam.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; the payload is one message, its
frames separated by ``harness.FRAME_SEPARATOR`` (at most
``MAX_MESSAGE_FRAMES + 1`` frames: the driver's pump reads no more). The
target does what ``LogjamSession.receive`` does with a message: the decode-size
bound, the decode, then the 400, the ping's 200, or the row
(``message_block``) through the row checks, and the 202 for a request. Flag
bits:

* ``0x01`` the ROUTER socket (the first frame is the routing id), else PULL;
* ``0x02`` frames are ``memoryview`` (as the driver passes libzmq's buffers);
* ``0x04`` the peer authenticated with a CURVE key (``source`` is its name).

The driver catches ``MalformedMessage`` (it carries the 400): any other
exception from the decoder, a bare ``RemoteProtocolError`` included, is a
finding here (in the service it is a ``message.failed`` with no reply).

Limits: the listener's defaults, but 1 MiB decompressed; with
``SMALL_LIMITS`` a 128-byte body, 1 KiB decompressed, 8 JSON containers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.config import LogjamListenerConfig, settings_from
    from appliance.protocols.logjam import (
        MAX_MESSAGE_FRAMES,
        FrameData,
        LogjamLimits,
        LogjamReceiver,
        MalformedMessage,
        Ping,
        accepted_frames,
        pong_frames,
    )
    from appliance.rows.logjam import message_block
    from fuzz.harness import (
        RECEIVED_AT_NS,
        SMALL_LIMITS,
        FuzzInput,
        check_rows,
        fuzz_main,
        split_frames,
    )

ROUTER: Final = 0x01
MEMORYVIEW: Final = 0x02
CURVE: Final = 0x04

#: ZeroMQ's Peer-Address of the message (a bare address).
PEER: Final = "192.0.2.7"
#: The CURVE key's name (the ZAP user id) with ``CURVE``.
CURVE_USER: Final = "fuzz-agent"
FQDN: Final = "appliance.fuzz"

_DEFAULT: Final = settings_from(
    LogjamListenerConfig(max_decompressed_bytes=1024 * 1024), LogjamLimits
)
_SMALL: Final = settings_from(
    LogjamListenerConfig(
        max_body_bytes=128,
        max_message_bytes=128,
        max_decompressed_bytes=1024,
        max_json_containers=8,
    ),
    LogjamLimits,
)


def _frame_list(frames: Sequence[bytes]) -> list[bytes]:
    result = list(frames)
    assert all(isinstance(f, bytes) for f in result), result
    return result


def run_one(data: bytes) -> None:
    """One message through the Logjam decoder, its row and Arrow (fuzz/harness.py)."""
    fuzz = FuzzInput.parse(data)
    receiver = LogjamReceiver(_SMALL if fuzz.has(SMALL_LIMITS) else _DEFAULT)
    router = fuzz.has(ROUTER)
    raw = split_frames(fuzz.payload, MAX_MESSAGE_FRAMES + 1)
    frames: list[FrameData] = [memoryview(f) for f in raw] if fuzz.has(MEMORYVIEW) else list(raw)
    bound = receiver.decode_size_bound(frames, router=router)
    assert isinstance(bound, int), type(bound)
    assert bound >= 0, bound
    try:
        event = receiver.receive_router(frames) if router else receiver.receive_pull(frames)
    except MalformedMessage as exc:
        if exc.reply_frames is not None:
            _frame_list(exc.reply_frames)
        return
    if isinstance(event, Ping):
        assert router
        _frame_list(pong_frames(event.route, FQDN))
        return
    source = CURVE_USER if fuzz.has(CURVE) else "anonymous"
    block = message_block(event, source=source, peer=PEER, received_at_ns=RECEIVED_AT_NS)
    if check_rows(block) and event.route is not None and event.route.reply:
        _frame_list(accepted_frames(event.route))


if __name__ == "__main__":
    fuzz_main(run_one)
