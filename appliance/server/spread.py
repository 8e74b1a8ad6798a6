"""Spreading connections over the workers of one machine: one accept queue, least connections.

With ``workers = N`` (docs/performance.md, "Several processes on one
machine") the supervisor binds each shared TCP listener once and hands its
sockets to every worker it starts, so all workers accept from one kernel
queue per port (:class:`InheritedSockets`). Which worker takes a pending
connection is decided by a least-connections gate (:class:`AcceptGate`):
the supervisor creates a small shared memory file of one signed 64-bit
slot per worker (:class:`ConnectionCounts`); each worker writes its own
open-connection count into its slot and reads all of them, and accepts at
once only while its count is the lowest of the live workers'. A worker
above the minimum still accepts a connection that nobody took within
:data:`ACCEPT_DEFER_SECONDS`, so a stuck or dead worker never strands a
client. The supervisor marks the slot of a worker that is not running
:data:`ABSENT`, so it never holds the minimum down.

The counts are a hint, not a lock: a worker may read another's slot while
it changes, and two workers at the same count may race for one connection
(the kernel gives it to one; the other finds nothing pending and waits
again). Each worker writes only its own slot, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from appliance.server.binding import LISTEN_BACKLOG

__all__ = [
    "ABSENT",
    "ACCEPT_DEFER_SECONDS",
    "ACCEPT_RECHECK_SECONDS",
    "AcceptGate",
    "ConnectionCounts",
    "InheritedSockets",
    "WorkerShare",
    "may_accept",
]

#: Seconds a pending connection waits for a worker with fewer connections
#: before a busier worker takes it anyway (a stuck or dead worker strands nothing).
ACCEPT_DEFER_SECONDS: Final = 0.05
#: Seconds between looks at the counts while a connection is deferred.
ACCEPT_RECHECK_SECONDS: Final = 0.005
#: The count in the slot of a worker that is not running: ignored by the gate.
ABSENT: Final = -1
#: Bytes of one worker's slot (a signed 64-bit count, native order: one machine).
_SLOT: Final = struct.Struct("=q")
#: Most workers one shared count file holds (the config allows no more cores than this).
MAX_WORKERS: Final = 4096


def may_accept(counts: Sequence[int], me: int) -> bool:
    """Whether worker ``me`` should accept now: its count is the lowest of the live workers'.

    A slot below 0 (:data:`ABSENT`) is a worker that is not running; worker
    ``me`` itself always counts as live (it is the one asking).
    """
    mine = max(counts[me], 0)
    return all(count < 0 or mine <= count for count in counts)


class ConnectionCounts:
    """One open-connection count per worker, in memory every worker of the machine maps.

    Made by the supervisor (:meth:`create`) and inherited by each worker
    as a file descriptor (:meth:`attach`).
    """

    def __init__(self, fd: int, workers: int) -> None:
        if not 0 < workers <= MAX_WORKERS:
            raise ValueError(f"{workers} workers")
        self.fd = fd
        self.workers = workers
        self._map = mmap.mmap(fd, workers * _SLOT.size)

    @classmethod
    def create(cls, workers: int) -> ConnectionCounts:
        """A new count file with every slot :data:`ABSENT` (no worker runs yet).

        Its descriptor is inheritable only where passed on (``pass_fds``).
        """
        fd = os.memfd_create("appliance-connections", os.MFD_CLOEXEC)
        made = False
        try:
            os.ftruncate(fd, workers * _SLOT.size)
            counts = cls(fd, workers)
            made = True
        finally:
            if not made:  # whatever stopped it (also a cancellation): no descriptor leaks
                os.close(fd)
        for index in range(workers):
            counts.set(index, ABSENT)
        return counts

    @classmethod
    def attach(cls, fd: int, workers: int) -> ConnectionCounts:
        """The count file the supervisor made, from the descriptor it passed."""
        return cls(fd, workers)

    def read(self) -> list[int]:
        """Every worker's count (:data:`ABSENT` for one that is not running)."""
        return [value for (value,) in _SLOT.iter_unpack(self._map[: self.workers * _SLOT.size])]

    def get(self, index: int) -> int:
        return int(_SLOT.unpack_from(self._map, index * _SLOT.size)[0])

    def set(self, index: int, value: int) -> None:
        _SLOT.pack_into(self._map, index * _SLOT.size, value)

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


class AcceptGate:
    """Worker ``me``'s view of the counts: it counts its own connections and asks the gate.

    Its slot stays :data:`ABSENT` until :meth:`join` (its listeners are open)
    and again from :meth:`leave` (it stops accepting): the others do not
    defer to a worker that takes no connection.
    """

    def __init__(self, counts: ConnectionCounts, me: int) -> None:
        self._counts = counts
        self.me = me
        self.open = 0
        self._present = False

    def may_accept(self) -> bool:
        counts = self._counts.read()
        # This worker's own count, also before join() (its slot reads absent then).
        counts[self.me] = self.open
        return may_accept(counts, self.me)

    def join(self) -> None:
        """This worker accepts from now on: its slot holds its count."""
        self._present = True
        self._publish()

    def leave(self) -> None:
        """This worker accepts no more (it stops): its slot is ABSENT."""
        self._present = False
        self._counts.set(self.me, ABSENT)

    def opened(self) -> None:
        self.open += 1
        self._publish()

    def closed(self) -> None:
        self.open -= 1
        self._publish()

    def _publish(self) -> None:
        if self._present:
            self._counts.set(self.me, self.open)

    def spread(self) -> list[int]:
        """Every worker's open connections now (:data:`ABSENT`: not running)."""
        return self._counts.read()


@dataclass(frozen=True, slots=True)
class _Inherited:
    bind: str
    fds: tuple[int, ...]


class InheritedSockets:
    """The listening sockets a worker was handed, by listener name and the address they bind.

    The worker keeps each descriptor for its life and serves a duplicate, so
    a listener that a reload stops and starts again on the same address
    gets the same socket (the same queue) back.
    """

    def __init__(self, listeners: Mapping[str, _Inherited]) -> None:
        self._listeners = dict(listeners)

    @classmethod
    def of(cls, listeners: Mapping[str, tuple[str, Sequence[int]]]) -> InheritedSockets:
        """Owning ``listeners`` (name -> the bind they were made for, their descriptors)."""
        return cls({n: _Inherited(b, tuple(f)) for n, (b, f) in listeners.items()})

    def fds(self) -> list[int]:
        """Every descriptor held (to pass on to a worker)."""
        return [fd for entry in self._listeners.values() for fd in entry.fds]

    def described(self) -> dict[str, tuple[str, Sequence[int]]]:
        """name -> (bind, descriptors), as :meth:`WorkerShare.spec` takes them."""
        return {n: (e.bind, e.fds) for n, e in self._listeners.items()}

    def close(self) -> None:
        """Close every descriptor held."""
        self.drop({})

    def take(self, name: str, bind: str) -> list[trio.SocketListener] | None:
        """Listeners on duplicates of the sockets handed for ``name`` at ``bind``, or None.

        None: none was handed for that listener at that address (a listener
        a reload added or moved): the caller binds its own.
        """
        entry = self._listeners.get(name)
        if entry is None or entry.bind != bind:
            return None
        listeners: list[trio.SocketListener] = []
        with contextlib.ExitStack() as opened:  # on any failure, close the duplicates
            for fd in entry.fds:
                sock = opened.enter_context(socket.socket(fileno=os.dup(fd)))
                # The supervisor bound it; the first worker to serve it makes it listen
                # (again by the others, which only sets the same backlog).
                sock.listen(LISTEN_BACKLOG)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
            opened.pop_all()
        return listeners

    def drop(self, keep: Mapping[str, str]) -> list[str]:
        """Close the sockets of listeners no longer at their address in ``keep`` (name -> bind).

        Returns the names dropped (the supervisor's reload: a listener that
        is gone or moved must not keep its old port queueing connections).
        """
        dropped = [n for n, e in self._listeners.items() if keep.get(n) != e.bind]
        for name in dropped:
            for fd in self._listeners.pop(name).fds:
                os.close(fd)
        return dropped


@dataclass(frozen=True, slots=True)
class WorkerShare:
    """What the supervisor hands a worker besides its configuration: sockets and counts."""

    sockets: InheritedSockets
    gate: AcceptGate | None

    @staticmethod
    def spec(
        listeners: Mapping[str, tuple[str, Sequence[int]]], counts_fd: int | None, workers: int
    ) -> str:
        """The ``--shared`` argument naming the descriptors a worker inherits (JSON)."""
        return json.dumps(
            {
                "listeners": {n: {"bind": b, "fds": list(f)} for n, (b, f) in listeners.items()},
                "counts_fd": counts_fd,
                "workers": workers,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, text: str, me: int) -> WorkerShare:
        """Worker ``me``'s share from its ``--shared`` argument.

        Raises:
            ValueError: the text is not what :meth:`spec` writes.
        """
        try:
            data = json.loads(text)
            listeners = {
                str(name): _Inherited(str(entry["bind"]), tuple(int(fd) for fd in entry["fds"]))
                for name, entry in data["listeners"].items()
            }
            counts_fd = data["counts_fd"]
            workers = int(data["workers"])
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"--shared: {exc}") from None
        gate = None
        if counts_fd is not None:
            gate = AcceptGate(ConnectionCounts.attach(int(counts_fd), workers), me)
        return cls(InheritedSockets(listeners), gate)
