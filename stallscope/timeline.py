"""Server-side timeline data: what a browser can draw for any window of a job's ranks.

:func:`timeline_window` returns, for some traces (ranks) of a job and a time
window, one row per drawable item. When a lane (a GPU stream or a host thread
of one rank) has few events in the window they come back as they are; when it
has more than ``max_items_per_lane``, they are aggregated into ``bins`` equal
time bins with the busy share of each bin (and the category that fills most of
it), so a million-event trace stays a few thousand shapes.

Times are int64 ns on each trace's own clock, as stored: ranks of one Kineto
job share wall time, so one window aligns them (:func:`first_step_starts` says
how far their first steps are apart). Everything here is pure (DuckDB queries
and pandas); the figures are in :mod:`stallscope.charts`, the page is thin.

An event is named by a **key**, ``trace|side|d|s|start_ns`` (side ``gpu``:
d = device, s = stream; ``host``/``annotation``: d = pid, s = tid), which the
frame, the search results and the flow pairs share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from stallscope.jobdata import JobData

SIDES = ("gpu", "host", "annotation")
SIDE_ORDER = {"gpu": 0, "host": 1, "annotation": 2}
MAX_DEPTH = 3  # nesting levels drawn apart; deeper ranges share the last sub-lane
COLUMNS = [
    "trace_id", "rank", "side", "lane", "key", "start_ns", "end_ns", "name", "kind", "category",
    "busy", "count", "d", "s", "correlation", "external_id", "grid", "block", "bytes",
]  # fmt: skip

# Categories a lane's slices are colored by (GPU: what the kernel is; host: what the call is).
GPU_CATEGORY_SQL = """CASE
  WHEN t.kind = 'kernel' AND coalesce(t.is_comm, false) THEN 'communication'
  WHEN t.kind = 'kernel' THEN 'compute'
  WHEN t.kind = 'memcpy' THEN 'memcpy ' || coalesce(t.copy_kind, 'other')
  ELSE t.kind END"""
HOST_CATEGORY_SQL = """CASE
  WHEN t.kind = 'annotation' AND (n.name LIKE 'ProfilerStep#%' OR regexp_matches(n.name, '^[Ss]tep \\d+$'))
    THEN 'step'
  ELSE t.kind END"""
CATEGORIES = (
    "compute", "communication", "memcpy HtoD", "memcpy DtoH", "memcpy DtoD", "memcpy PtoP",
    "memcpy HtoH", "memcpy other", "memset", "cpu_op", "runtime", "driver", "annotation", "step",
)  # fmt: skip


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int


def rank_of(job: JobData, trace_id: str) -> int:
    """The rank of a trace of the job (0 when the catalog has none)."""
    ref = next(r for r in job.traces if r.trace_id == trace_id)
    return int(ref.meta.get("rank") or 0)


def _lane_label(side: str, rank: int) -> str:
    """SQL text of the lane name: ``rank R · GPU d · stream s`` / ``rank R · host P · thread T``."""
    if side == "gpu":
        return f"'rank {rank} · GPU ' || t.device || ' · stream ' || t.stream"
    suffix = " || ' · ranges'" if side == "annotation" else ""
    return f"'rank {rank} · host ' || t.pid || ' · thread ' || t.tid" + suffix


def _lane_cols(side: str) -> tuple[str, str]:
    return ("device", "stream") if side == "gpu" else ("pid", "tid")


def _table(side: str) -> str:
    return "gpu" if side == "gpu" else "host"


def _kinds(side: str) -> str:
    if side == "gpu":
        return "t.kind <> 'sync'"
    if side == "annotation":
        return "t.kind = 'annotation'"
    return "t.kind IN ('cpu_op', 'runtime', 'driver')"


def _key_sql(side: str) -> str:
    a, b = _lane_cols(side)
    return f"t.trace_id || '|{side}|' || t.{a} || '|' || t.{b} || '|' || t.start_ns"


def event_key(trace_id: str, side: str, d: int, s: int, start_ns: int) -> str:
    """The key of one event (see the module docstring)."""
    return f"{trace_id}|{side}|{int(d)}|{int(s)}|{int(start_ns)}"


def parse_key(key: str) -> tuple[str, str, int, int, int] | None:
    """``(trace, side, d, s, start_ns)`` of a key, None when it is not one."""
    parts = key.split("|")
    if len(parts) != 5 or parts[1] not in SIDES:
        return None
    try:
        return parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4])
    except ValueError:
        return None


def nest_lanes(events: pd.DataFrame) -> pd.DataFrame:
    """Host events that nest (a DataLoader range inside ``ProfilerStep#N``, an operator inside
    another) get a sub-lane per depth, ``<lane> · <depth>``, so inner ones are not hidden
    under the outer bar. ``events`` is sorted by lane and start; depth 0 keeps the lane name."""
    if events.empty:
        return events
    depths = []
    for _, part in events.groupby("lane", sort=False):
        open_ends: list[int] = []
        for start, end in zip(part["start_ns"].tolist(), part["end_ns"].tolist(), strict=True):
            open_ends = [e for e in open_ends if e > start]
            depths.append(min(len(open_ends), MAX_DEPTH))
            open_ends.append(end)
    depth = pd.Series(depths, index=events.index)
    out = events.copy()
    out["lane"] = out["lane"].where(depth == 0, out["lane"] + " · " + depth.astype(str))
    return out


def default_window(job: JobData, trace_ids: str | list[str]) -> Window:
    """What the timeline opens on: the steps of these traces when they have any, else the
    whole traces."""
    ids = _ids(trace_ids)
    marks = ", ".join("?" for _ in ids)
    row = job.sql(
        f"SELECT min(start_ns), max(end_ns) FROM ranges WHERE trace_id IN ({marks}) AND kind = 'step'",
        ids,
    ).fetchone()
    if row[0] is None:
        return trace_bounds(job, ids)
    return Window(int(row[0]), int(row[1]))


def trace_bounds(job: JobData, trace_ids: str | list[str]) -> Window:
    """First start and last end over the traces' GPU and host activities."""
    ids = _ids(trace_ids)
    marks = ", ".join("?" for _ in ids)
    row = job.sql(
        f"SELECT min(s), max(e) FROM (SELECT min(start_ns) s, max(end_ns) e FROM gpu WHERE trace_id IN ({marks}) "
        f"UNION ALL SELECT min(start_ns), max(end_ns) FROM host WHERE trace_id IN ({marks}))",
        ids + ids,
    ).fetchone()
    return Window(int(row[0] or 0), int(row[1] or 0))


def first_step_starts(job: JobData, trace_ids: list[str]) -> dict[str, int]:
    """Start (ns, each trace's clock) of each trace's first step; traces without steps are left out."""
    marks = ", ".join("?" for _ in trace_ids)
    rows = job.sql(
        f"SELECT trace_id, min(start_ns) FROM ranges WHERE trace_id IN ({marks}) AND kind = 'step' "
        "GROUP BY trace_id",
        list(trace_ids),
    ).fetchall()
    return {str(t): int(s) for t, s in rows}


def default_ranks(ranks: list[int], finding_ranks: Iterable[int], limit: int = 8) -> list[int]:
    """The ranks the timeline opens with: all of them up to ``limit``, else rank 0 and the
    ranks named in findings (ascending), at most ``limit`` in all: when more ranks have
    findings (a 1,024-rank job where every rank waits), the first ones of ``finding_ranks``
    (give them worst first)."""
    if len(ranks) <= limit:
        return sorted(ranks)
    first = min(ranks)
    have = set(ranks)
    chosen = {first}
    for rank in finding_ranks:
        if len(chosen) >= limit:
            break
        if rank in have:
            chosen.add(rank)
    return sorted(chosen)


def _ids(trace_ids: str | list[str]) -> list[str]:
    return [trace_ids] if isinstance(trace_ids, str) else list(trace_ids)


def lanes_in_window(job: JobData, trace_id: str, window: Window) -> pd.DataFrame:
    """One row per lane of a trace with events in the window: side, d, s, n (events)."""
    parts = []
    for side in SIDES:
        a, b = _lane_cols(side)
        parts.append(
            f"SELECT '{side}' AS side, t.{a} AS d, t.{b} AS s, count(*) AS n FROM {_table(side)} t "
            f"WHERE t.trace_id = $trace AND {_kinds(side)} AND t.end_ns > $t0 AND t.start_ns < $t1 "
            "GROUP BY ALL"
        )
    params = {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns}
    return job.con.execute(" UNION ALL ".join(parts), params).fetchdf()


def timeline_window(
    job: JobData,
    trace_ids: str | list[str],
    window: Window,
    *,
    bins: int = 600,
    max_items_per_lane: int = 2000,
) -> pd.DataFrame:
    """The drawable items of some traces (ranks) in ``window``, all on one time axis.

    Columns (:data:`COLUMNS`): trace_id, rank, side (gpu/host/annotation), lane
    (``rank R · GPU d · stream s``, host lanes nested per depth), key (events; '' for
    bins), start_ns, end_ns, name, kind (``bin`` for bins), category (of
    :data:`CATEGORIES`; for a bin the one that fills most of it), busy (share 0..1
    for bins, 1 for events), count (events in the item), d, s, correlation,
    external_id, grid and block (``"x×y×z"`` text, kernels), bytes (copies, memsets).
    """
    frames = []
    bin_ns = max(1, (window.end_ns - window.start_ns) // bins)
    for trace_id in _ids(trace_ids):
        rank = rank_of(job, trace_id)
        lanes = lanes_in_window(job, trace_id, window)
        for side in SIDES:
            rows = lanes[lanes.side == side]
            raw = [(int(r.d), int(r.s)) for r in rows.itertuples() if r.n <= max_items_per_lane]
            dense = [(int(r.d), int(r.s)) for r in rows.itertuples() if r.n > max_items_per_lane]
            if raw:
                events = _raw_events(job, side, trace_id, rank, window, raw)
                frames.append(events if side == "gpu" else nest_lanes(events))
            if dense:
                frames.append(_binned(job, side, trace_id, rank, window, dense, bin_ns))
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def lane_order(frame: pd.DataFrame) -> list[str]:
    """Lanes top to bottom: per rank, its GPU streams (device, stream), then its host threads,
    each thread's operators before its ranges, sub-lanes after their lane."""
    if frame.empty:
        return []
    lanes = frame[["lane", "rank", "side", "d", "s"]].drop_duplicates("lane")
    order = lanes.assign(
        side_rank=lanes["side"].map(SIDE_ORDER),
        host_side=lanes["side"].map(lambda s: 0 if s == "gpu" else 1),
    )
    order = order.sort_values(["rank", "host_side", "d", "s", "side_rank", "lane"])
    return order["lane"].tolist()


def _lane_filter(side: str, lanes: list[tuple[int, int]]) -> str:
    a, b = _lane_cols(side)
    return "(" + " OR ".join(f"(t.{a} = {int(x)} AND t.{b} = {int(y)})" for x, y in lanes) + ")"


def _detail_cols(side: str) -> str:
    if side == "gpu":
        return (
            "t.correlation, t.external_id, "
            "CASE WHEN t.grid_x IS NULL THEN NULL ELSE t.grid_x || '×' || t.grid_y || '×' || t.grid_z END AS grid, "
            "CASE WHEN t.block_x IS NULL THEN NULL ELSE t.block_x || '×' || t.block_y || '×' || t.block_z END AS block, "
            "t.bytes"
        )
    return "t.correlation, t.external_id, NULL::VARCHAR AS grid, NULL::VARCHAR AS block, NULL::BIGINT AS bytes"


def _raw_events(
    job: JobData, side: str, trace_id: str, rank: int, window: Window, lanes
) -> pd.DataFrame:
    a, b = _lane_cols(side)
    category = GPU_CATEGORY_SQL if side == "gpu" else HOST_CATEGORY_SQL
    sql = f"""
        SELECT t.trace_id, {rank} AS rank, '{side}' AS side, {_lane_label(side, rank)} AS lane,
               {_key_sql(side)} AS key, t.start_ns, t.end_ns, n.name, t.kind, {category} AS category,
               1.0 AS busy, 1 AS count, t.{a} AS d, t.{b} AS s, {_detail_cols(side)}
        FROM {_table(side)} t JOIN names n ON n.trace_id = t.trace_id AND n.name_id = t.name_id
        WHERE t.trace_id = $trace AND {_kinds(side)} AND t.end_ns > $t0 AND t.start_ns < $t1
          AND {_lane_filter(side, lanes)}
        ORDER BY lane, t.start_ns, t.end_ns DESC"""
    return job.con.execute(
        sql, {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns}
    ).fetchdf()


def _binned(
    job: JobData, side: str, trace_id: str, rank: int, window: Window, lanes, bin_ns: int
) -> pd.DataFrame:
    """Busy share per bin (each event's overlap with every bin it covers, clipped to the
    window) and the category with the most time in the bin."""
    a, b = _lane_cols(side)
    category = {"gpu": GPU_CATEGORY_SQL, "host": "t.kind"}.get(side, HOST_CATEGORY_SQL)
    names = (  # only a range's category (step or not) needs its name
        "JOIN names n ON n.trace_id = t.trace_id AND n.name_id = t.name_id"
        if side == "annotation"
        else ""
    )
    sql = f"""
        WITH ev AS (
          SELECT {_lane_label(side, rank)} AS lane, t.{a} AS d, t.{b} AS s, {category} AS category,
                 greatest(t.start_ns, $t0) AS es, least(t.end_ns, $t1) AS ee
          FROM {_table(side)} t {names}
          WHERE t.trace_id = $trace AND {_kinds(side)} AND t.end_ns > $t0 AND t.start_ns < $t1
            AND {_lane_filter(side, lanes)}
        ), spans AS (
          SELECT *, CAST((es - $t0) // $bin AS BIGINT) AS b0, CAST((ee - 1 - $t0) // $bin AS BIGINT) AS b1
          FROM ev
        ), pieces AS (  -- most events sit in one bin: only the others go through range()
          SELECT lane, d, s, category, b0 AS bn, ee - es AS piece FROM spans WHERE b0 = b1
          UNION ALL
          SELECT lane, d, s, category, bn,
                 least(ee, $t0 + (bn + 1) * $bin) - greatest(es, $t0 + bn * $bin) AS piece
          FROM (SELECT * FROM spans WHERE b1 > b0), range(b0, b1 + 1) r(bn)
        )
        SELECT $trace AS trace_id, {rank} AS rank, '{side}' AS side, lane, '' AS key,
               $t0 + bn * $bin AS start_ns, $t0 + (bn + 1) * $bin AS end_ns,
               count(*) || ' events' AS name, 'bin' AS kind, arg_max(category, piece) AS category,
               least(1.0, sum(piece) / $bin) AS busy, count(*) AS count, any_value(d) AS d,
               any_value(s) AS s, NULL::BIGINT AS correlation, NULL::BIGINT AS external_id,
               NULL::VARCHAR AS grid, NULL::VARCHAR AS block, NULL::BIGINT AS bytes
        FROM pieces GROUP BY lane, bn ORDER BY lane, bn"""
    params = {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns, "bin": bin_ns}
    return job.con.execute(sql, params).fetchdf()


def slice_labels(
    frame: pd.DataFrame,
    window: Window,
    *,
    plot_px: int = 1200,
    min_px: float = 40.0,
    char_px: float = 6.5,
) -> pd.Series:
    """The text drawn inside each slice: the short name (kernels through
    :func:`stallscope.humanize.short_kernel_names`), cut to what fits, for events at least
    ``min_px`` wide when the window spans ``plot_px`` pixels; '' for narrower slices and bins."""
    from stallscope.humanize import short_kernel_names

    labels = pd.Series("", index=frame.index, dtype=object)
    if frame.empty or window.end_ns <= window.start_ns:
        return labels
    shown = frame["start_ns"].clip(lower=window.start_ns)
    ends = frame["end_ns"].clip(upper=window.end_ns)
    px = (ends - shown) / (window.end_ns - window.start_ns) * plot_px
    wide = (px >= min_px) & (frame["kind"] != "bin")
    if not wide.any():
        return labels
    names = frame.loc[wide, "name"].astype(str)
    kernels = frame.loc[wide, "side"] == "gpu"
    unique = sorted(set(names[kernels]))
    short = dict(zip(unique, short_kernel_names(unique), strict=True))
    text = names.where(~kernels, names.map(short))
    fits = (px[wide] / char_px).astype(int).clip(lower=1)
    labels[wide] = [
        t if len(t) <= n else t[: max(n - 1, 1)] + "…" for t, n in zip(text, fits, strict=True)
    ]
    return labels


def window_around(start_ns: int, end_ns: int, bounds: Window, *, share: float = 0.2) -> Window:
    """A window in which the event ``[start, end)`` takes about ``share`` of the width
    (at least 20 µs wide), centred on it and kept inside ``bounds`` where it fits."""
    dur = max(end_ns - start_ns, 1)
    width = max(int(dur / share), 20_000)
    mid = (start_ns + end_ns) // 2
    lo, hi = mid - width // 2, mid - width // 2 + width
    if lo < bounds.start_ns:
        lo, hi = bounds.start_ns, bounds.start_ns + width
    if hi > bounds.end_ns:
        lo, hi = max(bounds.start_ns, bounds.end_ns - width), bounds.end_ns
    return Window(int(lo), int(hi))


def search_events(
    job: JobData,
    trace_ids: list[str],
    text: str,
    window: Window | None = None,
    *,
    limit: int = 50,
) -> tuple[pd.DataFrame, int]:
    """Events whose name contains ``text`` (case-insensitive), in ``window`` when given, else
    anywhere in the traces: (the first ``limit`` by start time, the number of matches).

    Columns: key, trace_id, rank, side, lane (the lane without its depth), name, category,
    start_ns, end_ns."""
    columns = ["key", "trace_id", "rank", "side", "lane", "name", "category", "start_ns", "end_ns"]
    needle = text.strip().lower()
    if not needle:
        return pd.DataFrame(columns=columns), 0
    frames, total = [], 0
    for trace_id in trace_ids:
        rank = rank_of(job, trace_id)
        for side in SIDES:
            category = GPU_CATEGORY_SQL if side == "gpu" else HOST_CATEGORY_SQL
            when = "" if window is None else "AND t.end_ns > $t0 AND t.start_ns < $t1"
            base = f"""
                FROM {_table(side)} t JOIN names n ON n.trace_id = t.trace_id AND n.name_id = t.name_id
                WHERE t.trace_id = $trace AND {_kinds(side)} AND strpos(lower(n.name), $q) > 0 {when}"""
            params = {"trace": trace_id, "q": needle}
            if window is not None:
                params |= {"t0": window.start_ns, "t1": window.end_ns}
            total += job.con.execute("SELECT count(*) " + base, params).fetchone()[0]
            frames.append(
                job.con.execute(
                    f"""SELECT {_key_sql(side)} AS key, t.trace_id, {rank} AS rank, '{side}' AS side,
                        {_lane_label(side, rank)} AS lane, n.name, {category} AS category,
                        t.start_ns, t.end_ns {base} ORDER BY t.start_ns LIMIT {int(limit)}""",
                    params,
                ).fetchdf()
            )
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=columns), total
    found = pd.concat(frames, ignore_index=True).sort_values(["start_ns", "rank", "lane"])
    return found.head(limit).reset_index(drop=True)[columns], int(total)


def find_event(job: JobData, key: str) -> dict | None:
    """The event of a key with its details (the frame's columns plus registers and shared
    memory for kernels, copy kind), or None when no such event is stored."""
    parsed = parse_key(key)
    if parsed is None or parsed[0] not in {r.trace_id for r in job.traces}:
        return None
    trace_id, side, d, s, start = parsed
    rank = rank_of(job, trace_id)
    a, b = _lane_cols(side)
    category = GPU_CATEGORY_SQL if side == "gpu" else HOST_CATEGORY_SQL
    extra = (
        "t.registers_per_thread, t.shared_mem_bytes, t.copy_kind, t.stream"
        if side == "gpu"
        else "NULL AS registers_per_thread, NULL AS shared_mem_bytes, NULL AS copy_kind, NULL AS stream"
    )
    sql = f"""
        SELECT t.trace_id, {rank} AS rank, '{side}' AS side, {_lane_label(side, rank)} AS lane,
               {_key_sql(side)} AS key, t.start_ns, t.end_ns, n.name, t.kind, {category} AS category,
               t.{a} AS d, t.{b} AS s, {_detail_cols(side)}, {extra}
        FROM {_table(side)} t JOIN names n ON n.trace_id = t.trace_id AND n.name_id = t.name_id
        WHERE t.trace_id = $trace AND {_kinds(side)} AND t.{a} = $d AND t.{b} = $s AND t.start_ns = $start
        ORDER BY t.end_ns DESC LIMIT 1"""
    rows = job.con.execute(sql, {"trace": trace_id, "d": d, "s": s, "start": start}).fetchdf()
    return None if rows.empty else rows.iloc[0].to_dict()


FLOW_COLUMNS = [
    "trace_id", "rank", "launch_key", "launch_name", "launch_start_ns", "launch_end_ns",
    "gpu_key", "gpu_name", "gpu_start_ns", "gpu_end_ns",
]  # fmt: skip


def launch_flows(job: JobData, key: str, *, limit: int = 200) -> pd.DataFrame:
    """Launch -> GPU activity pairs of one event (columns :data:`FLOW_COLUMNS`).

    A kernel, copy or memset: the runtime/driver call that launched it (same
    ``correlation``). A runtime/driver call: the GPU activities it launched. An operator
    or range: every launch made on its thread while it ran, and what each launched.
    Empty when the trace records no such link (no correlation ids)."""
    event = find_event(job, key)
    if event is None:
        return pd.DataFrame(columns=FLOW_COLUMNS)
    trace_id, rank = event["trace_id"], int(event["rank"])
    if event["side"] == "gpu" or event["kind"] in ("runtime", "driver"):
        if pd.isna(event["correlation"]):
            return pd.DataFrame(columns=FLOW_COLUMNS)
        match = "h.correlation = $corr"
        params = {"corr": int(event["correlation"])}
    else:
        match = "h.pid = $pid AND h.tid = $tid AND h.start_ns >= $s0 AND h.start_ns < $s1"
        params = {
            "pid": int(event["d"]), "tid": int(event["s"]),
            "s0": int(event["start_ns"]), "s1": int(event["end_ns"]),
        }  # fmt: skip
    sql = f"""
        SELECT h.trace_id, {rank} AS rank,
               h.trace_id || '|host|' || h.pid || '|' || h.tid || '|' || h.start_ns AS launch_key,
               hn.name AS launch_name, h.start_ns AS launch_start_ns, h.end_ns AS launch_end_ns,
               g.trace_id || '|gpu|' || g.device || '|' || g.stream || '|' || g.start_ns AS gpu_key,
               gn.name AS gpu_name, g.start_ns AS gpu_start_ns, g.end_ns AS gpu_end_ns
        FROM host h
        JOIN gpu g ON g.trace_id = h.trace_id AND g.correlation = h.correlation AND g.kind <> 'sync'
        JOIN names hn ON hn.trace_id = h.trace_id AND hn.name_id = h.name_id
        JOIN names gn ON gn.trace_id = g.trace_id AND gn.name_id = g.name_id
        WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver') AND h.correlation IS NOT NULL
          AND {match}
        ORDER BY h.start_ns, g.start_ns LIMIT {int(limit)}"""
    return job.con.execute(sql, {"trace": trace_id, **params}).fetchdf()[FLOW_COLUMNS]
