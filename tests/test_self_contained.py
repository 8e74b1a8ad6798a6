"""The repository stands on its own: every citation in it can be followed from a clone.

Code, tests and docs cite what the repository holds (docs/decisions.md for the
design rules, the other pages of docs/, by anchor) or public sources by URL.
They must not cite what lives outside it: a design document by section, an
issue tracker's numbers, a developers' guide or its numbered habits, a specs
folder beside the repository. :data:`PATTERNS` names each such form; a match
fails the test with file:line and the text, so the citation can be replaced
by the rule itself (docs/decisions.md) or by the upstream source's URL.

The patterns are narrow on purpose: "issue" as an English word, "issued", and
a link to an upstream project's issue (``https://github.com/OWNER/REPO/issues/N``)
pass; so does "DESIGN" on its own.

A second check: every ``PAGE.md#anchor`` cited anywhere scanned names a heading
that exists in that page of docs/ (or of the citing file's directory), so the
anchors docs/decisions.md offers stay stable and a renamed heading is noticed.

Scanned: appliance/, auth/, pki/, migrations/, tests/, docs/, fuzz/, bench/,
scripts/, packaging/, README.md, pyproject.toml and the Makefile. Not scanned:
bench/HISTORY.md and bench/RESULTS.md, the records of benchmark runs as they
were written at the time (HISTORY.md keeps that history, the numbers the work
was tracked under included; RESULTS.md is cleaned in a pass of its own);
fuzz/corpus/ and fuzz/crashes/ (fuzzer inputs, not text); installed
dependencies and caches (node_modules, __pycache__, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED = (
    "appliance",
    "auth",
    "pki",
    "migrations",
    "tests",
    "docs",
    "fuzz",
    "bench",
    "scripts",
    "packaging",
    "README.md",
    "pyproject.toml",
    "Makefile",
)
#: Records of benchmark runs, kept as written (module docstring).
SKIPPED_FILES = frozenset({"bench/HISTORY.md", "bench/RESULTS.md"})
#: Fuzzer inputs: bytes, not prose.
SKIPPED_TREES = ("fuzz/corpus", "fuzz/crashes")
#: Installed dependencies, caches and build output, wherever they are.
SKIPPED_DIRS = frozenset(
    {
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "build",
        "dist",
    }
)

#: What cannot be followed from a clone, and what to cite instead.
PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\bDESIGN\b\s*(?:§|\.md\b)"),
        "a design document outside the repository: write the rule into "
        "docs/decisions.md and cite its anchor",
    ),
    (
        # The word, then a number: with a space, a dash, a '#' or nothing between, any
        # case; not "issued", not an upstream issue's URL (".../issues/" then the number).
        re.compile(r"\bissues?[ \t]*[-#]?[ \t]*\d+", re.IGNORECASE),
        "an issue number: say what happened in plain words, or cite the rule "
        "(docs/decisions.md) or an upstream issue by URL",
    ),
    (
        re.compile(r"\bhouse[ \t]+habits?\b", re.IGNORECASE),
        "a numbered habit of a guide outside the repository: cite docs/decisions.md",
    ),
    (
        re.compile(r"\bDEVELOPERS\.md\b", re.IGNORECASE),
        "a developers' guide outside the repository: cite docs/decisions.md",
    ),
    (
        re.compile(r"(?:\bshared|\.\./shared)/specs?\b|\.\./shared/"),
        "a specs folder outside the repository: cite the protocol's public "
        "specification by URL, or its page in docs/",
    ),
)

#: Citations left in files other engineers were changing when this test was
#: written (their replacements are in that change's report): (file, a piece of
#: the flagged line). Each goes when its file is next edited; an entry that no
#: longer matches a citation fails the test, so the list only shrinks.
PENDING: frozenset[tuple[str, str]] = frozenset()

#: A cited page and anchor: ``docs/decisions.md#strict-strings``, ``(table.md#times)``.
ANCHOR_LINK = re.compile(r"(?<![\w/.-])(docs/)?([A-Za-z][\w-]*\.md)#([\w-]+)")


def scanned_files(root: Path = ROOT) -> Iterator[Path]:
    """Every file the rules apply to, in a stable order."""
    for top in SCANNED:
        start = root / top
        if start.is_file():
            yield start
            continue
        for path in sorted(start.rglob("*")):
            relative = path.relative_to(root)
            if not path.is_file() or SKIPPED_DIRS.intersection(relative.parts):
                continue
            name = relative.as_posix()
            if name in SKIPPED_FILES or name.startswith(tuple(f"{t}/" for t in SKIPPED_TREES)):
                continue
            yield path


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def citations(root: Path = ROOT, pending: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """``file:line: text (why)`` for every citation a clone cannot follow.

    A citation on a line that an entry of ``pending`` matches is left out, and
    an entry that matched nothing is reported instead.
    """
    found, used = [], set()
    for path in scanned_files(root):
        text = text_of(path)
        if text is None:
            continue
        name = path.relative_to(root).as_posix()
        for number, line in enumerate(text.splitlines(), start=1):
            for pattern, why in PATTERNS:
                match = pattern.search(line)
                if not match:
                    continue
                waiting = {(f, piece) for f, piece in pending if f == name and piece in line}
                if waiting:
                    used |= waiting
                else:
                    found.append(f"{name}:{number}: {match.group(0)!r} in {line.strip()!r} ({why})")
    found += [
        f"{f}: PENDING entry {piece!r} matches no citation: remove it"
        for f, piece in sorted(pending - used)
    ]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    """The anchors of a markdown page's headings (fenced code left out)."""
    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6}\s+(.*)", line)):
            anchors.add(slug(heading.group(1)))
    return anchors


def broken_anchors(root: Path = ROOT) -> list[str]:
    """``file:line: link`` for every cited anchor that names no heading of its page."""
    broken, cache = [], {}
    for path in scanned_files(root):
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for match in ANCHOR_LINK.finditer(line):
                in_docs, page, anchor = match.groups()
                candidates = [root / "docs" / page] if in_docs else [path.parent / page]
                candidates.append(root / "docs" / page)
                target = next((c for c in candidates if c.is_file()), None)
                if target is None:
                    continue  # not a page of this repository (an upstream file's name)
                if target not in cache:
                    cache[target] = anchors_of(target)
                if anchor not in cache[target]:
                    where = f"{path.relative_to(root).as_posix()}:{number}"
                    broken.append(f"{where}: {match.group(0)} names no heading of {page}")
    return broken


def test_no_citation_points_outside_the_repository() -> None:
    found = citations(pending=PENDING)
    assert not found, "citations a clone cannot follow:\n" + "\n".join(found)


def test_every_cited_anchor_exists() -> None:
    broken = broken_anchors()
    assert not broken, "anchors that name no heading:\n" + "\n".join(broken)


def test_the_checks_find_what_they_are_for(tmp_path: Path) -> None:
    """Planted citations are found, with file:line; the legitimate look-alikes are not."""
    issue, design, spec = "iss" + "ue", "DES" + "IGN", "shared/" + "specs"
    missing = "decisions.md" + "#no-such-rule"  # split, so this file cites no such anchor
    planted = [
        f"x = 1  # one committer per table ({design} §3)",
        f"Found by {issue} 13: a lone surrogate.",
        f'"""{issue.title()} 20: the admin listener."""',
        f"seed = '{issue}13-tag-long'",
        f"The seed spec is ``{spec}/forward-protocol-v1.md``.",
        f"See ../{spec}/lumberjack.txt and {design}.md.",
        "the connection boundary (DEVELOPERS" + ".md, house " + "habit 4)",
    ]
    legitimate = [
        f"The {issue} here is the ack order; the CA {issue}d the certificate.",
        f"delta-rs https://github.com/delta-io/delta-rs/{issue}s/1128 is upstream.",
        f"{design} notes live in docs/decisions.md#strict-strings.",
        "the spec's reply-msg (https://github.com/skaes/logjam-tools, specs/producer_protocol.md)",
    ]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "decisions.md").write_text("# Decisions\n\n## Strict strings\n")
    (tmp_path / "docs" / "notes.md").write_text(
        "\n".join([*legitimate, *planted, f"see {missing}"]) + "\n"
    )
    found = citations(tmp_path)
    first = len(legitimate) + 1
    lines = [f"docs/notes.md:{n}:" for n in range(first, first + len(planted))]
    assert {entry.split(" ", 1)[0] for entry in found} == set(lines), found
    last = first + len(planted)
    assert broken_anchors(tmp_path) == [
        f"docs/notes.md:{last}: {missing} names no heading of decisions.md"
    ]
    waiting = frozenset({("docs/notes.md", "a lone surrogate"), ("docs/notes.md", "gone")})
    assert citations(tmp_path, waiting) == [
        entry for entry in found if not entry.startswith(f"docs/notes.md:{first + 1}:")
    ] + ["docs/notes.md: PENDING entry 'gone' matches no citation: remove it"]
