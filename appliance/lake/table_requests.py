"""The CLI's hand-off of table requests (erase, expire) to the running service, through files.

A delete from another process races the service's commits, and delta-rs
(Serializable isolation) fails the delete whenever a concurrent append adds
a file its predicate might match: with steady ingest, an erase could lose
every time, and each delete that wins makes one of the service's commits
fail and retry. So when the service runs, the CLI hands ``erase`` and
``expire`` to it (:func:`hand_off`): a request file in
``<state>/table-requests``, which the service's maintenance task
(:func:`serve_requests`) runs through ``LakeWriter.run_exclusive`` (no
commit of its own meanwhile) under the maintenance lock, answering with a
result file. :func:`serving_pid` says whether a service takes requests.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio
from deltalake.exceptions import DeltaError

from appliance import defaults
from appliance.lake import retention
from appliance.lake.errors import LakeError
from appliance.lake.operations import (
    STEP_BACKOFF,
    STEP_RETRY_SECONDS,
    MaintenanceBusy,
    MaintenanceLock,
    MaintenanceResult,
    Progress,
    lock_path,
    no_progress,
)
from appliance.lake.retry import retrying_async
from appliance.logs import get_logger
from appliance.state_lock import holder_pid

if TYPE_CHECKING:
    from appliance.lake.writer import LakeWriter

__all__ = [
    "REQUESTS_DIR",
    "REQUEST_PICKUP_TIMEOUT_SECONDS",
    "REQUEST_POLL_SECONDS",
    "RequestError",
    "Rule",
    "hand_off",
    "serve_requests",
    "serving_pid",
]

log = get_logger("maintenance")

#: Directory (under the state directory) of the requests the CLI hands to the service.
REQUESTS_DIR: Final = "table-requests"
#: Seconds between the service's looks for a new request.
REQUEST_POLL_SECONDS: Final = 0.25
#: Seconds the CLI waits for the service to take a request before it withdraws it.
REQUEST_PICKUP_TIMEOUT_SECONDS: Final = 30.0
#: The file a serving service keeps in the requests directory (its pid inside).
_SERVING: Final = "serving"


@dataclass(frozen=True, slots=True)
class Rule:
    """A retention rule as a request carries it (see :class:`.retention.RuleLike`)."""

    max_age_days: int
    tag_prefix: str | None = None
    protocol: str | None = None


class RequestError(LakeError):
    """A request to the service failed, was refused, or got no answer."""


def _requests_dir(state_dir: Path) -> Path:
    return state_dir / REQUESTS_DIR


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` to ``path`` atomically (0600): a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(value, out, default=str)
    os.replace(tmp, path)


def serving_pid(state_dir: Path) -> int | None:
    """The pid of a running service that takes table requests, or None."""
    pid = holder_pid(state_dir)
    if pid is None:
        return None
    try:
        marker = int((_requests_dir(state_dir) / _SERVING).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return pid if marker == pid else None


def _run_request(
    request: dict[str, Any], uri: str, storage_options: dict[str, str] | None, lock: Path
) -> MaintenanceResult:
    """Run one decoded request under the maintenance lock (in the writer's worker thread)."""
    hours = int(request.get("vacuum_retention_hours", defaults.VACUUM_RETENTION_HOURS))
    operation = request.get("operation")
    with MaintenanceLock(lock):
        if operation == "erase":
            predicate = request.get("predicate")
            if not isinstance(predicate, str) or not predicate.strip():
                raise RequestError("an erase request needs a predicate")
            return retention.erase(
                uri, storage_options, predicate=predicate, vacuum_retention_hours=hours
            )
        if operation == "expire":
            days = request.get("max_age_days")
            rules = tuple(Rule(**r) for r in request.get("rules", []))
            policy = retention.RetentionPolicy(None if days is None else int(days), rules)
            return retention.expire(
                uri, storage_options, policy=policy, vacuum_retention_hours=hours
            )
    raise RequestError(f"unknown request {operation!r}")


async def serve_requests(writer: LakeWriter, state_dir: Path, storage_options: Any) -> None:
    """Run the erase and expire requests the CLI hands over, one at a time, forever.

    Each runs through :meth:`LakeWriter.run_exclusive`, so the writer commits
    nothing meanwhile (its batches wait, and commit right after). A transient
    storage failure is retried with backoff for up to
    :data:`~appliance.lake.operations.STEP_RETRY_SECONDS` (the writer
    commits between attempts), then answered as a failure. Runs inside
    :func:`~appliance.lake.schedule.run_maintenance`.
    """
    directory = _requests_dir(state_dir)
    await trio.to_thread.run_sync(lambda: directory.mkdir(mode=0o700, exist_ok=True))
    marker = directory / _SERVING
    await trio.to_thread.run_sync(marker.write_text, f"{os.getpid()}\n", "ascii")
    lock = lock_path(state_dir)
    uri = writer.table.uri
    try:
        while True:
            await trio.sleep(REQUEST_POLL_SECONDS)
            try:
                pending = await trio.to_thread.run_sync(_pending, directory)
            except OSError as exc:
                log.warning("table_request.unreadable", directory=str(directory), reason=str(exc))
                continue
            for path in pending:
                await _serve_one(writer, path, uri, storage_options, lock)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: marker.unlink(missing_ok=True))


def _pending(directory: Path) -> list[Path]:
    """The requests waiting, oldest first (one withdrawn meanwhile is left out)."""
    found: list[tuple[int, Path]] = []
    for path in directory.glob("*.request.json"):
        try:
            found.append((path.stat().st_mtime_ns, path))
        except FileNotFoundError:
            continue
    return [path for _, path in sorted(found)]


async def _serve_one(
    writer: LakeWriter, path: Path, uri: str, storage_options: Any, lock: Path
) -> None:
    name = path.name.removesuffix(".request.json")
    running = path.with_name(f"{name}.running.json")
    try:
        await trio.to_thread.run_sync(os.replace, path, running)  # take it
        text = await trio.to_thread.run_sync(running.read_text, "utf-8")
    except OSError:
        return  # withdrawn by the CLI meanwhile
    answer: dict[str, Any]
    try:
        request = json.loads(text)
        if not isinstance(request, dict):
            raise RequestError("a request is a JSON object")
        log.info("table_request.start", request=name, operation=request.get("operation"))
        # A transient storage failure is retried (a delete runs again on a fresh
        # snapshot: what the first attempt removed is gone, the rest goes now).
        result = await retrying_async(
            functools.partial(
                writer.run_exclusive, _run_request, request, uri, storage_options, lock
            ),
            what=f"table request {request.get('operation')}",
            backoff=STEP_BACKOFF,
            give_up_after_seconds=STEP_RETRY_SECONDS,
        )
    except (LakeError, DeltaError, OSError, ValueError, TypeError) as exc:
        log.warning("table_request.failed", request=name, reason=str(exc)[:500])
        answer = {"ok": False, "error": str(exc), "busy": isinstance(exc, MaintenanceBusy)}
    else:
        log.info(
            "table_request.done", request=name, operation=result.operation,
            version=result.after.version, rows_before=result.before.rows,
            rows_after=result.after.rows,
        )  # fmt: skip
        answer = {"ok": True, "result": result.to_json()}
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(_write_json, running.with_name(f"{name}.result.json"), answer)
        await trio.to_thread.run_sync(lambda: running.unlink(missing_ok=True))


def hand_off(
    state_dir: Path,
    request: dict[str, Any],
    pid: int,
    progress: Progress = no_progress,
    *,
    pickup_timeout: float = REQUEST_PICKUP_TIMEOUT_SECONDS,
) -> MaintenanceResult:
    """Hand ``request`` to the running service ``pid`` and wait for its result.

    Raises:
        MaintenanceBusy: the maintenance lock was held when the service tried.
        RequestError: the service refused it, did not take it in time, or
            stopped before answering.
    """
    directory = _requests_dir(state_dir)
    name = f"{time.time_ns()}-{secrets.token_hex(6)}"
    pending = directory / f"{name}.request.json"
    result_path = directory / f"{name}.result.json"
    progress(1, 3, f"handing {request['operation']} to the running service (pid {pid})")
    _write_json(pending, request)
    deadline = time.monotonic() + pickup_timeout
    taken = False
    while not result_path.exists():
        time.sleep(0.1)
        alive = holder_pid(state_dir) == pid
        if not taken and pending.exists():
            if alive and time.monotonic() < deadline:
                continue
            withdrawn = directory / f"{name}.withdrawn"
            try:
                os.replace(pending, withdrawn)
            except OSError:
                continue  # taken just now: wait for it
            withdrawn.unlink(missing_ok=True)
            why = "did not take the request within" if alive else "stopped before it took the"
            raise RequestError(
                f"the running service (pid {pid}) {why} "
                + (f"{pickup_timeout:.0f}s" if alive else "request")
                + "; nothing was changed"
            )
        if not taken:
            taken = True
            progress(2, 3, f"running in the service (pid {pid})")
        if not alive and not result_path.exists():
            raise RequestError(
                f"the service (pid {pid}) stopped before it answered: the {request['operation']} "
                "may or may not have been committed; look with 'appliance table stats'"
            )
    answer = json.loads(result_path.read_text(encoding="utf-8"))
    result_path.unlink(missing_ok=True)
    if not answer.get("ok"):
        error = str(answer.get("error", "failed"))
        raise MaintenanceBusy(error) if answer.get("busy") else RequestError(error)
    progress(3, 3, "done")
    return MaintenanceResult.from_json(answer["result"])
