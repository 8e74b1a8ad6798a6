"""Errors of the Spark helpers."""

from __future__ import annotations

__all__ = ["SparkError", "SparkSetupError"]


class SparkError(Exception):
    """A Spark query or job failed; ``str()`` says why."""


class SparkSetupError(SparkError):
    """No Spark session could be built (missing package, unreachable server)."""
