"""Structured log events of the auth package on stdlib :mod:`logging`: an event name and fields.

The auth package imports nothing from the appliance. It logs through the
stdlib logger ``appliance.auth`` with the event name as the message and the
fields in the record's ``fields`` attribute: the appliance's formatter
(``appliance.logs``) renders exactly that as one ``key=value`` (or JSON)
line, ``... logger=auth event=auth.secret_unreadable key=k reason=...``.
Callers never pass a secret as a field (the formatter also masks fields
named like secrets).
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["AuthLogger", "get_logger"]

#: The stdlib logger of the auth package, under the appliance's root logger.
LOGGER_NAME: Final = "appliance.auth"


class AuthLogger:
    """Log an event name with ``key=value`` fields (field values are plain text)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, fields: dict[str, str]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields})

    def warning(self, event: str, **fields: str) -> None:
        """Log a warning event."""
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: str) -> None:
        """Log an error event."""
        self._log(logging.ERROR, event, fields)


def get_logger() -> AuthLogger:
    """The auth package's structured logger."""
    return AuthLogger(logging.getLogger(LOGGER_NAME))
