"""The decode budget (appliance/server/decode_budget.py) and the answering loop's use of it.

The budget alone, on trio's mock clock: what fits is taken at once, the rest
waits first come first served and at most ``wait_seconds``, a cost over the
capacity is refused at once, a cancelled wait keeps nothing. A grant: what
was prepaid first, then the budget if it has room now, else the request is
put off; on the event loop only a small allowance.

Then a forward listener on an in-memory stream (appliance/server/sessions/forward.py
with a budget in its ServiceContext): a request put off waits for room and
is acked once decoded, one that waits too long closes only its connection,
one that can never fit is refused before it is decoded, and a record over
``RECORD_MAX_BYTES`` of JSON is never stored.
"""

from __future__ import annotations

import gzip
import math
import struct
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from appliance import defaults
from appliance.config import ForwardListenerConfig
from appliance.protocols.decode_gate import Admit
from appliance.server.context import ServiceContext
from appliance.server.decode_budget import (
    LOOP_DECODE_MAX_COST_BYTES,
    DecodeBudget,
    DecodeGrant,
)
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.forward import forward_handler
from tests.appliance.lake.logcapture import logged
from tests.appliance.server.support import (
    StandInWriter,
    receive_exactly,
    receive_within,
    serving,
)

INFO = ConnectionInfo(listener="forward", address="192.0.2.7", port=4100, tls=True)
NOW = 1_700_000_000


# -- the budget ----------------------------------------------------------------------------------


def test_what_fits_is_taken_at_once_and_given_back() -> None:
    budget = DecodeBudget(100, wait_seconds=5)
    assert budget.try_take(60)
    assert budget.try_take(40)
    assert not budget.try_take(1)
    budget.release(40)
    assert budget.used == 60
    assert budget.try_take(40)


@pytest.mark.trio
async def test_waiters_are_served_first_come_first_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = DecodeBudget(100, wait_seconds=60)
    assert budget.try_take(100)
    order: list[str] = []

    async def wait(name: str, cost: int) -> None:
        assert await budget.acquire(cost) is None
        order.append(name)

    with trio.fail_after(600):  # a bug hangs, the test fails
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "big", 60)
            await trio.sleep(1)
            nursery.start_soon(wait, "small", 10)
            await trio.sleep(1)
            assert budget.waiting == 2
            # The small one would fit, but waits behind the big one; so would a newcomer.
            budget.release(30)
            await trio.sleep(1)
            assert order == []
            assert not budget.try_take(10)
            budget.release(30)  # 60 free: the big one's turn, and nothing left
            await trio.sleep(1)
            assert order == ["big"]
            budget.release(10)
    assert order == ["big", "small"]
    assert budget.used == 30 + 60 + 10  # what is still taken, and the two granted


@pytest.mark.trio
async def test_a_wait_is_bounded_and_then_says_why(autojump_clock: trio.testing.MockClock) -> None:
    budget = DecodeBudget(100, wait_seconds=30)
    assert budget.try_take(90)
    start = trio.current_time()
    with trio.fail_after(600):
        refusal = await budget.acquire(20)
    assert refusal is not None
    assert "decode budget busy: waited 30s for 20 bytes" in refusal
    assert trio.current_time() - start == pytest.approx(30)
    assert budget.used == 90  # nothing taken
    assert budget.waiting == 0


@pytest.mark.trio
async def test_a_waiter_that_gives_up_lets_those_behind_it_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = DecodeBudget(100, wait_seconds=30)
    assert budget.try_take(50)
    results: dict[str, str | None] = {}

    async def wait(name: str, cost: int) -> None:
        results[name] = await budget.acquire(cost)

    with trio.fail_after(600):  # a bug hangs, the test fails
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "too big for now", 80)
            await trio.sleep(10)
            nursery.start_soon(wait, "fits", 40)
    assert results["too big for now"] is not None
    assert results["fits"] is None
    assert budget.used == 90


@pytest.mark.trio
async def test_a_cost_over_the_capacity_is_refused_at_once() -> None:
    budget = DecodeBudget(100)
    with trio.fail_after(1):
        refusal = await budget.acquire(101)
    assert refusal is not None
    assert "more than the whole decode budget of 100 (decode_budget_bytes)" in refusal


@pytest.mark.trio
async def test_a_cancelled_wait_keeps_nothing(autojump_clock: trio.testing.MockClock) -> None:
    budget = DecodeBudget(100, wait_seconds=60)
    assert budget.try_take(100)
    results: list[str | None] = []

    async def wait(cost: int) -> None:
        results.append(await budget.acquire(cost))

    with trio.fail_after(600):  # a bug hangs, the test fails
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, 80)
            await trio.sleep(1)
            nursery.start_soon(wait, 30)
            await trio.sleep(1)
            assert budget.waiting == 2
            nursery.cancel_scope.cancel()
    assert budget.waiting == 0
    assert results == []
    budget.release(100)
    assert budget.used == 0


@pytest.mark.trio
async def test_a_waiter_cancelled_at_the_head_of_the_queue_lets_the_next_one_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = DecodeBudget(100, wait_seconds=60)
    assert budget.try_take(60)
    results: list[str | None] = []

    async def wait(cost: int) -> None:
        results.append(await budget.acquire(cost))

    with trio.fail_after(600):  # a bug hangs, the test fails
        async with trio.open_nursery() as outer, trio.open_nursery() as inner:
            inner.start_soon(wait, 90)  # waits at the head
            await trio.sleep(1)
            outer.start_soon(wait, 30)  # would fit, waits behind it
            await trio.sleep(1)
            assert results == []
            inner.cancel_scope.cancel()
    assert results == [None]
    assert budget.used == 90


def test_a_grant_uses_what_was_prepaid_then_what_is_free() -> None:
    budget = DecodeBudget(100)
    assert budget.try_take(30)
    grant = DecodeGrant(budget, prepaid=30)
    assert grant(20) is Admit.GO  # prepaid
    assert grant(10) is Admit.GO  # prepaid, all of it
    assert grant(50) is Admit.GO  # taken now
    assert budget.used == 80
    assert grant(30) is Admit.LATER  # 20 free: put off
    refusal = grant(101)
    assert isinstance(refusal, str)
    assert "more than the whole decode budget" in refusal
    grant.release()
    assert budget.used == 0


def test_a_grant_on_the_event_loop_has_a_small_allowance_and_never_takes() -> None:
    budget = DecodeBudget(LOOP_DECODE_MAX_COST_BYTES * 10)
    grant = DecodeGrant(budget, on_loop=True)
    assert grant(LOOP_DECODE_MAX_COST_BYTES // 2) is Admit.GO
    assert grant(LOOP_DECODE_MAX_COST_BYTES // 2) is Admit.GO
    assert grant(1) is Admit.LATER  # the rest goes to a worker thread, under the budget
    assert budget.used == 0
    assert DecodeGrant(None)(10**12) is Admit.GO  # no budget: nothing is counted


@pytest.mark.trio
async def test_a_grant_does_not_jump_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    budget = DecodeBudget(100, wait_seconds=60)
    assert budget.try_take(90)
    grant = DecodeGrant(budget)
    with trio.fail_after(600):  # a bug hangs, the test fails
        async with trio.open_nursery() as nursery:
            nursery.start_soon(budget.acquire, 50)  # a connection waits for room
            await trio.sleep(1)
            assert grant(1) is Admit.LATER  # 10 are free, but it waits first
            nursery.cancel_scope.cancel()
    assert grant(1) is Admit.GO
    grant.release()
    assert budget.used == 90


# -- a forward listener with a budget ------------------------------------------------------------


def event_time(seconds: int = NOW) -> msgpack.ExtType:
    return msgpack.ExtType(0, struct.pack(">II", seconds, 0))


def request(chunk: str, records: list[dict[str, Any]] | None = None, **option: Any) -> bytes:
    """A PackedForward request large enough (> 512 bytes) to be decoded in a worker thread."""
    records = records if records is not None else [{"i": i, "pad": "p" * 40} for i in range(20)]
    stream = b"".join(msgpack.packb([event_time(), r], use_bin_type=True) for r in records)
    if option.get("compressed") == "gzip":
        stream = gzip.compress(stream, mtime=0)
    return bytes(msgpack.packb(["app", stream, {"chunk": chunk, **option}], use_bin_type=True))


def ack(chunk: str) -> bytes:
    return bytes(msgpack.packb({"ack": chunk}))


def cost_of(data: bytes, kind: str = "packed") -> int:
    limits = ForwardListenerConfig()
    return defaults.forward_request_cost(
        len(data),
        kind,
        max_decompressed_bytes=limits.max_decompressed_bytes,
        max_events=limits.max_events_per_request,
    )


def handler(writer: StandInWriter, budget: DecodeBudget, lifecycle: Lifecycle | None = None) -> Any:
    """The forward listener's handler; the stream is closed when it returns (as a listener does)."""
    context = ServiceContext(writer, lifecycle or Lifecycle(), decode_budget=budget)  # type: ignore[arg-type]
    handle = forward_handler(ForwardListenerConfig(), context)

    async def closing(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        async with stream:
            await handle(stream, info)

    return closing


async def wait_for(predicate: Any, seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.01)


@pytest.mark.trio
async def test_a_request_put_off_waits_for_room_then_is_acked() -> None:
    data = request("c1")
    budget = DecodeBudget(cost_of(data) * 2, wait_seconds=30)
    assert budget.try_take(budget.capacity)  # someone else decodes
    writer = StandInWriter(resolve_empty=True)
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handler(writer, budget), INFO) as client:
            await client.send_all(data)
            await wait_for(lambda: budget.waiting == 1)
            assert writer.blocks == []  # nothing decoded while it waits
            budget.release(budget.capacity)
            await writer.wait_blocks(1)
            writer.commit(0)
            assert await receive_exactly(client, len(ack("c1"))) == ack("c1")
            await wait_for(lambda: budget.used == 0)  # given back once the rows were made
            await client.aclose()


@pytest.mark.trio
async def test_requests_of_one_read_are_decoded_in_turn_within_the_budget() -> None:
    first, second = request("c1"), request("c2")
    budget = DecodeBudget(cost_of(first) + cost_of(second) // 2, wait_seconds=30)
    writer = StandInWriter()
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handler(writer, budget), INFO) as client:
            await client.send_all(first + second)  # one read: the second does not fit beside
            await writer.wait_blocks(2)
            writer.commit(0)
            writer.commit(1)
            both = ack("c1") + ack("c2")
            assert await receive_exactly(client, len(both)) == both
            await client.aclose()
    assert budget.used == 0


@pytest.mark.trio
async def test_a_request_that_waits_too_long_closes_only_its_connection() -> None:
    budget = DecodeBudget(cost_of(request("x")) * 2, wait_seconds=0.5)
    assert budget.try_take(budget.capacity)
    writer = StandInWriter(resolve_empty=True)
    other = ConnectionInfo(listener="forward", address="192.0.2.8", port=4200, tls=True)
    handle = handler(writer, budget)
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handle, INFO) as client, serving(handle, other) as good:
            await client.send_all(request("late"))
            # A small request (decoded on the event loop, outside the budget) goes on.
            small = msgpack.packb(["app", NOW, {"ok": 1}, {"chunk": "small"}])
            await good.send_all(small)
            await writer.wait_blocks(1)
            writer.commit(0)
            assert await receive_exactly(good, len(ack("small"))) == ack("small")
            # The waiting one is closed with the reason: no ack, nothing stored.
            assert await receive_within(client, 5) == b""
            assert [b.batch_id for b in writer.blocks] == ["small"]
            await good.aclose()
    budget.release(budget.capacity)
    assert budget.used == 0


@pytest.mark.trio
async def test_a_request_that_can_never_fit_is_refused_before_it_is_decoded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = request("bomb", compressed="gzip")  # counted as inflating to 64 MiB
    budget = DecodeBudget(cost_of(data, "packed") * 4, wait_seconds=30)
    assert cost_of(data, "compressed") > budget.capacity
    writer = StandInWriter()
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handler(writer, budget), INFO) as client:
            await client.send_all(data)
            assert await receive_within(client, 5) == b""  # closed, nothing acked
    assert writer.blocks == []
    assert budget.used == 0
    (line,) = logged(caplog, "protocol.error")
    assert "more than the whole decode budget" in line["reason"]


@pytest.mark.trio
async def test_a_stop_ends_the_wait_for_the_budget() -> None:
    budget = DecodeBudget(cost_of(request("x")) * 2, wait_seconds=math.inf)
    assert budget.try_take(budget.capacity)
    lifecycle = Lifecycle()
    writer = StandInWriter()
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handler(writer, budget, lifecycle), INFO) as client:
            await client.send_all(request("waiting"))
            await wait_for(lambda: budget.waiting == 1)
            lifecycle.stop_reading()
            assert await receive_within(client, 5) == b""
    assert budget.waiting == 0
    assert writer.blocks == []


@pytest.mark.trio
async def test_a_record_over_the_record_limit_is_never_stored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Every protocol's rows pass the loop's check; here a forward record whose
    # JSON (310 bytes) is over a limit made small for the test.
    monkeypatch.setattr(defaults, "RECORD_MAX_BYTES", 200)
    writer = StandInWriter()
    data = request("big", [{"i": 1}, {"big": "b" * 300}])
    with trio.fail_after(30):  # a bug hangs, the test fails
        async with serving(handler(writer, DecodeBudget()), INFO) as client:
            await client.send_all(data)
            assert await receive_within(client, 5) == b""
    assert writer.blocks == []
    (line,) = logged(caplog, "block.refused")
    assert line["reason"] == (
        "a record of 310 bytes of JSON is over the limit of 200 (RECORD_MAX_BYTES)"
    )


# -- configuration -------------------------------------------------------------------------------


def test_the_budget_is_configured_and_must_hold_every_forward_listeners_largest_request() -> None:
    from appliance.config import ConfigError, parse_config
    from appliance.server.reload import plan_reload

    assert parse_config("").decode_budget_bytes == defaults.DECODE_BUDGET_BYTES
    config = parse_config("decode_budget_bytes = 3221225472\n")
    assert config.decode_budget_bytes == 3 * 1024**3
    # The defaults fit the default budget; a listener whose requests could not is refused.
    worst = defaults.forward_worst_request_cost(
        defaults.FORWARD_MAX_REQUEST_BYTES,
        defaults.FORWARD_MAX_DECOMPRESSED_BYTES,
        defaults.FORWARD_MAX_EVENTS_PER_REQUEST,
    )
    assert worst <= defaults.DECODE_BUDGET_BYTES
    with pytest.raises(ConfigError, match="raise decode_budget_bytes or lower those"):
        parse_config('[[listeners]]\nprotocol = "forward"\nmax_decompressed_bytes = 536870912\n')
    roomy = parse_config(
        'decode_budget_bytes = 8589934592\n[[listeners]]\nprotocol = "forward"\n'
        "max_decompressed_bytes = 536870912\n"
    )
    assert roomy.decode_budget_bytes == 8 * 1024**3
    # A running service keeps its budget: a change needs a restart.
    assert plan_reload(parse_config(""), config).restart_required == ["decode_budget_bytes"]
