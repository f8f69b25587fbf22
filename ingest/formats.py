"""The contract between the job ingester and each input format.

Each format lives in its own folder (``ingest/kineto/``, ``nsys/``, ``ncu/``,
``memory_snapshot/``) whose ``__init__.py`` declares a :class:`Format`: how a
file of it is recognised, its parser, and what its traces provide. The
formats are listed, in the order they are tried, in
:data:`stallscope.ingest.registry.FORMATS`; :func:`stallscope.ingest.sniff.sniff`
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


# The catalog sources of the companion formats (``Format.companion``): Nsight Compute results
# and CUDA memory snapshots. Formats may not import the registry (nor each other), so a
# format's ``finish`` tells a timeline from a companion by this list (tests check it).
COMPANION_SOURCES = ("ncu", "memory-snapshot")

# What a format's traces can provide: a GPU timeline (the gpu, host, ranges... tables that
# time-based analyzers read), per-kernel metrics (kernel_metrics), allocator events (memory).
PROVIDES = ("timeline", "kernel_metrics", "memory")


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
    once every file of the job is parsed. ``extensions`` are the file name
    endings the dashboard's file picker offers (files are told by content,
    never by these alone). A format that ``streams`` is handed a streamed
    :class:`Payload` (its file is never read whole by the ingest).
    """

    name: str
    title: str
    detect: Callable[[str, bytes], bool]
    parse: Parser
    provides: frozenset[str]
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
