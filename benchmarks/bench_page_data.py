"""Each dashboard page's data for one job, timed without a browser or Streamlit (issue 15).

    python benchmarks/bench_page_data.py STORE [JOB] [--pages overview,distributed] [--json FILE]

Issue 15's target: any dashboard page of a 1,024-rank job <= 2 s after its report exists
(the job ``bench_crossrank.py --keep DIR`` builds, analyzed once). Each page runs in its own
fresh process, as a page's first visit to a fresh server finds nothing cached: its modules
are imported first (not counted: a running server has them), then timed, wall and CPU:

* ``traces``: the job's catalog rows (``Store.traces``, every rank's ``meta.json``);
* ``report``: the stored report found and read (its key, then ``report_store.load``: bytes,
  hash, JSON decode);
* ``data``: what the page computes from the report and the store before drawing, with the
  core functions the page calls (``stallscope.views``, ``charts``, ``rank_charts``,
  ``timeline``, ``compare``): its tables, the wait matrix, the timeline window of the ranks
  it opens with, the comparison; its plotly figures built (skipped, and said so, where
  plotly is not installed).

What is not counted: Streamlit's script run, sending the page and the browser drawing it
(``bench_pages.py`` times those, end to end, in Chromium). Compare compares the job with
itself. The printed table is also written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PAGES = ("overview", "kernels", "distributed", "timeline", "occupancy", "compare")


def _figures() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def _overview(store, job_id, refs, report) -> dict:
    from stallscope.compare_inference import inference_summary
    from stallscope.finding_groups import spread_text
    from stallscope.report_store import step_time_ms
    from stallscope.views import grouped_findings

    inference_summary(report)
    step_time_ms(report)
    groups = grouped_findings(report["findings"])
    texts = [spread_text(g) for g in groups if len(g) > 1]
    out = {"finding_groups": len(groups), "spread_texts": len(texts)}
    if _figures():
        from stallscope.charts import (
            device_time_table,
            step_rows,
            step_stack_figure,
            time_by_cause_figure,
        )

        out["gpus"] = len(device_time_table(report))
        time_by_cause_figure(report)
        rows = step_rows(report)
        if not rows.empty:
            keys = rows.groupby(["rank", "device"])["step_ms"].median().sort_values()
            rank, device = keys.index[-1]
            one = rows[(rows["rank"] == rank) & (rows["device"] == device)].sort_values("step")
            step_stack_figure(one)
    return out


def _kernels(store, job_id, refs, report) -> dict:
    import pandas as pd

    from stallscope.humanize import records_table, short_kernel_names
    from stallscope.views import findings_of, table_of, table_places

    places = table_places(report, "kernel_categories") or table_places(report, "kernels")
    if not places:
        return {"places": 0}
    trace, _, device = places[0]
    [f for f in findings_of(report, "hotspots") if (f["trace"], f["device"]) == (trace, device)]
    categories = pd.DataFrame(table_of(report, "kernel_categories", trace, device))
    kernels = pd.DataFrame(table_of(report, "kernels", trace, device))
    if not kernels.empty:
        short_kernel_names(list(kernels["name"]))
    ops = pd.DataFrame(table_of(report, "operators", trace, device))
    if not ops.empty:
        records_table(ops.to_dict("records"))
    if _figures() and not categories.empty:
        import plotly.express as px

        categories["ms"] = categories["gpu_ns"] / 1e6
        px.bar(categories, x="ms", y="category", orientation="h", height=260, text="pct")
    return {"places": len(places)}


def _distributed(store, job_id, refs, report) -> dict:
    import pandas as pd

    from stallscope.humanize import records_table
    from stallscope.jobdata import JobData
    from stallscope.views import findings_of, grouped_findings, table_of, table_places, wait_matrix

    try:
        from stallscope.views import overlap_rows
    except ImportError:  # the code before 2026-12-02 (the same rows, built in the page)
        overlap_rows = _overlap_rows

    waiting = [f for f in findings_of(report, "nccl_wait") if f["severity"] != "info"]
    groups = grouped_findings(waiting)
    {(r["trace"], r["device"]): r["straggler_rank"] for r in table_of(report, "rank_waits")}
    overlap = overlap_rows(report)
    per_rank = overlap.groupby("rank", as_index=False)["waiting ms"].sum()
    try:
        job = JobData(store, store.traces(job_id), tables=("collectives",))  # as the page does
    except TypeError:  # the code before 2026-12-02: every table's view
        job = JobData(store, store.traces(job_id))
    try:
        waits = wait_matrix(job)
    finally:
        job.close()
    for trace, _, device in table_places(report, "collective_ops"):
        records_table(table_of(report, "collective_ops", trace, device))
    paths = [
        table_of(report, "critical_path", t, d) for t, _, d in table_places(report, "critical_path")
    ]
    if _figures():
        from stallscope.charts import critical_path_figure
        from stallscope.rank_charts import wait_distribution_figure, wait_heatmap

        wait_distribution_figure(per_rank.rename(columns={"waiting ms": "waiting_ms"}), None)
        if not waits.empty:
            wait_heatmap(waits)
        for steps in paths:
            if steps and steps[0]["segments"]:
                critical_path_figure(pd.DataFrame(steps[0]["segments"]))
    return {"waiting_groups": len(groups), "overlap_rows": len(overlap), "wait_rows": len(waits)}


def _overlap_rows(report):
    import pandas as pd

    from stallscope.views import table_of

    rows = [
        {"rank": r["rank"], "GPU": r["device"], "comm ms": r["comm_ns"] / 1e6,
         "hidden %": r["comm_overlap_pct"], "exposed ms": r["exposed_comm_ns"] / 1e6,
         "waiting ms": r["exposed_wait_ns"] / 1e6}
        for r in table_of(report, "comm_overlap")
    ]  # fmt: skip
    columns = ["rank", "GPU", "comm ms", "hidden %", "exposed ms", "waiting ms"]
    return pd.DataFrame(rows, columns=columns).sort_values(["rank", "GPU"]).round(2)


def _timeline(store, job_id, refs, report) -> dict:
    from stallscope.jobdata import JobData
    from stallscope.timeline import (
        default_ranks,
        default_window,
        first_step_starts,
        timeline_window,
        trace_bounds,
    )

    findings = [f for f in report["findings"] if f["severity"] != "info" and f["windows"]]
    by_rank = {int(r.meta.get("rank") or 0): r for r in refs}
    worst_first = sorted(findings, key=lambda f: -(f.get("impact_ns") or 0))
    ranks = default_ranks(list(by_rank), [int(f["rank"]) for f in worst_first])
    ids = [by_rank[r].trace_id for r in ranks]
    job = JobData(store, [r for r in store.traces(job_id) if r.trace_id in set(ids)])
    try:
        trace_bounds(job, ids)
        window = default_window(job, ids)
        first_step_starts(job, ids)
        frame = timeline_window(job, ids, window)
    finally:
        job.close()
    if _figures():
        from stallscope.charts import timeline_figure
        from stallscope.timeline import Window, lane_order, slice_labels

        shown = [
            {"id": f["id"], "title": f["title"], "windows": f["windows"], "rank": f["rank"]}
            for f in findings
            if f["trace"] in set(ids)
        ]
        span = (window.start_ns, window.end_ns)
        labels = slice_labels(frame, Window(*span), plot_px=850)
        timeline_figure(frame, span, shown, lanes=lane_order(frame), labels=labels)
    return {"ranks_shown": len(ranks), "slices": len(frame)}


def _occupancy(store, job_id, refs, report) -> dict:
    import pandas as pd

    from stallscope.views import findings_of, table_of

    tables = findings_of(report, "occupancy", key="table")
    for f in tables:
        pd.DataFrame(table_of(report, "occupancy", f["trace"], f["device"]))
    return {"tables": len(tables)}


def _compare(store, job_id, refs, report) -> dict:
    from stallscope.compare import compare_jobs, compare_tables

    result = compare_jobs(store, refs, store.traces(job_id), top=25, reports=(report, report))
    return {"tables": len(compare_tables(result, width=120))}


def child(page: str, store_path: str, job_id: str) -> dict:
    """One page's timings in this (fresh) process."""
    from stallscope import report_store
    from stallscope.store import Store

    work = {"overview": _overview, "kernels": _kernels, "distributed": _distributed,
            "timeline": _timeline, "occupancy": _occupancy, "compare": _compare}[page]  # fmt: skip
    _import_page_modules()
    out: dict = {"page": page, "figures": _figures()}
    store = Store(store_path)
    t, c = time.perf_counter(), time.process_time()
    refs = store.traces(job_id)
    out["traces_s"], out["traces_cpu_s"] = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    report = report_store.load(store, job_id, report_store.report_key([r.trace_id for r in refs]))
    out["report_s"], out["report_cpu_s"] = time.perf_counter() - t, time.process_time() - c
    if report is None:
        raise SystemExit(f"no stored report of job {job_id} for this code: analyze it first")
    t, c = time.perf_counter(), time.process_time()
    out.update(work(store, job_id, refs, report))
    out["data_s"], out["data_cpu_s"] = time.perf_counter() - t, time.process_time() - c
    out["total_s"] = out["traces_s"] + out["report_s"] + out["data_s"]
    return out


def _import_page_modules() -> None:
    """What a running server has imported before a page's first visit."""
    import duckdb  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    import stallscope.analyzers  # noqa: F401 (the report's key names every analyzer's settings)
    import stallscope.collectives  # noqa: F401
    import stallscope.compare  # noqa: F401
    import stallscope.humanize  # noqa: F401
    import stallscope.jobdata  # noqa: F401
    import stallscope.report_store  # noqa: F401
    import stallscope.timeline  # noqa: F401
    import stallscope.views  # noqa: F401
    from stallscope.report_store import code_fingerprint

    code_fingerprint()  # hashed once per process
    from stallscope.analyzers import all_specs

    all_specs()  # (imports each analyzer module: the report's key holds their settings)
    if _figures():  # plotly loads each trace type's validators at its first figure
        import plotly.express  # noqa: F401
        import plotly.graph_objects as go

        fig = go.Figure()
        for kind in ("heatmap", "histogram", "bar", "scatter", "scattergl"):
            getattr(fig, f"add_{kind}")()
        fig.update_layout(height=100).add_vline(x=0).to_plotly_json()

        import stallscope.charts  # noqa: F401
        import stallscope.rank_charts  # noqa: F401


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store")
    parser.add_argument("job", nargs="?", help="default: the store's newest job")
    parser.add_argument("--pages", default=",".join(PAGES))
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--timeout", type=float, default=120, help="per page, s (default 120)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.store, args.job)))
        return 0
    from stallscope.store import Store

    job_id = args.job or Store(args.store).jobs()[0]["job_id"]
    print(f"store {args.store}, job {job_id} ({len(Store(args.store).traces(job_id))} traces); "
          f"{os.cpu_count()} CPUs, load " + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    rows = []
    for page in args.pages.split(","):
        try:
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), args.store, job_id, "--child", page],
                capture_output=True, text=True, check=False, timeout=args.timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"{page}: not done in {args.timeout:.0f} s", flush=True)
            rows.append({"page": page, "timed_out_s": args.timeout})
            continue
        if done.returncode:
            print(f"{page}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        "\n| page | traces s | report s | data s (CPU s) | total s | figures |\n|---|---:|---:|---:|---:|---|"
    )
    for r in rows:
        if "timed_out_s" in r:
            print(f"| {r['page']} | | | > {r['timed_out_s']:.0f} | > {r['timed_out_s']:.0f} | |")
            continue
        print(f"| {r['page']} | {r['traces_s']:.2f} | {r['report_s']:.2f} | {r['data_s']:.2f} "
              f"({r['data_cpu_s']:.2f}) | **{r['total_s']:.2f}** | {'yes' if r['figures'] else 'no'} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
