"""Client networks (CIDR): their own shared keys, allowed users and anonymous clients.

Part of the credential store (:class:`auth.store.SqlCredentialStore`): the
``appliance client ...`` operations and ``appliance user allow|deny``; every
change writes its audit entry in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from auth.credentials import CredentialTables, parse_cidr
from auth.errors import ConflictError, InvalidValueError, NotFoundError
from auth.models import ClientNetwork, utc_now
from auth.records import NetworkInfo

__all__ = ["NetworkAdmin"]


def _network_info(network: ClientNetwork) -> NetworkInfo:
    return NetworkInfo(
        cidr=network.cidr,
        allow_anonymous=network.allow_anonymous,
        restrict_users=network.restrict_users,
        users=tuple(u.name for u in network.users),
        keys=tuple(k.name for k in network.keys),
        created_at=network.created_at,
        updated_at=network.updated_at,
    )


class NetworkAdmin(CredentialTables):
    """The ``client_networks`` table and who may connect from each network."""

    def add_network(
        self,
        cidr: str,
        *,
        keys: Iterable[str] = (),
        users: Iterable[str] = (),
        allow_anonymous: bool = False,
        actor: str,
    ) -> NetworkInfo:
        """Create a client network; ``keys`` (global) become its own, ``users`` its only users."""
        normalized = parse_cidr(cidr)
        key_names, user_names = sorted(set(keys)), sorted(set(users))
        with self._write() as session:
            exists = select(ClientNetwork.id).where(ClientNetwork.cidr == normalized)
            if session.scalar(exists) is not None:
                raise ConflictError(f"client network {normalized} already exists")
            owned = [self._key(session, k) for k in key_names]
            for key in owned:
                if key.network is not None:
                    raise ConflictError(
                        f"shared key {key.name!r} already belongs to network {key.network.cidr}"
                    )
            now = utc_now()
            network = ClientNetwork(
                cidr=normalized,
                allow_anonymous=allow_anonymous,
                restrict_users=bool(user_names),
                users=[self._user(session, u) for u in user_names],
                keys=owned,
                created_at=now,
                updated_at=now,
            )
            session.add(network)
            for key in owned:
                key.updated_at = now
            detail = (
                f"keys={','.join(key_names) or '-'} users={','.join(user_names) or 'any'} "
                f"allow_anonymous={allow_anonymous}"
            )
            self._audit(session, "client.add", normalized, actor=actor, detail=detail)
            session.flush()
            return _network_info(network)

    def list_networks(self) -> list[NetworkInfo]:
        """Every client network, by CIDR."""
        with self._read() as session:
            networks = session.scalars(
                select(ClientNetwork)
                .options(selectinload(ClientNetwork.users), selectinload(ClientNetwork.keys))
                .order_by(ClientNetwork.cidr)
            )
            return [_network_info(n) for n in networks]

    def get_network(self, cidr: str) -> NetworkInfo:
        """One client network."""
        with self._read() as session:
            return _network_info(self._network(session, cidr))

    def update_network(
        self,
        cidr: str,
        *,
        allow_anonymous: bool | None = None,
        any_user: bool = False,
        actor: str,
    ) -> NetworkInfo:
        """Change whether anonymous clients may connect, or lift the user restriction."""
        with self._write() as session:
            network = self._network(session, cidr)
            changes = []
            if allow_anonymous is not None:
                network.allow_anonymous = allow_anonymous
                changes.append(f"allow_anonymous={allow_anonymous}")
            if any_user:
                network.restrict_users = False
                network.users = []
                changes.append("users=any")
            if not changes:
                raise InvalidValueError("nothing to change")
            network.updated_at = utc_now()
            self._audit(session, "client.set", network.cidr, actor=actor, detail=" ".join(changes))
            return _network_info(network)

    def delete_network(self, cidr: str, *, with_keys: bool = False, actor: str) -> None:
        """Delete a client network; its keys too with ``with_keys`` (never made global)."""
        with self._write() as session:
            network = self._network(session, cidr)
            names = [k.name for k in network.keys]
            if names and not with_keys:
                raise ConflictError(
                    f"client network {network.cidr} has shared keys {', '.join(names)}: delete "
                    "them first ('appliance key delete NAME') or pass --with-keys"
                )
            for key in list(network.keys):
                session.delete(key)
            session.delete(network)
            detail = f"deleted keys {','.join(names)}" if names else ""
            self._audit(session, "client.delete", network.cidr, actor=actor, detail=detail)

    def allow_user(self, name: str, cidr: str, *, actor: str) -> NetworkInfo:
        """Add a user to a network's allowed users (the network then admits only those)."""
        with self._write() as session:
            network = self._network(session, cidr)
            user = self._user(session, name)
            if user not in network.users:
                network.users.append(user)
            network.restrict_users = True
            network.updated_at = utc_now()
            self._audit(session, "user.allow", name, actor=actor, detail=f"network={network.cidr}")
            return _network_info(network)

    def deny_user(self, name: str, cidr: str, *, actor: str) -> NetworkInfo:
        """Remove a user from a network's allowed users (with none left, no user may connect)."""
        with self._write() as session:
            network = self._network(session, cidr)
            user = self._user(session, name)
            if not network.restrict_users:
                raise ConflictError(
                    f"client network {network.cidr} admits any user: name the users it admits "
                    "with 'appliance user allow NAME CIDR' instead"
                )
            if user not in network.users:
                raise NotFoundError(f"user {name!r} is not allowed on {network.cidr} already")
            network.users.remove(user)
            network.updated_at = utc_now()
            self._audit(session, "user.deny", name, actor=actor, detail=f"network={network.cidr}")
            return _network_info(network)
