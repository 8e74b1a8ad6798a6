"""The credential store on SQLite and PostgreSQL: CRUD, resolution, sealed secrets, rotation."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from pathlib import Path
from unittest import mock

import pytest
from sqlalchemy import create_engine, select, text

from auth.credentials import KIND_KEY, KIND_USER, parse_cidr
from auth.errors import (
    ConflictError,
    InvalidValueError,
    NotFoundError,
    SecretKeyError,
)
from auth.models import AuditEntry, SharedKey, User
from auth.policy import CredentialStore, SourcePolicy
from auth.store import SqlCredentialStore
from auth.vault import SecretVault, key_id_of
from tests.auth.conftest import credentials

ADMIN = "cli:test"


def raw_secrets(url: str) -> dict[str, bytes]:
    """The sealed columns as stored, read past the store."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            users = connection.execute(select(User.name, User.password_sealed)).all()
            keys = connection.execute(select(SharedKey.name, SharedKey.secret_sealed)).all()
    finally:
        engine.dispose()
    found = {f"user:{name}": bytes(value) for name, value in users}
    found.update({f"key:{name}": bytes(value) for name, value in keys})
    return found


def set_raw(url: str, table: str, column: str, name: str, value: bytes) -> None:
    """Overwrite a sealed column behind the store's back."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(f"UPDATE {table} SET {column} = :value WHERE name = :name"),
                {"value": value, "name": name},
            )
    finally:
        engine.dispose()


def audit_text(store: SqlCredentialStore) -> str:
    return "\n".join(
        " ".join(str(v) for v in entry.to_json().values())
        for entry in store.audit_entries(limit=10_000)
    )


def test_the_store_has_every_method_of_the_contract(store: SqlCredentialStore) -> None:
    contract = [n for n in vars(CredentialStore) if not n.startswith("_")]
    assert set(contract) == {
        "resolve_source",
        "password_of",
        "note_login",
        "note_failure",
        "record_audit",
    }
    assert all(callable(getattr(store, name)) for name in contract)
    assert store.password_of("nobody") is None


# -- users ------------------------------------------------------------------------


def test_user_crud(store: SqlCredentialStore) -> None:
    before = dt.datetime.now(dt.UTC)
    added = store.add_user("alice", b"pw-alice", actor=ADMIN)
    assert added.enabled
    assert added.created_at.tzinfo is not None
    assert before - dt.timedelta(seconds=5) <= added.created_at <= dt.datetime.now(dt.UTC)
    store.add_user("bob", b"pw-bob", actor=ADMIN, enabled=False)
    assert [u.name for u in store.list_users()] == ["alice", "bob"]
    assert store.password_of("alice") == b"pw-alice"
    assert store.password_of("bob") is None  # disabled
    assert store.password_of("carol") is None  # unknown

    with pytest.raises(ConflictError, match="already exists"):
        store.add_user("alice", b"other", actor=ADMIN)
    with pytest.raises(InvalidValueError):
        store.add_user("with space", b"x", actor=ADMIN)
    with pytest.raises(InvalidValueError, match="empty"):
        store.add_user("dave", b"", actor=ADMIN)
    with pytest.raises(NotFoundError, match="carol"):
        store.get_user("carol")

    store.set_user_enabled("bob", True, actor=ADMIN)
    assert store.password_of("bob") == b"pw-bob"
    store.set_user_enabled("alice", False, actor=ADMIN)
    assert store.password_of("alice") is None
    assert not store.get_user("alice").enabled
    store.set_user_enabled("alice", True, actor=ADMIN)

    changed = store.set_password("alice", b"pw-alice-2", actor=ADMIN)
    assert changed.updated_at >= added.updated_at
    assert store.password_of("alice") == b"pw-alice-2"

    store.note_login("alice", "10.1.2.3")
    store.note_login(None, "10.1.2.3")  # anonymous: nothing to record
    seen = store.get_user("alice")
    assert seen.last_login_address == "10.1.2.3"
    assert seen.last_login_at is not None
    assert seen.last_login_at.tzinfo is not None

    store.delete_user("bob", actor=ADMIN)
    assert [u.name for u in store.list_users()] == ["alice"]
    with pytest.raises(NotFoundError):
        store.delete_user("bob", actor=ADMIN)


# -- keys and networks --------------------------------------------------------------


def test_keys_and_networks_crud(store: SqlCredentialStore) -> None:
    store.add_key("global-1", b"g1-secret", actor=ADMIN)
    with pytest.raises(NotFoundError, match=r"no client network 10\.0\.0\.0/8"):
        store.add_key("net-1", b"n1-secret", network="10.0.0.0/8", actor=ADMIN)
    store.add_user("alice", b"pw", actor=ADMIN)

    network = store.add_network("10.0.0.0/8", users=["alice"], allow_anonymous=True, actor=ADMIN)
    assert (network.cidr, network.users, network.restrict_users, network.allow_anonymous) == (
        "10.0.0.0/8",
        ("alice",),
        True,
        True,
    )
    key = store.add_key("net-1", b"n1-secret", network="10.0.0.0/8", actor=ADMIN)
    assert (key.scope, key.network) == ("10.0.0.0/8", "10.0.0.0/8")
    assert store.get_key("global-1").scope == "global"
    assert [k.name for k in store.list_keys()] == ["global-1", "net-1"]
    assert store.get_network("10.0.0.0/8").keys == ("net-1",)
    assert store.get_user("alice").networks == ("10.0.0.0/8",)

    with pytest.raises(ConflictError, match="already exists"):
        store.add_network("10.0.0.0/8", actor=ADMIN)
    with pytest.raises(ConflictError, match="already exists"):
        store.add_key("net-1", b"x", actor=ADMIN)
    with pytest.raises(InvalidValueError, match="host bits"):
        store.add_network("10.0.0.1/8", actor=ADMIN)
    with pytest.raises(InvalidValueError, match="CIDR"):
        store.add_network("not-a-network", actor=ADMIN)
    with pytest.raises(NotFoundError, match="no user named 'zed'"):
        store.add_network("192.168.0.0/16", users=["zed"], actor=ADMIN)
    with pytest.raises(NotFoundError, match="no shared key"):
        store.add_network("192.168.0.0/16", keys=["missing"], actor=ADMIN)

    # A global key handed to a network becomes its own; another network's key is refused.
    moved = store.add_network("192.168.0.0/16", keys=["global-1"], actor=ADMIN)
    assert moved.keys == ("global-1",)
    assert store.get_key("global-1").scope == "192.168.0.0/16"
    with pytest.raises(ConflictError, match="already belongs"):
        store.add_network("172.16.0.0/12", keys=["net-1"], actor=ADMIN)

    assert parse_cidr("10.9.8.7") == "10.9.8.7/32"
    assert parse_cidr(" 2001:DB8::/32 ") == "2001:db8::/32"
    assert [n.cidr for n in store.list_networks()] == ["10.0.0.0/8", "192.168.0.0/16"]

    updated = store.update_network("10.0.0.0/8", allow_anonymous=False, any_user=True, actor=ADMIN)
    assert (updated.allow_anonymous, updated.restrict_users, updated.users) == (False, False, ())
    with pytest.raises(InvalidValueError, match="nothing to change"):
        store.update_network("10.0.0.0/8", actor=ADMIN)

    # A network's keys are never made global behind the operator's back.
    with pytest.raises(ConflictError, match="has shared keys net-1"):
        store.delete_network("10.0.0.0/8", actor=ADMIN)
    store.delete_network("10.0.0.0/8", with_keys=True, actor=ADMIN)
    assert [k.name for k in store.list_keys()] == ["global-1"]
    store.delete_key("global-1", actor=ADMIN)
    store.delete_network("192.168.0.0/16", actor=ADMIN)
    assert store.list_networks() == []
    with pytest.raises(NotFoundError):
        store.delete_key("global-1", actor=ADMIN)


# -- resolution rules (auth/policy.py) ------------------------------------------------


def test_resolution_rules(store: SqlCredentialStore) -> None:
    for name in ["alice", "bob"]:
        store.add_user(name, f"pw-{name}".encode(), actor=ADMIN)
    store.add_key("g-old", b"global-old", actor=ADMIN)
    store.add_key("g-new", b"global-new", actor=ADMIN)
    # Added most specific first: order of rows must not decide.
    store.add_network("10.1.2.0/24", allow_anonymous=True, actor=ADMIN)
    store.add_network("10.0.0.0/8", actor=ADMIN)
    store.add_network("10.1.0.0/16", users=["alice"], actor=ADMIN)
    store.add_network("2001:db8::/32", users=["bob"], actor=ADMIN)
    store.add_key("k16", b"sixteen", network="10.1.0.0/16", actor=ADMIN)
    store.add_key("k6", b"six", network="2001:db8::/32", actor=ADMIN)

    globals_ = (b"global-new", b"global-old")  # several keys at once: rotation
    # 1. The most specific network wins, whatever the order they were added in.
    assert store.resolve_source("10.1.2.3") == SourcePolicy(
        network="10.1.2.0/24", shared_keys=globals_, allowed_users=None, allow_anonymous=True
    )
    # 2. A network's own keys replace the global ones; 3. its users restrict usernames.
    assert store.resolve_source("10.1.9.9") == SourcePolicy(
        network="10.1.0.0/16",
        shared_keys=(b"sixteen",),
        allowed_users=frozenset({"alice"}),
        allow_anonymous=False,
    )
    # No keys of its own: the global keys; no users named: any enabled user.
    assert store.resolve_source("10.200.0.1") == SourcePolicy(
        network="10.0.0.0/8", shared_keys=globals_, allowed_users=None
    )
    # 4. An address in no network is an anonymous source: global keys, any user.
    assert store.resolve_source("192.0.2.1") == SourcePolicy(network=None, shared_keys=globals_)
    # IPv6, the IPv4-mapped form of a dual-stack socket, a scope id, brackets.
    assert store.resolve_source("2001:db8::1").network == "2001:db8::/32"
    assert store.resolve_source("2001:db8::1").shared_keys == (b"six",)
    assert store.resolve_source("::ffff:10.1.2.3").network == "10.1.2.0/24"
    assert store.resolve_source("[2001:db8::5]").network == "2001:db8::/32"
    assert store.resolve_source("fe80::1%eth0").network is None
    assert store.resolve_source("not an address").network is None

    # Users allowed and denied per network.
    store.allow_user("bob", "10.1.0.0/16", actor=ADMIN)
    assert store.resolve_source("10.1.9.9").allowed_users == frozenset({"alice", "bob"})
    store.deny_user("alice", "10.1.0.0/16", actor=ADMIN)
    assert store.resolve_source("10.1.9.9").allowed_users == frozenset({"bob"})
    with pytest.raises(NotFoundError, match="not allowed"):
        store.deny_user("alice", "10.1.0.0/16", actor=ADMIN)
    with pytest.raises(ConflictError, match="admits any user"):
        store.deny_user("alice", "10.0.0.0/8", actor=ADMIN)


def test_removing_the_last_allowed_user_never_opens_a_network(
    store: SqlCredentialStore,
) -> None:
    store.add_user("alice", b"pw-a", actor=ADMIN)
    store.add_user("bob", b"pw-b", actor=ADMIN)
    store.add_network("10.0.0.0/8", users=["alice"], actor=ADMIN)
    store.add_network("10.2.0.0/16", users=["bob"], actor=ADMIN)
    store.deny_user("alice", "10.0.0.0/8", actor=ADMIN)
    assert store.resolve_source("10.0.0.1").allowed_users == frozenset()
    assert store.get_network("10.0.0.0/8").users_text == "none"
    store.delete_user("bob", actor=ADMIN)
    assert store.resolve_source("10.2.0.1").allowed_users == frozenset()
    store.update_network("10.0.0.0/8", any_user=True, actor=ADMIN)
    assert store.resolve_source("10.0.0.1").allowed_users is None


def test_changes_apply_to_a_running_store(migrated_url: str, key_file: Path) -> None:
    """The service's store sees the CLI's changes on its next look-up, rotation included."""
    with (
        credentials(migrated_url, key_file) as service,
        credentials(migrated_url, key_file) as cli,
    ):
        assert service.password_of("alice") is None
        cli.add_user("alice", b"pw-1", actor=ADMIN)
        assert service.password_of("alice") == b"pw-1"
        cli.set_password("alice", b"pw-2", actor=ADMIN)
        assert service.password_of("alice") == b"pw-2"
        cli.add_key("k", b"key-1", actor=ADMIN)
        assert service.resolve_source("10.0.0.1").shared_keys == (b"key-1",)
        cli.add_network("10.0.0.0/8", users=["alice"], actor=ADMIN)
        assert service.resolve_source("10.0.0.1").allowed_users == frozenset({"alice"})
        cli.rotate_master_key(actor=ADMIN)
        assert service.password_of("alice") == b"pw-2"  # new key id: re-read from the file
        assert service.resolve_source("10.0.0.1").shared_keys == (b"key-1",)
        cli.set_user_enabled("alice", False, actor=ADMIN)
        assert service.password_of("alice") is None


def test_concurrent_lookups_share_the_pool(store: SqlCredentialStore) -> None:
    store.add_user("alice", b"pw", actor=ADMIN)
    store.add_key("k", b"key", actor=ADMIN)
    errors: list[BaseException] = []

    def look_up() -> None:
        try:
            for _ in range(15):
                assert store.resolve_source("10.0.0.1").shared_keys == (b"key",)
                assert store.password_of("alice") == b"pw"
        except BaseException as exc:  # collected for the main thread
            errors.append(exc)

    def write() -> None:
        try:
            for n in range(5):
                store.add_user(f"user-{n}", b"pw", actor=ADMIN)
                store.note_failure("10.0.0.9", "mallory", "bad digest")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=look_up) for _ in range(6)] + [
        threading.Thread(target=write)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(store.list_users()) == 6


# -- secrets at rest ------------------------------------------------------------------


def test_secrets_are_sealed_at_rest(store: SqlCredentialStore, migrated_url: str) -> None:
    store.add_user("alice", b"plain-password-alice", actor=ADMIN)
    store.add_key("k", b"plain-shared-key-k", actor=ADMIN)
    stored = raw_secrets(migrated_url)
    assert b"plain-password-alice" not in stored["user:alice"]
    assert b"plain-shared-key-k" not in stored["key:k"]
    current = store.vault.current_key_id()
    assert key_id_of(stored["user:alice"]) == current
    assert key_id_of(stored["key:k"]) == current
    # Two seals of one secret differ (random nonce).
    assert store.vault.seal(KIND_USER, "alice", b"x") != store.vault.seal(KIND_USER, "alice", b"x")
    # Decryptable with the key file, and only as its own row.
    assert store.vault.open(KIND_USER, "alice", stored["user:alice"]) == b"plain-password-alice"
    assert store.vault.open(KIND_KEY, "k", stored["key:k"]) == b"plain-shared-key-k"
    with pytest.raises(SecretKeyError, match="fails authentication"):
        store.vault.open(KIND_USER, "bob", stored["user:alice"])
    with pytest.raises(SecretKeyError, match="fails authentication"):
        store.vault.open(KIND_KEY, "alice", stored["user:alice"])
    if migrated_url.startswith("sqlite"):
        database = Path(migrated_url.removeprefix("sqlite:///")).read_bytes()
        assert b"plain-password-alice" not in database
        assert b"plain-shared-key-k" not in database


def test_key_file_created_on_first_use_with_mode_0600(
    store: SqlCredentialStore, migrated_url: str
) -> None:
    key_file = store.vault.path
    assert not key_file.exists()
    store.add_user("alice", b"pw", actor=ADMIN)
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o077 == 0
    key_file.chmod(0o640)
    with pytest.raises(SecretKeyError, match="chmod 600"):
        store.add_user("bob", b"pw", actor=ADMIN)
    key_file.chmod(0o600)
    store.vault._keys.clear()  # as a freshly started service
    key_file.rename(key_file.with_name("elsewhere"))
    with pytest.raises(SecretKeyError, match="missing"):
        store.vault.open(KIND_USER, "alice", raw_secrets(migrated_url)["user:alice"])
    assert store.password_of("alice") is None  # fails closed, logged


def test_tampered_ciphertexts_are_refused(store: SqlCredentialStore, migrated_url: str) -> None:
    store.add_user("alice", b"pw-alice", actor=ADMIN)
    store.add_user("bob", b"pw-bob", actor=ADMIN)
    store.add_key("net", b"net-key", actor=ADMIN)
    store.add_network("10.0.0.0/8", keys=["net"], actor=ADMIN)
    stored = raw_secrets(migrated_url)

    flipped = bytearray(stored["user:alice"])
    flipped[-1] ^= 0x01
    set_raw(migrated_url, "users", "password_sealed", "alice", bytes(flipped))
    assert store.password_of("alice") is None
    with pytest.raises(SecretKeyError, match="fails authentication"):
        store.vault.open(KIND_USER, "alice", bytes(flipped))

    # Bob's ciphertext pasted onto alice does not give alice bob's password.
    set_raw(migrated_url, "users", "password_sealed", "alice", stored["user:bob"])
    assert store.password_of("alice") is None
    assert store.password_of("bob") == b"pw-bob"

    # A network key that cannot be opened is left out, never replaced by the global keys.
    store.add_key("global", b"global-key", actor=ADMIN)
    set_raw(migrated_url, "shared_keys", "secret_sealed", "net", b"\x01garbage")
    assert store.resolve_source("10.0.0.1").shared_keys == ()


# -- rotation of the key file ------------------------------------------------------------


def test_rotation_reseals_everything_and_retires_the_old_key(
    store: SqlCredentialStore, migrated_url: str, tmp_path: Path
) -> None:
    store.add_user("alice", b"pw-alice", actor=ADMIN)
    store.add_user("bob", b"pw-bob", actor=ADMIN)
    store.add_key("k1", b"key-1", actor=ADMIN)
    old_copy = tmp_path / "old-copy" / "secret.key"
    old_copy.parent.mkdir(mode=0o700)
    shutil.copy2(store.vault.path, old_copy)
    before = raw_secrets(migrated_url)
    old_id = store.vault.current_key_id()

    result = store.rotate_master_key(actor=ADMIN)
    assert (result.resealed, result.resumed) == (3, False)
    after = raw_secrets(migrated_url)
    assert {key_id_of(v) for v in after.values()} == {bytes.fromhex(result.key_id)}
    assert result.key_id != old_id.hex()
    assert all(after[name] != before[name] for name in before)
    assert not store.vault.old_path.exists()
    assert store.vault.path.stat().st_mode & 0o777 == 0o600

    assert store.password_of("alice") == b"pw-alice"
    assert store.resolve_source("10.0.0.1").shared_keys == (b"key-1",)
    old_vault = SecretVault(old_copy)
    with pytest.raises(SecretKeyError, match="neither"):
        old_vault.open(KIND_USER, "alice", after["user:alice"])
    assert old_vault.open(KIND_USER, "alice", before["user:alice"]) == b"pw-alice"
    entry = store.audit_entries(limit=1)[0]
    assert (entry.action, entry.actor) == ("key.rotate-master", ADMIN)
    assert "re-encrypted 3 secrets" in entry.detail


def test_rotation_on_an_empty_database(store: SqlCredentialStore) -> None:
    result = store.rotate_master_key(actor=ADMIN)
    assert result.resealed == 0
    assert store.vault.current_key_id().hex() == result.key_id


def test_rotation_interrupted_before_commit_is_safe_and_resumes(
    store: SqlCredentialStore, migrated_url: str
) -> None:
    store.add_user("alice", b"pw-alice", actor=ADMIN)
    store.add_key("k1", b"key-1", actor=ADMIN)
    old_id = store.vault.current_key_id()
    # The crash: the new key is in place, the old one kept, nothing re-encrypted yet.
    with store.vault.lock(exclusive=True):
        new_id = store.vault.stage_new_key()
    assert store.vault.rotation_pending
    assert {key_id_of(v) for v in raw_secrets(migrated_url).values()} == {old_id}
    # A service started now (fresh cache) opens everything with the two files.
    with credentials(migrated_url, store.vault.path) as service:
        assert service.password_of("alice") == b"pw-alice"
        # A secret written meanwhile is sealed under the new key.
        service.add_user("bob", b"pw-bob", actor=ADMIN)
    assert key_id_of(raw_secrets(migrated_url)["user:bob"]) == new_id

    result = store.rotate_master_key(actor=ADMIN)
    assert result.resumed
    assert not store.vault.rotation_pending
    assert {key_id_of(v) for v in raw_secrets(migrated_url).values()} == {
        bytes.fromhex(result.key_id)
    }
    assert store.password_of("alice") == b"pw-alice"
    assert store.password_of("bob") == b"pw-bob"
    assert "completed an interrupted rotation" in audit_text(store)


def test_rotation_interrupted_after_commit_resumes(
    store: SqlCredentialStore, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add_user("alice", b"pw-alice", actor=ADMIN)

    def crash() -> None:
        raise OSError("simulated crash before secret.key.old was deleted")

    with monkeypatch.context() as patch:
        patch.setattr(store.vault, "drop_old_key", crash)
        with pytest.raises(OSError, match="simulated crash"):
            store.rotate_master_key(actor=ADMIN)
    assert store.vault.rotation_pending
    with credentials(migrated_url, store.vault.path) as service:
        assert service.password_of("alice") == b"pw-alice"
    result = store.rotate_master_key(actor=ADMIN)
    assert result.resumed
    assert not store.vault.rotation_pending
    assert store.password_of("alice") == b"pw-alice"


def test_rotation_stops_on_an_unreadable_secret(
    store: SqlCredentialStore, migrated_url: str
) -> None:
    store.add_user("alice", b"pw-alice", actor=ADMIN)
    store.add_user("bob", b"pw-bob", actor=ADMIN)
    sealed = raw_secrets(migrated_url)
    # Flip every bit of the last byte: replacing it with a fixed byte left the secret
    # unchanged whenever it already ended in that byte (one run in 256).
    damaged = sealed["user:bob"][:-1] + bytes([sealed["user:bob"][-1] ^ 0xFF])
    set_raw(migrated_url, "users", "password_sealed", "bob", damaged)
    with pytest.raises(SecretKeyError, match="unfinished but safe"):
        store.rotate_master_key(actor=ADMIN)
    assert store.password_of("alice") == b"pw-alice"  # both keys still open it
    store.delete_user("bob", actor=ADMIN)
    assert store.rotate_master_key(actor=ADMIN).resumed
    assert store.password_of("alice") == b"pw-alice"


# -- audit -----------------------------------------------------------------------------------


def test_a_user_without_a_password_costs_what_opening_one_costs(
    store: SqlCredentialStore,
) -> None:
    """Unknown or disabled: a stand-in secret is opened, so existence takes no time to tell."""
    store.add_user("alice", b"pw-alice", actor=ADMIN)
    store.add_user("bob", b"pw-bob", actor=ADMIN, enabled=False)
    with mock.patch.object(store, "_open_decoy", wraps=store._open_decoy) as decoy:
        assert store.password_of("nobody") is None
        assert store.password_of("bob") is None
        assert decoy.call_count == 2
        assert store.password_of("alice") == b"pw-alice"
        assert decoy.call_count == 2


def test_audit_log_records_changes_and_failures_without_secrets(
    store: SqlCredentialStore, migrated_url: str
) -> None:
    secrets = [b"audit-pw-1", b"audit-pw-2", b"audit-key-1"]
    store.add_user("alice", secrets[0], actor=ADMIN)
    store.set_password("alice", secrets[1], actor=ADMIN)
    store.add_key("k", secrets[2], actor=ADMIN)
    store.add_network("10.0.0.0/8", keys=["k"], users=["alice"], actor=ADMIN)
    store.set_user_enabled("alice", False, actor=ADMIN)
    store.rotate_master_key(actor=ADMIN)
    store.note_failure("192.0.2.7", "mallory", "password digest mismatch")
    store.note_failure("192.0.2.8", None, "shared key digest mismatch")
    store.note_failure("192.0.2.9", "evil\x1b[2Jname", "x" * 5000)
    store.note_failure("192.0.2.10", "cli:root", "password digest mismatch")
    store.note_failure("192.0.2.11", "a\\x0ab\nc", "password digest mismatch")

    entries = store.audit_entries()
    actions = [e.action for e in reversed(entries)]
    assert actions == [
        "user.add",
        "user.passwd",
        "key.add",
        "client.add",
        "user.disable",
        "key.rotate-master",
        "auth.failure",
        "auth.failure",
        "auth.failure",
        "auth.failure",
        "auth.failure",
    ]
    # A failed handshake proved no identity: its actor is the address, never
    # the name the client claimed (which is the target, escaped).
    failure = entries[4]
    assert (failure.source_address, failure.actor, failure.target) == (
        "192.0.2.7",
        "unauthenticated:192.0.2.7",
        "mallory",
    )
    assert failure.detail == "password digest mismatch"
    assert (entries[3].actor, entries[3].target) == ("unauthenticated:192.0.2.8", "")
    assert entries[2].actor == "unauthenticated:192.0.2.9"
    assert entries[2].target == "evil\\x1b[2Jname"  # no terminal escapes stored
    assert len(entries[2].detail) == 1000
    assert (entries[1].actor, entries[1].target) == ("unauthenticated:192.0.2.10", "cli:root")
    # The backslash is escaped too: a sent "\x0a" never reads as an escaped newline.
    assert entries[0].target == "a\\\\x0ab\\x0ac"
    assert not any(e.actor == "cli:root" for e in entries)
    assert all(e.at.tzinfo is not None for e in entries)
    assert entries[-1].actor == ADMIN

    text_of_audit = audit_text(store)
    for secret in secrets:
        assert secret.decode() not in text_of_audit
    engine = create_engine(migrated_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(AuditEntry.__table__)).all()
            count = connection.execute(text("SELECT count(*) FROM audit_log")).scalar()
    finally:
        engine.dispose()
    assert count == len(entries)
    dumped = repr(rows)
    for secret in secrets:
        assert secret.decode() not in dumped


def test_display_url_masks_a_password_in_the_query() -> None:
    """libpq takes password and sslpassword as query parameters too: never shown."""
    from auth.engine import display_url

    shown = display_url(
        "postgresql+psycopg://u:pw@h/db?password=s3cret&sslpassword=k3y&sslmode=require"
    )
    assert "s3cret" not in shown
    assert "k3y" not in shown
    assert "pw@" not in shown
    assert "sslmode=require" in shown
