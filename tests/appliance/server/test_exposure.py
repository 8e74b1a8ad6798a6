"""The start-up check for listeners that take data from anyone on the network."""

from __future__ import annotations

from pathlib import Path

from appliance.config import load_config
from appliance.server.exposure import is_loopback, unauthenticated_listeners


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("")
    assert not is_loopback("192.0.2.1")
    assert not is_loopback("logs.example")


def test_non_loopback_listeners_without_authentication_are_named(tmp_path: Path) -> None:
    config_file = tmp_path / "appliance.toml"
    config_file.write_text(
        f"""
state_dir = "{tmp_path}"
[[listeners]]
protocol = "forward"
name = "open-forward"
bind = "0.0.0.0:24224"
[[listeners]]
protocol = "forward"
name = "keyed-forward"
bind = "0.0.0.0:24225"
security = "shared_key"
[[listeners]]
protocol = "lumberjack"
name = "mtls-beats"
bind = "0.0.0.0:5044"
client_auth = "required"
[[listeners]]
protocol = "lumberjack"
name = "local-beats"
bind = "127.0.0.1:5045"
[[listeners]]
protocol = "courier"
name = "open-courier"
bind = "192.0.2.1:12345"
client_auth = "optional"
[[listeners]]
protocol = "logjam"
name = "plain-logjam"
bind = "0.0.0.0:9604"
pull_bind = ""
curve = false
""",
        encoding="utf-8",
    )
    names = [listener.name for listener in unauthenticated_listeners(load_config(config_file))]
    assert names == ["open-forward", "open-courier", "plain-logjam"]


def _with_examples_enabled(text: str) -> str:
    """The packaged config with its commented-out listener examples turned on."""
    lines, in_example = [], False
    for line in text.splitlines():
        if line.startswith("# [[listeners]]"):
            in_example = True
        if in_example and line.startswith("# ") and ("=" in line or line.startswith("# [[")):
            line = line[2:].split("  #", 1)[0]
        elif in_example and line.strip() in ("", "#"):
            in_example = line.strip() == "#"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_packaged_config_authenticates_every_listener_beyond_loopback(tmp_path: Path) -> None:
    """The example config, all examples on, leaves no listener open."""
    shipped = Path(__file__).parents[3] / "packaging" / "appliance.toml"
    text = _with_examples_enabled(shipped.read_text(encoding="utf-8"))
    text = text.replace('state_dir = "/var/lib/appliance"', f'state_dir = "{tmp_path}"')
    # The network forward example replaces the loopback one; both on, they would share a port.
    text = text.replace('bind = "127.0.0.1:24224"', 'bind = "127.0.0.1:24230"')
    config_file = tmp_path / "appliance.toml"
    config_file.write_text(text, encoding="utf-8")
    config = load_config(config_file)
    assert len(config.listeners) >= 4, "the examples were not turned on"
    assert unauthenticated_listeners(config) == []
