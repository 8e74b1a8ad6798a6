"""Every error the lake layer raises (one exceptions module, as deltalake does)."""

from __future__ import annotations


class LakeError(Exception):
    """Base class of the lake layer's errors."""


class CommitError(LakeError):
    """A commit did not happen; nothing of it may be acknowledged. Retrying is safe."""


class TableSchemaError(LakeError):
    """An existing table does not have the schema or protocol the appliance writes."""
