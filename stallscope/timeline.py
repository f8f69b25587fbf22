"""Server-side timeline data: what a browser can draw for any window of a trace.

:func:`timeline_window` returns, for one trace and a time window, one row per
drawable item. When a lane (a GPU stream or a host thread) has few events in
the window they come back as they are; when it has more than
``max_items_per_lane``, they are aggregated into ``bins`` equal time bins with
the busy share of each bin, so a million-event trace stays a few thousand
shapes. Times are int64 ns on the trace clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from stallscope.jobdata import JobData

LANES_SQL = """
SELECT 'gpu' AS side, 'GPU ' || device || ' · stream ' || stream AS lane, device AS d, stream AS s,
       count(*) AS n
FROM gpu WHERE trace_id = $trace AND kind <> 'sync' AND end_ns > $t0 AND start_ns < $t1 GROUP BY ALL
UNION ALL
SELECT 'host', 'host ' || pid || ' · thread ' || tid, pid, tid, count(*)
FROM host WHERE trace_id = $trace AND kind IN ('cpu_op', 'runtime', 'driver') AND end_ns > $t0 AND start_ns < $t1
GROUP BY ALL
UNION ALL
SELECT 'annotation', 'host ' || pid || ' · thread ' || tid || ' · ranges', pid, tid, count(*)
FROM host WHERE trace_id = $trace AND kind = 'annotation' AND end_ns > $t0 AND start_ns < $t1
GROUP BY ALL
"""


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int


MAX_DEPTH = 3  # nesting levels drawn apart; deeper ranges share the last sub-lane


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


def default_window(job: JobData, trace_id: str) -> Window:
    """What the timeline opens on: the steps when the trace has any, else the whole trace."""
    row = job.sql(
        "SELECT min(start_ns), max(end_ns) FROM ranges WHERE trace_id = ? AND kind = 'step'",
        [trace_id],
    ).fetchone()
    if row[0] is None:
        return trace_bounds(job, trace_id)
    return Window(int(row[0]), int(row[1]))


def trace_bounds(job: JobData, trace_id: str) -> Window:
    """First start and last end over the trace's GPU and host activities."""
    row = job.sql(
        "SELECT min(s), max(e) FROM (SELECT min(start_ns) s, max(end_ns) e FROM gpu WHERE trace_id = $1 "
        "UNION ALL SELECT min(start_ns), max(end_ns) FROM host WHERE trace_id = $1)",
        [trace_id],
    ).fetchone()
    return Window(int(row[0] or 0), int(row[1] or 0))


def timeline_window(
    job: JobData, trace_id: str, window: Window, *, bins: int = 600, max_items_per_lane: int = 2000
) -> pd.DataFrame:
    """Columns: side, lane, start_ns, end_ns, name, kind, busy (share 0..1 for bins, 1 for events), count."""
    params = {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns}
    lanes = job.con.execute(LANES_SQL, params).fetchdf()
    frames = []
    bin_ns = max(1, (window.end_ns - window.start_ns) // bins)
    for side in ("gpu", "host", "annotation"):
        rows = lanes[lanes.side == side]
        raw = [(int(r.d), int(r.s)) for r in rows.itertuples() if r.n <= max_items_per_lane]
        dense = [(int(r.d), int(r.s)) for r in rows.itertuples() if r.n > max_items_per_lane]
        if raw:
            events = _raw_events(job, side, trace_id, window, raw)
            frames.append(events if side == "gpu" else nest_lanes(events))
        if dense:
            frames.append(_binned(job, side, trace_id, window, dense, bin_ns))
    if not frames:
        return pd.DataFrame(
            columns=["side", "lane", "start_ns", "end_ns", "name", "kind", "busy", "count"]
        )
    return pd.concat(frames, ignore_index=True)


def _lane_filter(side: str, lanes: list[tuple[int, int]]) -> str:
    a, b = ("device", "stream") if side == "gpu" else ("pid", "tid")
    return "(" + " OR ".join(f"({a} = {int(x)} AND {b} = {int(y)})" for x, y in lanes) + ")"


def _lane_label(side: str) -> str:
    if side == "gpu":
        return "'GPU ' || device || ' · stream ' || stream"
    suffix = " || ' · ranges'" if side == "annotation" else ""
    return "'host ' || pid || ' · thread ' || tid" + suffix


def _table(side: str) -> str:
    return "gpu" if side == "gpu" else "host"


def _kinds(side: str) -> str:
    if side == "gpu":
        return "kind <> 'sync'"
    return (
        "kind = 'annotation'" if side == "annotation" else "kind IN ('cpu_op', 'runtime', 'driver')"
    )


def _raw_events(job: JobData, side: str, trace_id: str, window: Window, lanes) -> pd.DataFrame:
    sql = f"""
        SELECT '{side}' AS side, {_lane_label(side)} AS lane, t.start_ns, t.end_ns, n.name, t.kind,
               1.0 AS busy, 1 AS count
        FROM {_table(side)} t JOIN names n ON n.trace_id = t.trace_id AND n.name_id = t.name_id
        WHERE t.trace_id = $trace AND {_kinds(side).replace("kind", "t.kind")} AND t.end_ns > $t0 AND t.start_ns < $t1
          AND {_lane_filter(side, lanes)}
        ORDER BY lane, t.start_ns"""
    return job.con.execute(
        sql, {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns}
    ).fetchdf()


def _binned(
    job: JobData, side: str, trace_id: str, window: Window, lanes, bin_ns: int
) -> pd.DataFrame:
    """Busy share per bin: each event's overlap with its (first) bin, clipped; long events span bins."""
    sql = f"""
        WITH ev AS (
          SELECT {_lane_label(side)} AS lane, greatest(start_ns, $t0) AS s, least(end_ns, $t1) AS e
          FROM {_table(side)} WHERE trace_id = $trace AND {_kinds(side)} AND end_ns > $t0 AND start_ns < $t1
            AND {_lane_filter(side, lanes)}
        ), pieces AS (
          SELECT lane, b, greatest(s, $t0 + b * $bin) AS ps, least(e, $t0 + (b + 1) * $bin) AS pe
          FROM ev, range(CAST((s - $t0) // $bin AS BIGINT), CAST((e - 1 - $t0) // $bin + 1 AS BIGINT)) r(b)
        )
        SELECT '{side}' AS side, lane, $t0 + b * $bin AS start_ns, $t0 + (b + 1) * $bin AS end_ns,
               count(*) || ' events' AS name, 'bin' AS kind,
               least(1.0, sum(pe - ps) / $bin) AS busy, count(*) AS count
        FROM pieces GROUP BY lane, b ORDER BY lane, b"""
    params = {"trace": trace_id, "t0": window.start_ns, "t1": window.end_ns, "bin": bin_ns}
    return job.con.execute(sql, params).fetchdf()
