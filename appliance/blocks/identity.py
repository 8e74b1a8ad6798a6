"""A batch's identity: its dedupe key ``(protocol, scope, batch id)`` and that key's digest.

The key says which batches are the same batch sent again
(docs/table.md#dedupe-scope); the writer, the write-ahead log and the table
all remember batches by it. The digest (:func:`batch_digest`) is what a data
commit names in its ``commitInfo`` (appliance/lake/commit_info.py) and what
the log's index holds: 16 bytes, whatever the key's length.

Digests, not the keys themselves: a Fluentd chunk id is short, but a batch
id may be up to ``MAX_BATCH_ID_BYTES`` long and its scope a certificate
subject, and a commit's JSON is read by every other writer. 128 bits keep a
false match (which would drop a batch) out of reach: with a million
remembered ids and a million new ones the chance is about 2^-88.

Pure code: no I/O, no trio.
"""

from __future__ import annotations

import hashlib
from typing import Final

from appliance.blocks.block import RowBlock

__all__ = [
    "DIGEST_BYTES",
    "BatchDigest",
    "DedupeKey",
    "batch_digest",
    "dedupe_key",
    "dedupe_scope",
    "peer_address",
]

#: ``(protocol, dedupe scope, batch id)``: what the writer remembers of a committed batch.
DedupeKey = tuple[str, str, str]

BatchDigest = bytes

#: Bytes of a batch digest (blake2b).
DIGEST_BYTES: Final = 16

#: The ``source`` of a peer nothing authenticated (appliance.server.listener.ANONYMOUS).
_ANONYMOUS: Final = "anonymous"


def dedupe_scope(source: str, peer: str) -> str:
    """Whose batch ids a batch's id is unique among (docs/table.md#dedupe-scope).

    An authenticated principal is its own scope. Unauthenticated peers must
    not share one (two clients that both number their chunks from 1 would
    each get an ack while only the first is written), so an anonymous peer's
    scope is its IP address: a resend after reconnecting from a new port is
    still recognised.
    """
    if source != _ANONYMOUS:
        return source
    return f"{_ANONYMOUS}@{peer_address(peer)}"


def peer_address(peer: str) -> str:
    """The IP address of a ``peer``: ``host:port``, ``[v6]:port``, or a bare address.

    ZeroMQ gives bare addresses (``2001:db8::5``): only one colon means a port.
    """
    if peer.startswith("["):
        return peer[1:].split("]", 1)[0]
    if peer.count(":") == 1:
        return peer.split(":", 1)[0]
    return peer


def dedupe_key(block: RowBlock) -> DedupeKey | None:
    """A batch's identity for dedupe (docs/table.md#dedupe-scope); None without an id."""
    if block.batch_id is None:
        return None
    return (block.protocol, dedupe_scope(block.source, block.peer), block.batch_id)


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
