"""Time the timeline's server side on a 1M-event trace: query, labels, figure, JSON.

    python benchmarks/bench_timeline.py [TRACE.json] [--runs 3] [--store DIR]

The trace defaults to ``benchmarks/data/df_index_resolver_x5.json`` (5 copies
of the corpus trace ``hta/df_index_resolver`` by ``make_big_trace.py``:
269.6 MB, 1,080,270 events), made if missing. It is ingested once into a
temporary store (or ``--store``, reused when it already holds it); then, for
four windows (the whole trace, the steps the page opens on, 10 ms, 1 ms),
each step the timeline page runs is timed on a fresh ``JobData``, best of
``--runs``: ``timeline_window`` (DuckDB: raw events for sparse lanes,
busy-share bins for lanes with more than 2,000 events), ``lane_order`` and
``slice_labels``, ``timeline_figure``, and ``plotly.io.to_json`` (what
``st.plotly_chart`` sends). Also reported: shapes in the frame, points sent
(x values over all traces, NaN separators included) and JSON bytes.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATA = REPO / "benchmarks" / "data"
SRC = REPO.parent / "shared" / "corpus" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"


def make_trace(path: Path) -> None:
    base = DATA / "df_index_resolver.json"
    if not base.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        with gzip.open(SRC, "rb") as src, open(base, "wb") as dst:
            shutil.copyfileobj(src, dst)
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "make_big_trace.py"), str(base), str(path),
         "--copies", "5"], check=True,
    )  # fmt: skip


def best(fn, runs: int):
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DATA / "df_index_resolver_x5.json")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", type=Path)
    args = parser.parse_args()
    if not args.trace.is_file():
        make_trace(args.trace)
    import plotly.io as pio

    from stallscope.charts import timeline_figure
    from stallscope.ingest import ingest_paths
    from stallscope.jobdata import JobData
    from stallscope.store import Store
    from stallscope.timeline import (
        Window,
        default_window,
        lane_order,
        slice_labels,
        timeline_window,
        trace_bounds,
    )  # fmt: skip

    store = Store(args.store or Path(tempfile.mkdtemp(prefix="stallscope-bench-tl-")) / "s")
    store.ensure()
    t = time.perf_counter()
    (res,) = ingest_paths(store, [str(args.trace)])
    refs = store.traces(res.job_id)
    events = sum(r.meta.get("event_count", 0) for r in refs)
    print(f"ingest {time.perf_counter() - t:.1f} s; {events:,} events")
    ids = [r.trace_id for r in refs]
    with _closing(JobData(store, refs)) as job:
        whole, steps = trace_bounds(job, ids), default_window(job, ids)
    mid = (steps.start_ns + steps.end_ns) // 2
    windows = {
        "whole trace": whole,
        "steps (opens on)": steps,
        "10 ms": Window(mid, mid + 10_000_000),
        "1 ms": Window(mid, mid + 1_000_000),
    }
    print(
        "| window | ms | shapes (bins) | query s | labels s | figure s | JSON s | points sent | JSON MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, w in windows.items():

        def query(w=w):
            job = JobData(store, refs)
            try:
                return timeline_window(job, ids, w)
            finally:
                job.close()

        q, frame = best(query, args.runs)
        lb, (lanes, labels) = best(
            lambda frame=frame, w=w: (lane_order(frame), slice_labels(frame, w, plot_px=850)),
            args.runs,
        )
        fg, fig = best(
            lambda frame=frame, w=w, lanes=lanes, labels=labels: timeline_figure(
                frame, (w.start_ns, w.end_ns), [], lanes=lanes, labels=labels
            ),
            args.runs,
        )
        js, text = best(lambda fig=fig: pio.to_json(fig, validate=False), args.runs)
        points = sum(len(d.x) for d in fig.data if d.x is not None)
        bins = int((frame["kind"] == "bin").sum())
        print(
            f"| {name} | {(w.end_ns - w.start_ns) / 1e6:,.1f} | {len(frame):,} ({bins:,}) | "
            f"{q:.3f} | {lb:.3f} | {fg:.3f} | {js:.3f} | {points:,} | {len(text) / 1e6:.2f} |"
        )


class _closing:
    def __init__(self, job):
        self.job = job

    def __enter__(self):
        return self.job

    def __exit__(self, *exc):
        self.job.close()


if __name__ == "__main__":
    main()
