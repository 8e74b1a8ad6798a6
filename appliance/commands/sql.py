"""``appliance sql``: Spark SQL over the appliance's tables, from argv, a pipe or a prompt.

The tables (``events`` and the derived ones) are registered by name in a
Spark session (docs/spark.md). Results come back as Arrow
(``DataFrame.toArrow()``, on Spark Connect and classic Spark alike) and are
printed from plain Python values as a table, JSON or CSV, so the output does
not depend on the engine. At most ``max_rows`` rows are fetched; a result that
had more says so on stderr. pyspark is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO

from appliance.commands.common import (
    Subparsers,
    add_remote_option,
    guarded,
    positive_int,
    print_table,
)
from appliance.config import Config
from appliance.lake.errors import LakeError
from appliance.spark.catalog import EVENTS, appliance_tables, register_tables
from appliance.spark.errors import SparkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MAX_ROWS",
    "FORMATS",
    "QueryResult",
    "add_parser",
    "execute",
    "interactive",
    "render",
    "run_statements",
    "split_statements",
]

#: Rows fetched for one statement unless --max-rows says otherwise.
DEFAULT_MAX_ROWS: Final = 10_000
Format = Literal["table", "json", "csv"]
FORMATS: Final = ("table", "json", "csv")

PROMPT: Final = "sql> "
CONTINUATION: Final = "...> "
_QUIT: Final = frozenset({"exit", "quit", "\\q"})


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Column names and rows of one statement's result."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def split_statements(text: str) -> tuple[list[str], str]:
    """Split SQL text at ``;`` outside quotes and comments.

    Returns:
        The complete statements (without their ``;``), and the rest after
        the last ``;`` (an unfinished statement, or blank).
    """
    statements: list[str] = []
    start = 0
    quote: str | None = None
    comment = False
    i = 0
    while i < len(text):
        ch = text[i]
        if comment:
            if ch == "\n":
                comment = False
        elif quote is not None:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "-" and text.startswith("--", i):
            comment = True
        elif ch == ";":
            statement = text[start:i].strip()
            if statement:
                statements.append(statement)
            start = i + 1
        i += 1
    return statements, text[start:]


def execute(spark: SparkSession, statement: str, max_rows: int = DEFAULT_MAX_ROWS) -> QueryResult:
    """Run one statement and fetch at most ``max_rows`` rows of its result.

    Raises:
        pyspark.errors.PySparkException: the engine refused or failed it.
    """
    table = spark.sql(statement).limit(max_rows + 1).toArrow()
    columns = list(table.column_names)
    values = [column.to_pylist() for column in table.columns]
    rows = list(zip(*values, strict=True)) if values else []
    truncated = len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows], truncated)


def _plain(value: Any) -> Any:
    """A JSON-ready form of one value."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    plain = _plain(value)
    if isinstance(plain, dict | list):
        return json.dumps(plain, ensure_ascii=False)
    return str(plain)


def render(result: QueryResult, fmt: Format, out: TextIO = sys.stdout) -> None:
    """Print a result in ``fmt``."""
    if fmt == "json":
        objects = [dict(zip(result.columns, map(_plain, row), strict=True)) for row in result.rows]
        print(json.dumps(objects, indent=2, ensure_ascii=False), file=out)
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        for row in result.rows:
            writer.writerow(["" if v is None else _cell(v) for v in row])
    elif result.columns:
        print_table(result.columns, [[_cell(v) for v in row] for row in result.rows], out=out)
    if result.truncated:
        print(f"(only the first {len(result.rows)} rows: see --max-rows)", file=sys.stderr)


def run_statements(
    spark: SparkSession,
    statements: Sequence[str],
    fmt: Format,
    max_rows: int,
    out: TextIO = sys.stdout,
    *,
    keep_going: bool = False,
) -> int:
    """Run and print each statement; 1 after the first failure unless ``keep_going``."""
    from pyspark.errors import PySparkException

    status = 0
    for statement in statements:
        try:
            result = execute(spark, statement, max_rows)
        except PySparkException as exc:
            print(f"error: {_first_lines(str(exc))}", file=sys.stderr)
            status = 1
            if keep_going:
                continue
            return status
        render(result, fmt, out)
    return status


def _first_lines(message: str, lines: int = 5) -> str:
    return "\n".join(message.strip().splitlines()[:lines])


def interactive(
    spark: SparkSession,
    fmt: Format,
    max_rows: int,
    stdin: TextIO = sys.stdin,
    out: TextIO = sys.stdout,
) -> int:
    """Read statements ended by ``;`` and run each; ``exit``, ``quit`` or EOF ends.

    At a terminal it prompts, carries on after an error and returns 0;
    reading a script from a pipe it stops at the first error and returns 1.
    """
    tty = stdin.isatty()
    if tty:
        with contextlib.suppress(ImportError):  # not every Python has readline
            import readline  # noqa: F401 -- line editing and history for input()
        print("Spark SQL over the appliance's tables; end statements with ';', exit with 'exit'.")
    buffer = ""
    while True:
        line = _read_line(stdin, CONTINUATION if buffer.strip() else PROMPT, tty)
        if line is None:
            statements = [buffer.strip()] if buffer.strip() else []
            result = run_statements(spark, statements, fmt, max_rows, out, keep_going=tty)
            return 0 if tty else result
        if not buffer.strip() and line.strip().rstrip(";").lower() in _QUIT:
            return 0
        buffer += line + "\n"
        statements, buffer = split_statements(buffer)
        result = run_statements(spark, statements, fmt, max_rows, out, keep_going=tty)
        if result and not tty:
            return result


def _read_line(stdin: TextIO, prompt: str, tty: bool) -> str | None:
    if tty and stdin is sys.stdin:
        try:
            return input(prompt)
        except EOFError:
            print(file=sys.stderr)
            return None
    line = stdin.readline()
    return line.rstrip("\n") if line else None


# -- the command ------------------------------------------------------------------


def _sql(args: argparse.Namespace, config: Config) -> int:
    from pyspark.errors import PySparkException

    from appliance.spark.session import build_session

    spark = build_session(config.spark, args.remote)
    try:
        try:
            _, missing = register_tables(spark, config)
        except PySparkException as exc:
            raise SparkError(f"cannot register the tables: {exc}") from exc
        for table in missing:
            if table.name == EVENTS or args.query is None:
                print(f"note: no table {table.name} at {table.uri} yet", file=sys.stderr)
        if args.query is not None:
            return run_statements(spark, [args.query], args.format, args.max_rows)
        return interactive(spark, args.format, args.max_rows)
    finally:
        spark.stop()


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``sql`` to the CLI."""
    sql = commands.add_parser(
        "sql",
        help="Spark SQL over events and the derived tables",
        parents=[common],
        description="Run Spark SQL over the appliance's tables, registered by name "
        f"({', '.join(t.name for t in appliance_tables(Config()))}). "
        "Without QUERY, an interactive prompt (or statements from a pipe).",
    )
    sql.add_argument("query", nargs="?", metavar="QUERY", help="one SQL statement")
    add_remote_option(sql)
    sql.add_argument("--format", choices=FORMATS, default="table", help="output (default: table)")
    sql.add_argument(
        "--max-rows",
        type=positive_int,
        default=DEFAULT_MAX_ROWS,
        help=f"rows fetched per statement (default: {DEFAULT_MAX_ROWS})",
    )
    sql.set_defaults(func=guarded(LakeError, SparkError)(_sql))
