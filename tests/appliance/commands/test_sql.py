"""The sql command's own logic, without Spark: statement splitting and output formats."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import pytest

from appliance.commands.sql import QueryResult, render, split_statements


@pytest.mark.parametrize(
    ("text", "statements", "rest"),
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"], ""),
        ("SELECT 1;\nSELECT 2", ["SELECT 1"], "\nSELECT 2"),
        ("SELECT ';' AS s; x", ["SELECT ';' AS s"], " x"),
        ('SELECT "a;b", `c;d`;', ['SELECT "a;b", `c;d`'], ""),
        ("SELECT 'it\\'s;' AS s;", ["SELECT 'it\\'s;' AS s"], ""),
        ("SELECT 1 -- a comment; still comment\n;", ["SELECT 1 -- a comment; still comment"], ""),
        (";;  ;", [], ""),
        ("SELECT 'open;", [], "SELECT 'open;"),
    ],
)
def test_split_statements(text: str, statements: list[str], rest: str) -> None:
    assert split_statements(text) == (statements, rest)


RESULT = QueryResult(
    columns=["t", "n", "x", "d"],
    rows=[
        (dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC), 1, None, Decimal("1.50")),
        (dt.datetime(2026, 3, 1, 10, 1, tzinfo=dt.UTC), 2, {"k": [1, 2]}, Decimal("2")),
    ],
    truncated=False,
)


def test_render_json() -> None:
    out = io.StringIO()
    render(RESULT, "json", out)
    assert json.loads(out.getvalue()) == [
        {"t": "2026-03-01T10:00:00+00:00", "n": 1, "x": None, "d": "1.50"},
        {"t": "2026-03-01T10:01:00+00:00", "n": 2, "x": {"k": [1, 2]}, "d": "2"},
    ]


def test_render_csv_and_table() -> None:
    out = io.StringIO()
    render(RESULT, "csv", out)
    assert out.getvalue().splitlines() == [
        "t,n,x,d",
        "2026-03-01T10:00:00+00:00,1,,1.50",
        '2026-03-01T10:01:00+00:00,2,"{""k"": [1, 2]}",2',
    ]
    out = io.StringIO()
    render(RESULT, "table", out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["t", "n", "x", "d"]
    assert lines[2].split() == ["2026-03-01T10:00:00+00:00", "1", "NULL", "1.50"]


def test_render_says_when_rows_were_cut(capsys: pytest.CaptureFixture[str]) -> None:
    render(QueryResult(["n"], [(1,)], truncated=True), "json", io.StringIO())
    assert "only the first 1 rows" in capsys.readouterr().err
