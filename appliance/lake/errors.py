"""Every error the lake layer raises (one exceptions module, as deltalake does).

A block the writer refuses raises :class:`~appliance.blocks.errors.BlockRefused`,
which belongs to the block vocabulary (the write-ahead log and the checks
below the lake raise it too), not to this hierarchy.
"""

from __future__ import annotations


class LakeError(Exception):
    """Base class of the lake layer's errors."""


class CommitError(LakeError):
    """A commit did not happen; nothing of it may be acknowledged. Retrying is safe."""


class CommitConflict(CommitError):
    """Another writer took the table version this commit was prepared for.

    Nothing was committed. The commit must be checked again against the
    commits it lost to (appliance/lake/exactly_once.py), never simply moved
    to the next version.
    """


class TableSchemaError(LakeError):
    """An existing table does not have the schema or protocol the appliance writes."""


class AppIdInUse(LakeError):
    """Another live process commits under this node's app id to the same table.

    Two writers sharing an app id would each take the other's commits for
    their own and acknowledge batches that were never written, so
    the second refuses to start, and a writer that finds a foreign commit
    under its app id stops acknowledging.
    """
