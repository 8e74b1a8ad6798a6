"""``appliance sql --remote`` reads the events table on S3 through Sail.

Sail (pysail, a Spark Connect server) runs in a process of its own, started
in another directory, configured for moto's S3 server the standard way: the
``AWS_*`` environment variables (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``,
credentials, region), which Sail's object store reads as the AWS SDKs do.
The appliance hands Spark the table's ``s3://`` URI as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from appliance.lake.arrow import blocks_to_arrow
from appliance.lake.table import EventsTable
from tests.s3server import S3Server
from tests.spark.helpers import CLI_TIMEOUT_SECONDS, block, sail_elsewhere
from tests.support.cli import run_cli


def _s3_events(
    s3_server: S3Server, tmp_path: Path, tag: str, events: int, extra: str = ""
) -> tuple[Path, dict[str, str], str]:
    """An events table on S3 holding ``events`` rows of ``tag``; its config, Sail's env, bucket."""
    bucket = s3_server.bucket()
    uri = f"s3://{bucket}/events"
    options = s3_server.storage_options()
    table = EventsTable(uri, options)
    table.open_or_create()
    records = [{"m": i} for i in range(events)]
    assert table.commit(blocks_to_arrow([block(tag=tag, records=records)]), "node-s", 1)
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[lake]\npath = "{uri}"\n'
        f"{s3_server.toml_options()}\n{extra.format(bucket=bucket)}"
    )
    (tmp_path / "sail").mkdir()
    return config, {k: v for k, v in options.items() if k.startswith("AWS_")}, bucket


def test_sql_remote_reads_the_s3_table_through_sail(s3_server: S3Server, tmp_path: Path) -> None:
    config, aws_env, _ = _s3_events(s3_server, tmp_path, "s3.sail", 7)
    with sail_elsewhere(tmp_path / "sail", aws_env) as url:
        query = "SELECT tag, count(*) AS n FROM events GROUP BY tag"
        result = run_cli("sql", query, "--remote", url, "--format", "json", config=config,
                         timeout=CLI_TIMEOUT_SECONDS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"tag": "s3.sail", "n": 7}]


def test_derived_tables_are_built_on_s3_through_sail(s3_server: S3Server, tmp_path: Path) -> None:
    """``appliance spark run all``: Spark (Sail) reads events on S3; the jobs write S3 tables."""
    derived = '[spark]\nderived_path = "s3://{bucket}/derived"\n'
    config, aws_env, _ = _s3_events(s3_server, tmp_path, "s3.jobs", 5, derived)
    with sail_elsewhere(tmp_path / "sail", aws_env) as url:
        run = run_cli("spark", "run", "all", "--remote", url, "--json", config=config,
                      timeout=CLI_TIMEOUT_SECONDS)  # fmt: skip
        assert run.returncode == 0, run.stderr
        query = "SELECT sum(events) AS n FROM events_per_minute"
        result = run_cli("sql", query, "--remote", url, "--format", "json", config=config,
                         timeout=CLI_TIMEOUT_SECONDS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 5}]
