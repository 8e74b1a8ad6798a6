"""Lumberjack v2's fast path: a run of whole ``J`` frames read column by column, or None.

What Beats send is windows of ``J`` frames (docs/lumberjack.md). The
general path (:meth:`LumberjackServerConnection._json_frames
<appliance.protocols.lumberjack.LumberjackServerConnection>`) parses each
frame and then makes several Python calls for it (the tag, the host, the
time, the lists). For a run of frames the codec has already checked (whole,
within ``max_frame_bytes``, the window's bytes and the ``C`` frame's
budget, and short enough that ``RECORD_MAX_VALUES`` cannot be exceeded),
:func:`json_run` does the same work one column at a time:

1. every frame's JSON through the same parser, :func:`orjson.loads` (so
   exactly the same frames are valid: strict RFC 8259, valid UTF-8, no lone
   surrogate escapes, bounded nesting), and its text;
2. the tag and host candidates at the listener's paths
   (:func:`appliance.rows.fields.first_string`'s rule: the first non-empty
   string), still unchecked: the codec checks them against
   ``MAX_TAG_BYTES`` / ``MAX_HOST_BYTES`` as for every event;
3. every ``@timestamp`` at once (:class:`~appliance.rows.timecache.Rfc3339Cache`,
   which is ``rfc3339_ns`` value for value).

Any frame that is not valid JSON, or not an object, makes it return None
and the codec parses the run frame by frame, which refuses that frame with
its own reason: so the events and the violations are the general path's
own (a differential hypothesis test, tests/appliance/protocols/test_lumberjack_fast.py).
A miss costs the frames parsed before it again; it only happens on a
connection that is closed for it.

Memory: the records of a run are parsed one after the other and each is
dropped once its three fields are read, as on the general path; the run
holds its texts, the candidates (strings taken from the texts) and the
times, which the window holds anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from appliance.rows.timecache import Rfc3339Cache

__all__ = ["MIN_RUN_FRAMES", "JsonRun", "json_run"]

#: Runs shorter than this take the general path (the setup is not worth it).
MIN_RUN_FRAMES: Final = 4

#: A dotted field path split in two: the top-level key and the keys below it.
FieldPath = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class JsonRun:
    """A run of ``J`` frames: per frame its text, tag and host candidates, and time."""

    texts: list[str]
    tags: list[str | None]
    hosts: list[str | None]
    times_ns: list[int | None]


def split_paths(paths: Sequence[tuple[str, ...]]) -> tuple[FieldPath, ...]:
    """Key paths as (first key, the rest): what :func:`json_run` walks."""
    return tuple((path[0], path[1:]) for path in paths if path)


def json_run(
    view: memoryview,
    frames: Sequence[tuple[int, int]],
    tag_paths: tuple[FieldPath, ...],
    host_paths: tuple[FieldPath, ...],
    times: Rfc3339Cache,
) -> JsonRun | None:
    """The columns of the ``J`` frames whose JSON is ``view[start:end]`` for each of ``frames``.

    None as soon as one is not valid JSON or not a JSON object.
    """
    loads = orjson.loads
    texts: list[str] = []
    tags: list[str | None] = []
    hosts: list[str | None] = []
    stamps: list[object] = []
    for start, end in frames:
        raw = view[start:end]
        try:
            record = loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(record) is not dict:
            return None
        # orjson validated the bytes as UTF-8: this cannot fail.
        texts.append(str(raw, "utf-8"))
        stamps.append(record.get("@timestamp"))
        # first_string (appliance/rows/fields.py), inline: dicts from orjson
        # are exactly dict, so type() is isinstance() here.
        found: Any = None
        for first, rest in tag_paths:
            found = record.get(first)
            for key in rest:
                found = found.get(key) if type(found) is dict else None
            if type(found) is str and found:
                break
            found = None
        tags.append(found)  # a str or None, by the loop
        found = None
        for first, rest in host_paths:
            found = record.get(first)
            for key in rest:
                found = found.get(key) if type(found) is dict else None
            if type(found) is str and found:
                break
            found = None
        hosts.append(found)
    return JsonRun(texts, tags, hosts, times.times_ns(stamps))
