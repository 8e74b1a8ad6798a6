"""One maintainer at a time on a shared table: a lease kept in the table's own app transactions.

Several appliances may write one ``events`` table on object storage (docs/fleet.md).
Appends from many nodes are safe together, but compaction, checkpoints and
vacuum should run on one node at a time: two compactions of the same files
conflict (one is wasted), and a vacuum must not race another node's reads
of the files it deletes. So before each operation a node takes the
maintenance lease: a commit of no rows recording two app transactions,
``maintenance#writer`` = the node's lease token and ``maintenance#lease`` = the
time in epoch milliseconds (:meth:`EventsTable.claim`, the same mechanism as
the per-node writer lease).

* Taking it is atomic: two nodes that claim at once write app transactions
  with the same id, which Delta's conflict check refuses to all but one.
  On S3 that needs ``conditional_put = "etag"`` (docs/fleet.md).
* The holder takes it again at each operation (a renewal); another node may
  take it only when the last claim is older than ``lease_seconds``. So the
  lease survives its holder's death for ``lease_seconds`` at most, and then
  the next node whose schedule comes round takes over.
* Clocks: ages compare one node's clock with another's, so ``lease_seconds``
  must be much longer than the clock skew between nodes (NTP keeps it under
  a second; the default is ten minutes).
* An operation that runs longer than the lease may overlap another node's
  next one: Delta's optimistic concurrency still keeps the table correct (one
  of two conflicting rewrites fails and is retried at its next turn).

* Storage failures: :meth:`MaintenanceLease.acquire` raises them as
  :class:`~appliance.lake.errors.LakeError` (chained from deltalake's
  error), and the service's schedule retries the whole step, lease
  included, through transient ones (:mod:`appliance.lake.retry`). Taking
  the lease again is safe after an attempt whose outcome is unknown: a
  claim that did land names this holder's token, which may always renew.
  Only another holder's fresh claim is a refusal (the step is skipped).

With ``[maintenance] lease = "auto"`` (the default) the lease is taken for
tables on object storage (a URI with a scheme: ``s3://``, ``gs://``,
``az://``, ...) and not for a local path, which one node owns.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Final, Literal

from appliance.lake.errors import AppIdInUse
from appliance.lake.table import EventsTable, shared_with_others

__all__ = ["MAINTENANCE_APP_ID", "MaintenanceLease", "lease_applies"]

#: The app id under which the maintenance lease is recorded (``maintenance#writer``, ``#lease``).
MAINTENANCE_APP_ID: Final = "maintenance"


def lease_applies(mode: Literal["auto", "on", "off"], uri: str) -> bool:
    """Whether the maintenance of the table at ``uri`` takes the lease (see the module)."""
    return shared_with_others(mode, uri)


class MaintenanceLease:
    """This node's hold on the maintenance lease of one table (blocking calls).

    Args:
        table: the table (the caller keeps its calls away from commits).
        lease_seconds: how long a claim keeps other nodes away.
        token: this holder's identity; a random one by default (a restarted
            node is a new holder and waits out its predecessor's lease).
        clock: epoch seconds (tests move it).
    """

    def __init__(
        self,
        table: EventsTable,
        lease_seconds: float,
        *,
        token: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = table
        self._lease_ms = int(lease_seconds * 1000)
        # Positive int64: an app transaction version.
        self.token = token if token is not None else secrets.randbits(62) + 1
        self._clock = clock
        self._opened = False

    def acquire(self) -> str | None:
        """Take or renew the lease; None when this node holds it now, else why not.

        Raises:
            LakeError: the table cannot be read or written (a transient
                failure is chained from deltalake's or the OS's error, which
                :func:`appliance.lake.retry.classify` reads).
        """
        if not self._opened:
            self._table.open_or_create()
            self._opened = True
        try:
            self._table.claim(
                MAINTENANCE_APP_ID, self.token, int(self._clock() * 1000), self._lease_ms
            )
        except AppIdInUse as exc:
            return f"another node holds the maintenance lease ({exc})"
        return None
