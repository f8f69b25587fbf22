"""Ingest one job (one or more ranks' files) into the store, atomically.

A job's id is derived from the hashes of its files, so ingesting the same
files again finds the job already stored instead of duplicating it. Each file
is one rank: the rank comes from ``distributedInfo.rank``, else from the file
name (``rank3``, ``rank-3``, ``worker3``...), else, for a single-file job,
rank 0; anything else is an error, never a silent guess.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from stallscope.ingest.canonical import CanonicalTrace
from stallscope.ingest.kineto_canonical import to_canonical
from stallscope.ingest.kineto_decode import decode_kineto
from stallscope.ingest.reader import Source
from stallscope.ingest.sniff import sniff

from stallscope import __version__
from stallscope.errors import InputError
from stallscope.store import Store, write_json

Progress = Callable[[str, int, int], None]
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_ ]?(\d+)", re.IGNORECASE)


@dataclass
class IngestResult:
    """What one job ingest produced (``existed`` when it was already stored)."""

    job_id: str
    job_name: str
    trace_ids: list[str]
    existed: bool
    warnings: list[str] = field(default_factory=list)


def short_hash(*parts: str) -> str:
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=6).hexdigest()


def ingest_job(
    store: Store,
    job_name: str,
    sources: list[Source],
    *,
    uploaded_by: str | None = None,
    tags: list[str] | None = None,
    notes: str = "",
    progress: Progress | None = None,
) -> IngestResult:
    """Parse every source of one job and publish it in one atomic step."""
    hashes = [s.file_hash for s in sources]
    _reject_duplicate_files(sources, hashes)
    job_id = short_hash(*sorted(hashes))
    trace_ids = [short_hash(job_id, h) for h in hashes]
    if store.has_job(job_id):
        return IngestResult(job_id, job_name, trace_ids, existed=True)
    staging = store.new_staging()
    try:
        metas = []
        for index, (source, trace_id) in enumerate(zip(sources, trace_ids, strict=True)):
            if progress:
                progress(f"parsing {source.name}", index, len(sources))
            metas.append(
                _ingest_source(source, trace_id, staging / trace_id, single=len(sources) == 1)
            )
            source.release()
        _check_ranks(metas)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        user = uploaded_by or _current_user()
        for meta in metas:
            meta.update(job_id=job_id, uploaded_by=user, uploaded_at=now)
            meta.setdefault("world_size", len(metas))
            if meta["world_size"] is None:
                meta["world_size"] = len(metas)
            write_json(staging / meta["trace_id"] / "meta.json", meta)
        job = {
            "job_id": job_id,
            "name": job_name,
            "uploaded_by": user,
            "uploaded_at": now,
            "trace_ids": [m["trace_id"] for m in sorted(metas, key=lambda m: m["rank"])],
            "world_size": max(m["world_size"] for m in metas),
            "sources": sorted({m["source"] for m in metas}),
            "tags": sorted({t.strip() for t in tags or [] if t.strip()}),
            "notes": notes,
        }
        write_json(staging / "job.json", job)
        if progress:
            progress("publishing", len(sources), len(sources))
        existed = not store.publish(staging, job_id)
    except BaseException:
        store.discard(staging)
        raise
    warnings = [f"{m['file_name']}: {w}" for m in metas for w in m.get("warnings", [])]
    return IngestResult(job_id, job_name, trace_ids, existed=existed, warnings=warnings)


def _reject_duplicate_files(sources: list[Source], hashes: list[str]) -> None:
    seen: dict[str, str] = {}
    for source, digest in zip(sources, hashes, strict=True):
        if digest in seen:
            raise InputError(
                source.name, f"same contents as {seen[digest]}: a job cannot hold one file twice"
            )
        seen[digest] = source.name


def _ingest_source(source: Source, trace_id: str, folder: Path, *, single: bool) -> dict[str, Any]:
    started = time.perf_counter()
    data = source.read()
    kind = sniff(source.name, data)
    assert kind == "kineto"
    decoded = decode_kineto(source.name, data)
    del data
    header = decoded.header
    rank, world_size, backend = _rank_info(source.name, header, single=single)
    canonical = to_canonical(decoded.events, header, trace_id, rank)
    warnings = list(decoded.warnings)
    del decoded
    if canonical.dropped_events:
        warnings.append(f"dropped {canonical.dropped_events} events with unreadable timestamps")
    if canonical.gpu.num_rows == 0:
        warnings.append("no GPU activity in this trace (CPU-only or unsupported accelerator)")
    folder.mkdir()
    for table_name, table in canonical.tables().items():
        pq.write_table(
            table, folder / f"{table_name}.parquet", compression="zstd", compression_level=1
        )
    meta = _trace_meta(source, trace_id, header, canonical, rank, world_size, backend)
    meta["warnings"] = warnings
    meta["ingest_seconds"] = round(time.perf_counter() - started, 3)
    return meta


def _rank_info(
    name: str, header: dict[str, Any], *, single: bool
) -> tuple[int, int | None, str | None]:
    info = header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    world = info.get("world_size")
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    world = world if isinstance(world, int) and world > 0 else None
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank, world, backend
    match = _RANK_IN_NAME.search(name.rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    if match:
        return int(match.group(1)), world, backend
    if single:
        return 0, world, backend
    raise InputError(
        name, "cannot tell this file's rank: no distributedInfo.rank and no rank in the file name"
    )


def _check_ranks(metas: list[dict[str, Any]]) -> None:
    by_rank: dict[int, str] = {}
    for meta in metas:
        other = by_rank.get(meta["rank"])
        if other is not None:
            raise InputError(meta["file_name"], f"rank {meta['rank']} is also claimed by {other}")
        by_rank[meta["rank"]] = meta["file_name"]


def _trace_meta(
    source: Source,
    trace_id: str,
    header: dict[str, Any],
    canonical: CanonicalTrace,
    rank: int,
    world_size: int | None,
    backend: str | None,
) -> dict[str, Any]:
    gpu = canonical.gpu
    busy = gpu.filter(pc.not_equal(gpu["kind"], "sync")) if gpu.num_rows else gpu
    span = 0
    if busy.num_rows:
        span = pc.max(busy["end_ns"]).as_py() - pc.min(busy["start_ns"]).as_py()
    kernel_count = pc.sum(pc.equal(gpu["kind"], "kernel")).as_py() or 0 if gpu.num_rows else 0
    schema_version = header.get("schemaVersion")
    return {
        "trace_id": trace_id,
        "name": os.path.basename(source.name.rsplit(":", 1)[-1]) or source.name,
        "file_name": source.name,
        "file_hash": source.file_hash,
        "file_bytes": source.file_bytes,
        "source": "kineto",
        "source_version": None if schema_version is None else str(schema_version),
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "base_time_ns": header.get("baseTimeNanoseconds")
        if isinstance(header.get("baseTimeNanoseconds"), int)
        else None,
        "event_count": canonical.event_count,
        "gpu_event_count": gpu.num_rows,
        "kernel_count": int(kernel_count),
        "span_ns": int(span),
        "devices": _active_devices(canonical),
        "stallscope_version": __version__,
    }


def _active_devices(canonical: CanonicalTrace) -> list[dict[str, Any]]:
    gpu = canonical.gpu
    if not gpu.num_rows:
        return []
    active = sorted(d for d in pc.unique(gpu["device"]).to_pylist() if d is not None)
    props = {row["device"]: row for row in canonical.devices.to_pylist()}
    return [
        {
            "device": d,
            "name": props.get(d, {}).get("name"),
            "sm_count": props.get(d, {}).get("sm_count"),
        }
        for d in active
    ]


def _current_user() -> str:
    env = os.environ.get("STALLSCOPE_USER")
    if env:
        return env
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 (no passwd entry in some containers)
        return "unknown"


__all__ = ["IngestResult", "ingest_job"]
