"""Names that mimic another kind of principal are refused; a claimed name is never an actor.

The stores run on the embedded SQLite database (the PostgreSQL cases of the
stores are in test_models_store.py); the CLI runs in this process.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from unittest import mock

import pytest

from appliance.cli import main
from auth.curve import generate_keypair
from auth.database import open_database
from auth.errors import InvalidValueError
from auth.principals import check_principal_name, escape_claimed, unauthenticated_actor
from auth.settings import AuthSettings

RESERVED = [
    "anonymous",
    "Anonymous",
    "anonymous@192.0.2.1",
    "token:ci",
    "TOKEN:ci",
    "cli:root",
    "unauthenticated:192.0.2.7",
    "CN=shipper-1",
    "CN=shipper-1,O=example",
]
ALLOWED = ["alice", "anonymous-shipper", "tokens", "cli", "shipper.example.net", "a:b"]


@pytest.mark.parametrize("name", RESERVED)
def test_names_of_other_principals_are_reserved(name: str) -> None:
    with pytest.raises(InvalidValueError, match="reserved") as refused:
        check_principal_name("user", name)
    assert repr(name) in str(refused.value)  # the message names it


@pytest.mark.parametrize("name", ALLOWED)
def test_other_names_are_free(name: str) -> None:
    assert check_principal_name("user", name) == name


def test_invalid_names_stay_invalid() -> None:
    with pytest.raises(InvalidValueError, match="spaces"):
        check_principal_name("token", "two words")


def test_the_stores_refuse_reserved_names(tmp_path: Path) -> None:
    public, _ = generate_keypair()
    with open_database(AuthSettings.under(tmp_path)) as database:
        for name in RESERVED:
            with pytest.raises(InvalidValueError, match="reserved"):
                database.credentials.add_user(name, b"pw", actor="cli:test")
            with pytest.raises(InvalidValueError, match="reserved"):
                database.tokens.add(name, "ingest", actor="cli:test")
            with pytest.raises(InvalidValueError, match="reserved"):
                database.curve_keys.add(name, public, actor="cli:test")
        assert database.credentials.list_users() == []
        assert database.tokens.list() == []
        assert database.curve_keys.list() == []
        database.credentials.add_user("anonymous-shipper", b"pw", actor="cli:test")
        database.tokens.add("tokens", "ingest", actor="cli:test")
        database.curve_keys.add("cli", public, actor="cli:test")


@pytest.mark.parametrize(
    "args",
    [
        ["user", "add", "token:ci"],
        ["token", "add", "CN=shipper-1", "--scope", "ingest"],
        ["curve", "add", "anonymous@10.0.0.1", "--generate"],
    ],
)
def test_the_cli_refuses_reserved_names_before_anything_else(
    tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One clear line, exit 1, no password asked, no database created."""
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{state}"\n', encoding="utf-8")
    with mock.patch.object(getpass, "getpass", side_effect=AssertionError("asked")):
        assert main([*args, "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "is reserved" in err
    assert "Traceback" not in err
    assert not (state / "auth" / "auth.db").exists()


def test_a_claimed_name_is_kept_escaped_and_unambiguous() -> None:
    assert unauthenticated_actor("192.0.2.7") == "unauthenticated:192.0.2.7"
    assert escape_claimed("bob") == "bob"
    assert escape_claimed("a\nb") == "a\\x0ab"
    assert escape_claimed("a\\x0ab") == "a\\\\x0ab"  # not the same as the newline
    assert escape_claimed("\u2028\U000e0001") == "\\u2028\\U000e0001"
