"""``appliance table ...``: the human output of a maintenance result has no Python reprs.

The details of a run (``dry_run``, the Delta operation metrics, partition
lists) are printed as ``key: value`` lines, a mapping's keys and a list's
items indented under it; ``--json`` keeps the values as they are.
"""

from __future__ import annotations

import pytest

from appliance.commands.table import _print_maintenance
from appliance.lake.operations import MaintenanceResult, TableStats


def _stats() -> TableStats:
    return TableStats(
        version=3, files=2, bytes=2048, rows=10, partitions=1, smallest_file_bytes=1024,
        largest_file_bytes=1024,
    )  # fmt: skip


def test_details_are_key_value_lines_not_reprs(capsys: pytest.CaptureFixture[str]) -> None:
    details = {
        "dry_run": True,
        "files_to_delete": 1234,
        "partition_delete": {"num_added_files": 0, "num_removed_files": 2, "seconds": 0.25},
        "partitions_to_remove": ["event_date=2026-01-01", "event_date=2026-01-02"],
        "rules": [],
        "rule_rows_removed": None,
        "vacuum": "the files stay until vacuum",
    }
    result = MaintenanceResult("vacuum", "/srv/lake/events", _stats(), _stats(), details)
    _print_maintenance(result, as_json=False)
    out = capsys.readouterr().out
    for repr_text in ("True", "None", "{", "[", "'"):
        assert repr_text not in out, out
    assert out.splitlines()[-12:] == [
        "dry_run: yes",
        "files_to_delete: 1,234",
        "partition_delete:",
        "  num_added_files: 0",
        "  num_removed_files: 2",
        "  seconds: 0.25",
        "partitions_to_remove:",
        "  - event_date=2026-01-01",
        "  - event_date=2026-01-02",
        "rules: none",
        "rule_rows_removed: -",
        "vacuum: the files stay until vacuum",
    ]
    _print_maintenance(result, as_json=True)
    assert '"dry_run": true' in capsys.readouterr().out
