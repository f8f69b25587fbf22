"""Ingest one job (the files of one run) into the store, atomically.

A job's id is derived from the hashes of its files, so ingesting the same
files again finds the job already stored instead of duplicating it. Each file
is handed to the parser of its format (``registry.FORMATS``), which returns
one trace per rank it holds; ranks must be distinct across the job — a clash
is an error, never a silent guess.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stallscope import __version__
from stallscope.errors import EnvironmentProblem, InputError
from stallscope.ingest.canonical import conform
from stallscope.ingest.formats import SEPARATE_JOBS_HINT, ParseContext, ParsedTrace, Parser, Payload
from stallscope.ingest.limits import (
    check_deadline,
    check_rank,
    check_times,
    max_ranks,
    memory_limit_text,
    negative_durations,
)
from stallscope.ingest.reader import Source, decompressed_head
from stallscope.ingest.registry import BY_NAME, FORMATS, companion_file, is_companion, provides
from stallscope.ingest.sniff import JSON_HEAD_BYTES, json_decides, sniff
from stallscope.ingest.startup import give_back_freed_memory, skip_pandas_probe, thread_budget
from stallscope.ingest.streamed import PARQUET_OPTIONS, WrittenTable
from stallscope.rank_card import write_card
from stallscope.schema import RANK_CARD
from stallscope.store import Store, current_user, new_upload, write_json, write_upload

Progress = Callable[[str, int, int], None]


@dataclass
class IngestResult:
    """What one job ingest produced (``existed`` when it was already stored: this upload was
    then recorded beside the earlier ones, ``upload_id`` names it)."""

    job_id: str
    job_name: str
    trace_ids: list[str]
    existed: bool
    warnings: list[str] = field(default_factory=list)
    upload_id: str = ""


def short_hash(*parts: str) -> str:
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=6).hexdigest()


@dataclass
class PreparedJob:
    """A parsed job waiting in its staging folder (``None`` when already stored).

    ``upload`` is this upload's entry (see :func:`stallscope.store.new_upload`);
    ``again`` prepares the job afresh, for when the stored job was removed
    before this upload could be recorded. ``durable``: files of the staging
    folder already fsync'ed by their writer (the publish skips them).
    """

    result: IngestResult
    staging: Path | None
    upload: dict[str, Any] = field(default_factory=dict)
    again: Callable[[], PreparedJob] | None = None
    durable: frozenset[Path] = frozenset()


def ingest_job(store: Store, job_name: str, sources: list[Source], **options: Any) -> IngestResult:
    """Parse every source of one job and publish it in one atomic step."""
    return publish_job(store, prepare_job(store, job_name, sources, **options))


def publish_job(store: Store, prepared: PreparedJob) -> IngestResult:
    """Make a prepared job visible, or record this upload of the job already stored.

    Races are settled here: a job published by another process meanwhile gets
    this upload recorded; a stored job removed meanwhile is ingested afresh.
    """
    again = prepared.again
    for _ in range(20):
        job_id = prepared.result.job_id
        if prepared.staging is not None and store.publish(
            prepared.staging, job_id, prepared.durable
        ):
            prepared.result.existed = False
            return prepared.result
        if store.add_upload(job_id, prepared.upload):
            prepared.result.existed = True
            return prepared.result
        if again is None:
            break
        prepared = again()  # removed between our look and our upload: ingest it afresh
    raise EnvironmentProblem(f"job {prepared.result.job_id} keeps vanishing: try again")


def discard_job(store: Store, prepared: PreparedJob) -> None:
    if prepared.staging is not None:
        store.discard(prepared.staging)


def prepare_job(
    store: Store,
    job_name: str,
    sources: list[Source],
    *,
    uploaded_by: str | None = None,
    tags: list[str] | None = None,
    notes: str = "",
    progress: Progress | None = None,
    ranks: RankIngest | None = None,
) -> PreparedJob:
    """Parse every source of one job into a staging folder; nothing is visible yet.

    A job already stored is not parsed again: publishing records this upload
    (``uploaded_by``, job name, ``tags``, ``notes``) beside the earlier ones.
    ``ranks`` hashes and parses the files (default :data:`HERE`: one after the
    other in this process; :mod:`stallscope.cluster` spreads them over a Dask
    cluster).
    """
    options = {"uploaded_by": uploaded_by, "tags": tags, "notes": notes, "progress": progress,
               "ranks": ranks}  # fmt: skip
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    upload = new_upload(uploaded_by or current_user(), job_name, tags, notes, now)

    def again() -> PreparedJob:
        return _prepare(store, job_name, sources, upload, force=True, **options)

    prepared = _prepare(store, job_name, sources, upload, **options)
    prepared.again = again
    return prepared


def _prepare(
    store: Store,
    job_name: str,
    sources: list[Source],
    upload: dict[str, Any],
    *,
    uploaded_by: str | None,
    tags: list[str] | None,
    notes: str,
    progress: Progress | None,
    ranks: RankIngest | None = None,
    force: bool = False,
) -> PreparedJob:
    ranks = ranks or HERE
    hashes = ranks.hashes(sources)
    _reject_duplicate_files(sources, hashes)
    job_id = short_hash(*sorted(hashes))
    if not force and store.has_job(job_id):
        stored = store.job(job_id).get("trace_ids", [])
        warnings = [
            f"{ref.meta.get('file_name')}: {w}"
            for ref in store.traces(job_id)
            for w in ref.meta.get("warnings", [])
        ]
        result = IngestResult(job_id, job_name, stored, True, warnings, upload["upload_id"])
        return PreparedJob(result, None, upload)
    staging = store.new_staging()
    try:
        # Companions (Nsight Compute results, memory snapshots) describe a timeline's rank:
        # not ranks of their own.
        single = sum(not companion_file(s) for s in sources) <= 1
        metas = ranks.ingest(sources, hashes, job_id, staging, single=single, progress=progress)
        # A format's finish step may rewrite files in place: then nothing counts as synced.
        durable = frozenset() if _finish_formats(metas, staging) else ranks.synced
        _check_ranks(metas)
        now = datetime.fromisoformat(upload["uploaded_at"]).isoformat(timespec="seconds")
        user = upload["uploaded_by"]
        world = max([len({m["rank"] for m in metas})] + [m["world_size"] or 0 for m in metas])
        for meta in metas:
            meta.update(job_id=job_id, uploaded_by=user, uploaded_at=now)
            meta["world_size"] = meta["world_size"] or world
            write_json(staging / meta["trace_id"] / "meta.json", meta)
        ordered = [m["trace_id"] for m in sorted(metas, key=lambda m: m["rank"])]
        job = {
            "job_id": job_id,
            "name": job_name,
            "uploaded_by": user,
            "uploaded_at": now,
            "trace_ids": ordered,
            "world_size": world,
            "sources": sorted({m["source"] for m in metas}),
            "tags": sorted({t.strip() for t in tags or [] if t.strip()}),
            "notes": notes,
        }
        write_json(staging / "job.json", job)
        write_upload(staging, upload)
        if progress:
            progress("publishing", len(sources), len(sources))
    except BaseException:
        store.discard(staging)
        raise
    warnings = [f"{m['file_name']}: {w}" for m in metas for w in m.get("warnings", [])]
    result = IngestResult(job_id, job_name, ordered, False, warnings, upload["upload_id"])
    return PreparedJob(result, staging, upload, durable=durable)


def _finish_formats(metas: list[dict[str, Any]], staging: Path) -> bool:
    """Each format of the job that has a ``finish`` step (ncu: pairing with the timeline) runs it,
    given the job's timeline traces and its own (never another companion's); True when one ran."""
    sources = {meta["source"] for meta in metas}
    ran = False
    for fmt in FORMATS:
        if fmt.finish is not None and fmt.source in sources:
            own = [m for m in metas if m["source"] == fmt.source or not is_companion(m["source"])]
            fmt.finish(own, staging)
            ran = True
    return ran


class RankIngest(Protocol):
    """How a job's files are hashed and parsed into its staging folder (one trace folder per
    rank); :data:`HERE` does it in this process, :mod:`stallscope.cluster` on a Dask cluster.

    ``synced``: after :meth:`ingest`, the files it wrote into the staging folder already
    fsync'ed (empty when it syncs nothing: the publish then syncs every file).
    """

    synced: frozenset[Path]

    def hashes(self, sources: list[Source]) -> list[str]:
        """Each source's SHA-256 (``Source.file_hash``), in order."""
        ...

    def ingest(
        self,
        sources: list[Source],
        hashes: list[str],
        job_id: str,
        staging: Path,
        *,
        single: bool,
        progress: Progress | None,
    ) -> list[dict[str, Any]]:
        """Write every source's traces into ``staging/<trace_id>/``; their catalog rows
        (:func:`_trace_meta`), in source order. Raises on the first source that fails."""
        ...


class RanksHere:
    """Hash and parse a job's files one after the other, in this process (syncing nothing:
    the publish syncs the job's files, which are still in the page cache)."""

    synced: frozenset[Path] = frozenset()

    def hashes(self, sources: list[Source]) -> list[str]:
        if len(sources) == 1 and not streamable(sources[0]):
            sources[0].load_hashed()  # read and hashed in one pass, then parsed from the same bytes
        hashes = []
        for source in sources:  # (zip members: streamed, one at a time, none kept)
            hashes.append(source.file_hash)
            check_deadline(source.name)
        return hashes

    def ingest(
        self,
        sources: list[Source],
        hashes: list[str],
        job_id: str,
        staging: Path,
        *,
        single: bool,
        progress: Progress | None,
    ) -> list[dict[str, Any]]:
        metas = []
        for index, (source, digest) in enumerate(zip(sources, hashes, strict=True)):

            def stage(label: str, index: int = index, source: Source = source) -> None:
                if progress:
                    progress(f"{label} {source.name}", index, len(sources))

            metas += _ingest_source(source, job_id, digest, staging, single=single, stage=stage)
            source.release()
        return metas


HERE = RanksHere()


def _reject_duplicate_files(sources: list[Source], hashes: list[str]) -> None:
    seen: dict[str, str] = {}
    for source, digest in zip(sources, hashes, strict=True):
        if digest in seen:
            raise InputError(
                source.name, f"same contents as {seen[digest]}: a job cannot hold one file twice"
            )
        seen[digest] = source.name


def _ingest_source(
    source: Source,
    job_id: str,
    digest: str,
    staging: Path,
    *,
    single: bool,
    stage: Callable[[str], None] = lambda label: None,
) -> list[dict[str, Any]]:
    """Parse one file and write its traces' tables into the staging folder."""
    started = time.perf_counter()
    stage("reading")
    fmt = streamed_format(source)
    if fmt:  # parsed block by block from the file: never held whole
        payload = Payload(blocks=source.stream, size_hint=source.decompressed_size_hint())
        stage("parsing")
    else:
        data = source.read()
        source.release()  # the (compressed) file bytes are no longer needed: keep one copy only
        stage("parsing")
        fmt = sniff(source.name, data)
        payload = Payload(data)
        del data  # the parser holds the only reference and may free the bytes early
    ctx = ParseContext(
        name=source.name,
        single=single,
        trace_id=lambda key: short_hash(job_id, digest, key) if key else short_hash(job_id, digest),
        scratch=staging,
    )
    skip_pandas_probe()  # the command never needs pandas: 0.2-0.5 s less start-up
    parsed = _parse_guarded(BY_NAME[fmt].parse, source, payload, ctx)
    check_deadline(source.name)
    stage("writing")
    metas = []
    while parsed:  # each trace's tables let go once written, before the next step reads them back
        trace = parsed.pop(0)
        _check_in_range(source.name, trace)
        trace_id = ctx.trace_id(trace.key)
        folder = staging / trace_id
        folder.mkdir()
        _write_tables(folder, trace.canonical.tables())
        meta = _trace_meta(source, digest, trace_id, trace, single=single)
        card = trace.source in RANK_CARD.formats
        del trace  # the card reads the written files: the tables in memory are no longer needed
        give_back_freed_memory()
        if card:  # the cross-rank step's summary (#15)
            write_card(folder, trace_id)
        meta["ingest_seconds"] = round(time.perf_counter() - started, 3)
        metas.append(meta)
    return metas


# Plain files at least this large that are parsed streamed are not read whole to be hashed.
STREAM_MIN_BYTES = 8 << 20


def streamable(source: Source) -> bool:
    """Whether ``source`` is a big plain file parsed streamed (``Format.streams``): hashed
    while read block by block rather than loaded whole (``Source.load_hashed``)."""
    if source.path is None or source.file_bytes < STREAM_MIN_BYTES:
        return False
    return bool(streamed_format(source))


def streamed_format(source: Source) -> str:
    """The name of ``source``'s format when that format ``streams`` (its file is then never
    read whole), else "" (read it whole and sniff that, as before: also when its head is
    unreadable or not plainly JSON, so every refusal keeps its message).

    The format is told from the decompressed head, which ``Format.detect`` is
    defined on; only a head that starts as a JSON object or array is trusted
    (``sniff.json_decides``), where the whole file's sniff reads no further.
    """
    head = decompressed_head(source, JSON_HEAD_BYTES)
    if head is None or not json_decides(head):
        return ""
    try:
        fmt = sniff(source.name, head)
    except InputError:
        return ""
    return fmt if BY_NAME[fmt].streams else ""


def _parse_guarded(
    parser: Parser, source: Source, payload: Payload, ctx: ParseContext
) -> list[ParsedTrace]:
    """Run a parser; what hostile data makes a parser raise becomes a one-line InputError.

    Nesting too deep for the decoder (RecursionError), a trace that needs
    more memory than this ingest may use (MemoryError, e.g. under
    ``--max-memory-mb``) and values past a type's range (DuckDB/Arrow
    overflow and conversion errors) are properties of the input, not bugs.
    """
    try:
        return parser(source, payload, ctx)
    except RecursionError:
        raise InputError(
            source.name, "nested too deeply (thousands of levels): not a trace"
        ) from None
    except MemoryError:
        raise InputError(
            source.name,
            f"needs more memory than this ingest may use ({memory_limit_text()})",
        ) from None
    except (duckdb.OutOfRangeException, duckdb.ConversionException, OverflowError,
            pa.ArrowInvalid) as exc:  # fmt: skip
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(source.name, f"value out of range ({first})") from None


def _check_in_range(name: str, trace: ParsedTrace) -> None:
    """Refuse values that would break analysis later; repair (with a warning) what can be repaired."""
    check_rank(name, trace.rank, trace.world_size)
    tables = trace.canonical.tables()
    check_times(name, tables)
    for table_name in ("gpu", "host", "ranges", "collectives"):
        table = tables.get(table_name)
        if table is None or not (count := negative_durations(table)):
            continue
        if isinstance(table, WrittenTable):  # streamed by its parser, repaired as written
            trace.warnings.append(_negative_warning(count, table_name))
            continue
        ends = pc.max_element_wise(table["end_ns"], table["start_ns"])
        setattr(
            trace.canonical,
            table_name,
            table.set_column(table.schema.get_field_index("end_ns"), "end_ns", ends),
        )
        trace.warnings.append(_negative_warning(count, table_name))


def _negative_warning(count: int, table_name: str) -> str:
    return (
        f"{count:,} {table_name} events had a negative duration (end before start): "
        "given duration 0"
    )


def _write_tables(folder: Path, tables: dict[str, Any]) -> None:
    """One zstd Parquet file per canonical table, written by a few threads at once.

    Arrow encodes and compresses without the GIL, so the big tables (gpu,
    host) are written side by side instead of one after the other. A table
    its parser already streamed to Parquet (``streamed.WrittenTable``) is
    moved into the folder.
    """

    def write(item: tuple[str, Any]) -> None:
        name, table = item
        if isinstance(table, WrittenTable):
            table.move_to(folder / f"{name}.parquet")
            return
        pq.write_table(conform(name, table), folder / f"{name}.parquet", **PARQUET_OPTIONS)

    with ThreadPoolExecutor(max_workers=min(4, thread_budget() or 4)) as pool:
        list(pool.map(write, tables.items()))


def _check_ranks(metas: list[dict[str, Any]]) -> None:
    """One timeline per rank, at most ``max_ranks()`` of them; beside each, at most one
    companion of each kind (ncu: raw/details page; a memory snapshot)."""
    timelines = sum(not is_companion(meta["source"]) for meta in metas)
    if timelines > max_ranks():
        raise InputError(
            metas[0]["file_name"],
            f"the job holds {timelines:,} ranks, more than the {max_ranks():,} one job may hold "
            "(STALLSCOPE_MAX_RANKS raises it)",
        )
    by_rank: dict[tuple, str] = {}
    for meta in metas:
        kind = _companion_kind(meta) if is_companion(meta["source"]) else ""
        key = (meta["rank"], kind)
        other = by_rank.get(key)
        if other is not None:
            raise InputError(
                meta["file_name"],
                f"rank {meta['rank']} is also claimed by {other} ({SEPARATE_JOBS_HINT})",
            )
        by_rank[key] = meta["file_name"]


def _companion_kind(meta: dict[str, Any]) -> str:
    """What a companion trace is, one allowed per rank: its format, and its label when the
    format has several (ncu: the raw or the details page)."""
    label = meta["name"].rsplit("(", 1)[-1] if meta["name"].endswith(")") else ""
    return f"{meta['source']} {label}"


def _trace_meta(
    source: Source, digest: str, trace_id: str, trace: ParsedTrace, *, single: bool
) -> dict[str, Any]:
    canonical = trace.canonical
    gpu = canonical.gpu
    busy = gpu.filter(pc.not_equal(gpu["kind"], "sync")) if gpu.num_rows else gpu
    span = pc.max(busy["end_ns"]).as_py() - pc.min(busy["start_ns"]).as_py() if busy.num_rows else 0
    kernel_count = (pc.sum(pc.equal(gpu["kind"], "kernel")).as_py() or 0) if gpu.num_rows else 0
    warnings = list(trace.warnings)
    if gpu.num_rows == 0 and provides(trace.source, "timeline"):
        warnings.append("no GPU activity in this trace (CPU-only or unsupported accelerator)")
    name = os.path.basename(source.name.rsplit(":", 1)[-1]) or source.name
    if trace.rank is None:
        if is_companion(trace.source):
            rank = None  # the rank of the timeline it describes: set by its format's finish
        elif not single:
            raise InputError(source.name, f"cannot tell this file's rank ({SEPARATE_JOBS_HINT})")
        else:
            rank = 0
    else:
        rank = trace.rank
    return {
        "trace_id": trace_id,
        "name": f"{name} ({trace.label})" if trace.label else name,
        "file_name": source.name,
        "file_hash": digest,
        "file_bytes": source.file_bytes,
        "source": trace.source,
        "source_version": trace.source_version,
        "rank": rank,
        "world_size": trace.world_size,
        "backend": trace.backend,
        "base_time_ns": trace.base_time_ns,
        "event_count": canonical.event_count,
        "gpu_event_count": gpu.num_rows,
        "kernel_count": int(kernel_count),
        "span_ns": int(span),
        "devices": _active_devices(canonical),
        "warnings": warnings,
        "stallscope_version": __version__,
    }


def _active_devices(canonical) -> list[dict[str, Any]]:
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


ingest_source = _ingest_source  # one file's traces into a folder (a cluster worker's part)

__all__ = [
    "HERE", "IngestResult", "PreparedJob", "RankIngest", "discard_job", "ingest_job", "ingest_source",
    "prepare_job", "publish_job",
]  # fmt: skip
