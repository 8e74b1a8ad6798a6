"""What a data commit's ``commitInfo`` says about the batches it added, written and read.

Every data commit the appliance makes names the batches it adds, as 16-byte
digests of their dedupe keys (:func:`~appliance.blocks.identity.batch_digest`)
in its ``commitInfo`` (:data:`COMMIT_INFO_KEY`), with the writer's app id and
commit sequence. Another writer of the same table reads those digests from
the commits it has not seen yet, never from the data files, and so knows
which batches are stored without scanning the table
(docs/fleet.md, "Exactly once across writers").

Pure code: no I/O, no trio, no deltalake.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any, Final

from appliance.blocks.identity import DIGEST_BYTES, BatchDigest

__all__ = [
    "COMMIT_APP_ID_KEY",
    "COMMIT_INFO_KEY",
    "COMMIT_SEQUENCE_KEY",
    "MAX_COMMIT_BATCH_IDS",
    "CommitBatches",
    "commit_metadata",
    "read_commit_info",
]

#: Most batch ids one commit names. A group with more is committed in
#: several commits, so no commit's JSON (read by every other writer) grows
#: past about 350 KiB of digests.
MAX_COMMIT_BATCH_IDS: Final = 16_384

#: ``commitInfo`` key whose value is the commit's batch digests, base64 of
#: their concatenation.
COMMIT_INFO_KEY: Final = "appliance.batchDigests"
#: ``commitInfo`` keys naming the writer (its app id) and its commit sequence.
COMMIT_APP_ID_KEY: Final = "appliance.appId"
COMMIT_SEQUENCE_KEY: Final = "appliance.commit"


def commit_metadata(digests: Iterable[BatchDigest], app_id: str, sequence: int) -> dict[str, Any]:
    """The ``commitInfo`` entries of a data commit by ``app_id``'s commit ``sequence``."""
    joined = b"".join(digests)
    return {
        COMMIT_INFO_KEY: base64.b64encode(joined).decode("ascii"),
        COMMIT_APP_ID_KEY: app_id,
        COMMIT_SEQUENCE_KEY: sequence,
    }


class CommitBatches:
    """What one commit of the table says about the batches it added."""

    __slots__ = ("app_id", "digests", "sequence", "version")

    def __init__(
        self,
        version: int,
        digests: tuple[BatchDigest, ...],
        app_id: str | None,
        sequence: int | None,
    ) -> None:
        self.version = version
        self.digests = digests
        #: The appliance writer that made the commit and its sequence, when it says.
        self.app_id = app_id
        self.sequence = sequence


def read_commit_info(version: int, info: Mapping[str, Any]) -> CommitBatches:
    """The batches a commit's ``commitInfo`` names (none for commits of other programs).

    A value that is not what this module writes (another program's key of
    the same name, a damaged entry) names no batch: the check then relies on
    what it already knows, never on guesses.
    """
    raw = info.get(COMMIT_INFO_KEY)
    digests: tuple[BatchDigest, ...] = ()
    if isinstance(raw, str):
        try:
            joined = base64.b64decode(raw.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            joined = b""
        if len(joined) % DIGEST_BYTES == 0:
            digests = tuple(
                joined[i : i + DIGEST_BYTES] for i in range(0, len(joined), DIGEST_BYTES)
            )
    app_id = info.get(COMMIT_APP_ID_KEY)
    sequence = info.get(COMMIT_SEQUENCE_KEY)
    return CommitBatches(
        version,
        digests,
        app_id if isinstance(app_id, str) else None,
        sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None,
    )
