"""Configuration parsing, validation and the ``appliance config check`` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance.config import (
    ConfigError,
    CourierListenerConfig,
    ForwardListenerConfig,
    LogjamListenerConfig,
    LumberjackListenerConfig,
    WebSocketListenerConfig,
    default_config,
    parse_config,
    settings_from,
)
from appliance.lake.writer import WriterSettings
from appliance.node import worker_config
from appliance.protocols.courier import CourierLimits
from appliance.protocols.forward import ForwardLimits
from appliance.protocols.logjam import LogjamLimits
from appliance.protocols.lumberjack import LumberjackLimits
from appliance.protocols.websocket_messages import MessageLimits
from tests.support.cli import run_cli


def test_embedded_default_is_one_tls_forward_listener_on_loopback() -> None:
    config = default_config()
    (listener,) = config.listeners
    assert (listener.protocol, listener.host, listener.port, listener.tls) == (
        "forward",
        "127.0.0.1",
        24224,
        True,
    )
    assert config.table_uri == str(Path("var") / "lake" / "events")


def test_every_key_is_optional() -> None:
    assert parse_config("") == default_config()


def test_full_file_round_trips_values() -> None:
    config = parse_config(
        """
state_dir = "/srv/appliance"
node_id = "node-a"
[log]
level = "debug"
format = "json"
[lake]
path = "s3://bucket/events"
storage_options = { AWS_REGION = "eu-west-1" }
commit_max_rows = 5000
commit_max_delay_seconds = 0.5
[[listeners]]
name = "tls"
bind = "0.0.0.0:24224"
max_request_bytes = 1048576
[[listeners]]
name = "plain"
bind = "127.0.0.1:24225"
tls = false
"""
    )
    assert config.node_id == "node-a"
    assert config.log.format == "json"
    assert config.table_uri == "s3://bucket/events"
    assert config.lake.storage_options == {"AWS_REGION": "eu-west-1"}
    assert settings_from(config.lake, WriterSettings).commit_max_rows == 5000
    assert [(lc.name, lc.tls) for lc in config.listeners] == [("tls", True), ("plain", False)]
    assert settings_from(config.listeners[0], ForwardLimits).max_request_bytes == 1048576


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("state_dir = \n", "invalid TOML"),
        ("bogus = 1\n", "x.toml:1: bogus: unknown key"),
        (
            "\n[lake]\ncommit_max_rows = -1\n",
            "x.toml:3: lake.commit_max_rows: must be greater than 0",
        ),
        (
            "[lake]\n\ncommit_max_rows = 1.5\n",
            "x.toml:3: lake.commit_max_rows: must be a whole number",
        ),
        ('[log]\nlevel = "loud"\n', "x.toml:2: log.level: must be one of"),
        (
            '[[listeners]]\nname = "a"\n[[listeners]]\nname = "b"\ntls = "yes"\n',
            "x.toml:5: listeners[1].tls: must be true or false",
        ),
        ('[[listeners]]\nbind = "nowhere"\n', "x.toml:2: listeners[0].bind: must be host:port"),
        ('[[listeners]]\nprotocol = "smtp"\n', "listeners[0].protocol: unknown protocol 'smtp'"),
        (
            '[[listeners]]\ntls = false\nclient_auth = "required"\n',
            "x.toml:3: listeners[0].client_auth: needs tls = true",
        ),
        (
            '[[listeners]]\nbind = "127.0.0.1:1"\n[[listeners]]\nbind = "127.0.0.1:1"\nname="x"\n',
            "two listeners bind the same address",
        ),
    ],
)
def test_errors_name_the_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(text, "x.toml")
    assert message in str(excinfo.value)


def test_reading_a_config_loads_no_codec_lake_or_event_loop() -> None:
    """config depends on nothing above it: what ``import appliance.config`` loads."""
    code = (
        "import sys, appliance.config\n"
        "appliance.config.parse_config('[[listeners]]\\nprotocol = \"logjam\"\\n')\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = {
        "trio",
        "deltalake",
        "pyarrow",
        "sqlalchemy",
        "zmq",
        "msgpack",
        "orjson",
        "auth",
        "pki",
    }
    above = ("appliance.protocols", "appliance.lake", "appliance.server", "appliance.commands")
    above_dotted = tuple(f"{a}." for a in above)
    found = [
        m for m in loaded if m.split(".")[0] in heavy or m in above or m.startswith(above_dotted)
    ]
    assert found == []
    assert {"appliance.config", "appliance.defaults", "appliance.toml_binder"} <= set(loaded)


@pytest.mark.parametrize(
    ("section", "limits_type"),
    [
        (ForwardListenerConfig, ForwardLimits),
        (LumberjackListenerConfig, LumberjackLimits),
        (CourierListenerConfig, CourierLimits),
        (LogjamListenerConfig, LogjamLimits),
        (WebSocketListenerConfig, MessageLimits),
    ],
)
def test_a_listener_gives_its_codec_the_codec_defaults(section: type, limits_type: type) -> None:
    """Every codec limit is a key of its listener section, with the codec's own default."""
    assert settings_from(section(), limits_type) == limits_type()


def test_courier_event_limit_is_two_mebibytes_in_config_and_codec() -> None:
    assert CourierListenerConfig().max_event_bytes == 2 * 1024 * 1024
    assert CourierLimits().max_event_bytes == 2 * 1024 * 1024


def test_port_zero_binds_any_free_port() -> None:
    config = parse_config(
        '[[listeners]]\nbind = "127.0.0.1:0"\n'
        '[[listeners]]\nname = "b"\nprotocol = "lumberjack"\nbind = "127.0.0.1:0"\n'
        '[[listeners]]\nname = "z"\nprotocol = "logjam"\nbind = "127.0.0.1:0"\n'
        'pull_bind = "127.0.0.1:0"\n'
    )
    assert [listener.port for listener in config.listeners] == [0, 0, 0]
    with pytest.raises(ConfigError, match=r"listeners\[0\]\.bind: must be host:port"):
        parse_config('[[listeners]]\nbind = "127.0.0.1:65536"\n')


@pytest.mark.parametrize("host", ["127.0.0..1", "a" * 64 + ".example", ".example"])
def test_a_host_the_resolver_cannot_encode_is_refused(host: str) -> None:
    """Its bind would fail with a UnicodeError (not an OSError) at start or at a reload."""
    with pytest.raises(ConfigError, match=r"listeners\[0\]\.bind: must be host:port"):
        parse_config(f'[[listeners]]\nbind = "{host}:24224"\n')
    assert parse_config('[[listeners]]\nbind = "[::1]:24224"\n').listeners[0].port == 24224


def test_config_check_command_reports_the_line(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[listeners]]\nbind = "127.0.0.1:24224"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[lake]\ncommit_max_delay_seconds = "soon"\n')
    ok = run_cli("config", "check", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    failed = run_cli("config", "check", str(bad))
    assert failed.returncode == 1
    assert f"{bad}:2: lake.commit_max_delay_seconds: must be a number" in failed.stderr


def test_version_command() -> None:
    from appliance import __version__

    result = run_cli("--version")
    assert result.stdout.strip() == f"appliance {__version__}"


# -- workers (appliance/supervisor.py) ---------------------------------------------


WORKERS_TOML = """
state_dir = "/srv/appliance"
workers = 3
[admin]
bind = "127.0.0.1:9880"
[[listeners]]
name = "fwd"
bind = "0.0.0.0:24224"
[[listeners]]
name = "jam"
protocol = "logjam"
bind = "0.0.0.0:9604"
"""


def test_a_worker_has_its_own_state_and_shares_everything_else() -> None:
    config = parse_config(WORKERS_TOML)
    worker = worker_config(config, 2)
    assert worker.state_dir == Path("/srv/appliance/workers/2")
    assert (worker.workers, worker.worker, worker.node_id) == (1, 2, None)
    # One table, checked for batches the other workers stored; one maintainer at a time.
    assert worker.table_uri == "/srv/appliance/lake/events"
    assert (worker.lake.shared, worker.maintenance.lease) == ("on", "on")
    # One PKI, one auth database, one place for derived tables: the supervisor's.
    pki = Path("/srv/appliance/pki")
    assert (worker.tls.cert_file, worker.tls.key_file) == (pki / "server.pem", pki / "server.key")
    assert (worker.tls.client_ca_file, worker.tls.crl_file) == (pki / "ca.pem", pki / "crl.pem")
    assert worker.auth_database_url == config.auth_database_url
    assert worker.auth_secret_key_file == config.auth_secret_key_file
    assert worker.derived_table_uri("x") == "/srv/appliance/lake/x"
    # Ports: shared listeners, an admin port each; Logjam (ZeroMQ) in worker 0 only.
    assert [(lc.name, lc.reuse_port) for lc in worker.listeners] == [("fwd", True)]
    assert [lc.name for lc in worker_config(config, 0).listeners] == ["fwd", "jam"]
    assert worker.admin.bind == "127.0.0.1:9882"
    assert worker_config(config, 0).admin.bind == "127.0.0.1:9880"


def test_an_explicit_node_id_and_files_stay_the_operators() -> None:
    text = WORKERS_TOML.replace(
        "workers = 3", 'workers = 2\nnode_id = "edge-1"\n[lake]\nshared = "off"'
    )
    config = parse_config(text)
    worker = worker_config(config, 1)
    assert worker.node_id == "edge-1-w1"
    assert worker.lake.shared == "off"


@pytest.mark.parametrize("bad", ["workers = 0", "workers = 65", "worker = 1"])
def test_workers_out_of_range_and_a_worker_key_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="worker"):
        parse_config(bad)


def test_worker_config_refuses_a_worker_the_config_does_not_have() -> None:
    with pytest.raises(ValueError, match="worker 3 of 3"):
        worker_config(parse_config(WORKERS_TOML), 3)
