"""The contract between the job ingester and each format parser.

A parser turns one input file into one or more :class:`ParsedTrace` (a Kineto
file is one rank; an Nsight Systems report may hold several processes or
devices, each its own rank). Parsers are registered in :data:`PARSERS` under
the name that :func:`stallscope.ingest.sniff.sniff` returns for the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stallscope.errors import InputError
from stallscope.ingest.canonical import CanonicalTrace
from stallscope.ingest.reader import Source, decompressed_head


@dataclass
class ParseContext:
    """What a parser needs to know about its place in the job.

    ``trace_id(key)`` gives the store id of the trace with that key (``""``
    for a file that holds one trace); ``single`` is true when the job has just
    this one file (a rank may then default to 0). ``scratch`` is where a parser
    writes temporary files: inside the store's staging area, so a killed ingest
    leaves none behind once the next writer cleans up.
    """

    name: str
    single: bool
    trace_id: Callable[[str], str]
    scratch: Path | None = None  # the ingest's staging folder: temporary files go here


@dataclass
class ParsedTrace:
    """One rank's canonical tables plus what the catalog needs to know."""

    key: str
    canonical: CanonicalTrace
    source: str
    source_version: str | None
    rank: int | None
    world_size: int | None = None
    backend: str | None = None
    base_time_ns: int | None = None
    label: str | None = None
    warnings: list[str] = field(default_factory=list)


class Payload:
    """A file's decompressed bytes, handed to a parser that may free them early.

    The caller keeps no other reference, so a parser that calls :meth:`take`
    and drops the bytes once decoded (Kineto: before its SQL stage) frees
    them while it still works: on a 500 MB trace, 500 MB less at the peak.
    """

    def __init__(self, data: bytes):
        self._data: bytes | None = data

    def take(self) -> bytes:
        """The bytes; this payload no longer holds them."""
        data, self._data = self._data, None
        if data is None:
            raise RuntimeError("payload already taken")
        return data


Parser = Callable[[Source, Payload, ParseContext], list[ParsedTrace]]

# Files given together are one job's ranks; said where ranks cannot be told apart.
SEPARATE_JOBS_HINT = (
    "files given together are taken as the ranks of one job: to analyze unrelated traces,"
    " pass --each or put each job in its own folder"
)


def _kineto(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.kineto.parse import parse_kineto

    return parse_kineto(source, payload.take(), ctx)


def _ncu(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.ncu.parse import parse_ncu

    return parse_ncu(source, payload.take(), ctx)


def _nsys(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.nsys.parse import parse_nsys

    return parse_nsys(source, payload, ctx)


def _nsys_report(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.nsys.export import parse_nsys_report

    return parse_nsys_report(source, payload.take(), ctx)


PARSERS: dict[str, Parser] = {"kineto": _kineto, "ncu": _ncu}


def _memory_snapshot(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.memory_snapshot.parse import parse_snapshot

    return parse_snapshot(source, payload.take(), ctx)


PARSERS.update({"nsys": _nsys, "nsys-rep": _nsys_report, "memory-snapshot": _memory_snapshot})


def detect_format(name: str, data: bytes) -> str:
    """The :data:`PARSERS` key for decompressed ``data``.

    Nsight Systems reports (``.nsys-rep``/``.qdrep``) are ``"nsys-rep"``: their
    parser exports them to SQLite first. Everything else is :func:`sniff`'s call.
    """
    from stallscope.ingest.nsys.export import is_report
    from stallscope.ingest.sniff import sniff

    if is_report(name, data[:64]):
        return "nsys-rep"
    return sniff(name, data)


# How much of a file's decompressed head tells whether it is a trace: sniff
# looks at the first MiB at most (Nsight Systems table names in an SQLite file).
SNIFF_HEAD_BYTES = 1 << 20
# One of these sits in the first 64 KiB of every JSON trace we know.
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"',
               b'"displayTimeUnit"', b'"ph"')  # fmt: skip
_JSON_KEYS_HEAD = 1 << 16
# Refusals about how a file is packed, not what it is (empty, compressed twice, another
# archive, UTF-16): it may well be a rank's trace, so it refuses the job, never skipped.
_PACKING = ("empty file", "compressed twice", "decompress it first", "unpack it first", "UTF-16")


def not_a_trace(source: Source) -> str | None:
    """Why a file inside a directory or zip is not a trace, from its content; ``None`` when it is one.

    Reads only the decompressed head (:data:`SNIFF_HEAD_BYTES`). Not a trace:
    what :func:`detect_format` refuses (an image, a CSV, an empty file...), and
    JSON with none of a trace's keys in its first 64 KiB (a run's
    ``meta.json``). A trace that is broken further on (truncated, corrupt) is a
    trace here: its parse refuses the job; so is a file packed in a way that
    hides what it is (empty, compressed twice, a nested archive, UTF-16), and
    a head that cannot be decoded at all: the full read says why.
    """
    head = decompressed_head(source, SNIFF_HEAD_BYTES)
    if head is None:
        return None
    try:
        fmt = detect_format(source.name, head)
    except InputError as exc:
        return None if any(word in exc.reason for word in _PACKING) else exc.reason
    if fmt == "kineto" and not any(key in head[:_JSON_KEYS_HEAD] for key in _TRACE_KEYS):
        return "JSON without any trace keys (traceEvents, schemaVersion, ph...), not a trace"
    return None
