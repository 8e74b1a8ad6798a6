"""The check every protocol's limits dataclass makes (pure: no I/O, no trio)."""

from __future__ import annotations

__all__ = ["require_at_least_one"]


def require_at_least_one(limits: object, *names: str) -> None:
    """Raise ``ValueError`` for the first of the attributes ``names`` of ``limits`` below 1.

    Raises:
        ValueError: ``"<name> must be at least 1"``.
    """
    for name in names:
        if getattr(limits, name) < 1:
            raise ValueError(f"{name} must be at least 1")
