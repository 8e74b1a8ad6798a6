"""Certificate names: a safe charset and length, so a name never leaves its output directory."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from pki.authority import CertificateAuthority, PkiPaths
from pki.errors import PkiError
from pki.names import (
    MAX_COMMON_NAME_CHARS,
    check_client_name,
    check_server_name,
    check_server_names,
)
from tests.support.cli import run_cli

GOOD_CLIENT_NAMES = ["web-01", "a", "fluent.bit_2", "svc@host", "x" * MAX_COMMON_NAME_CHARS]
BAD_CLIENT_NAMES = [
    "",
    "x" * (MAX_COMMON_NAME_CHARS + 1),
    "../evil",
    "..",
    "a..b",
    "a/b",
    "/etc/cron.d/x",
    "a\\b",
    ".hidden",
    "-rf",
    "web 01",
    "web\x0001",
    "wéb",
    "a\nb",
]


@pytest.mark.parametrize("name", GOOD_CLIENT_NAMES)
def test_good_client_names(name: str) -> None:
    assert check_client_name(name) == name


@pytest.mark.parametrize("name", BAD_CLIENT_NAMES)
def test_bad_client_names(name: str) -> None:
    with pytest.raises(PkiError, match="certificate name"):
        check_client_name(name)


@pytest.mark.parametrize(
    "name",
    ["localhost", "ingest.example.net", "*.example.net", "127.0.0.1", "::1", "host_1.lan", "a-b"],
)
def test_good_server_names(name: str) -> None:
    assert check_server_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "../x", "..", "a..b", ".example", "-a.example", "a-.example", "*.com",
     "a.*.example", "fe80::1%eth0", "fe80::1%..", "a b", "x" * 254, "a" * 64 + ".example"],
)  # fmt: skip
def test_bad_server_names(name: str) -> None:
    with pytest.raises(PkiError, match="server name"):
        check_server_name(name)


def test_the_first_server_name_is_the_common_name_and_must_fit() -> None:
    long_name = ".".join(["a" * 30, "b" * 30, "example"])  # a DNS name, 69 characters
    assert check_server_name(long_name) == long_name
    assert check_server_names(["localhost", long_name]) == ["localhost", long_name]
    with pytest.raises(PkiError, match="at most 64 characters"):
        check_server_names([long_name])
    with pytest.raises(PkiError, match="at least one name"):
        check_server_names([])


def test_the_ca_refuses_bad_names_before_signing(tmp_path: Path) -> None:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    before = ca.inventory.entries()
    with pytest.raises(PkiError):
        ca.issue_client("../../evil")
    with pytest.raises(PkiError):
        ca.issue_server(["a/b"])
    with pytest.raises(PkiError):
        ca.rotate_server(["bad name"])
    assert ca.inventory.entries() == before
    assert not (tmp_path / "pki" / "issued").exists() or not any(
        (tmp_path / "pki" / "issued").iterdir()
    )


def test_issue_client_writes_only_inside_out(tmp_path: Path) -> None:
    config = tmp_path / "appliance.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')

    cert = functools.partial(run_cli, "cert", config=config)

    assert cert("init").returncode == 0
    out = tmp_path / "deep" / "out"
    for name in ("../escaped", "../../escaped", "sub/escaped"):
        result = cert("issue-client", name, "--out", str(out))
        assert result.returncode == 1
        assert f"appliance: certificate name {name!r}: use letters" in result.stderr
    result = cert("issue-server", "../escaped", "--out", str(out))
    assert result.returncode == 1
    assert "appliance: server name '../escaped'" in result.stderr
    assert not list(tmp_path.rglob("escaped*"))
    assert not out.exists()
    listed = cert("list", "--json")
    assert "escaped" not in listed.stdout  # nothing was issued either
