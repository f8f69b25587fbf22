"""Nsight Systems: SQLite exports, and ``.nsys-rep``/``.qdrep`` reports (exported with nsys first).

Two formats with one ``source`` (``nsys``): :data:`EXPORT` (the SQLite file
stallscope reads) and :data:`REPORT` (``export.py`` runs ``nsys export`` and
parses the result, or says which command to run). ``parse.py`` is the entry;
``db.py`` (SQLite access, layout detection), ``tables.py`` (what is read),
``enums.py``, ``sql.py`` + ``canonical.py`` (DuckDB SQL to canonical rows),
``ranks.py``, ``parallel.py``, and a module per further table, named after it.
docs/formats/nsys.md.
"""

from __future__ import annotations

from stallscope.ingest.formats import Format, ParseContext, ParsedTrace, Payload
from stallscope.ingest.nsys.db import SQLITE_MAGIC
from stallscope.ingest.nsys.export import is_report
from stallscope.ingest.reader import Source

# Table names only an Nsight Systems export has (its schema is near the start).
_NSYS_TABLES = (b"StringIds", b"CUPTI_ACTIVITY_KIND", b"TARGET_INFO", b"META_DATA_EXPORT",
                b"EXPORT_META_DATA", b"NVTX_EVENTS")  # fmt: skip


def looks_like_export(name: str, data: bytes) -> bool:
    """An SQLite file whose first MiB names Nsight Systems tables (``parse.py`` checks them for real)."""
    return data.startswith(SQLITE_MAGIC) and any(t in data[: 1 << 20] for t in _NSYS_TABLES)


def looks_like_report(name: str, data: bytes) -> bool:
    """An nsys report by its header, or by its extension (unless it is really SQLite)."""
    return is_report(name, data[:64])


def _parse_export(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.nsys.parse import parse_nsys

    return parse_nsys(source, payload, ctx)


def _parse_report(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.nsys.export import parse_nsys_report

    return parse_nsys_report(source, payload.take(), ctx)


REPORT = Format(
    name="nsys-rep",
    title="Nsight Systems report",
    detect=looks_like_report,
    parse=_parse_report,
    provides=frozenset({"timeline"}),
    priority=10,
    source="nsys",
    binary=True,
    extensions=("nsys-rep", "qdrep"),
)
EXPORT = Format(
    name="nsys",
    title="Nsight Systems SQLite export",
    detect=looks_like_export,
    parse=_parse_export,
    provides=frozenset({"timeline"}),
    priority=20,
    binary=True,
    extensions=("sqlite",),
)
FORMATS = (REPORT, EXPORT)
