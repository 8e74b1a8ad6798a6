"""Structured logs: one event per line, ``key=value`` (logfmt) or JSON, on stderr.

Call sites name an event and its fields::

    log = get_logger("forward")
    log.info("connection.closed", peer="10.0.0.7:53211", reason="idle timeout")

Secrets are never passed as fields; as a second guard, a field whose name
looks like a secret is masked by the formatter.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final, Literal

__all__ = ["StructLogger", "configure", "get_logger"]

_SECRET_WORDS: Final = ("password", "secret", "shared_key", "token", "passphrase")
_ROOT: Final = "appliance"


def _masked(name: str, value: Any) -> Any:
    lowered = name.lower()
    if any(word in lowered for word in _SECRET_WORDS):
        return "***"
    return value


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and all(c.isalnum() or c in "-_.:/@+,[]" for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


class _Formatter(logging.Formatter):
    def __init__(self, style: Literal["logfmt", "json"], worker: int | None = None) -> None:
        super().__init__()
        self._line_style = style
        #: A worker process of the supervisor (``workers = N``) names itself on every line.
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name.removeprefix(_ROOT + ".") or _ROOT,
            "event": record.getMessage(),
        }
        if self._worker is not None:
            fields["worker"] = self._worker
        for key, value in getattr(record, "fields", {}).items():
            fields[key] = _masked(key, value)
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self._line_style == "json":
            return json.dumps(fields, default=str, ensure_ascii=False)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


class StructLogger:
    """A logger whose messages are an event name plus key=value fields."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(f"{_ROOT}.{name}")

    def _log(self, level: int, event: str, fields: dict[str, Any], exc: bool = False) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields}, exc_info=exc)

    def debug(self, event: str, **fields: Any) -> None:
        """Log a debug event."""
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log an info event."""
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log a warning event."""
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log an error event."""
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log an error event with the exception being handled."""
        self._log(logging.ERROR, event, fields, exc=True)


def get_logger(name: str) -> StructLogger:
    """The structured logger for one component (``forward``, ``lake``, ...)."""
    return StructLogger(name)


def configure(
    level: str = "info", style: Literal["logfmt", "json"] = "logfmt", *, worker: int | None = None
) -> None:
    """Send the appliance's logs to stderr, one event per line (a worker's: ``worker=k``)."""
    root = logging.getLogger(_ROOT)
    root.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(style, worker))
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
