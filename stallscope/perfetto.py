"""Export one stored trace as Chrome trace JSON (opens in Perfetto and chrome://tracing).

:func:`write_chrome_trace` streams the trace's GPU and host activities, one
``ph: "X"`` slice each, the GPU-projected annotations (``gpu_user_annotation``),
one launch -> GPU activity flow arrow per correlated pair (Kineto's ``ac2g``
``s``/``f`` events), plus the analyzers' findings as slices on a separate
``stallscope findings`` process (one thread per finding, one slice per
evidence window; args ``severity``, ``analyzer``, ``detail``,
``recommendation``, ``impact_ms``). Event lines are built inside DuckDB and
written in batches, so a million-event trace never becomes a Python list.

Layout: GPU ``d`` is process ``d`` named ``GPU d`` with one thread per stream
(as Kineto writes them); host activities keep their pid/tid; times are
microseconds with exactly three decimals, from the stored integer
nanoseconds. Categories and args follow Kineto's, so ``stallscope ingest``
reads the export back (same kernels, same GPU busy time, same operator input
shapes: ``Input Dims``/``Input type`` are written back verbatim from the host
table's ``input_dims``/``input_types``).
"""

from __future__ import annotations

import json
from typing import IO, Any

from stallscope.jobdata import JobData

BATCH_ROWS = 50_000
FINDINGS_PID = 2_000_000_000
FINDINGS_TRACK = "stallscope findings"
GPU_CATS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "sync": "cuda_sync"}
HOST_CATS = {
    "cpu_op": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "python": "python_function",
    "annotation": "user_annotation", "overhead": "overhead", "osrt": "osrt",
}  # fmt: skip
SEVERITY_COLOR = {
    "critical": "terrible", "high": "bad", "medium": "yellow", "low": "olive", "info": "good",
}  # fmt: skip


def us_sql(expr: str) -> str:
    """SQL text of integer ns ``expr`` as µs with exactly three decimals (exact, no float)."""
    return (
        f"(CASE WHEN ({expr}) < 0 THEN '-' ELSE '' END || (abs({expr}) // 1000)::VARCHAR || '.' "
        f"|| lpad((abs({expr}) % 1000)::VARCHAR, 3, '0'))"
    )


def us_text(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    ns = abs(int(ns))
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _case(column: str, mapping: dict[str, str]) -> str:
    return (
        "CASE "
        + column
        + " "
        + " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in mapping.items())
        + " ELSE "
        + column
        + " END"
    )


def _columns(job: JobData, table: str) -> set[str]:
    return {row[0] for row in job.sql(f"DESCRIBE {table}").fetchall()}


def _gpu_sql(cols: set[str]) -> str:
    def col(name: str) -> str:
        return f"g.{name}" if name in cols else "NULL"

    common = [("device", "g.device"), ("stream", "g.stream"), ("correlation", col("correlation")),
              ("External id", col("external_id"))]  # fmt: skip
    by_kind = {
        "kernel": common + [
            ("grid", f"[{col('grid_x')}, {col('grid_y')}, {col('grid_z')}]"),
            ("block", f"[{col('block_x')}, {col('block_y')}, {col('block_z')}]"),
            ("registers per thread", col("registers_per_thread")),
            ("shared memory", col("shared_mem_bytes")),
            ("blocks per SM", col("blocks_per_sm")),
            ("warps per SM", col("warps_per_sm")),
            ("est. achieved occupancy %", col("est_occupancy_pct")),
        ],
        "memcpy": common + [("bytes", col("bytes"))],
        "memset": common + [("bytes", col("bytes"))],
        "sync": common + [("cuda_sync_kind", col("sync_kind"))],
    }  # fmt: skip
    cases = " ".join(
        f"WHEN '{kind}' THEN json_object({', '.join(f'{chr(39)}{k}{chr(39)}, {v}' for k, v in args)})"
        for kind, args in by_kind.items()
    )
    pairs = f"CASE g.kind {cases} ELSE json_object({', '.join(f'{chr(39)}{k}{chr(39)}, {v}' for k, v in common)}) END"
    return f"""
        SELECT '{{"ph":"X","cat":' || to_json({_case("g.kind", GPU_CATS)}) || ',"name":' || to_json(coalesce(n.name, ''))
            || ',"pid":' || coalesce(g.device, 0) || ',"tid":' || coalesce(g.stream, -1)
            || ',"ts":' || {us_sql("g.start_ns")} || ',"dur":' || {us_sql("g.end_ns - g.start_ns")}
            || ',"args":' || ({pairs})::VARCHAR || '}}' AS line
        FROM gpu g LEFT JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id
        WHERE g.trace_id = $trace ORDER BY g.device, g.stream, g.start_ns"""


def _host_sql(cols: set[str]) -> str:
    def col(name: str) -> str:
        return f"h.{name}" if name in cols else "NULL"

    return f"""
        SELECT '{{"ph":"X","cat":' || to_json({_case("h.kind", HOST_CATS)}) || ',"name":' || to_json(coalesce(n.name, ''))
            || ',"pid":' || coalesce(h.pid, 0) || ',"tid":' || coalesce(h.tid, 0)
            || ',"ts":' || {us_sql("h.start_ns")} || ',"dur":' || {us_sql("h.end_ns - h.start_ns")}
            || ',"args":' || rtrim(json_object('correlation', {col("correlation")}, 'External id', {col("external_id")})::VARCHAR, '}}')
            || coalesce(',"Input Dims":' || {col("input_dims")}, '') || coalesce(',"Input type":' || {col("input_types")}, '')
            || '}}}}' AS line
        FROM host h LEFT JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
        WHERE h.trace_id = $trace ORDER BY h.pid, h.tid, h.start_ns"""


def _flow_sql() -> str:
    """Launch -> kernel flow arrows (Kineto's ``ac2g`` pairs): one ``s`` at the runtime/driver
    call that launched each GPU activity, one ``f`` (binding to the enclosing slice) at it."""
    return f"""
        WITH pairs AS (
            SELECT g.correlation AS id, h.pid, h.tid, h.start_ns AS h_start,
                   g.device, g.stream, g.start_ns AS g_start
            FROM gpu g JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation
            WHERE g.trace_id = $trace AND h.kind IN ('runtime', 'driver') AND g.correlation IS NOT NULL
        )
        SELECT line FROM (
            SELECT h_start AS t, 0 AS part, id,
                   '{{"ph":"s","id":' || id || ',"pid":' || coalesce(pid, 0) || ',"tid":' || coalesce(tid, 0)
                   || ',"ts":' || {us_sql("h_start")} || ',"cat":"ac2g","name":"ac2g"}}' AS line
            FROM pairs
            UNION ALL
            SELECT g_start, 1, id,
                   '{{"ph":"f","id":' || id || ',"pid":' || coalesce(device, 0) || ',"tid":' || coalesce(stream, -1)
                   || ',"ts":' || {us_sql("g_start")} || ',"cat":"ac2g","name":"ac2g","bp":"e"}}'
            FROM pairs
        ) ORDER BY id, part"""


def _gpu_annotation_sql() -> str:
    """``record_function``/NVTX ranges projected on GPU streams (Kineto ``gpu_user_annotation``)."""
    return f"""
        SELECT '{{"ph":"X","cat":"gpu_user_annotation","name":' || to_json(coalesce(n.name, ''))
            || ',"pid":' || coalesce(r.device, 0) || ',"tid":' || coalesce(r.stream, -1)
            || ',"ts":' || {us_sql("r.start_ns")} || ',"dur":' || {us_sql("r.end_ns - r.start_ns")}
            || ',"args":' || json_object('device', r.device, 'stream', r.stream,
                                         'External id', r.external_id)::VARCHAR || '}}' AS line
        FROM ranges r LEFT JOIN names n ON n.trace_id = r.trace_id AND n.name_id = r.name_id
        WHERE r.trace_id = $trace AND r.kind = 'gpu_annotation' ORDER BY r.device, r.stream, r.start_ns"""


def _meta(name: str, pid: int, tid: int | None, value: str, sort: int | None = None) -> list[str]:
    base = {"ph": "M", "pid": pid, "tid": 0 if tid is None else tid}
    out = [json.dumps({**base, "name": name, "args": {"name": value}})]
    if sort is not None:
        kind = "process_sort_index" if tid is None else "thread_sort_index"
        out.append(json.dumps({**base, "name": kind, "args": {"sort_index": sort}}))
    return out


def merged(windows: list[list[int]]) -> list[list[int]]:
    """Sorted, non-overlapping windows (slices on one thread must nest, so overlaps are joined)."""
    out: list[list[int]] = []
    for start, end in sorted((int(s), int(e)) for s, e in windows):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def finding_events(findings: list[dict[str, Any]], bounds: tuple[int, int]) -> list[str]:
    """Metadata and slices of the findings track (findings are few: a list is fine)."""
    lines = _meta("process_name", FINDINGS_PID, None, FINDINGS_TRACK, sort=-1)
    for index, f in enumerate(findings, start=1):
        label = f"[{f['severity'].upper()}] {f['analyzer']}: {f['title']}"
        lines += _meta("thread_name", FINDINGS_PID, index, label, sort=index)
        windows = merged(f.get("windows") or [list(bounds)])
        args = {
            "severity": f["severity"], "analyzer": f["analyzer"], "title": f["title"],
            "detail": f["detail"], "recommendation": f["recommendation"],
            "impact_ms": round(f["impact_ns"] / 1e6, 6), "finding": f["id"],
        }  # fmt: skip
        for start, end in windows:
            lines.append(
                '{"ph":"X","cat":"stallscope_finding","name":' + json.dumps(label)
                + f',"pid":{FINDINGS_PID},"tid":{index},"ts":{us_text(start)},"dur":{us_text(max(0, end - start))}'
                + ',"cname":' + json.dumps(SEVERITY_COLOR.get(f["severity"], "generic_work"))
                + ',"args":' + json.dumps(args) + "}"
            )  # fmt: skip
    return lines


def write_chrome_trace(
    job: JobData, trace_id: str, out: IO[str], findings: list[dict[str, Any]]
) -> dict[str, int]:
    """Write the trace as Chrome trace JSON to ``out``; returns event counts by part."""
    ref = next(r for r in job.traces if r.trace_id == trace_id)
    meta = ref.meta
    devices = job.sql(
        "SELECT device, name, sm_count FROM devices WHERE trace_id = ? ORDER BY device", [trace_id]
    ).fetchall()
    bounds = job.sql(
        "SELECT min(s), max(e) FROM (SELECT min(start_ns) s, max(end_ns) e FROM gpu WHERE trace_id = $1 "
        "UNION ALL SELECT min(start_ns), max(end_ns) FROM host WHERE trace_id = $1)",
        [trace_id],
    ).fetchone()
    header: dict[str, Any] = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "deviceProperties": [
            {"id": d, "name": name, "numSms": sms} for d, name, sms in devices if d is not None
        ],
        "stallscope": {"trace": trace_id, "job": ref.job_id, "name": meta.get("name")},
    }
    if meta.get("rank") is not None:
        header["distributedInfo"] = {
            "rank": meta.get("rank"),
            "world_size": meta.get("world_size") or 1,
        }
    out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
    counts = {"gpu": 0, "host": 0, "metadata": 0, "findings": 0, "flows": 0, "gpu_annotations": 0}
    first = True

    def emit(lines: list[str]) -> None:
        nonlocal first
        if not lines:
            return
        out.write(("" if first else ",\n") + ",\n".join(lines))
        first = False

    gpu_lanes = job.sql(
        "SELECT DISTINCT device, stream FROM gpu WHERE trace_id = ? ORDER BY ALL", [trace_id]
    ).fetchall()
    meta_lines: list[str] = []
    for device in sorted({d for d, _ in gpu_lanes}):
        meta_lines += _meta("process_name", device, None, f"GPU {device}", sort=device)
    for device, stream in gpu_lanes:
        meta_lines += _meta("thread_name", device, stream, f"stream {stream}", sort=stream)
    threads = job.sql(
        "SELECT h.pid, h.tid, min(t.name) FROM host h LEFT JOIN threads t "
        "ON t.trace_id = h.trace_id AND t.pid = h.pid AND t.tid = h.tid WHERE h.trace_id = ? "
        "GROUP BY h.pid, h.tid ORDER BY h.pid, h.tid",
        [trace_id],
    ).fetchall()
    seen_pids: set[int] = set()
    for pid, tid, name in threads:
        if pid not in seen_pids:
            seen_pids.add(pid)
            meta_lines += _meta(
                "process_name", pid, None, f"host {pid}", sort=1000 + len(seen_pids)
            )
        meta_lines += _meta("thread_name", pid, tid, name or f"thread {tid}")
    emit(meta_lines)
    counts["metadata"] = len(meta_lines)
    for part, sql in (
        ("gpu", _gpu_sql(_columns(job, "gpu"))),
        ("gpu_annotations", _gpu_annotation_sql()),
        ("host", _host_sql(_columns(job, "host"))),
        ("flows", _flow_sql()),
    ):
        cursor = job.con.execute(sql, {"trace": trace_id})
        while batch := cursor.fetchmany(BATCH_ROWS):
            emit([row[0] for row in batch])
            counts[part] += len(batch) // 2 if part == "flows" else len(batch)
    lines = finding_events(findings, (int(bounds[0] or 0), int(bounds[1] or 0)))
    emit(lines)
    counts["findings"] = sum(1 for line in lines if '"ph":"X"' in line)
    out.write("\n]}\n")
    return counts
