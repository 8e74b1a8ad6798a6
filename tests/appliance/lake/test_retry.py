"""appliance/lake/retry.py: backoff, the classifier on real object_store messages, the loops.

The loops run on trio's MockClock (``autojump_clock``): the backoff sleeps
take no real time, and the delays are checked against the clock, not a
stopwatch. The messages are what deltalake 1.x raised through the fault
proxy (tests/fleet/faultproxy.py) in front of moto's S3 server.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError

from appliance.lake.errors import AppIdInUse, CommitError, LakeError
from appliance.lake.retry import (
    STORE_DEFAULTS,
    Backoff,
    Misconfigured,
    Phase,
    RetriesExhausted,
    classify,
    describe,
    is_transient,
    retrying,
    retrying_async,
    store_options,
)
from tests.appliance.lake.logcapture import logged

_ARROW = "\x1b[31m↳\x1b[0m"
_GET = "Error performing GET http://127.0.0.1:4242/lake-1?list-type=2&prefix=events%2F_delta_log%2F"


def _s3(*lines: str) -> str:
    """An object_store message as deltalake renders it: one cause a line, with colour."""
    return "Generic S3 error\n" + "\n".join(
        f"{' ' * (10 + i)}{_ARROW} {line}" for i, line in enumerate(lines)
    )


def _status(status: str, code: str) -> str:
    return _s3(
        "Error performing list request",
        f"{_GET} in 235.46ms, after 2 retries, max_retries",
        "2, retry_timeout",
        "5s  - Server returned non-2xx status code",
        status,
        '<?xml version="1.0" encoding="UTF-8"?>',
        f"<Error><Code>{code}</Code><Message>m</Message></Error>",
    )


def _transport(cause: str) -> str:
    return _s3(
        "Error performing list request",
        f"{_GET} in 6.1s, after 1 retries, max_retries",
        "2, retry_timeout",
        "5s  - HTTP error",
        "error sending request",
        cause,
    )


FORBIDDEN = _status("403 Forbidden", "AccessDenied")
NO_BUCKET = _status("404 Not Found", "NoSuchBucket")
SLOWDOWN = _status("503 Service Unavailable", "SlowDown")
INTERNAL = _status("500 Internal Server Error", "InternalError")
TIMEOUT = _transport("operation timed out")
RESET = _transport("Connection reset by peer (os error 104)")


def wrapped(message: str, kind: type[LakeError] = LakeError) -> LakeError:
    """A lake error raised from deltalake's OSError, as table.py raises them."""
    try:
        try:
            raise OSError(message)
        except OSError as exc:
            raise kind(f"cannot read recent batch ids: Kernel error -> {exc}") from exc
    except LakeError as error:
        return error


# -- backoff -------------------------------------------------------------------------------


def test_backoff_ceiling_grows_exponentially_up_to_its_cap() -> None:
    backoff = Backoff(initial_seconds=0.5, max_seconds=30.0, multiplier=2.0)
    assert [backoff.ceiling(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.ceiling(10_000) == 30.0  # no overflow


def test_full_jitter_draws_below_the_ceiling_and_spreads() -> None:
    backoff = Backoff(initial_seconds=1.0, max_seconds=8.0)
    rng = random.Random(7)
    delays = [backoff.delay(4, rng) for _ in range(200)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 150  # spread, not one value
    assert Backoff(1.0, 8.0, full_jitter=False).delay(4) == 8.0


@pytest.mark.parametrize(
    "kwargs", [{"initial_seconds": 0.0}, {"initial_seconds": 5.0, "max_seconds": 1.0},
               {"multiplier": 0.5}]
)  # fmt: skip
def test_backoff_refuses_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)


# -- describe and classify -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (SLOWDOWN, "Generic S3 error: 503 Service Unavailable (SlowDown)"),
        (FORBIDDEN, "Generic S3 error: 403 Forbidden (AccessDenied)"),
        (NO_BUCKET, "Generic S3 error: 404 Not Found (NoSuchBucket)"),
        (TIMEOUT, "Generic S3 error: operation timed out"),
        (RESET, "Generic S3 error: Connection reset by peer (os error 104)"),
    ],
)
def test_describe_keeps_the_status_and_code_or_the_root_cause(message: str, reason: str) -> None:
    assert describe(wrapped(message)) == reason
    assert "\x1b" not in describe(wrapped(message))
    assert "127.0.0.1" not in describe(wrapped(message))  # no endpoint or bucket


def test_describe_of_a_plain_error_is_its_message() -> None:
    assert describe(PermissionError(13, "Permission denied")) == "[Errno 13] Permission denied"
    assert describe(LakeError("no Delta table at /x")) == "no Delta table at /x"


@pytest.mark.parametrize("message", [SLOWDOWN, INTERNAL, TIMEOUT, RESET])
@pytest.mark.parametrize("phase", ["start", "running"])
def test_5xx_slowdown_timeouts_and_resets_are_transient(message: str, phase: Phase) -> None:
    assert classify(wrapped(message), phase=phase).kind == "transient"
    assert classify(wrapped(message, CommitError), phase=phase).transient


@pytest.mark.parametrize(
    ("message", "names"), [(FORBIDDEN, "credentials"), (NO_BUCKET, "bucket does not exist")]
)
def test_a_refusal_at_start_is_a_misconfiguration_later_transient(message: str, names: str) -> None:
    at_start = classify(wrapped(message), phase="start")
    assert at_start.kind == "misconfigured"
    assert names in at_start.advice
    assert classify(wrapped(message), phase="running").kind == "transient"
    assert not is_transient(wrapped(message), phase="start")
    assert is_transient(wrapped(message))


def test_network_errno_is_transient_at_start_a_local_permission_is_not() -> None:
    assert is_transient(ConnectionResetError(104, "reset"), phase="start")
    assert is_transient(TimeoutError("timed out"), phase="start")
    denied = PermissionError(13, "Permission denied")
    assert classify(denied, phase="start").kind == "permanent"
    assert classify(denied, phase="running").kind == "transient"  # the disk may heal


def test_a_bad_option_stops_the_start() -> None:
    bad = OSError('Generic Config error\n  ↳ failed to parse "zz" as Duration')
    assert classify(bad, phase="start").kind == "permanent"


@pytest.mark.parametrize("phase", ["start", "running"])
def test_the_appliances_own_verdicts_are_permanent(phase: Phase) -> None:
    try:
        raise AppIdInUse("claimed at the same moment") from DeltaError("concurrent transaction")
    except AppIdInUse as exc:
        in_use = exc
    for error in (
        in_use,
        LakeError("no Delta table at s3://b/events"),  # no storage error in its chain
        LakeError("cannot evaluate the predicate"),
        DeltaProtocolError("unsupported reader features"),
    ):
        assert classify(error, phase=phase).kind == "permanent", error


def test_a_lost_race_is_transient() -> None:
    assert is_transient(CommitFailedError("Transaction conflict: concurrent append"))


def test_store_options_add_bounded_timeouts_for_object_storage_only() -> None:
    options = store_options("s3://b/events", {"AWS_REGION": "eu-west-1", "TIMEOUT": "90s"})
    assert options is not None
    assert options["AWS_REGION"] == "eu-west-1"
    assert options["TIMEOUT"] == "90s"  # the operator's wins
    assert "timeout" not in options
    assert {k: options[k] for k in STORE_DEFAULTS if k != "timeout"} == {
        k: v for k, v in STORE_DEFAULTS.items() if k != "timeout"
    }
    assert store_options("s3://b/events", None) == dict(STORE_DEFAULTS)
    assert store_options("/var/lib/appliance/lake/events", None) is None
    assert store_options("file:///x", {"a": "b"}) == {"a": "b"}


# -- the loops -----------------------------------------------------------------------------


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"done"``; records trio's clock per call."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(trio.current_time())
        if self.errors:
            raise self.errors.pop(0)
        return "done"


@pytest.mark.trio
async def test_retries_transient_failures_with_backoff_then_recovers(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    op = Flaky(wrapped(SLOWDOWN), wrapped(TIMEOUT), wrapped(FORBIDDEN))
    states: list[str | None] = []
    backoff = Backoff(1.0, 4.0, full_jitter=False)
    with caplog.at_level(logging.INFO):
        assert await retrying_async(op, what="batch ids", backoff=backoff,
                                    on_failure=states.append) == "done"  # fmt: skip
    gaps = [b - a for a, b in zip(op.calls, op.calls[1:], strict=False)]
    assert gaps == [1.0, 2.0, 4.0]  # on trio's clock: the ceilings without jitter
    assert states == [
        "Generic S3 error: 503 Service Unavailable (SlowDown)",
        "Generic S3 error: operation timed out",
        "Generic S3 error: 403 Forbidden (AccessDenied)",  # running: retried too
        None,
    ]
    retries = logged(caplog, "table.retry")
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert [r["retry_in_seconds"] for r in retries] == [1.0, 2.0, 4.0]
    assert all(r["op"] == "batch ids" and r["reason"] for r in retries)
    assert logged(caplog, "table.recovered") == [
        {"op": "batch ids", "attempts": 4, "after_seconds": 7.0}
    ]


@pytest.mark.trio
async def test_jittered_delays_stay_under_the_cap(autojump_clock: trio.testing.MockClock) -> None:
    op = Flaky(*(wrapped(RESET) for _ in range(12)))
    await retrying_async(op, what="x", backoff=Backoff(0.5, 3.0), rng=random.Random(3))
    gaps = [b - a for a, b in zip(op.calls, op.calls[1:], strict=False)]
    assert len(gaps) == 12
    assert all(0 <= g <= 3.0 for g in gaps)


@pytest.mark.trio
async def test_a_first_success_logs_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    states: list[str | None] = []
    with caplog.at_level(logging.INFO):
        assert await retrying_async(Flaky(), what="x", on_failure=states.append) == "done"
    assert states == []
    assert not logged(caplog, "table.retry")
    assert not logged(caplog, "table.recovered")


@pytest.mark.trio
async def test_a_refusal_at_start_stops_naming_the_misconfiguration(
    autojump_clock: trio.testing.MockClock,
) -> None:
    op = Flaky(wrapped(SLOWDOWN), wrapped(NO_BUCKET))
    with pytest.raises(Misconfigured) as caught:
        await retrying_async(op, what="opening the table s3://lake-1/events", phase="start")
    message = str(caught.value)
    assert message.startswith("opening the table s3://lake-1/events: the bucket does not exist")
    assert "NoSuchBucket" in message
    assert len(op.calls) == 2  # the 503 was retried, the 404 was not


@pytest.mark.trio
async def test_the_phase_is_read_at_each_failure(autojump_clock: trio.testing.MockClock) -> None:
    phases: Iterator[Phase] = iter(["running", "start"])
    op = Flaky(wrapped(FORBIDDEN), wrapped(FORBIDDEN))
    with pytest.raises(Misconfigured):
        await retrying_async(op, what="x", phase=lambda: next(phases))
    assert len(op.calls) == 2


@pytest.mark.trio
async def test_permanent_errors_are_raised_at_once_unchanged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    in_use = AppIdInUse("another appliance")
    states: list[str | None] = []
    op = Flaky(in_use)
    with pytest.raises(AppIdInUse) as caught:
        await retrying_async(op, what="x", on_failure=states.append)
    assert caught.value is in_use
    assert len(op.calls) == 1
    assert states == []
    with pytest.raises(ValueError, match="not storage"):  # outside STORAGE_ERRORS
        await retrying_async(Flaky(ValueError("not storage")), what="x")


@pytest.mark.trio
async def test_a_budget_gives_up_with_the_last_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    op = Flaky(*(wrapped(INTERNAL) for _ in range(100)))
    start = trio.current_time()
    assert start == 0.0
    with pytest.raises(RetriesExhausted) as caught:
        await retrying_async(op, what="compact", backoff=Backoff(1.0, 10.0, full_jitter=False),
                             give_up_after_seconds=60.0)  # fmt: skip
    assert trio.current_time() - start <= 60.0  # no sleep past the budget
    # Attempts at 0, 1, 3, 7, 15, 25, 35, 45, 55 s; the next would come at 65 s.
    assert op.calls == [0.0, 1.0, 3.0, 7.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    assert caught.value.attempts == 9
    assert "500 Internal Server Error (InternalError)" in caught.value.reason
    assert str(caught.value).startswith("compact: still failing after 9 attempt(s)")
    assert isinstance(caught.value.__cause__, LakeError)


@pytest.mark.trio
async def test_cancellation_passes_through_the_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    op = Flaky(*(wrapped(RESET) for _ in range(100)))
    with trio.move_on_after(100) as scope:
        await retrying_async(op, what="x", backoff=Backoff(1.0, 30.0))
    assert scope.cancelled_caught


@pytest.mark.trio
async def test_retrying_runs_the_op_in_a_thread_under_the_limiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = trio.CapacityLimiter(1)
    seen: list[int] = []
    errors: list[BaseException] = [wrapped(TIMEOUT)]

    def op() -> int:
        seen.append(limiter.borrowed_tokens)
        if errors:
            raise errors.pop()
        return 42

    borrowed_between: list[int] = []

    def note(reason: str | None) -> None:
        borrowed_between.append(limiter.borrowed_tokens)

    assert await retrying(op, what="x", limiter=limiter, on_failure=note) == 42
    assert seen == [1, 1]  # each attempt held the token
    assert borrowed_between == [0, 0]  # and released it between attempts


def test_a_local_write_refused_names_the_file_and_the_fix() -> None:
    """deltalake's message for a read-only _delta_log, as deltalake 1.6 words it."""
    from appliance.lake.retry import describe

    message = (
        "Generic LocalFileSystem error\n          \x1b[31m↳\x1b[0m Unable to open file "
        "/srv/lake/events/_delta_log/00000000000000000001.json#1\n           \x1b[31m↳\x1b[0m "
        "Permission denied (os error 13)\n"
    )
    reason = describe(OSError(message))
    assert reason == (
        "Generic LocalFileSystem error: Permission denied (os error 13) "
        "(/srv/lake/events/_delta_log/00000000000000000001.json): the service may not "
        "write there; check the directory's owner and mode"
    )
