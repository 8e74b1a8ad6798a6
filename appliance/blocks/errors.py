"""The errors of the block vocabulary: a string column's value refused, a whole block refused."""

from __future__ import annotations

__all__ = ["BlockRefused", "InvalidText"]


class InvalidText(ValueError):
    """A string bound for a column is not valid UTF-8 or is too long."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BlockRefused(Exception):
    """A block cannot be stored (a string that is not UTF-8, a time out of range, ...).

    The fault is the sending peer's: its connection gets no ack and is closed
    with ``reason``; the other connections' batches are not affected. The
    writer raises it too when it cannot take a block now (the disk guard, the
    write-ahead log full), with the same consequence for that connection.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
