"""The defaults the docs state are the defaults appliance/config.py has.

docs/limits.md is generated from the code (tests/appliance/test_config_reference.py
keeps it current). Every other page states defaults by hand, in three forms,
and this test reads all three:

* **Tables.** Every markdown table whose header has a ``default`` column is a
  table of defaults. :data:`TABLES` names, for each one (page, heading, n-th such
  table under that heading), the config dataclass it documents; a table of
  defaults that is not in :data:`TABLES` fails, so a new one cannot go unchecked.
  Each row's first cell names one or more backticked keys; each must be a field
  of the dataclass, and its documented default must equal the code's. Rows that
  are not config keys are skipped by rule (:func:`_is_constant`): a first cell
  that names an UPPER_CASE constant or says "constant". Tables without a default
  column (columns of the table, files, metrics, messages) are not about
  defaults and are skipped by rule.
* **TOML blocks that show defaults** (:data:`TOML_BLOCKS`): every ``key = value``
  line, commented out or not, must hold the default, except the keys the block
  names as examples.
* **Prose**: "`key` (default X)", and "`key` (N)" with a number, anywhere on a
  page, resolved against the page's sections (:data:`PAGE_SECTIONS`) or an
  explicit ``[section]`` in the backticks.

A table that claims to list a section's keys (``complete`` in :class:`Section`)
must also list every key of it, except the ones it leaves out on purpose.

Normalisation (:func:`parse_default`): ``16 MiB`` = 16777216, ``1,024`` = 1024,
``5.0`` = 5, ``true``/``false``, ``"quoted"`` or bare strings, TOML arrays and
tables, ``none`` = None, ``one hour`` = 3600; a size in parentheses after the
value (``67108864 (64 MiB)``) must agree too. A default the code leaves as None
and computes later (``<state_dir>/lake/events``) is compared with what
:class:`~appliance.config.Config` computes (:data:`COMPUTED`), and one the
code computes outside the config (the generated certificate, the FQDN) may be
told in words (:data:`NARRATED`).

Failures name page:line, the key, the documented and the actual default.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import pytest

from appliance.config import (
    AdminConfig,
    AuthConfig,
    Config,
    CourierListenerConfig,
    ForwardListenerConfig,
    LakeConfig,
    ListenerConfig,
    LogConfig,
    LogjamListenerConfig,
    LumberjackListenerConfig,
    MaintenanceConfig,
    RetentionConfig,
    SparkConfig,
    TlsConfig,
    WalConfig,
    WebSocketListenerConfig,
)

DOCS: Final = Path(__file__).parents[1] / "docs"
#: Generated from the code and checked by tests/appliance/test_config_reference.py.
GENERATED: Final = frozenset({"limits.md"})

LISTENER_CLASSES: Final[tuple[type[ListenerConfig], ...]] = (
    ForwardListenerConfig,
    LumberjackListenerConfig,
    CourierListenerConfig,
    LogjamListenerConfig,
    WebSocketListenerConfig,
)
PROTOCOLS: Final = {cls().protocol: cls for cls in LISTENER_CLASSES}
COMMON_KEYS: Final = frozenset(f.name for f in dataclasses.fields(ListenerConfig))
#: Keys that are limits: what a "Limits" table must list.
LIMIT_KEY: Final = re.compile(r"^max_|_bytes$|_seconds$")

#: Sections of the whole config, by the name of their ``[section]``.
SECTIONS: Final[dict[str, type]] = {
    f.name: type(getattr(Config(), f.name))
    for f in dataclasses.fields(Config)
    if dataclasses.is_dataclass(getattr(Config(), f.name))
}


@dataclass(frozen=True)
class Section:
    """What one table of defaults documents.

    ``complete``: "all" (every key of ``cls``), "limits" (every key that is a
    limit: ``max_*``, ``*_bytes``, ``*_seconds``) or "some" (no claim).
    ``omitted``: keys the table leaves out on purpose (documented elsewhere).
    """

    cls: type
    complete: Literal["all", "limits", "some"] = "all"
    omitted: frozenset[str] = frozenset()


_FORWARD_HANDSHAKE_KEYS: Final = frozenset(
    {
        "security",
        "allow_anonymous_source",
        "self_hostname",
        "handshake_timeout_seconds",
        "free_failed_handshakes",
        "failed_handshake_backoff_seconds",
        "failed_handshake_max_backoff_seconds",
    }
)

#: (page, heading, n-th table of defaults under that heading) -> what it documents.
TABLES: Final[dict[tuple[str, str, int], Section]] = {
    # Sections and the listener keys are all on configuration.md.
    ("configuration.md", "Top level", 0): Section(
        Config,
        omitted=frozenset(
            # Sections have their own headings; ``source`` (the file read) and ``worker``
            # (set by the supervisor, refused in a file) are not keys.
            {*SECTIONS, "listeners", "source", "worker"}
        ),
    ),
    ("configuration.md", "`[log]`", 0): Section(LogConfig),
    ("configuration.md", "`[tls]`", 0): Section(TlsConfig),
    ("configuration.md", "`[lake]`", 0): Section(LakeConfig),
    ("configuration.md", "`[wal]`", 0): Section(WalConfig),
    ("configuration.md", "`[auth]`", 0): Section(AuthConfig),
    ("configuration.md", "`[maintenance]`", 0): Section(MaintenanceConfig),
    ("configuration.md", "`[retention]`", 0): Section(RetentionConfig),
    ("configuration.md", "`[spark]`", 0): Section(SparkConfig),
    ("configuration.md", "`[admin]`", 0): Section(AdminConfig),
    # "Each entry": the forward listener, the default; the handshake keys are
    # named in the paragraph below the table and documented on forward.md.
    ("configuration.md", "`[[listeners]]`", 0): Section(
        ForwardListenerConfig, omitted=_FORWARD_HANDSHAKE_KEYS
    ),
    ("maintenance.md", "Settings", 0): Section(MaintenanceConfig),
    ("maintenance.md", "Settings", 1): Section(RetentionConfig),
    # "[lake]": only the disk guard's keys (the rest is on configuration.md).
    ("maintenance.md", "Settings", 2): Section(LakeConfig, complete="some"),
    ("forward.md", "Limits (per listener, `[[listeners]]` keys)", 0): Section(
        # The handshake's limits are in its own section (prose, checked below).
        ForwardListenerConfig,
        complete="limits",
        omitted=_FORWARD_HANDSHAKE_KEYS,
    ),
    ("lumberjack.md", 'Limits (`[[listeners]]` with `protocol = "lumberjack"`)', 0): Section(
        LumberjackListenerConfig, omitted=frozenset({"protocol", "name"})
    ),
    ("courier.md", "Limits (per listener)", 0): Section(CourierListenerConfig, complete="limits"),
    # The PROXY protocol keys every TCP listener has (forward's class stands for them).
    ("proxy-protocol.md", "Configuration", 0): Section(ForwardListenerConfig, complete="some"),
    ("websocket.md", "Limits", 0): Section(
        # Not used by the WebSocket driver (see the page): trio-websocket reads
        # RECEIVE_BUFFER_BYTES and a message has max_message_bytes, not a deadline.
        WebSocketListenerConfig,
        complete="limits",
        omitted=frozenset({"read_size_bytes", "request_timeout_seconds"}),
    ),
    # The write-ahead log's settings: the [wal] section fills WalSettings key by key.
    ("wal.md", "Limits", 0): Section(WalConfig),
}

#: Tables whose rows are protocols: default ``bind`` and the protocol's own keys.
PROTOCOL_TABLES: Final = frozenset({("configuration.md", "Other listener protocols", 0)})

#: (page, heading) of TOML blocks whose lines show defaults -> (section, example keys).
TOML_BLOCKS: Final[dict[tuple[str, str], tuple[type, frozenset[str]]]] = {
    ("courier.md", "Listener"): (CourierListenerConfig, frozenset({"bind", "client_auth"})),
    ("logjam.md", "Configuration"): (LogjamListenerConfig, frozenset({"self_hostname"})),
    ("websocket.md", "WebSocket: ingest from browsers and JavaScript, and the live tail"): (
        WebSocketListenerConfig,
        frozenset({"allowed_origins", "client_auth"}),
    ),
    ("observability.md", "Configuration and security"): (AdminConfig, frozenset({"token_file"})),
}

#: Sections a page's prose "`key` (default X)" may mean, first match wins.
PAGE_SECTIONS: Final[dict[str, tuple[type, ...]]] = {
    "auth.md": (AuthConfig,),
    "configuration.md": (Config,),
    "courier.md": (CourierListenerConfig,),
    "fleet.md": (LakeConfig, MaintenanceConfig),
    "forward.md": (ForwardListenerConfig, LakeConfig),
    "logjam.md": (LogjamListenerConfig, LakeConfig),
    "lumberjack.md": (LumberjackListenerConfig,),
    "maintenance.md": (MaintenanceConfig, RetentionConfig, LakeConfig),
    "observability.md": (AdminConfig,),
    "security.md": (ForwardListenerConfig,),
    "spark.md": (SparkConfig,),
    "wal.md": (WalConfig, LakeConfig),
    "websocket.md": (WebSocketListenerConfig,),
}
#: Prose defaults told in words that no parser should guess: (page, key) -> why.
PROSE_SKIP: Final[dict[tuple[str, str], str]] = {
    ("lumberjack.md", "tag_fields"): 'a list told as "`@metadata.beat`, then `type`"',
}


def _derived_path(config: Config) -> str:
    return config.derived_table_uri("NAME").removesuffix("/NAME")


#: Keys the code leaves None and computes later: the documented default, with
#: ``<state_dir>`` for the default state directory, must equal the computed one.
COMPUTED: Final[dict[tuple[type, str], Callable[[Config], str]]] = {
    (LakeConfig, "path"): lambda c: c.table_uri,
    (SparkConfig, "derived_path"): _derived_path,
    (AuthConfig, "database_url"): lambda c: c.auth_database_url,
    (AuthConfig, "secret_key_file"): lambda c: str(c.auth_secret_key_file),
}
#: Keys the code leaves None whose default is made outside the config (a generated
#: file or id, the machine's FQDN, the appliance's own CA): told in words.
NARRATED: Final = frozenset(
    {
        (Config, "node_id"),
        (TlsConfig, "cert_file"),
        (TlsConfig, "key_file"),
        (TlsConfig, "client_ca_file"),
        (TlsConfig, "crl_file"),
        (ForwardListenerConfig, "self_hostname"),
        (LogjamListenerConfig, "self_hostname"),
    }
)


# -- reading the pages ---------------------------------------------------------


@dataclass(frozen=True)
class Table:
    page: str
    heading: str
    index: int  # n-th table of defaults under this heading, or -1
    line: int  # of the header row
    header: list[str]
    rows: list[tuple[int, list[str]]]


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner.removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _lines(text: str) -> Iterator[tuple[int, str, str, bool]]:
    """(number, line, current heading, inside a fenced block) for each line."""
    heading = ""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            yield number, line, heading, True
            continue
        if not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip()
        yield number, line, heading, fenced


def tables(page: str, text: str) -> list[Table]:
    """Every markdown table of the page; ``index`` counts tables of defaults."""
    found: list[Table] = []
    current: list[tuple[int, str]] = []
    counts: dict[str, int] = {}

    def close(heading: str) -> None:
        if len(current) >= 2:
            header = _cells(current[0][1])
            index = -1
            if _default_column(header) is not None or (page, heading, 0) in PROTOCOL_TABLES:
                index = counts.get(heading, 0)
                counts[heading] = index + 1
            rows = [(n, _cells(line)) for n, line in current[2:]]
            found.append(Table(page, heading, index, current[0][0], header, rows))
        current.clear()

    last_heading = ""
    for number, line, heading, fenced in _lines(text):
        if heading != last_heading:
            close(last_heading)
            last_heading = heading
        if not fenced and line.lstrip().startswith("|"):
            current.append((number, line))
        else:
            close(heading)
    close(last_heading)
    return found


def _default_column(header: list[str]) -> int | None:
    for index, cell in enumerate(header):
        if cell.lower() == "default":
            return index
    return None


# -- normalising documented defaults ---------------------------------------------

_UNITS: Final = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE: Final = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)$")
_GROUPED: Final = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DURATION: Final = re.compile(r"^(one|an|a|\d+) (second|minute|hour|day)s?$")
_SECONDS_UNIT: Final = re.compile(r"^(\d+(?:\.\d+)?) ?s$")
_SECONDS: Final = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


class Words(str):
    """A default told in words or as a bare template, not a literal."""

    __slots__ = ()


def literal(source: str) -> Any:
    """One documented value, normalised (see the module docstring)."""
    text = source.strip()
    if text.lower() == "none":
        return None
    if match := _SIZE.match(text):
        number = float(match.group(1)) * _UNITS[match.group(2)]
        return int(number) if number.is_integer() else number
    if _GROUPED.match(text):
        return literal(text.replace(",", ""))
    if match := _SECONDS_UNIT.match(text):
        return literal(match.group(1))
    if match := _DURATION.match(text):
        count = 1 if match.group(1) in ("one", "an", "a") else int(match.group(1))
        return count * _SECONDS[match.group(2)]
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return Words(text)


def parse_default(cell: str) -> tuple[Any, list[Any]]:
    """The documented value of a default cell, and numbers given beside it.

    ``67108864 (64 MiB)`` is 67108864 and [67108864]; a backticked value is the
    value, and the text after it a note; ``30 (the packages: 60)`` is 30.
    """
    text = cell.strip()
    if text.startswith("`"):
        value, _, rest = text[1:].partition("`")
    else:
        value, paren, rest = text.partition(" (")
        rest = paren + rest
    beside = []
    for note in re.findall(r"\(([^()]*)\)", rest):
        number = literal(note)
        if isinstance(number, int | float) and not isinstance(number, bool):
            beside.append(number)
    return literal(value), beside


def _same(documented: Any, actual: Any) -> bool:
    if isinstance(actual, bool) or isinstance(documented, bool):
        return documented is actual
    if isinstance(actual, int | float):
        return isinstance(documented, int | float) and documented == actual
    if isinstance(actual, str | Path):
        return isinstance(documented, str) and documented == str(actual)
    return bool(documented == actual)


def check_default(cls: type, key: str, documented: Any, beside: Sequence[Any] = ()) -> str | None:
    """None when ``documented`` is the code's default of ``cls.key``, else why not."""
    actual = getattr(cls(), key)
    shown = f"{actual!r}" if not isinstance(actual, Path) else repr(str(actual))
    if actual is None:
        if documented is None:
            return None
        if (cls, key) in COMPUTED:
            state_dir = str(Config().state_dir)
            computed = COMPUTED[(cls, key)](Config())
            if isinstance(documented, str) and documented.replace("<state_dir>", state_dir) == (
                computed
            ):
                return None
            return f"documented {documented!r}, actual None, computed as {computed!r}"
        if (cls, key) in NARRATED and isinstance(documented, Words):
            return None
        return f"documented {documented!r}, actual None (write none)"
    if not _same(documented, actual):
        return f"documented {documented!r}, actual {shown}"
    for number in beside:
        if not _same(number, actual):
            return f"documented {documented!r} ({number!r} beside it), actual {shown}"
    return None


# -- the checks ----------------------------------------------------------------------


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _is_constant(cell: str) -> bool:
    """Rows that name a code constant, not a config key, are skipped by rule."""
    names = re.findall(r"`([^`]+)`", cell)
    return "constant" in cell or any(re.fullmatch(r"[A-Z][A-Z0-9_]+", n) for n in names)


def _split_values(cell: str, count: int) -> list[str] | None:
    """``a`, `b`` into its ``count`` comma-separated parts (None if it has not so many)."""
    parts = [p.strip() for p in re.split(r",\s+(?=`)", cell)]
    return parts if len(parts) == count else None


def check_table(table: Table, section: Section) -> list[str]:
    problems: list[str] = []
    where = f"docs/{table.page}"
    column = _default_column(table.header)
    assert column is not None, f"{where}:{table.line}: no default column"
    fields = _fields(section.cls)
    listed: set[str] = set()
    for number, cells in table.rows:
        first = cells[0]
        if _is_constant(first):
            continue
        keys = re.findall(r"`([^`]+)`", first)
        if not keys or re.sub(r"`[^`]+`|[,\s]", "", first):
            problems.append(f"{where}:{number}: first cell {first!r} is not backticked key(s)")
            continue
        cell = cells[column] if column < len(cells) else ""
        values = _split_values(cell, len(keys)) if len(keys) > 1 else [cell]
        for key, value in zip(keys, values or [cell] * len(keys), strict=True):
            listed.add(key)
            if key not in fields:
                problems.append(
                    f"{where}:{number}: {key}: documented, but {section.cls.__name__} "
                    f"has no such key"
                )
                continue
            documented, beside = parse_default(value)
            problem = check_default(section.cls, key, documented, beside)
            if problem:
                problems.append(
                    f"{where}:{number}: {section.cls.__name__}.{key}: {problem} (cell {value!r})"
                )
    if section.complete != "some":
        wanted = [
            k
            for k in fields
            if k not in section.omitted
            and k != "protocol"
            and (section.complete == "all" or LIMIT_KEY.search(k))
        ]
        missing = [k for k in wanted if k not in listed]
        if missing:
            problems.append(
                f"{where}:{table.line}: table of {section.cls.__name__} "
                f"({section.complete} keys) lacks {', '.join(missing)}"
            )
    return problems


def check_protocol_table(table: Table) -> list[str]:
    """``| `protocol` | default `bind` | its own keys |``."""
    problems: list[str] = []
    where = f"docs/{table.page}"
    for number, cells in table.rows:
        protocol = cells[0].strip("`")
        cls = PROTOCOLS.get(protocol)
        if cls is None:
            problems.append(f"{where}:{number}: unknown protocol {protocol!r}")
            continue
        documented, beside = parse_default(cells[1])
        problem = check_default(cls, "bind", documented, beside)
        if problem:
            problems.append(f"{where}:{number}: {cls.__name__}.bind: {problem}")
        keys_cell = cells[2]
        while re.search(r"\([^()]*\)", keys_cell):  # notes and links, nested
            keys_cell = re.sub(r"\([^()]*\)", "", keys_cell)
        named = re.findall(r"`([a-z_]+)`", keys_cell)
        fields = _fields(cls)
        for key in named:
            if key not in fields:
                problems.append(f"{where}:{number}: {key}: {cls.__name__} has no such key")
        if "..." not in keys_cell:
            own = [k for k in fields if k not in COMMON_KEYS]
            missing = [k for k in own if k not in named]
            if missing:
                problems.append(
                    f"{where}:{number}: {protocol}'s own keys lack {', '.join(missing)}"
                )
    return problems


def check_toml_blocks(page: str, text: str) -> list[str]:
    problems: list[str] = []
    block: tuple[type, frozenset[str]] | None = None
    for number, line, heading, fenced in _lines(text):
        if line.startswith("```"):
            opening = block is None and line.strip() == "```toml"
            block = TOML_BLOCKS.get((page, heading)) if opening else None
            continue
        if block is None or not fenced:
            continue
        cls, examples = block
        match = re.match(r"^#?\s*([a-z_]+)\s*=", line)
        if not match:
            continue
        key = match.group(1)
        if key not in _fields(cls):
            problems.append(f"docs/{page}:{number}: {key}: {cls.__name__} has no such key")
            continue
        if key in examples:
            continue
        documented = tomllib.loads(line.lstrip("#").strip())[key]
        problem = check_default(cls, key, documented)
        if problem:
            problems.append(f"docs/{page}:{number}: {cls.__name__}.{key}: {problem}")
    return problems


_NUMBER: Final = r"\d[\d,]*(?:\.\d+)?(?: ?(?:B|KiB|MiB|GiB|TiB|s))?"
_PROSE: Final = re.compile(
    r"`(?:\[(?P<section>\w+)\] )?(?P<key>[a-z_]+)`\**,? \("
    r"(?:default:? (?P<value>`[^`]+`|[^,;:)]+(?:,\d{3})*)|(?P<bare>" + _NUMBER + r")(?=[):]))"
)


def check_prose(page: str, text: str) -> list[str]:
    problems: list[str] = []
    flat = text.replace("\n", " ")  # same offsets; a sentence may wrap
    for match in _PROSE.finditer(flat):
        key = match.group("key")
        number = text.count("\n", 0, match.start()) + 1
        if (page, key) in PROSE_SKIP:
            continue
        if match.group("section"):
            candidates: tuple[type, ...] = (SECTIONS[match.group("section")],)
        else:
            candidates = PAGE_SECTIONS.get(page, ())
        cls = next((c for c in candidates if key in _fields(c)), None)
        if cls is None:
            problems.append(f"docs/{page}:{number}: {key}: no such key in {candidates}")
            continue
        documented, beside = parse_default(match.group("value") or match.group("bare"))
        problem = check_default(cls, key, documented, beside)
        if problem:
            problems.append(f"docs/{page}:{number}: {cls.__name__}.{key}: {problem}")
    return problems


def check_page(page: str, text: str) -> list[str]:
    """Every problem of one page."""
    problems: list[str] = []
    for table in tables(page, text):
        if table.index < 0:
            continue  # no default column: not a table of defaults
        spot = (page, table.heading, table.index)
        if spot in PROTOCOL_TABLES:
            problems += check_protocol_table(table)
        elif spot in TABLES:
            problems += check_table(table, TABLES[spot])
        else:
            problems.append(
                f"docs/{page}:{table.line}: a table of defaults under {table.heading!r} "
                f"(#{table.index}) is not in TABLES: name the config section it documents"
            )
    problems += check_toml_blocks(page, text)
    problems += check_prose(page, text)
    return problems


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if p.name not in GENERATED)


# -- tests -------------------------------------------------------------------------


@pytest.mark.parametrize("path", _pages(), ids=lambda p: p.name)
def test_documented_defaults_are_the_code_defaults(path: Path) -> None:
    problems = check_page(path.name, path.read_text(encoding="utf-8"))
    assert not problems, "docs disagree with appliance/config.py:\n" + "\n".join(problems)


def test_every_mapped_table_and_block_exists() -> None:
    """A renamed heading must not silently switch a check off."""
    seen_tables: set[tuple[str, str, int]] = set()
    seen_blocks: set[tuple[str, str]] = set()
    for path in _pages():
        text = path.read_text(encoding="utf-8")
        seen_tables |= {(path.name, t.heading, t.index) for t in tables(path.name, text)}
        heading_of_block = [h for _, line, h, _ in _lines(text) if line.strip() == "```toml"]
        seen_blocks |= {(path.name, h) for h in heading_of_block}
    assert set(TABLES) | PROTOCOL_TABLES <= seen_tables, (set(TABLES) | PROTOCOL_TABLES) - (
        seen_tables
    )
    assert set(TOML_BLOCKS) <= seen_blocks, set(TOML_BLOCKS) - seen_blocks


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        ("16 MiB", 16 * 1024 * 1024),
        ("256 KiB", 256 * 1024),
        ("1,024", 1024),
        ("1,048,576", 1048576),
        ("5.0", 5),
        ("0.25", 0.25),
        ("true", True),
        ("`false`", False),
        ('`"info"`', "info"),
        ('"lumberjack"', "lumberjack"),
        ("none", None),
        ("`[]`", []),
        ('`["@metadata.beat", "type"]`', ["@metadata.beat", "type"]),
        ("`127.0.0.1:5044`", "127.0.0.1:5044"),
        ("one hour", 3600),
        ("0.25 s", 0.25),
        ("67108864 (64 MiB)", 67108864),
    ],
)
def test_normalisation(cell: str, value: Any) -> None:
    documented, beside = parse_default(cell)
    assert _same(documented, value)
    assert all(_same(b, value) for b in beside)


def test_true_is_not_one() -> None:
    assert check_default(ForwardListenerConfig, "tls", 1) is not None
    assert check_default(ForwardListenerConfig, "max_connections", True) is not None


def test_a_wrong_default_fails_with_page_line_key_and_both_values() -> None:
    page = "configuration.md"
    text = (DOCS / page).read_text(encoding="utf-8")
    row = "| `max_connections` | 1024 |"
    assert row in text
    before = check_page(page, text)
    problems = check_page(page, text.replace(row, "| `max_connections` | 1,000 |"))
    line = text[: text.index(row)].count("\n") + 1
    assert [p for p in problems if p not in before] == [
        f"docs/{page}:{line}: ForwardListenerConfig.max_connections: documented 1000, "
        "actual 1024 (cell '1,000')"
    ]


def test_a_size_beside_the_value_is_checked() -> None:
    documented, beside = parse_default("1073741824 (2 GiB)")
    problem = check_default(LakeConfig, "min_free_bytes", documented, beside)
    assert problem == "documented 1073741824 (2147483648 beside it), actual 1073741824"
    assert check_default(LakeConfig, "min_free_bytes", *parse_default("1073741824 (1 GiB)")) is None


def test_unknown_keys_missing_keys_and_unmapped_tables_fail() -> None:
    text = (
        "## `[log]`\n\n| key | default |\n|---|---|\n"
        '| `level` | `"info"` |\n| `colour` | `true` |\n\n'
        "## Somewhere new\n\n| key | default |\n|---|---|\n| `tls` | `true` |\n"
    )
    problems = check_page("configuration.md", text)
    assert any(":6: colour: documented, but LogConfig has no such key" in p for p in problems)
    assert any(":3: table of LogConfig (all keys) lacks format" in p for p in problems)
    assert any(":10: a table of defaults under 'Somewhere new'" in p for p in problems)


def test_constants_are_skipped_by_rule() -> None:
    text = (
        "## Limits (per listener)\n\n| key / constant | default |\n|---|---|\n"
        "| `MAX_HELLO_BYTES` (codec constant) | 32 |\n"
    )
    problems = check_page("courier.md", text)
    assert all("MAX_HELLO_BYTES" not in p for p in problems)
