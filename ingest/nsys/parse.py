"""Nsight Systems SQLite export -> one :class:`ParsedTrace` per rank.

``parse_nsys`` is the format parser (the decompressed bytes of a ``.sqlite`` or
``.sqlite.gz``); ``parse_nsys_file`` reads an export on disk (such as the cached
export of a ``.nsys-rep``, see ``export``). sqlite3 needs a file: bytes
that are not already a plain file on disk are written to a temporary file,
removed afterwards.

The export's tables and columns are detected, never assumed (``db``);
``tables`` reads them, ``canonical`` turns them into the canonical
tables, ``ranks`` decides ranks. What comes from which table is in
docs/formats/nsys.md. Times are the export's integer nanoseconds (session
relative; ``base_time_ns`` is the session start in Unix-epoch ns).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from stallscope.errors import InputError
from stallscope.ingest.canonical import devices_table
from stallscope.ingest.formats import ParseContext, ParsedTrace, Payload
from stallscope.ingest.nsys.canonical import NsysCanonical, further_readers
from stallscope.ingest.nsys.db import NsysDb, check_header
from stallscope.ingest.nsys.enums import enum_tables
from stallscope.ingest.nsys.ranks import Unit, assign, recorded_ranks
from stallscope.ingest.nsys.tables import (
    GPU_TABLES,
    RUNTIME,
    cuda_device_map,
    export_meta,
    gpu_info,
    mpi_ranks,
    read_activities,
    read_nvtx,
    read_osrt,
    read_runtime,
    read_strings,
    read_threads,
    session_start_ns,
)
from stallscope.ingest.reader import Source


def parse_nsys(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    """The nsys format parser: ``payload`` holds the whole (decompressed) SQLite file.

        The temporary copy lies in the ingest's staging folder (``ctx.scratch``), so
    one left by a killed ingest is removed with that folder. SQLite reads a file, so the bytes are dropped (freed: the payload held the
        only reference) once the file on disk is known to hold them, or once they
        are written to a temporary copy: not held through the parse.
    """
    data = payload.take()
    check_header(source.name, data[:100], len(data))
    if _same_file_on_disk(source.name, data):
        del data
        return parse_nsys_file(source.name, source.name, ctx)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-nsys-", suffix=".sqlite", dir=ctx.scratch)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise InputError(source.name, f"cannot write a temporary copy ({exc})") from None
        del data
        return parse_nsys_file(tmp, source.name, ctx)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def parse_nsys_file(path: str | Path, name: str, ctx: ParseContext) -> list[ParsedTrace]:
    """Parse the export at ``path``; ``name`` is what messages call it."""
    with open(path, "rb") as fh:
        check_header(name, fh.read(100), os.path.getsize(path))
    db = NsysDb(path, name)
    canon = None
    try:
        meta = export_meta(db)
        _require_gpu_tables(db, name, meta)
        threads, processes = read_threads(db)
        raw = {  # the event tables are read by NsysCanonical, one at a time (it frees each)
            "act": lambda: read_activities(db),
            "runtime": lambda: read_runtime(db),
            "osrt": lambda: read_osrt(db),
            "nvtx": lambda: read_nvtx(db),
            "strings": read_strings(db),
            "thread_names": threads,
            "processes": processes,
            **enum_tables(db),
            **{r.raw: r.read(db) for r in further_readers()},  # further tables (TABLE_READER)
        }
        gpus, cuda_map, mpi = gpu_info(db), cuda_device_map(db), mpi_ranks(db)
        start_ns, has_runtime = session_start_ns(db), db.has(RUNTIME)
        canon = NsysCanonical(raw)
        del raw  # DuckDB holds its own copy now
        text_warnings = list(db.warnings)
    except BaseException:
        if canon is not None:
            canon.close()
        raise
    finally:
        db.close()
    try:
        units = _units(canon, name)
        idle = canon.idle_processes()
        recorded, _, world = recorded_ranks(
            mpi, canon.thread_name_rows(), canon.nccl_init_payloads()
        )
        how = assign(units, recorded, name, ctx.single)
        keys = ["" if len(units) == 1 else u.key for u in units]
        rows = [
            {"tix": i, "gp": u.gp, "device": u.device, "split": u.split,
             "trace_id": ctx.trace_id(k), "rank": u.rank}
            for i, (u, k) in enumerate(zip(units, keys, strict=True))
        ]  # fmt: skip
        warnings, first = _warnings(canon, units, how, has_runtime), _idle_warning(idle)
        warnings = text_warnings + warnings
        if len(units) > 1 and how != "recorded":
            first.append(f"ranks assigned by {how}: the export records no MPI or NCCL rank")
        nccl = canon.has_nccl()
        traces = canon.emit(rows, ctx.scratch)  # last: it frees the prepared tables
    finally:
        canon.close()
    out = []
    for index, (unit, key, trace) in enumerate(zip(units, keys, traces, strict=True)):
        trace.devices = devices_table(rows[index]["trace_id"], _devices(gpus, cuda_map, unit.pid))
        out.append(
            ParsedTrace(
                key=key,
                canonical=trace,
                source="nsys",
                source_version=meta.get("EXPORT_SCHEMA_VERSION"),
                rank=unit.rank,
                world_size=world,
                backend="nccl" if nccl or trace.collectives.num_rows else None,
                base_time_ns=start_ns,
                label=unit.label if len(units) > 1 else None,
                warnings=warnings + (first if index == 0 else []),
            )
        )
    return out


def _same_file_on_disk(name: str, data: bytes) -> bool:
    """True when ``name`` is a plain file holding exactly ``data`` (no copy needed)."""
    try:
        if not os.path.isfile(name) or os.path.getsize(name) != len(data):
            return False
        with open(name, "rb") as fh:
            return fh.read(4096) == data[:4096]
    except OSError:
        return False


def _require_gpu_tables(db: NsysDb, name: str, meta: dict[str, str]) -> None:
    """Refuse an SQLite file that is not an nsys export, or one without GPU activity tables."""
    cupti = [t for t in db.tables if t.startswith("CUPTI_ACTIVITY_KIND_")]
    if not db.has("StringIds") or not (meta or cupti or db.has("NVTX_EVENTS")):
        raise InputError(name, "SQLite database without Nsight Systems tables: not an nsys export")
    if any(db.has(t) for t in GPU_TABLES.values()):
        return
    if not cupti:
        raise InputError(
            name,
            "Nsight Systems export of a CPU-only capture: no CUDA tables (CUPTI_ACTIVITY_KIND_*), "
            "so there is no GPU activity to analyze (capture with nsys profile -t cuda)",
        )
    calls = db.rows(f"SELECT count(*) FROM {db.ref(RUNTIME)}")[0][0] if db.has(RUNTIME) else 0
    raise InputError(
        name,
        "Nsight Systems export without GPU activity: no CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY or "
        f"_MEMSET table ({calls:,} CUDA API calls, no kernels or copies were traced)",
    )


def _units(canon: NsysCanonical, name: str) -> list[Unit]:
    """One unit per process with GPU activity, or per GPU of a multi-GPU process."""
    rows = canon.unit_rows()
    if not rows:
        raise InputError(
            name,
            "Nsight Systems export without GPU activity: its kernel/memcpy/memset tables hold "
            "no rows with timestamps",
        )
    per_process: dict[int, list[int]] = {}
    for gp, device, _ in rows:
        per_process.setdefault(gp, []).append(device)
    return [
        Unit(gp=gp, pid=-1 if gp < 0 else gp & 0xFFFFFF, device=d, split=len(devs) > 1)
        for gp, devs in per_process.items()
        for d in devs
    ]


def _warnings(canon: NsysCanonical, units: list[Unit], how: str, has_runtime: bool) -> list[str]:
    """What every trace of the file should say about how it was read."""
    counts = canon.counts()
    out = []
    if counts["dropped"]:
        out.append(f"dropped {counts['dropped']:,} GPU activities without valid timestamps")
    if counts["open_ranges"]:
        out.append(f"left out {counts['open_ranges']:,} NVTX ranges that never ended")
    if not has_runtime:
        out.append("no CUDA API table: GPU work cannot be tied to the calls that launched it")
    if counts["graphs"]:
        out.append(
            "CUDA graphs traced as whole graphs: each graph launch is one kernel row "
            "(capture with --cuda-graph-trace=node to see the graphs' kernels)"
        )
    return out


def _idle_warning(idle: list[int]) -> list[str]:
    if not idle:
        return []
    pids = ", ".join(str(gp & 0xFFFFFF) for gp in idle[:5]) + (", ..." if len(idle) > 5 else "")
    plural = "es" if len(idle) > 1 else ""
    return [f"left out {len(idle)} process{plural} without GPU activity (pid {pids})"]


def _devices(gpus: list[dict[str, Any]], cuda_map: list[tuple], pid: int) -> list[dict[str, Any]]:
    """Kineto-style device properties of the GPUs one process could see, keyed by CUDA ordinal."""
    ordinal = {gpu: cuda for gpu, cuda, p in cuda_map if p == pid}
    out, seen = [], set()
    for g in gpus:
        gid = g.get("id")
        if ordinal:
            if gid not in ordinal:
                continue
            device = ordinal[gid]
        else:
            device = g.get("cuDevice") if isinstance(g.get("cuDevice"), int) else gid
        if not isinstance(device, int) or device in seen:
            continue
        seen.add(device)
        warps, warp = g.get("maxWarpsPerSm"), g.get("threadsPerWarp")
        out.append(
            {
                "id": device,
                "name": g.get("name"),
                "computeMajor": g.get("computeMajor"),
                "computeMinor": g.get("computeMinor"),
                "numSms": g.get("smCount"),
                "regsPerMultiprocessor": g.get("maxRegistersPerSm"),
                "regsPerBlock": g.get("maxRegistersPerBlock"),
                "sharedMemPerMultiprocessor": g.get("maxShmemPerSm"),
                "sharedMemPerBlock": g.get("maxShmemPerBlock"),
                "sharedMemPerBlockOptin": g.get("maxShmemPerBlockOptin"),
                "maxThreadsPerMultiprocessor": warps * warp
                if isinstance(warps, int) and isinstance(warp, int)
                else None,
                "maxThreadsPerBlock": g.get("maxThreadsPerBlock"),
                "maxBlocksPerMultiprocessor": g.get("maxBlocksPerSm"),
                "warpSize": warp,
                "totalGlobalMem": g.get("totalMemory"),
            }
        )
    return out
