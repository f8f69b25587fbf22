#!/usr/bin/env python3
"""Issue 18: fit and check the host-work model of stallscope/launch_cost.py on paired captures.

    .venv/bin/python tools/capture/fit_host_work.py DIR [--held NAME=TRACE:SAVING_PER_STEP_NS ...]

DIR holds what tools/capture/launch_pairs.py wrote: ``pairs.json`` and the traces
``<loop>_<shapes|noshapes>.pt.trace.json.gz`` (kept out of git; the truths are in
sample_traces/logs/launch_pairs_2026-12-02.json). For every trace it reads the launching
threads' recorded work over the idle span (:func:`stallscope.launch_cost.host_work`) and
fits ``WORK_OP_NS``, ``WORK_LAUNCH_NS``, ``WORK_OTHER_NS`` by least squares to the
unprofiled eager step (x the trace's steps) of the host-bound loops (``FIT_LOOPS``).
It then prints, for every trace, the saving of :func:`graph_saving` with the fitted
constants against the measured one (3 x (eager - graph step)): leave-one-loop-out for the
fitted loops (both captures of a loop left out together), plain for the others and for
the held-out traces named with ``--held``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np

FIT_LOOPS = ("muladd_256", "add_1m", "linear_16", "decode_big", "train_small")


def features(path: str) -> dict:
    """The trace's recorded work, its step count and what graph_saving needs, via stallscope."""
    from stallscope import launch_cost as lc
    from stallscope.idle import attribute_idle
    from stallscope.ingest import ingest_paths
    from stallscope.jobdata import JobData
    from stallscope.store import Store

    store = Store(tempfile.mkdtemp() + "/s").ensure()
    (res,) = ingest_paths(store, [path])
    job = JobData(store, store.traces(res.job_id))
    ref = job.traces[0]
    steps = job.sql(
        "SELECT count(*) FROM ranges WHERE trace_id = ? AND kind = 'step'", [ref.trace_id]
    ).fetchone()[0]
    device = int(job.devices(ref.trace_id)[0])
    attribution = attribute_idle(job, ref.trace_id, device)
    host = lc._host_events(job, ref.trace_id, attribution.threads)
    work = lc.host_work(host, attribution.span_start, attribution.span_end)
    return {"job": job, "trace": ref.trace_id, "device": device, "a": attribution,
            "steps": int(steps), "work": work}  # fmt: skip


def saving(f: dict, coef) -> int:
    from stallscope import launch_cost as lc

    lc.WORK_OP_NS, lc.WORK_LAUNCH_NS, lc.WORK_OTHER_NS = (int(round(c)) for c in coef)
    g = lc.graph_saving(f["job"], f["trace"], f["device"], f["a"], f["steps"], replay_ns=10_000)
    return g.saving_ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--held", nargs="*", default=[], help="NAME=TRACE:SAVING_PER_STEP_NS")
    args = ap.parse_args()
    with open(os.path.join(args.dir, "pairs.json")) as fh:
        pairs = json.load(fh)
    rows = {}
    for loop, truth in pairs.items():
        if loop == "env":
            continue
        for setting in ("shapes", "noshapes"):
            path = os.path.join(args.dir, f"{loop}_{setting}.pt.trace.json.gz")
            f = features(path)
            f.update(loop=loop, eager=truth["eager_ns"], per_step=truth["saving_per_step_ns"])
            rows[f"{loop}_{setting}"] = f
            print(f"read {loop}_{setting}", file=sys.stderr, flush=True)
    held = {}
    for spec in args.held:
        name, rest = spec.split("=", 1)
        path, per_step = rest.rsplit(":", 1)
        f = features(path)
        f.update(loop=name, per_step=int(per_step))
        held[name] = f
    fit = [n for n, f in rows.items() if f["loop"] in FIT_LOOPS]

    def solve(names):
        a = np.array(
            [[rows[n]["work"].ops, rows[n]["work"].launches, rows[n]["work"].other] for n in names],
            float,
        )
        y = np.array([rows[n]["eager"] * rows[n]["steps"] for n in names], float)
        return np.linalg.lstsq(a, y, rcond=None)[0]  # fmt: skip

    coef = solve(fit)
    print("fitted ns per operator, launch call, other API call:", [int(round(c)) for c in coef])
    errors = []
    for name, f in list(rows.items()) + list(held.items()):
        loo = f["loop"] in FIT_LOOPS and name in rows
        c = solve([n for n in fit if rows[n]["loop"] != f["loop"]]) if loo else coef
        est, truth = saving(f, c), f["per_step"] * f["steps"]
        shipped = saving(f, coef) if loo else est
        err = 100 * (est / truth - 1)
        tag = "leave-one-loop-out" if loo else ("held-out" if name in held else "not fitted")
        errors.append(abs(err))
        w = f["work"]
        print(
            f"{name:22s} busy {w.busy_ns / 1e6:6.1f} ms work {w.work_ns / 1e6:6.1f} ms "
            f"saving {est / 1e6:6.2f} ms ({err:+.0f} %, {tag}; fitted {shipped / 1e6:6.2f} ms, "
            f"{100 * (shipped / truth - 1):+.0f} %) measured {truth / 1e6:6.2f} ms"
        )
    print(f"median |error| {statistics.median(errors):.0f} %")


if __name__ == "__main__":
    main()
