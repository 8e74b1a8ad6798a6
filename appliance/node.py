"""A node's identity, its workers' configurations, and what its state directory holds.

One module for what makes a process *this* node on the table: its stable
id (``node_id``, the Delta app id), the writer token of its state
directory (the app id's lease), its write-ahead log, the configuration each
of its ``workers`` runs with (:func:`worker_config`), and the logs that
other runs of this state directory left behind (another number of workers)
and that must reach the table before anything else starts. The service and
the supervisor both build on it, neither on the other.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import trio

from appliance.config import Config, settings_from
from appliance.logs import get_logger
from appliance.server.registry import kind_of
from appliance.state_lock import StateLock, StateLocked
from appliance.wal.log import WriteAheadLog
from appliance.wal.settings import WalSettings

__all__ = [
    "LeftLogLocked",
    "drain_left_logs",
    "left_log_dirs",
    "node_id",
    "worker_config",
    "write_ahead_log",
    "writer_token",
]

log = get_logger("supervisor")


class LeftLogLocked(OSError):
    """A log left by another run is still held by a running process (it names the directory)."""


def node_id(config: Config) -> str:
    """This node's stable id: from the config, or generated once into ``<state>/node-id``."""
    if config.node_id:
        return config.node_id
    path = config.state_dir / "node-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        value = f"appliance-{uuid.uuid4().hex}"
        path.write_text(value + "\n", encoding="ascii")
        return value


def worker_config(config: Config, index: int) -> Config:
    """The configuration worker ``index`` of ``config.workers`` runs with (docs/performance.md).

    Its own state directory (so its own node id, write-ahead log and
    lock); everything else this node's: the table (``[lake] shared`` and
    the maintenance lease on, unless turned off), the server certificate,
    client CA and CRL of this state directory's PKI, the auth database
    and its key file, the derived tables. A listener whose kind shares its
    port (:attr:`~appliance.server.registry.ListenerKind.shares_port`: the
    TCP ones) runs in every worker, on the socket the supervisor bound for
    it (appliance/server/spread.py), with ``reuse_port`` for what a worker
    binds itself (the UDP heartbeat, a listener a reload adds or moves);
    one that cannot (Logjam's ZeroMQ sockets) runs in worker 0 only. Worker ``k``'s admin
    listener binds the admin port + ``k`` (port 0: any).

    Raises:
        ValueError: ``index`` is not a worker of this configuration.
    """
    if not 0 <= index < config.worker_count:
        raise ValueError(f"worker {index} of {config.worker_count}")
    pki = config.pki_dir
    tls = replace(
        config.tls,
        cert_file=config.tls.cert_file or pki / "server.pem",
        key_file=config.tls.key_file or pki / "server.key",
        client_ca_file=config.tls.client_ca_file or pki / "ca.pem",
        # Only the node's own CA comes with its own CRL (an operator's CA: none unless given).
        crl_file=config.tls.crl_file
        or (pki / "crl.pem" if config.tls.client_ca_file is None else None),
    )
    lake = replace(
        config.lake,
        path=config.table_uri,
        shared="on" if config.lake.shared == "auto" else config.lake.shared,
    )
    maintenance = replace(
        config.maintenance,
        lease="on" if config.maintenance.lease == "auto" else config.maintenance.lease,
    )
    auth = replace(
        config.auth,
        database_url=config.auth_database_url,
        secret_key_file=config.auth_secret_key_file,
    )
    spark = replace(
        config.spark, derived_path=config.spark.derived_path or str(config.state_dir / "lake")
    )
    admin = config.admin
    if index and admin.port:
        host = admin.bind.rsplit(":", 1)[0]
        admin = replace(admin, bind=f"{host}:{admin.port + index}")
    listeners = [
        replace(listener, reuse_port=True) if kind_of(listener).shares_port else listener
        for listener in config.listeners
        if index == 0 or kind_of(listener).shares_port
    ]
    return replace(
        config,
        state_dir=config.worker_state_dir(index),
        node_id=f"{config.node_id}-w{index}" if config.node_id else None,
        workers=1,
        worker=index,
        tls=tls,
        lake=lake,
        maintenance=maintenance,
        auth=auth,
        spark=spark,
        admin=admin,
        listeners=listeners,
    )


def writer_token(config: Config) -> int:
    """This state directory's writer token (the app id lease, appliance/lake/table.py).

    Drawn once and kept in ``<state_dir>/writer-token``: a restart of the same
    state directory reclaims its app id at once, even after SIGKILL, and
    another state directory under the same ``node_id`` has another token, so
    it is refused while the first one's lease is fresh. It is not tied to the
    machine (``/etc/machine-id`` changes at every boot of a container without
    one, which would lock a restarted node out for a lease). A machine cloned
    from an image that already ran the appliance copies this file with
    ``node-id``: remove both from the image (docs/table.md).
    """
    path = config.state_dir / "writer-token"
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = secrets.token_hex(16)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(text + "\n")
    digest = hashlib.sha256(text.encode("ascii", "replace")).digest()
    return int.from_bytes(digest[:8], "big") >> 2  # positive, fits a Delta txn version


def write_ahead_log(config: Config) -> WriteAheadLog | None:
    """The log under ``<state_dir>/wal``: with ``ack = "wal"``, or to drain one left behind.

    With ``ack = "commit"`` a log directory from an earlier ``ack = "wal"``
    run is opened only to commit what it holds; none is created.
    """
    directory = config.state_dir / "wal"
    if config.lake.ack != "wal" and not directory.is_dir():
        return None
    return WriteAheadLog(directory, settings_from(config.wal, WalSettings))


def left_log_dirs(config: Config) -> list[Path]:
    """State directories whose write-ahead logs no worker of ``config`` will replay.

    With workers, this directory's own (from a run with ``workers = 1``);
    always, those of workers beyond ``workers`` (from a run with more; all
    of them for a single process): what they hold was acknowledged.
    """
    found: list[Path] = []
    if config.worker_count > 1 and (config.state_dir / "wal").is_dir():
        found.append(config.state_dir)
    workers_dir = config.state_dir / "workers"
    count = config.worker_count
    running = count if count > 1 else 0  # a single process runs no worker
    if workers_dir.is_dir():
        for entry in sorted(workers_dir.iterdir(), key=lambda p: p.name):
            beyond = entry.name.isdigit() and int(entry.name) >= running
            if beyond and (entry / "wal").is_dir():
                found.append(entry)
    return found


async def drain_left_logs(config: Config) -> None:
    """Commit every record of the logs no worker will replay, before the workers start.

    Each is committed under the node id and writer token of the directory
    that wrote it, as its own service would at start (exactly once: the
    table's app transaction records how far each log is committed), then
    its segments are gone. Changing ``workers`` thus loses nothing.

    Raises:
        LakeError: the table cannot be written.
    """
    from appliance.lake.table import EventsTable
    from appliance.lake.writer import LakeWriter, WriterSettings

    left = left_log_dirs(config)
    if not left:
        return
    shared = worker_config(config, 0)
    for state_dir in left:
        if state_dir == config.state_dir:
            owner = replace(shared, state_dir=state_dir, node_id=config.node_id, worker=None)
        else:
            index = int(state_dir.name)
            node = f"{config.node_id}-w{index}" if config.node_id else None
            owner = replace(shared, state_dir=state_dir, node_id=node, worker=None)
        owner = replace(owner, lake=replace(owner.lake, ack="wal"))
        lock: StateLock | None = None
        if state_dir != config.state_dir:  # this process holds that one already
            try:
                # A process still running there (a worker of a supervisor that died) keeps it.
                lock = await trio.to_thread.run_sync(StateLock, state_dir)
            except StateLocked as exc:
                raise LeftLogLocked(f"cannot commit the log left in {state_dir}: {exc}") from None
        try:
            wal = write_ahead_log(owner)
            if wal is None:
                continue
            writer = LakeWriter(
                EventsTable(owner.table_uri, owner.lake.storage_options or None),
                node_id(owner),
                settings_from(owner.lake, WriterSettings),
                token=writer_token(owner),
            )
            await writer.open()
            await writer.drain_log(wal)
            if writer.lost_records == 0:
                # Everything in it is in the table now: no later start needs to look again.
                # (Records logged as lost stay on disk, for whoever investigates.)
                await trio.to_thread.run_sync(shutil.rmtree, state_dir / "wal")
            log.info("supervisor.log_drained", state_dir=str(state_dir), commits=writer.commits)
        finally:
            if lock is not None:
                lock.release()
