"""The helpers every command module shares (appliance.commands.common)."""

from __future__ import annotations

import argparse
import io
import ssl
from pathlib import Path

import pytest

from appliance.commands import common
from appliance.config import Config


def test_config_source_names_where_the_file_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.CONFIG_ENV, raising=False)
    assert common.config_source(None) is None
    assert common.config_source("a.toml") == "a.toml"
    monkeypatch.setenv(common.CONFIG_ENV, "b.toml")
    assert common.config_source(None) == "b.toml ($APPLIANCE_CONFIG)"
    assert common.config_source("a.toml") == "a.toml"


def test_load_reads_the_named_file_else_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(common.CONFIG_ENV, raising=False)
    assert common.load(None).state_dir == Path("var")
    config = tmp_path / "a.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n', encoding="utf-8")
    monkeypatch.setenv(common.CONFIG_ENV, str(config))
    assert common.load(None).state_dir == tmp_path / "state"


def test_guarded_turns_the_named_errors_into_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: argparse.Namespace, config: Config) -> int:
        raise LookupError("no such thing")

    assert common.guarded(LookupError)(broken)(argparse.Namespace(), Config()) == 1
    assert capsys.readouterr().err == "appliance: no such thing\n"
    with pytest.raises(LookupError):
        common.guarded(ValueError)(broken)(argparse.Namespace(), Config())


def test_fail_prints_one_line_and_returns_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert common.fail("bad --url", 2) == 2
    assert capsys.readouterr().err == "appliance: bad --url\n"


def test_print_table_aligns_and_says_when_empty() -> None:
    out = io.StringIO()
    common.print_table(["a", "long header"], [["xyz", None], [1, 2]], out=out)
    assert out.getvalue().splitlines() == [
        "a    long header",
        "---  -----------",
        "xyz",
        "1    2",
    ]
    empty = io.StringIO()
    common.print_table(["a"], [], out=empty)
    assert empty.getvalue() == "(none)\n"


@pytest.mark.parametrize(
    ("convert", "text", "value"),
    [
        (common.positive_int, "3", 3),
        (common.non_negative_int, "0", 0),
    ],
)
def test_integer_arguments(convert: object, text: str, value: int) -> None:
    assert callable(convert)
    assert convert(text) == value


@pytest.mark.parametrize(
    ("convert", "text", "message"),
    [
        (common.positive_int, "0", "must be greater than 0"),
        (common.positive_int, "x", "not a whole number: 'x'"),
        (common.non_negative_int, "-1", "cannot be negative"),
        (common.non_negative_int, "1.5", "not a whole number: '1.5'"),
    ],
)
def test_integer_arguments_refuse(convert: object, text: str, message: str) -> None:
    assert callable(convert)
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        convert(text)


@pytest.mark.parametrize(
    ("bound", "ipv6_any", "host"),
    [
        ("0.0.0.0", "::1", "127.0.0.1"),
        ("", "::1", "127.0.0.1"),
        ("::", "::1", "[::1]"),
        ("::", "127.0.0.1", "127.0.0.1"),
        ("192.0.2.7", "::1", "192.0.2.7"),
        ("2001:db8::7", "::1", "[2001:db8::7]"),
        ("logs.example", "::1", "logs.example"),
    ],
)
def test_listener_host(bound: str, ipv6_any: str, host: str) -> None:
    assert common.listener_host(bound, ipv6_any=ipv6_any) == host


def test_read_token_from_stdin_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_ENV", " from-env \n")
    assert common.read_token(False, "T_ENV") == "from-env"
    monkeypatch.setattr("sys.stdin", io.StringIO(" from-stdin \nrest\n"))
    assert common.read_token(True, "T_ENV") == "from-stdin"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert common.read_token(True, "T_ENV") is None
    monkeypatch.delenv("T_ENV")
    assert common.read_token(False, "T_ENV") is None


def test_ca_context_without_the_ca_file(tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path)
    assert isinstance(common.ca_context(None, config, system_if_missing=True), ssl.SSLContext)
    with pytest.raises(OSError, match="No such file"):
        common.ca_context(None, config, system_if_missing=False)
