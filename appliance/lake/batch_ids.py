"""Batch identities as they are written into the table's commits.

Every data commit the appliance makes names the batches it adds, as 16-byte
digests of their dedupe keys (:func:`batch_digest`) in its ``commitInfo``
(:data:`COMMIT_INFO_KEY`). Another writer of the same table reads those
digests from the commits it has not seen yet, never from the data files, and
so knows which batches are stored without scanning the table
(docs/fleet.md, "Exactly once across writers").

Digests, not the keys themselves: a Fluentd chunk id is short, but a batch
id may be up to ``MAX_BATCH_ID_BYTES`` long and its scope a certificate
subject, and a commit's JSON is read by every other writer. 128 bits keep a
false match (which would drop a batch) out of reach: with a million
remembered ids and a million new ones the chance is about 2^-88.

Pure code: no I/O, no trio, no deltalake.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from appliance.lake.blocks import DedupeKey

__all__ = [
    "COMMIT_APP_ID_KEY",
    "COMMIT_INFO_KEY",
    "COMMIT_SEQUENCE_KEY",
    "DIGEST_BYTES",
    "MAX_COMMIT_BATCH_IDS",
    "BatchDigest",
    "CommitBatches",
    "batch_digest",
    "commit_metadata",
    "read_commit_info",
]

#: Bytes of a batch digest (blake2b).
DIGEST_BYTES: Final = 16

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

BatchDigest = bytes


def batch_digest(key: DedupeKey) -> BatchDigest:
    """The 16-byte digest of a batch's dedupe key ``(protocol, scope, batch id)``.

    The parts are length-prefixed, so no two keys encode alike.
    """
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"appliance.batch")
    for part in key:
        raw = part.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return h.digest()


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
