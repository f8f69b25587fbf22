"""Kineto (PyTorch Profiler) JSON -> one :class:`ParsedTrace` per file.

Decoding is in ``decode``, the canonical SQL in ``canonical``;
this module decides the rank: ``distributedInfo.rank``, else a rank in the
file name (``rank3``, ``rank-3``, ``worker3``...), else 0 for a single-file
job, else a clear error.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from stallscope.errors import InputError
from stallscope.ingest.formats import (
    SEPARATE_JOBS_HINT,
    ParseContext,
    ParsedTrace,
    Payload,
    TableReader,
    rank_in_name,
    table_readers,
)
from stallscope.ingest.kineto.canonical import to_canonical
from stallscope.ingest.kineto.decode import decode_kineto
from stallscope.ingest.kineto.stream import decode_stream
from stallscope.ingest.reader import Source


@functools.cache
def further_readers() -> list[TableReader]:
    """The readers of this folder's further tables (``TABLE_READER``), found once."""
    return table_readers(__package__, Path(__file__).parent)


def parse_kineto(source: Source, data: bytes | Payload, ctx: ParseContext) -> list[ParsedTrace]:
    """One rank's trace, from its bytes or a streamed :class:`Payload` (``stream.py``: the
    file is never held whole). ``data`` is freed once decoded when the caller holds no
    other reference. Further tables (the ``TABLE_READER`` of this folder's modules) are read
    from the same bytes: piece by piece when streamed, else from the whole document."""
    readers = further_readers()
    if isinstance(data, Payload) and data.blocks is not None:
        decoded, further = decode_stream(
            source.name, data.blocks, ctx.trace_id(""), readers, data.size_hint
        )
    else:
        further = [(r, *r.read(data, ctx.trace_id(""))) for r in readers]
        decoded = decode_kineto(source.name, data)
    del data  # the Arrow events hold everything needed from here on
    header = decoded.header
    rank, world_size, backend = rank_info(source.name, header, single=ctx.single)
    negative = _negative_durations(decoded.events) + _negative_durations(decoded.others)
    canonical = to_canonical(decoded, ctx.trace_id(""), rank, ctx.scratch)
    for reader, table, _ in further:
        setattr(canonical, reader.table, table)
    if not (canonical.gpu.num_rows or canonical.host.num_rows or canonical.ranges.num_rows):
        raise InputError(
            source.name,
            "empty trace: no events with a time (nothing was recorded, nothing to analyze)",
        )
    warnings = list(decoded.warnings)
    if negative:
        warnings.append(f"{negative:,} events had a negative duration (dur < 0): given duration 0")
    for reader, _, skipped in further:
        if skipped:
            warnings.append(f"skipped {skipped:,} unreadable {reader.skipped}")
    if canonical.dropped_events:
        warnings.append(f"dropped {canonical.dropped_events} events with unreadable timestamps")
    version = header.get("schemaVersion")
    base = header.get("baseTimeNanoseconds")
    return [
        ParsedTrace(
            key="",
            canonical=canonical,
            source="kineto",
            source_version=None if version is None else str(version),
            rank=rank,
            world_size=world_size,
            backend=backend,
            base_time_ns=base if isinstance(base, int) and not isinstance(base, bool) else None,
            warnings=warnings,
        )
    ]


def _negative_durations(events) -> int:
    """Events whose ``dur`` is negative (read as 0 by the canonical tables)."""
    if "negative_dur" in events.column_names:  # decode.KinetoDecoded.others
        return int(pc.sum(events["negative_dur"]).as_py() or 0)
    count = 0
    if "dur_fast_ns" in events.column_names:
        count += pc.sum(pc.less(events["dur_fast_ns"], 0)).as_py() or 0
    if "dur_txt" in events.column_names:
        count += (
            pc.sum(pc.starts_with(pc.utf8_trim_whitespace(events["dur_txt"]), "-")).as_py() or 0
        )
    return int(count)


def rank_info(
    name: str, header: dict[str, Any], *, single: bool
) -> tuple[int, int | None, str | None]:
    """(rank, world_size or None, backend or None) of one Kineto file."""
    info = header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    world = info.get("world_size")
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    world = world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank, world, backend
    named = rank_in_name(name)
    if named is not None:
        return named, world, backend
    if single:
        return 0, world, backend
    raise InputError(
        name,
        "cannot tell this file's rank: no distributedInfo.rank and no rank in the file name"
        f" ({SEPARATE_JOBS_HINT})",
    )
