"""Pair Nsight Compute traces with the timeline trace they describe, and match kernels.

Called by the job ingester once every file of a job is parsed (tables still in
the staging folder). Two steps:

1. **Rank.** An ncu trace whose rank is unknown takes the rank of the job's
   timeline: the only timeline rank, else the rank whose timeline ran on the
   ncu kernels' device(s); no timeline at all gives rank 0. Anything still
   ambiguous is an :class:`InputError` (name the rank in the file name).
2. **Kernels.** Each ncu kernel (result ``ID``) is matched to the timeline
   kernels of the same rank with the same **name** (exact, else the base
   function name without return type, namespaces, template arguments and
   parameters: ncu and Kineto/nsys demangle differently), **grid** and
   **block** (when ncu knows them), and the **device** when the timeline has
   several. ``timeline_name_id`` is then the timeline's ``name_id`` of that
   kernel (so its GPU time can be summed there); the k-th ncu profile of a
   kernel is paired by **order** with the k-th launch of it in the timeline
   (``timeline_correlation``, ``timeline_start_ns``, ``timeline_end_ns``),
   when the timeline has that many.

The ncu trace's ``kernel_metrics.parquet`` is rewritten in place (staging only).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from stallscope.errors import InputError
from stallscope.ingest.formats import ranks_on_devices
from stallscope.ingest.streamed import PARQUET_OPTIONS
from stallscope.kernel_names import kernel_base_name


def pair_ncu_traces(metas: list[dict[str, Any]], staging: Path) -> None:
    """Give each ncu trace its rank and write its kernels' timeline matches."""
    timelines = [m for m in metas if m["source"] != "ncu"]  # the job gives only its own and those
    by_rank = {m["rank"]: m for m in timelines}
    for meta in (m for m in metas if m["source"] == "ncu"):
        folder = staging / meta["trace_id"]
        if meta["rank"] is None:
            meta["rank"] = _rank(meta, folder, timelines)
        timeline = by_rank.get(meta["rank"])
        if timeline is not None:
            matched, total = _match(folder, staging / timeline["trace_id"], timeline["trace_id"])
            if matched < total:
                meta["warnings"].append(
                    f"{total - matched} of {total} profiled kernels have no match in the timeline "
                    f"of rank {meta['rank']} ({timeline['file_name']})"
                )


def _rank(meta: dict[str, Any], folder: Path, timelines: list[dict[str, Any]]) -> int:
    ranks = sorted({m["rank"] for m in timelines})
    if len(ranks) <= 1:
        return ranks[0] if ranks else 0
    table = pq.read_table(folder / "kernel_metrics.parquet", columns=["device"])
    devices = {d for d in table["device"].unique().to_pylist() if d is not None}
    owners = ranks_on_devices(timelines, devices)
    if len(owners) == 1:
        return owners[0]
    raise InputError(
        meta["file_name"],
        f"cannot tell which rank this Nsight Compute result describes (the job has ranks "
        f"{', '.join(map(str, ranks))}): put the rank in its file name, e.g. rank1.raw.csv",
    )


def _match(ncu_dir: Path, timeline_dir: Path, timeline_id: str) -> tuple[int, int]:
    con = duckdb.connect(config={"threads": 2})
    try:
        km, names = ncu_dir / "kernel_metrics.parquet", ncu_dir / "names.parquet"
        kernels = con.execute(
            f"SELECT DISTINCT k.kernel_index, n.name, k.device, k.grid_x, k.grid_y, k.grid_z,"
            f" k.block_x, k.block_y, k.block_z FROM read_parquet({_q(km)}) k"
            f" JOIN read_parquet({_q(names)}) n USING (name_id) ORDER BY k.kernel_index"
        ).fetchall()
        gpu, tnames = timeline_dir / "gpu.parquet", timeline_dir / "names.parquet"
        signatures = con.execute(
            f"SELECT g.name_id, n.name, g.device, g.grid_x, g.grid_y, g.grid_z, g.block_x,"
            f" g.block_y, g.block_z, count(*) FROM read_parquet({_q(gpu)}) g"
            f" JOIN read_parquet({_q(tnames)}) n USING (name_id) WHERE g.kind = 'kernel'"
            f" GROUP BY ALL ORDER BY 10 DESC, 1"
        ).fetchall()
        pairs = _pair(kernels, signatures)
        rows = _order_pairs(con, gpu, pairs)
        _rewrite(con, km, timeline_id, rows)
    finally:
        con.close()
    return len(pairs), len(kernels)


def _pair(kernels: list[tuple], signatures: list[tuple]) -> dict[int, tuple]:
    """kernel_index -> (timeline signature, ordinal of this profile among its kernel's profiles)."""
    several_devices = len({s[2] for s in signatures}) > 1
    exact, base = defaultdict(list), defaultdict(list)
    for sig in signatures:
        exact[" ".join(sig[1].split())].append(sig)
        base[kernel_base_name(sig[1])].append(sig)
    seen: dict[tuple, int] = defaultdict(int)
    pairs = {}
    for index, name, device, *dims in kernels:
        for candidates in (
            exact.get(" ".join(name.split()), []),
            base.get(kernel_base_name(name), []),
        ):
            fits = [s for s in candidates if _same_launch(dims, s[3:9]) and
                    (not several_devices or device is None or s[2] == device)]  # fmt: skip
            if fits:
                sig = tuple(fits[0][:9])  # most launches first: the likeliest of equals
                pairs[index] = (sig, seen[sig])
                seen[sig] += 1
                break
    return pairs


def _same_launch(ncu_dims: list, timeline_dims: tuple) -> bool:
    """Grid and block agree, or ncu does not know them (old export, failed replay)."""
    if any(d is None for d in ncu_dims) or not any(ncu_dims):
        return True
    return tuple(ncu_dims) == tuple(timeline_dims)


def _order_pairs(con, gpu: Path, pairs: dict[int, tuple]) -> pa.Table:
    """Attach the k-th timeline launch (correlation, start, end) to the k-th ncu profile."""
    cols = ("name_id", "device", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
    rows = {c: [] for c in ("kernel_index", "ordinal", *cols)}
    for index, (sig, ordinal) in pairs.items():
        rows["kernel_index"].append(index)
        rows["ordinal"].append(ordinal)
        values = (sig[0], sig[2], *sig[3:9])
        for col, value in zip(cols, values, strict=True):
            rows[col].append(value)
    con.register("pairs", pa.table(rows))
    on = " AND ".join(f"t.{c} IS NOT DISTINCT FROM p.{c}" for c in cols)
    return con.sql(
        f"WITH t AS (SELECT *, row_number() OVER (PARTITION BY {', '.join(cols)}"
        f" ORDER BY start_ns) - 1 AS ordinal FROM read_parquet({_q(gpu)}) WHERE kind = 'kernel')"
        f" SELECT p.kernel_index, p.name_id AS timeline_name_id, t.correlation AS timeline_correlation,"
        f" t.start_ns AS timeline_start_ns, t.end_ns AS timeline_end_ns"
        f" FROM pairs p LEFT JOIN t ON {on} AND t.ordinal = p.ordinal"
    ).to_arrow_table()


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _rewrite(con, km: Path, timeline_id: str, matches: pa.Table) -> None:
    con.register("matches", matches)
    tmp = km.with_name(f".{km.name}.{os.getpid()}.tmp")
    table = con.sql(
        f"SELECT k.* EXCLUDE (row_, timeline_trace_id, timeline_name_id, timeline_correlation,"
        f" timeline_start_ns, timeline_end_ns),"
        f" CASE WHEN m.kernel_index IS NOT NULL THEN '{timeline_id}' END AS timeline_trace_id,"
        f" m.timeline_name_id, m.timeline_correlation, m.timeline_start_ns, m.timeline_end_ns"
        f" FROM (SELECT *, row_number() OVER () AS row_ FROM read_parquet({_q(km)})) k"
        f" LEFT JOIN matches m USING (kernel_index) ORDER BY k.row_"
    ).to_arrow_table()
    schema = pq.read_schema(km)
    pq.write_table(table.cast(schema), tmp, **PARQUET_OPTIONS)
    os.replace(tmp, km)
