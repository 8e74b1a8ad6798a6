"""The commit-and-check protocol: a group is stored once, whatever other writers do.

Several writers may append to one table: worker processes of one node, and
the nodes of a fleet (docs/fleet.md). A client that lost an ack resends its
batch with the same id, perhaps to another writer, so two writers can hold
the same batch at once. Each commit therefore names its batches (16-byte
digests in its ``commitInfo``, :mod:`appliance.lake.commit_info`), and a
writer commits a group like this (docs/fleet.md, "Exactly once across
writers", has the argument in full):

1. **Read** the commits after ``checked``, the last version this writer
   has checked, and remember every batch they name (:class:`StoredBatches`).
2. **Leave out** every batch of the group that is known as stored.
3. **Commit** the rest as exactly version ``r + 1``, ``r`` being the version
   step 1 read up to, with delta-rs's own retries off.
4. If another commit took ``r + 1`` (:class:`CommitConflict`), nothing was
   written: go back to 1. A lost race is checked again, never moved blindly
   to the next version.

Steps 1 to 3 of an attempt hold the table as one turn
(:meth:`Storage.exclusive`): nothing else of the writer's (its table
maintenance, a lease renewal) comes between the check and the put. Had it
room there, it would move the table, and a node whose maintenance runs
back to back (a busy machine) lost every race, for as long as that lasted.
The waits between attempts (a storage failure's backoff, a lost race's)
hold nothing.

Why no batch is stored twice: let our commit ``C`` land at ``r + 1``. Every
commit at ``r`` or before was read (step 1, or earlier checks and the table
scan at start), so ``C`` holds none of their batches. Every other commit
after ``C`` was made by a writer whose own step 3 succeeded at a version
above ``r + 1``, so its step 1 read ``C`` and left ``C``'s batches out. The
one bound is time: a batch is remembered for ``dedupe_window_seconds``, as
before.

What it costs: one ``commitInfo`` read per commit of another writer (none
with a single writer, whose own commits are never read back), and a
re-read plus a second commit attempt per lost race.

An outcome the storage left unknown (a timeout after the put) is settled by
the table itself: each commit also records ``(app_id, sequence)`` as a
Delta app transaction, and step 1 reads it, so an attempt that did land is
taken as done rather than written again.

The storage and the retry policy are the caller's (:class:`Storage`), so
this module holds only the protocol; appliance/lake/committer.py drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Final, Protocol

from appliance.blocks.identity import BatchDigest
from appliance.lake.dedupe import StoredBatches
from appliance.lake.errors import AppIdInUse, CommitConflict, CommitError, LakeError
from appliance.lake.table import TableChanges

__all__ = ["FREE_CONFLICTS", "ExactlyOnce", "Outcome", "Storage"]

#: Lost races in a row retried at once; past this many the storage's
#: conflict backoff applies (short and random), so writers that keep
#: colliding spread out instead of taking turns at losing.
FREE_CONFLICTS: Final = 2


class Storage(Protocol):
    """The table operations and the retry policy the protocol runs on."""

    def exclusive(self) -> AbstractAsyncContextManager[None]:
        """Hold the table for one attempt: its ``changes_since`` and ``write`` run in it.

        Nothing else of the writer's touches the table meanwhile, so
        nothing of its own moves the table between the check and the put.
        """
        ...

    async def changes_since(self, checked: int) -> TableChanges:
        """Refresh the table and read its commits after ``checked`` (raises LakeError)."""
        ...

    async def write(
        self, keep: Sequence[int], read_version: int, sequence: int, digests: list[BatchDigest]
    ) -> None:
        """Commit the blocks ``keep`` as version ``read_version + 1`` and commit ``sequence``.

        Raises CommitConflict when another commit took that version, CommitError
        on a storage failure, and a data error when a block cannot be converted.
        """
        ...

    async def failed(self, error: LakeError, attempt: int) -> None:
        """A storage failure: say so and wait before the next attempt."""
        ...

    async def conflicted(self, conflicts: int, error: CommitConflict) -> None:
        """The ``conflicts``-th lost race in a row past FREE_CONFLICTS: say so, wait a little."""
        ...

    def recovered(self) -> None:
        """The operation succeeded (after failures, if any)."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a group."""

    #: Indexes of the blocks left out because another commit stored their batch.
    stored_elsewhere: frozenset[int]
    #: Whether a commit was made (False: every block was stored elsewhere and
    #: nothing else had to be recorded).
    committed: bool


class ExactlyOnce:
    """One writer's side of the protocol: its checked version and commit sequence.

    Args:
        app_id: the writer's app id (its commits are never read back as another's).
        stored: the batches known as stored; the protocol adds what it reads.
        checked: the table version everything up to which is in ``stored``.
        sequence: the next commit sequence under ``app_id``.
        clock: the time ``stored`` is kept in (trio's clock in the writer).
        token: this writer's token in the app id's lease: a check that finds
            another token there stops the writer (a clone of this node).
    """

    def __init__(
        self,
        app_id: str,
        stored: StoredBatches,
        checked: int,
        sequence: int,
        clock: Callable[[], float],
        token: int | None = None,
    ) -> None:
        self.app_id = app_id
        self.token = token
        self.stored = stored
        self.checked = checked
        self.sequence = sequence
        self._clock = clock
        #: Races lost to another writer's commit, and other writers' commits read.
        self.lost_races = 0
        self.commits_read = 0

    def absorb(self, changes: TableChanges) -> None:
        """Take in what a read of the table found: the batches other commits name.

        Raises:
            AppIdInUse: the app id's lease names another writer's token.
        """
        if self.token is not None and changes.writer is not None and changes.writer != self.token:
            # Never take a clone's commit for this writer's own (its sequence
            # would pass for an attempt of ours that landed).
            raise AppIdInUse(
                f"another appliance committed under this node's app id {self.app_id!r}: "
                "two nodes share a node_id; this one stops acknowledging"
            )
        now = self._clock()
        for commit in changes.commits:
            if commit.app_id == self.app_id and commit.sequence == self.sequence:
                continue  # this commit's own earlier attempt: settled by ``done``
            self.commits_read += 1
            self.stored.add_all(commit.digests, now)
        self.checked = changes.version

    async def commit(
        self,
        digests: Sequence[BatchDigest | None],
        storage: Storage,
        *,
        must_commit: bool,
    ) -> Outcome:
        """Commit the group whose blocks have ``digests`` (None: a block without an id).

        ``must_commit``: commit even when no block is left (the commit then
        records only its app transactions, such as a log position).

        Raises:
            AppIdInUse: another writer committed under this app id.
            A data error from ``storage.write``: nothing was committed.
        """
        attempt = 0
        conflicts = 0
        tried: frozenset[int] | None = None  # what the last attempt left out
        tried_digests: list[BatchDigest] = []  # and the batches it named
        while True:
            error: LakeError
            # The check and the put in one hold; the waits below, outside it.
            async with storage.exclusive():
                try:
                    changes = await storage.changes_since(self.checked)
                except LakeError as exc:
                    error = exc
                else:
                    self.absorb(changes)
                    if changes.done is not None and changes.done >= self.sequence:
                        if tried is None:
                            # Never attempted here, yet recorded: another process writes
                            # under this app id; acking on its commit would lose data.
                            raise AppIdInUse(
                                f"the table records commit {changes.done} under app id "
                                f"{self.app_id!r}, which this writer never attempted"
                            )
                        # An attempt whose outcome was unknown did land: it is this commit.
                        self.sequence = changes.done + 1
                        self.stored.add_all(tried_digests, self._clock())
                        storage.recovered()
                        return Outcome(tried or frozenset(), committed=True)
                    now = self._clock()
                    elsewhere = frozenset(
                        i
                        for i, digest in enumerate(digests)
                        if digest is not None and self.stored.contains(digest, now)
                    )
                    keep = [i for i in range(len(digests)) if i not in elsewhere]
                    if not keep and not must_commit:
                        storage.recovered()
                        return Outcome(elsewhere, committed=False)
                    kept = [d for d in (digests[i] for i in keep) if d is not None]
                    tried, tried_digests = elsewhere, kept
                    try:
                        await storage.write(keep, changes.version, self.sequence, kept)
                    except CommitError as exc:  # CommitConflict included
                        error = exc
                    else:
                        self.checked = changes.version + 1
                        self.sequence += 1
                        now = self._clock()
                        self.stored.add_all(kept, now)
                        storage.recovered()
                        return Outcome(elsewhere, committed=True)
            if isinstance(error, CommitConflict):
                self.lost_races += 1
                conflicts += 1
                if conflicts > FREE_CONFLICTS:
                    await storage.conflicted(conflicts - FREE_CONFLICTS, error)
                continue
            attempt += 1
            await storage.failed(error, attempt)
