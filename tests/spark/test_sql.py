"""``appliance sql`` (the real command) over Spark Connect against Sail."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import select
import socket
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from appliance.config import SparkConfig
from appliance.spark.errors import SparkSetupError
from appliance.spark.session import build_session, check_reachable
from tests.spark.helpers import (
    CLI_TIMEOUT_SECONDS,
    EventsWriter,
    block,
    sail_elsewhere,
    write_config,
)
from tests.support.cli import cli_argv, cli_env, run_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess

ACK_TIMEOUT_SECONDS = 30


def send_acked(app: ApplianceProcess, tag: str, chunk: str, count: int) -> bool:
    """One PackedForward request over TLS; True when the appliance acknowledged it."""
    now = int(time.time())
    entries = b"".join(
        msgpack.packb([msgpack.ExtType(0, now.to_bytes(4, "big") + i.to_bytes(4, "big")), {"i": i}])
        for i in range(count)
    )
    request = msgpack.packb([tag, entries, {"chunk": chunk, "size": count}])
    context = ssl.create_default_context(cafile=str(app.ca_file))
    with (
        socket.create_connection(("127.0.0.1", app.ports["forward"]), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.settimeout(ACK_TIMEOUT_SECONDS)
        tls.sendall(request)
        unpacker = msgpack.Unpacker()
        while True:
            data = tls.recv(4096)
            if not data:
                return False
            unpacker.feed(data)
            for answer in unpacker:
                return bool(answer == {"ack": chunk})


def sql(
    config: Path, sail_url: str, query: str | None, *extra: str, stdin: str | None = None
) -> Any:
    args = ["sql", *([query] if query is not None else []), "--remote", sail_url, *extra]
    return run_cli(*args, config=config, stdin=stdin, timeout=CLI_TIMEOUT_SECONDS)


@pytest.mark.slow
def test_sql_counts_match_what_the_appliance_acknowledged(
    appliance: Callable[..., ApplianceProcess], sail_url: str, tmp_path: Path
) -> None:
    app = appliance({"forward": ""})
    acked: Counter[str] = Counter()
    for n in range(12):
        tag = f"svc.{('api', 'web', 'db')[n % 3]}"
        count = n + 1
        assert send_acked(app, tag, f"chunk-{n}", count), f"request {n} was not acknowledged"
        acked[tag] += count
    # A resent chunk is acknowledged again but not written twice.
    assert send_acked(app, "svc.api", "chunk-0", 1)

    config = tmp_path / "appliance0.toml"  # the fixture's config file
    result = sql(
        config,
        sail_url,
        "SELECT tag, count(*) AS n FROM events GROUP BY tag ORDER BY tag",
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"tag": t, "n": acked[t]} for t in sorted(acked)]

    total = sql(config, sail_url, "SELECT count(*) AS n FROM events", "--format", "csv")
    assert total.returncode == 0, total.stderr
    assert list(csv.reader(io.StringIO(total.stdout))) == [["n"], [str(sum(acked.values()))]]

    table = sql(config, sail_url, "SELECT count(DISTINCT batch_id) AS chunks FROM events")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines() == ["chunks", "------", "12"]
    app.stop()


def test_sql_prompt_reads_statements_from_a_pipe(sail_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    events = EventsWriter(str(tmp_path / "state" / "lake" / "events"))
    events.commit([block(tag="a", records=[{"m": 1}, {"m": 2}]), block(tag="b")])
    script = (
        "SELECT tag, count(*) AS n\n  FROM events GROUP BY tag ORDER BY tag;\n"
        "SELECT get_json_object(record, '$.m') AS m FROM events "
        "WHERE tag = 'a' ORDER BY m; SELECT 'x;y' AS s\n"
    )
    result = sql(config, sail_url, None, "--format", "json", stdin=script)
    assert result.returncode == 0, result.stderr
    outputs = [json.loads(part) for part in result.stdout.replace("]\n[", "]\0[").split("\0")]
    assert outputs == [
        [{"tag": "a", "n": 2}, {"tag": "b", "n": 1}],
        [{"m": "1"}, {"m": "2"}],
        [{"s": "x;y"}],
    ]


def test_sql_errors_and_limits(sail_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    events = EventsWriter(str(tmp_path / "state" / "lake" / "events"))
    events.commit([block(records=[{"i": i} for i in range(5)])])

    bad = sql(config, sail_url, "SELECT nope FROM events")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error:")

    piped = sql(config, sail_url, None, stdin="SELECT nope FROM events;\nSELECT 1 AS one;\n")
    assert piped.returncode == 1
    assert "one" not in piped.stdout, "a piped script stops at its first error"

    limited = sql(config, sail_url, "SELECT * FROM events", "--max-rows", "2", "--format", "json")
    assert limited.returncode == 0, limited.stderr
    assert len(json.loads(limited.stdout)) == 2
    assert "only the first 2 rows" in limited.stderr


def test_sql_says_when_spark_connect_is_unreachable(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    port = free_port()
    result = run_cli(
        "sql",
        "SELECT 1",
        "--remote",
        f"sc://127.0.0.1:{port}",
        config=config,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    assert result.returncode == 1
    assert f"cannot reach Spark Connect at 127.0.0.1:{port}" in result.stderr
    with pytest.raises(SparkSetupError, match="not a Spark Connect URL"):
        check_reachable("http://127.0.0.1:1")


def test_classic_session_needs_delta_spark() -> None:
    # pyspark-client has no JVM and delta-spark is not installed here: the
    # classic path stops with what to install, before starting anything.
    with pytest.raises(SparkSetupError, match="spark-classic"):
        build_session(SparkConfig())


def run_at_terminal(args: list[str], lines: list[str]) -> tuple[str, int]:
    """Run the real command on a pseudo-terminal, type ``lines``, read everything."""
    pid, fd = pty.fork()
    if pid == 0:  # the child becomes the appliance
        os.execve(sys.executable, cli_argv(args), cli_env())
    output = b""
    deadline = time.monotonic() + CLI_TIMEOUT_SECONDS
    pending = list(lines)
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            # Type the next line once the prompt for it has been printed.
            if pending and output.count(b"> ") > len(lines) - len(pending):
                os.write(fd, pending.pop(0).encode() + b"\r")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return output.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def test_sql_prompt_at_a_terminal(sail_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    events = EventsWriter(str(tmp_path / "state" / "lake" / "events"))
    events.commit([block(records=[{"i": i} for i in range(7)])])
    output, code = run_at_terminal(
        ["sql", "--remote", sail_url, "--config", str(config)],
        [
            "SELECT count(*) AS n",
            "FROM events;",
            "SELECT nope;",
            "SELECT 41 + 1 AS answer;",
            "exit",
        ],
    )
    assert code == 0, output
    assert "sql> " in output
    assert "...> " in output, "a statement may span lines"
    lines = [line.strip() for line in output.splitlines()]
    assert lines[lines.index("n") + 2] == "7"
    assert any(line.startswith("error:") for line in lines), "the error is shown"
    assert lines[lines.index("answer") + 2] == "42", "the prompt carries on after an error"


def test_sql_remote_reads_the_default_relative_table_from_a_server_started_elsewhere(
    tmp_path: Path,
) -> None:
    """Locations handed to Spark are absolute URIs.

    The appliance runs with the default, relative state directory (``var``);
    the Spark Connect server runs in another directory. Handed ``var/lake/events``
    as given, the server looked for it in its own directory ("No commit files
    found in _delta_log").
    """
    app_dir, sail_dir = tmp_path / "appliance", tmp_path / "sail"
    app_dir.mkdir()
    sail_dir.mkdir()
    EventsWriter(str(app_dir / "var" / "lake" / "events")).commit(
        [block(tag="rel", records=[{"m": 1}, {"m": 2}, {"m": 3}])]
    )
    config = app_dir / "appliance.toml"
    config.write_text('state_dir = "var"\n')
    with sail_elsewhere(sail_dir) as url:
        result = run_cli(
            "sql", "SELECT count(*) AS n FROM events", "--remote", url, "--format", "json",
            config=config, cwd=app_dir, timeout=CLI_TIMEOUT_SECONDS,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 3}]
