"""The contract between the job ingester and each input format.

Each format lives in its own folder (``ingest/<format>/``) whose
``__init__.py`` declares a :class:`Format`: how a file of it is recognised,
its parser, what its traces provide and its place in the order formats are
tried. :data:`stallscope.ingest.registry.FORMATS` finds them, in that order; :func:`stallscope.ingest.sniff.sniff`
names a file's format.

A parser turns one input file into one or more :class:`ParsedTrace` (a Kineto
file is one rank; an Nsight Systems report may hold several processes or
devices, each its own rank).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.ingest.canonical import CanonicalTrace
from stallscope.ingest.reader import Source
from stallscope.schema import TABLES


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

    A streamed payload (``Payload(blocks=source.stream)``, for a format whose
    ``streams`` is set) holds no bytes: :attr:`blocks` reads them block by block
    (each call from the start), ``size_hint`` says about how many there are,
    and :meth:`take` reads them all into one buffer for a parser that wants them whole.
    """

    def __init__(
        self,
        data: bytes | None = None,
        *,
        blocks: Callable[[], Iterator[bytes]] | None = None,
        size_hint: int = 0,
    ):
        self._data: bytes | None = data
        self.blocks = blocks
        self.size_hint = size_hint

    def take(self) -> bytes:
        """The bytes; this payload no longer holds them."""
        data, self._data = self._data, None
        if data is None and self.blocks is not None:
            whole = bytearray()
            for block in self.blocks():
                whole += block
            self.blocks = None
            return whole
        if data is None:
            raise RuntimeError("payload already taken")
        return data


Parser = Callable[[Source, Payload, ParseContext], list[ParsedTrace]]

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_ ]?(\d+)", re.IGNORECASE)


def rank_in_name(name: str) -> int | None:
    """The rank a file's base name gives (``rank3``, ``worker_1``...; zip members: the member's
    name), else None: the rule every format uses when the file itself does not say."""
    match = _RANK_IN_NAME.search(name.rsplit(":", 1)[-1].rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def ranks_on_devices(timelines: list[dict[str, Any]], devices: set) -> list[int]:
    """The ranks whose timeline (``meta.json`` with ``devices``) ran on every one of
    ``devices``: how a companion result that names no rank finds its owner (one owner, or
    none to tell). Empty when ``devices`` is."""
    return [
        m["rank"]
        for m in timelines
        if devices and devices <= {d["device"] for d in m.get("devices", [])}
    ]


# Files given together are one job's ranks; said where ranks cannot be told apart.
SEPARATE_JOBS_HINT = (
    "files given together are taken as the ranks of one job: to analyze unrelated traces,"
    " pass --each or put each job in its own folder"
)


# What a format declares its traces provide beyond tables: a GPU timeline (the gpu, host,
# ranges... tables that time-based analyzers read). The tables a format fills are added to
# its ``provides`` from the schema (the formats each declared table names), so a new table
# changes no format's declaration.
PROVIDES = ("timeline",)


@dataclass(frozen=True)
class TableReader:
    """A further canonical table a format reads, declared as ``TABLE_READER`` by a module of
    the format's folder: the format's parser finds it there (:func:`table_readers`), so a new
    table edits no parser. ``table``: the declared table it fills. ``read``: what the parser
    calls, with the format's signature (Kineto: ``read(data, trace_id) -> (table, skipped
    events)``; Nsight Systems: ``read(db) -> raw table``, registered as ``raw``, and
    ``out_sql`` its canonical rows per trace). ``skipped``: what a warning calls the events
    it could not read. ``pieces`` (Kineto, optional): a factory of an accumulator that the
    streamed decode feeds the document's parts in file order, each cut between events
    (``add(part)``), then asks ``table(trace_id) -> (table, skipped events)``: the same as
    ``read`` over the whole document (a reader without it makes the ingest hold the whole
    document)."""

    table: str
    read: Callable[..., Any]
    skipped: str = "events"
    raw: str = ""
    out_sql: str = ""
    pieces: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if self.table not in {t.name for t in TABLES}:
            raise ValueError(
                f"TABLE_READER: no declared table {self.table!r} (stallscope/schema.py)"
            )


def table_readers(package: str, folder: Path) -> list[TableReader]:
    """The ``TABLE_READER`` of each module of a format's folder (module-name order; only those
    modules are imported). Raises RuntimeError for one that is not a TableReader."""
    from stallscope.discovery import declared

    readers = []
    for name, reader, _ in declared(package, folder, "TABLE_READER"):
        if not isinstance(reader, TableReader):
            raise RuntimeError(f"{package}.{name}: TABLE_READER must be a TableReader")
        readers.append(reader)
    return readers


@dataclass(frozen=True)
class Format:
    """One input format, declared by its folder's ``__init__.py``.

    ``detect(name, data)`` says from a file's name and decompressed head (at
    least its first MiB) whether the file is of this format; it may raise
    InputError for a file that looks like this format but is refused (e.g. a
    PyTorch Execution Trace, JSON but not Kineto's). ``binary`` formats are
    recognised by a header and tried first; text formats only once the file
    is known to be UTF-8 text. ``source`` is the catalog ``source`` of the
    traces it makes. A ``companion`` format's traces describe the kernels of a
    timeline trace of the same rank (Nsight Compute): they are not ranks of
    their own, and ``finish(metas, staging)`` pairs them with their timeline
    once every file of the job is parsed (``metas``: the job's timeline traces
    and this format's own, never another companion's). ``extensions`` are the file name
    endings the dashboard's file picker offers (files are told by content,
    never by these alone). A format that ``streams`` is handed a streamed
    :class:`Payload` (its file is never read whole by the ingest).
    """

    name: str
    title: str
    detect: Callable[[str, bytes], bool]
    parse: Parser
    provides: frozenset[str]  # declared: PROVIDES; the schema's tables of this format are added
    priority: int  # the order formats are tried in (lowest first; unique)
    source: str = ""  # default: ``name``
    binary: bool = False
    companion: bool = False
    finish: Callable[[list[dict[str, Any]], Path], None] | None = None
    extensions: tuple[str, ...] = ()
    streams: bool = False

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", self.name)
        unknown = set(self.provides) - set(PROVIDES)
        if unknown:
            raise ValueError(f"format {self.name}: unknown provides {sorted(unknown)}")
        filled = {t.name for t in TABLES if self.source in t.formats}
        object.__setattr__(self, "provides", frozenset(self.provides) | filled)
