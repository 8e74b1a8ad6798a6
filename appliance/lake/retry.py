"""Retrying table operations through object-store failures: backoff, classification, the loop.

No transient storage failure ends a node (docs/fleet.md, "When the object
store fails"). Every operation on the table (the commit path, the batch-id
reads, lease renewals, maintenance and retention steps, opening the table
at start) runs through :func:`retrying` (a blocking call in a worker thread)
or :func:`retrying_async` (an async call), which:

* classifies each failure (:func:`classify`): *transient* (a timeout, a
  reset or refused connection, a 5xx answer, ``SlowDown``, object_store's
  ``Generic S3 error``: retried), *misconfigured* (only before the table has
  been opened once: the store refuses the credentials, ``403``, or the
  bucket does not exist, ``NoSuchBucket``: the service stops with a message
  that names it), or *permanent* (an error of the appliance's own, such as
  :class:`~appliance.lake.errors.AppIdInUse`, or an error that is not about
  storage at all: raised at once);
* waits a :class:`Backoff` delay (exponential, capped, full jitter) between
  attempts, on trio's clock, and optionally gives up after a budget of
  seconds (:class:`RetriesExhausted`);
* logs each failure, ``table.retry op=... attempt=... retry_in_seconds=...
  reason=...``, and the recovery, ``table.recovered op=... after_seconds=...``;
* tells the caller's readiness hook the reason at each failure and None once
  the operation succeeded (``on_failure``): ``/readyz`` says why the table is
  not OK meanwhile.

Once the node has opened its table, the answers that mean a misconfiguration
at start (``403``, ``NoSuchBucket``) are taken as transient: a store that
answered before and refuses now (a policy being rolled out, an expired
session token, a proxy's outage page) is retried, and readiness says why.

The storage client has its own timeouts and retries under these:
:func:`store_options` fills in bounded ones (:data:`STORE_DEFAULTS`) for a
table on object storage, so that a store that stops answering fails an
attempt within about half a minute instead of hanging it for minutes.
"""

from __future__ import annotations

import errno
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import trio
from deltalake.exceptions import DeltaError, DeltaProtocolError, SchemaMismatchError

from appliance import defaults
from appliance.blocks.errors import BlockRefused
from appliance.lake.errors import AppIdInUse, LakeError, TableSchemaError
from appliance.logs import get_logger

__all__ = [
    "DEFAULT_BACKOFF",
    "REASON_MAX_CHARS",
    "STORAGE_ERRORS",
    "STORE_DEFAULTS",
    "Backoff",
    "Failure",
    "FailureKind",
    "Misconfigured",
    "NotRetryable",
    "Phase",
    "RetriesExhausted",
    "classify",
    "describe",
    "is_transient",
    "retrying",
    "retrying_async",
    "store_options",
]

log = get_logger("lake")

_T = TypeVar("_T")

#: ``start``: the table has not been opened yet (a refusal is a misconfiguration);
#: ``running``: it has (the same refusal is retried).
Phase = Literal["start", "running"]
#: What a failure is: retried, a misconfiguration that stops the start, or raised at once.
FailureKind = Literal["transient", "misconfigured", "permanent"]

#: The exceptions the retry loops look at; anything else passes through untouched.
#: BlockRefused is listed (and classified permanent) because it was a LakeError
#: until it moved to the block vocabulary (docs/architecture.md#import-rules).
STORAGE_ERRORS: Final = (LakeError, BlockRefused, DeltaError, OSError)

#: The object-store client's timeouts and retries the appliance sets unless
#: ``[lake] storage_options`` does (keys of deltalake / object_store):
#: one request may take 30 s (connecting 5 s); a failed request is retried
#: by the client at most 3 times and not after 30 s from the first. A
#: store that answers nothing (a blackhole) thus fails an attempt after
#: about 30 s, not after object_store's own 3 minutes and 10 retries, and
#: the appliance's own backoff takes over.
STORE_DEFAULTS: Final[Mapping[str, str]] = {
    "timeout": "30s",
    "connect_timeout": "5s",
    "max_retries": "3",
    "retry_timeout": "30s",
}

#: Characters of a failure's reason kept for logs and ``/readyz``.
REASON_MAX_CHARS: Final = 300


class NotRetryable(LakeError):
    """An operation's own verdict that no retry can help: the retry loops raise it as it is."""


class Misconfigured(NotRetryable):
    """The store refused the table at start: wrong credentials, no such bucket, ... (stop)."""


class RetriesExhausted(NotRetryable):
    """An operation still failed when its budget of seconds ran out.

    Attributes:
        attempts: how many attempts were made.
        reason: why the last one failed (:func:`describe`).
    """

    def __init__(self, message: str, *, attempts: int, reason: str) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.reason = reason


# -- backoff ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and full jitter.

    The ``n``-th retry (``attempt`` = n, from 1) waits a delay drawn
    uniformly from ``[0, min(max_seconds, initial_seconds * multiplier **
    (n - 1))]`` (full jitter: nodes that failed together do not retry
    together), or exactly that ceiling with ``full_jitter = False``.

    Attributes:
        initial_seconds: the ceiling of the first delay.
        max_seconds: the cap on every delay.
        multiplier: the growth of the ceiling per attempt.
        full_jitter: draw each delay below its ceiling (else wait the ceiling).
    """

    initial_seconds: float = defaults.LAKE_RETRY_INITIAL_SECONDS
    max_seconds: float = defaults.LAKE_RETRY_MAX_SECONDS
    multiplier: float = 2.0
    full_jitter: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.initial_seconds <= self.max_seconds:
            raise ValueError("backoff: need 0 < initial_seconds <= max_seconds")
        if self.multiplier < 1:
            raise ValueError("backoff: multiplier must be at least 1")

    def ceiling(self, attempt: int) -> float:
        """The longest delay after failed attempt number ``attempt`` (from 1)."""
        exponent = max(attempt - 1, 0)
        # Capped before it can overflow: the ceiling stops growing at max_seconds.
        if exponent > 64:
            return self.max_seconds
        return min(self.max_seconds, self.initial_seconds * self.multiplier**exponent)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay after failed attempt number ``attempt``: jittered below its ceiling."""
        ceiling = self.ceiling(attempt)
        if not self.full_jitter:
            return ceiling
        return (rng or _RNG).uniform(0.0, ceiling)


#: The commit path's backoff: ``[lake] retry_initial_seconds`` / ``retry_max_seconds``'s defaults.
DEFAULT_BACKOFF: Final = Backoff()

#: Jitter only spreads retries in time; it needs no secret randomness.
_RNG: Final = random.Random()  # noqa: S311


# -- classification ---------------------------------------------------------------------

_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")
_STATUS: Final = re.compile(r"\b([1-5]\d\d) ([A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)*)")
_S3_CODE: Final = re.compile(r"<Code>([^<]{1,64})</Code>")
#: A local file the store could not open or write (a local path is no secret).
_LOCAL_FILE: Final = re.compile(
    r"(?:Unable to (?:open|access|write|create|rename|copy) file|Unable to [a-z]+) ([^\n#]+)"
)
#: OS errors that mean the service may not write there: the fix is the mode.
_NOT_PERMITTED: Final = re.compile(r"\(os error (?:1|13|30)\)")

#: Lower-case fragments of an object store's message that mean "it is not you, try again".
_TRANSIENT_TEXT: Final = (
    "timed out",
    "timeout",
    "connection reset",
    "connection refused",
    "connection closed",
    "connection aborted",
    "connection error",
    "error sending request",
    "broken pipe",
    "incomplete message",
    "unexpected eof",
    "dns error",
    "temporarily unavailable",
    "slowdown",
    "slow down",
    "serviceunavailable",
    "service unavailable",
    "internalerror",
    "internal server error",
    "bad gateway",
    "gateway timeout",
    "requesttimeout",
    "too many requests",
    "throttl",
    "generic s3 error",
    "generic gcs error",
    "generic microsoftazure error",
    "generic http error",
)
#: Fragments that mean the store refuses these credentials (a misconfiguration at start).
_CREDENTIAL_TEXT: Final = (
    "403 forbidden",
    "401 unauthorized",
    "accessdenied",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "invalidtoken",
    "expiredtoken",
)
#: Fragments that mean the bucket (or container) does not exist.
_BUCKET_TEXT: Final = ("nosuchbucket", "bucket does not exist", "containernotfound")
#: errno values of a network failure (an OSError raised with one is transient).
_TRANSIENT_ERRNOS: Final = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EAGAIN,
    }
)
#: The appliance's own errors that no retry can change.
_PERMANENT_TYPES: Final = (
    AppIdInUse,
    TableSchemaError,
    BlockRefused,
    NotRetryable,
    DeltaProtocolError,
    SchemaMismatchError,
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What :func:`classify` made of an exception.

    Attributes:
        kind: ``transient``, ``misconfigured`` or ``permanent``.
        reason: one line for logs and ``/readyz`` (:func:`describe`; never a secret).
        advice: for a misconfiguration, what to check (else empty).
    """

    kind: FailureKind
    reason: str
    advice: str = ""

    @property
    def transient(self) -> bool:
        """Whether the operation should be tried again."""
        return self.kind == "transient"


def _storage_cause(exc: BaseException) -> BaseException | None:
    """The deltalake or OS error in ``exc``'s chain of causes (``exc`` itself first)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (DeltaError, OSError)):
            return current
        current = current.__cause__
    return None


def describe(exc: BaseException) -> str:
    """A one-line reason for ``exc``: the store's status and error code, or the root cause.

    object_store's messages span lines (and carry colour codes): ``Generic
    S3 error`` / ``Error performing GET http://... in 1.2s, after 3 retries``
    / ``503 Service Unavailable`` / ``<Error><Code>SlowDown</Code>...``. This
    keeps ``Generic S3 error: 503 Service Unavailable (SlowDown)``, or for a
    transport failure ``Generic S3 error: operation timed out``. The request
    URL (endpoint, bucket, key) is left out, and no message of the store's
    carries the credentials.
    """
    storage = _storage_cause(exc) or exc
    text = _ANSI.sub("", str(storage))
    parts = [p.strip(" -:") for p in re.split(r"[\n↳]+", text)]
    parts = [p for p in parts if p and not p.startswith("<")]
    if not parts:
        return type(storage).__name__
    head = parts[0].split(" -> ")[-1]  # "Kernel error -> Generic S3 error"
    status = _STATUS.search(text)
    code = _S3_CODE.search(text)
    if status is not None:
        detail = f"{status.group(1)} {status.group(2)}"
        if code is not None:
            detail += f" ({code.group(1)})"
    else:
        detail = parts[-1]
        # The last part of "... - HTTP error / error sending request / ..." is the root cause.
        detail = detail.rsplit(" - ", 1)[-1]
    reason = head if detail == head or len(parts) == 1 else f"{head}: {detail}"
    local = _LOCAL_FILE.search(text) if "LocalFileSystem" in head else None
    if local is not None:
        reason += f" ({local.group(1).strip()})"
        if _NOT_PERMITTED.search(text):
            reason += ": the service may not write there; check the directory's owner and mode"
    return " ".join(reason.split())[:REASON_MAX_CHARS]


def classify(exc: BaseException, *, phase: Phase = "running") -> Failure:
    """Whether ``exc`` (from a table operation) is worth another attempt.

    * The appliance's own verdicts (another writer holds the app id, the
      table's schema is foreign, a block's data, a misconfiguration already
      found, a budget already spent) and Delta protocol or schema errors are
      permanent.
    * An error whose chain holds no deltalake or OS error is not about
      storage: permanent (a predicate that does not parse, a request that
      makes no sense).
    * At start (``phase = "start"``): a refusal of the credentials (``403``,
      ``AccessDenied``, ``InvalidAccessKeyId``, ...) or a missing bucket is
      a misconfiguration; timeouts, resets, 5xx, ``SlowDown``, object_store's
      ``Generic S3 error`` and network errno values are transient; anything
      else (an invalid option, a local directory that cannot be created) is
      permanent, and stops the start with its message.
    * Once running: every storage error is transient. The table worked a
      moment ago; what fails now (even a ``403`` or a full local disk) may
      heal, and ``/readyz`` says why meanwhile.
    """
    reason = describe(exc)
    if isinstance(exc, _PERMANENT_TYPES):
        return Failure("permanent", reason)
    storage = _storage_cause(exc)
    if storage is None or isinstance(storage, _PERMANENT_TYPES):
        return Failure("permanent", reason)
    if phase == "running":
        return Failure("transient", reason)
    text = _ANSI.sub("", str(storage)).lower()
    if any(fragment in text for fragment in _CREDENTIAL_TEXT):
        return Failure(
            "misconfigured", reason,
            "the object store refuses these credentials or this bucket to them: check "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in [lake] "
            "storage_options or the service's environment, the bucket's policy, and "
            "AWS_ENDPOINT_URL",
        )  # fmt: skip
    if any(fragment in text for fragment in _BUCKET_TEXT):
        return Failure(
            "misconfigured", reason,
            "the bucket does not exist: create it, or correct [lake] path (and "
            "AWS_ENDPOINT_URL / AWS_REGION in storage_options)",
        )  # fmt: skip
    if isinstance(storage, (TimeoutError, ConnectionError)) or (
        isinstance(storage, OSError) and storage.errno in _TRANSIENT_ERRNOS
    ):
        return Failure("transient", reason)
    if any(fragment in text for fragment in _TRANSIENT_TEXT):
        return Failure("transient", reason)
    return Failure("permanent", reason)


def is_transient(exc: BaseException, *, phase: Phase = "running") -> bool:
    """Whether ``exc`` is a transient storage failure (:func:`classify`)."""
    return classify(exc, phase=phase).transient


def store_options(uri: str, options: Mapping[str, str] | None) -> dict[str, str] | None:
    """``options`` with :data:`STORE_DEFAULTS` added for a table on object storage.

    A key the operator set (in any letter case) is kept as set; a local table
    gets ``options`` unchanged (None stays None, and the environment's
    ``AWS_*`` variables still apply with added keys).
    """
    if "://" not in uri or uri.startswith("file://"):
        return dict(options) if options else None
    merged = dict(options or {})
    given = {key.lower() for key in merged}
    for key, value in STORE_DEFAULTS.items():
        if key not in given:
            merged[key] = value
    return merged


# -- the retry loops -----------------------------------------------------------------------


async def retrying_async(
    fn: Callable[[], Awaitable[_T]],
    *,
    what: str,
    backoff: Backoff = DEFAULT_BACKOFF,
    on_failure: Callable[[str | None], None] | None = None,
    phase: Phase | Callable[[], Phase] = "running",
    give_up_after_seconds: float | None = None,
    rng: random.Random | None = None,
) -> _T:
    """``await fn()`` until it succeeds, retrying transient storage failures with ``backoff``.

    Args:
        fn: the operation; called again for each attempt, so it must be safe
            to repeat (every table operation of the appliance is: commits are
            idempotent through their app transaction).
        what: the operation's name in the logs (``op=``), e.g. ``"commit 42"``.
        backoff: the delays between attempts.
        on_failure: told the reason (:func:`describe`) after each failed
            attempt that will be retried, and None once an attempt succeeds
            after failures (a readiness hook: ``writer.failing``, the start's
            "opening" state). Never told about permanent errors.
        phase: ``start`` or ``running`` (:func:`classify`), or a function
            returning it at each failure.
        give_up_after_seconds: stop retrying once this many seconds (trio's
            clock) have passed since the first attempt: the last failure is
            raised as :class:`RetriesExhausted`. None: retry for ever.
        rng: the jitter's random source (tests pass a seeded one).

    Returns:
        What ``fn`` returned.

    Raises:
        Misconfigured: at start, the store refused the credentials or the
            bucket is missing (the message names it, and what to check).
        RetriesExhausted: the budget ran out (chained from the last error).
        LakeError | BlockRefused | DeltaError | OSError: a permanent error, as raised.
        BaseException: anything outside :data:`STORAGE_ERRORS` (cancellation
            included) passes through at once.
    """
    started = trio.current_time()
    attempt = 0
    while True:
        attempt += 1
        try:
            result = await fn()
        except STORAGE_ERRORS as exc:
            current = phase() if callable(phase) else phase
            failure = classify(exc, phase=current)
            if failure.kind == "misconfigured":
                raise Misconfigured(f"{what}: {failure.advice} ({failure.reason})") from exc
            if failure.kind == "permanent":
                raise
            elapsed = trio.current_time() - started
            delay = backoff.delay(attempt, rng)
            if give_up_after_seconds is not None and elapsed + delay > give_up_after_seconds:
                raise RetriesExhausted(
                    f"{what}: still failing after {attempt} attempt(s) in {elapsed:.1f}s: "
                    f"{failure.reason}",
                    attempts=attempt, reason=failure.reason,
                ) from exc  # fmt: skip
            log.warning(
                "table.retry", op=what, attempt=attempt, retry_in_seconds=round(delay, 3),
                reason=failure.reason, error=type(exc).__name__,
            )  # fmt: skip
            if on_failure is not None:
                on_failure(failure.reason)
            await trio.sleep(delay)
            continue
        if attempt > 1:
            log.info(
                "table.recovered", op=what, attempts=attempt,
                after_seconds=round(trio.current_time() - started, 3),
            )  # fmt: skip
            if on_failure is not None:
                on_failure(None)
        return result


async def retrying(
    op: Callable[[], _T],
    *,
    what: str,
    limiter: trio.CapacityLimiter,
    backoff: Backoff = DEFAULT_BACKOFF,
    on_failure: Callable[[str | None], None] | None = None,
    phase: Phase | Callable[[], Phase] = "running",
    give_up_after_seconds: float | None = None,
    rng: random.Random | None = None,
) -> _T:
    """Run the blocking ``op()`` in a worker thread under ``limiter``, retried.

    As :func:`retrying_async` (same arguments, same errors).

    Each attempt holds a token of ``limiter`` only while it runs: between
    attempts (the backoff) the token is free, so the writer's commits (or
    whoever shares the limiter) go on. A cancelled wait for an attempt waits
    for its thread (a thread cannot be stopped; the storage client's own
    timeouts, :data:`STORE_DEFAULTS`, bound it); a cancelled backoff ends at once.
    """

    async def attempt() -> _T:
        return await trio.to_thread.run_sync(op, limiter=limiter)

    return await retrying_async(
        attempt, what=what, backoff=backoff, on_failure=on_failure, phase=phase,
        give_up_after_seconds=give_up_after_seconds, rng=rng,
    )  # fmt: skip
