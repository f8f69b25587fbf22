"""Compare two jobs (a baseline and a candidate): step time, time by cause, kernels.

:func:`compare_jobs` returns a plain dict (``stallscope.compare/1``, described
in docs/cli.md under ``stallscope compare``) with a verdict that accounts for
step-to-step noise:

* step time per job: the ``ProfilerStep#N`` / NVTX ``step N`` ranges; with
  several ranks, a step's time is its slowest rank's. Without steps, the one
  sample is the job's GPU span (first to last GPU activity; no noise estimate).
* ``delta`` = median(new) - median(base);
  ``noise`` = k × s_p × sqrt(1/n_base + 1/n_new), s_p the pooled step-to-step
  standard deviation (0 when either side has fewer than 2 steps);
* **regression** when ``delta > max_regression × median(base)`` and
  ``delta > noise``; **improvement** when ``-delta`` passes both; else
  **no significant change**.

Time by cause and per-kernel GPU time are per step (totals divided by the
step count) so that captures of different lengths compare.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stallscope import report_store
from stallscope.analyzers.base import SEVERITY_RANK
from stallscope.compare_inference import inference_deltas, inference_summary, inference_table
from stallscope.jobdata import JobData
from stallscope.rank_compare import IN_STEPS_SQL, stored_summaries
from stallscope.report_types import IDLE_CAUSES
from stallscope.store import Store, TraceRef
from stallscope.views import table_of

COMPARE_SCHEMA = "stallscope.compare/1"
DEFAULT_MAX_REGRESSION = 0.05
DEFAULT_NOISE_K = 2.0
CAUSES = (
    ("compute", "busy"), ("comm", "busy"), ("memcpy", "busy"),
    *((cause, "idle") for cause in IDLE_CAUSES),
)  # fmt: skip
# One GPU's step scope split into parts that do not overlap, all from report metrics:
# compute_pct x gpu_span_ns, exposed_comm_ns - exposed_comm_wait_ns, exposed_comm_wait_ns,
# exposed_memcpy_ns, idle_<cause>_ns (docs/compare.md).
PARTS = (
    ("compute", "compute"),
    ("exposed_comm", "exposed communication"),
    ("rank_wait", "waiting for other ranks"),
    ("exposed_copies", "exposed copies"),
    *((f"idle_{cause}", f"idle: {cause}") for cause in IDLE_CAUSES),
)
LEAD_SHARE = 0.25  # a category is named beside the largest when it moved this share of it
ACCOUNTED_SHARE = 0.5  # rows adding up to less than this share of the step change leave it open
REASON_SHARE = 0.25  # a gap this share of the step change is named as a reason


def step_samples(job: JobData) -> tuple[np.ndarray, str]:
    """Step durations (ns) of a job, slowest rank per step; else its GPU span."""
    rows = job.numpy(
        "SELECT step, max(end_ns - start_ns) AS dur FROM ranges WHERE kind = 'step' "
        "GROUP BY step ORDER BY step"
    )
    if rows["dur"].size:
        return rows["dur"].astype(np.int64), "steps"
    span = job.sql(
        "SELECT max(e - s) FROM (SELECT trace_id, min(start_ns) s, max(end_ns) e FROM gpu "
        "WHERE kind <> 'sync' GROUP BY trace_id)"
    ).fetchone()[0]
    return np.array([int(span or 0)], dtype=np.int64), "gpu_span"


def rank_step_means(job: JobData) -> dict[int, float]:
    """Rank -> mean duration (ns) of its step ranges (ranks without steps are left out)."""
    rows = job.sql(
        "SELECT trace_id, sum(end_ns - start_ns), count(*) FROM ranges WHERE kind = 'step' GROUP BY 1"
    ).fetchall()
    return _means_by_rank(rows, job.traces)


def _means_by_rank(rows: list[tuple], refs: list[TraceRef]) -> dict[int, float]:
    """Rank -> mean step (ns) from (trace, summed step ns, steps) rows."""
    rank_of = {ref.trace_id: int(ref.meta.get("rank", 0)) for ref in refs}
    totals: dict[int, list[int]] = {}
    for trace, total, count in sorted(rows):  # one order: the float mean is then one
        acc = totals.setdefault(rank_of.get(trace, 0), [0, 0])
        acc[0] += int(total)
        acc[1] += int(count)
    return {rank: total / count for rank, (total, count) in totals.items() if count}


def gpu_times(job: JobData) -> tuple[dict[str, tuple[int, int]], dict[tuple[str, str], list[int]]]:
    """Kernel name -> (GPU ns, launches) and copy (direction, host memory) -> [GPU ns, bytes,
    count], summed over the job's traces, over the operations launched inside a step (every
    operation of a trace without steps). GPU time is summed durations, not a union."""
    kernels: dict[str, tuple[int, int]] = {}
    copies: dict[tuple[str, str], list[int]] = {}
    job.con.execute(
        "CREATE OR REPLACE TEMP TABLE compare_ops AS " + IN_STEPS_SQL + "SELECT * FROM scoped"
    )
    for name, total, count in job.sql(
        "SELECT n.name, sum(end_ns - start_ns), count(*) FROM compare_ops o JOIN names n "
        "ON n.trace_id = o.trace_id AND n.name_id = o.name_id WHERE o.kind = 'kernel' "
        "GROUP BY 1 ORDER BY 1"
    ).fetchall():
        kernels[name] = (int(total), int(count))
    for kind, copy_kind, src, dst, total, nbytes, count in job.sql(
        "SELECT kind, copy_kind, src_kind, dst_kind, sum(end_ns - start_ns), sum(bytes), "
        "count(*) FROM compare_ops WHERE kind <> 'kernel' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
    ).fetchall():
        acc = copies.setdefault(copy_key(kind, copy_kind, src, dst), [0, 0, 0])
        acc[0] += int(total)
        acc[1] += int(nbytes)
        acc[2] += int(count)
    job.sql("DROP TABLE IF EXISTS compare_ops")
    return kernels, copies


def copy_key(kind: str, copy_kind: str, src: str, dst: str) -> tuple[str, str]:
    """(direction, host memory) of a copy: ('HtoD', 'pageable'), ('DtoD', ''), ('peer', ''),
    ('memset', '')... The host memory is the host side's kind (docs/schema.md)."""
    if kind == "memset":
        return "memset", ""
    direction = {"PtoP": "peer", "": "unknown"}.get(copy_kind, copy_kind)
    memory = {"HtoD": src, "DtoH": dst, "HtoH": f"{src} -> {dst}"}.get(copy_kind, "")
    return direction, memory


def device_values(report: dict[str, Any]) -> dict[tuple, dict[str, float]]:
    """(trace, device) -> {metric name: value} for the report's per-device metrics."""
    per_device: dict[tuple, dict[str, float]] = {}
    for m in report["metrics"]:
        if m["device"] is not None:
            per_device.setdefault((m["trace"], m["device"]), {})[m["name"]] = m["value"]
    return per_device


def cause_times(report: dict[str, Any]) -> dict[str, float]:
    """GPU ns by busy category and idle cause, summed over the report's GPUs."""
    out = {f"{side}:{name}": 0.0 for name, side in CAUSES}
    for values in device_values(report).values():
        span = values.get("gpu_span_ns") or 0
        for name, side in CAUSES:
            if side == "busy":
                out[f"busy:{name}"] += (values.get(f"{name}_pct") or 0) / 100 * span
            else:
                out[f"idle:{name}"] += values.get(f"idle_{name}_ns") or 0
    return out


def step_parts(report: dict[str, Any]) -> tuple[dict[str, float], int]:
    """GPU ns of each part of :data:`PARTS` plus ``scope`` (the summed ``gpu_span_ns``), summed
    over the GPUs with a span, and how many GPUs that is."""
    out = {key: 0.0 for key, _ in PARTS} | {"scope": 0.0}
    gpus = 0
    for v in device_values(report).values():
        span = v.get("gpu_span_ns") or 0
        if not span:
            continue
        gpus += 1
        wait = v.get("exposed_comm_wait_ns") or 0
        out["compute"] += (v.get("compute_pct") or 0) / 100 * span
        out["exposed_comm"] += (v.get("exposed_comm_ns") or 0) - wait
        out["rank_wait"] += wait
        out["exposed_copies"] += v.get("exposed_memcpy_ns") or 0
        for cause in IDLE_CAUSES:
            out[f"idle_{cause}"] += v.get(f"idle_{cause}_ns") or 0
        out["scope"] += span
    return out, gpus


def comm_totals(report: dict[str, Any]) -> dict[str, float | None]:
    """Communication ns summed over GPUs: ``comm`` (comm_ns), ``exposed`` (exposed_comm_ns),
    ``waiting`` (nccl_wait_ns; None when no GPU has it: a single-rank job)."""
    values = list(device_values(report).values())
    waits = [v["nccl_wait_ns"] for v in values if v.get("nccl_wait_ns") is not None]
    return {
        "comm": sum(v.get("comm_ns") or 0 for v in values),
        "exposed": sum(v.get("exposed_comm_ns") or 0 for v in values),
        "waiting": sum(waits) if waits else None,
    }


def rank_data(store: Store, refs: list[TraceRef]) -> tuple:
    """(step samples, their source, kernel GPU times, copy GPU times, rank step means) of a
    job (:func:`step_samples`, :func:`gpu_times`, :func:`rank_step_means`): from the ranks'
    stored summaries (``rank_compare``) when every trace has one, else from its tables."""
    con = stored_summaries(refs)
    if con is not None:
        try:
            return _stored_rank_data(con, refs)
        finally:
            con.close()
    job = JobData(store, refs)
    try:
        steps, source = step_samples(job)
        kernels, copies = gpu_times(job)
        return steps, source, kernels, copies, rank_step_means(job)
    finally:
        job.close()


def _stored_rank_data(con, refs: list[TraceRef]) -> tuple:
    """:func:`rank_data` from the view ``rank_compare`` (every rank's summary rows): the same
    sums, per rank first, so the same integers."""
    durs = con.execute(
        "SELECT step, max(end_ns - start_ns) AS dur FROM rank_compare WHERE kind = 'step' "
        "GROUP BY step ORDER BY step"
    ).fetchnumpy()["dur"]
    if durs.size:
        steps, source = np.asarray(durs).astype(np.int64), "steps"
    else:
        span = con.execute(
            "SELECT max(end_ns - start_ns) FROM rank_compare WHERE kind = 'span'"
        ).fetchone()[0]
        steps, source = np.array([int(span or 0)], dtype=np.int64), "gpu_span"
    kernels = {
        name: (int(total), int(count))
        for name, total, count in con.execute(
            "SELECT name, sum(total_ns), sum(count) FROM rank_compare WHERE kind = 'kernel' "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
    }
    copies: dict[tuple[str, str], list[int]] = {}
    for kind, copy_kind, src, dst, total, nbytes, count in con.execute(
        "SELECT kind, copy_kind, src_kind, dst_kind, sum(total_ns), sum(bytes), sum(count) "
        "FROM rank_compare WHERE kind IN ('memcpy', 'memset') GROUP BY 1, 2, 3, 4 "
        "ORDER BY 1, 2, 3, 4"
    ).fetchall():
        acc = copies.setdefault(copy_key(kind, copy_kind, src, dst), [0, 0, 0])
        acc[0] += int(total)
        acc[1] += int(nbytes)
        acc[2] += int(count)
    rows = con.execute(
        "SELECT trace_id, sum(end_ns - start_ns), count(*) FROM rank_compare "
        "WHERE kind = 'step' GROUP BY 1"
    ).fetchall()
    return steps, source, kernels, copies, _means_by_rank(rows, refs)


def _side(
    store: Store, refs: list[TraceRef], overrides, report: dict[str, Any] | None = None
) -> dict[str, Any]:
    steps, source, kernels, copies, ranks = rank_data(store, refs)
    if report is None:
        # every rank: the sides' causes and step parts are sums over all GPUs (triage would
        # leave each side's out-of-line ranks only, not comparable); the job's stored report
        # when it has every rank (jobs up to the triage threshold), else analyzed here
        from stallscope.rank_triage import DETAIL_ALL_UP_TO
        from stallscope.report import build_report

        if len(refs) <= DETAIL_ALL_UP_TO:
            report = report_store.ensure(store, refs, overrides)[0]
        else:
            report = build_report(store, [refs], overrides, all_ranks=True)
    parts, gpus = step_parts(report)
    worlds = [w for r in refs if isinstance(w := r.meta.get("world_size"), int)]
    return {
        "refs": refs,
        "job_name": _job_name(store, refs),
        "steps": steps,
        "source": source,
        "kernels": kernels,
        "copies": copies,
        "causes": cause_times(report),
        "parts": parts,
        "gpus": gpus,
        "comm": comm_totals(report),
        "rank_steps": ranks,
        "ranks": {int(r.meta.get("rank", 0)) for r in refs},
        "world_size": max(worlds, default=0),
        "findings": report["findings"],
        "rank_waits": table_of(report, "rank_waits"),
        "inference": inference_summary(report),
    }


def compare_jobs(
    store: Store,
    base: list[TraceRef],
    new: list[TraceRef],
    *,
    max_regression: float = DEFAULT_MAX_REGRESSION,
    noise_k: float = DEFAULT_NOISE_K,
    top: int = 10,
    overrides: dict[str, dict[str, float]] | None = None,
    reports: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The comparison dict; ``max_regression`` is a fraction (0.05 = 5 %). ``reports``: the two
    jobs' reports when the caller has them (the dashboard reads them from the store)."""
    base_report, new_report = reports or (None, None)
    a = _side(store, base, overrides, base_report)
    b = _side(store, new, overrides, new_report)
    step = step_statistics(a["steps"], b["steps"], noise_k)
    verdict, reason = decide(step, max_regression)
    per_a, per_b = len(a["steps"]), len(b["steps"])
    result = {
        "schema": COMPARE_SCHEMA,
        "base": _describe(a),
        "new": _describe(b),
        "thresholds": {"max_regression_pct": round(max_regression * 100, 6), "noise_k": noise_k},
        "step_time": step,
        "verdict": verdict,
        "reason": reason,
        "warnings": sample_warnings(a, b),
        "causes": [
            _delta_row(
                {"cause": key.split(":", 1)[1], "kind": key.split(":", 1)[0]},
                a["causes"][key] / per_a,
                b["causes"][key] / per_b,
            )
            for key in (f"{side}:{name}" for name, side in CAUSES)
        ],  # fmt: skip
        "attribution": attribution(a, b),
        "communication": communication(a, b),
        "copies": copy_deltas(a["copies"], b["copies"], per_a, per_b),
        "kernels": kernel_deltas(a["kernels"], b["kernels"], per_a, per_b, top),
        "findings": {
            "base": _finding_counts(a["findings"]),
            "new": _finding_counts(b["findings"]),
            **finding_changes(a["findings"], b["findings"]),
            "savings": finding_savings(a["findings"], b["findings"], per_a, per_b, top),
        },
    }
    result["inference"] = inference_deltas(a["inference"], b["inference"])
    result["explanation"] = explain(result, a, b, max_regression)
    return result


def attribution(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Where one GPU's step time goes, per step (mean over the side's GPUs), base vs new.

    ``parts``: :data:`PARTS`; ``scope``: the GPU step scope they split; ``step_mean``: the
    mean step time (slowest rank per step); ``rank_mean``: the mean of every rank's steps;
    ``outside_scope``: ``step_mean - scope``. Each a delta row in ms.
    """

    def per_gpu(side: dict[str, Any], key: str) -> float | None:
        if not side["gpus"]:
            return None
        return side["parts"][key] / side["gpus"] / len(side["steps"])

    def rank_mean(side: dict[str, Any]) -> float:
        means = side["rank_steps"]
        return sum(means.values()) / len(means) if means else float(np.mean(side["steps"]))

    parts = [
        _delta_row({"category": key, "label": label}, per_gpu(a, key), per_gpu(b, key))
        for key, label in PARTS
    ]
    scope_a, scope_b = per_gpu(a, "scope"), per_gpu(b, "scope")
    mean_a, mean_b = float(np.mean(a["steps"])), float(np.mean(b["steps"]))
    return {
        "gpus": {"base": a["gpus"], "new": b["gpus"]},
        "parts": parts,
        "scope": _delta_row({}, scope_a, scope_b),
        "step_mean": _delta_row({}, mean_a, mean_b),
        "rank_mean": _delta_row({}, rank_mean(a), rank_mean(b)),
        "outside_scope": _delta_row(
            {},
            None if scope_a is None else mean_a - scope_a,
            None if scope_b is None else mean_b - scope_b,
        ),
    }


def communication(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Exposed communication and waiting for other ranks (ms per step, summed over GPUs) and the
    overlap % (|comm ∩ compute| / |comm| over all GPUs: (Σ comm_ns − Σ exposed_comm_ns) / Σ comm_ns)."""
    per_a, per_b = len(a["steps"]), len(b["steps"])

    def overlap(comm: dict[str, Any]) -> float | None:
        total = comm["comm"]
        return round(100.0 * (total - comm["exposed"]) / total, 3) if total else None

    def per_step(value: float | None, steps: int) -> float | None:
        return None if value is None else value / steps

    oa, ob = overlap(a["comm"]), overlap(b["comm"])
    return {
        "exposed": _delta_row({}, a["comm"]["exposed"] / per_a, b["comm"]["exposed"] / per_b),
        "waiting": _delta_row(
            {}, per_step(a["comm"]["waiting"], per_a), per_step(b["comm"]["waiting"], per_b)
        ),
        "overlap_pct": {
            "base": oa,
            "new": ob,
            "delta_pp": None if oa is None or ob is None else round(ob - oa, 3),
        },
    }


def copy_deltas(a: dict, b: dict, per_a: int, per_b: int) -> list[dict[str, Any]]:
    """Copies by (direction, host memory): GPU ms and MB per step, copy counts (totals)."""
    rows = []
    for key in sorted(set(a) | set(b)):
        ta, ba, ca = a.get(key, (0, 0, 0))
        tb, bb, cb = b.get(key, (0, 0, 0))
        row = _delta_row({"kind": key[0], "memory": key[1]}, ta / per_a, tb / per_b)
        row.update(
            base_mb=round(ba / per_a / 1e6, 6),
            new_mb=round(bb / per_b / 1e6, 6),
            base_count=ca,
            new_count=cb,
        )
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["kind"], r["memory"]))
    return rows


# Analyzers whose saving_ns is for the unprofiled run (the profiler's own cost taken out);
# the others' savings are in the captured (profiled) time.
UNPROFILED_SAVINGS = frozenset({"launch_overhead"})


def _finding_key(f: dict) -> tuple:
    """How findings of two jobs are matched: analyzer, evidence key, rank, device."""
    return (f["analyzer"], str(f["evidence"].get("key", "")), f["rank"], f["device"])


def finding_changes(base: list[dict], new: list[dict]) -> dict[str, list[list[str]]]:
    """Findings matched by :func:`_finding_key` (each side's worst severity per key):
    ``new_only``: sorted ``[analyzer, severity]`` of the keys NEW has and BASE lacks;
    ``worse``: sorted ``[analyzer, base severity, new severity]`` of the keys on both
    sides whose severity rose in NEW."""

    def worst(findings: list[dict]) -> dict[tuple, str]:
        out: dict[tuple, str] = {}
        for f in findings:
            key = _finding_key(f)
            if key not in out or SEVERITY_RANK[f["severity"]] > SEVERITY_RANK[out[key]]:
                out[key] = f["severity"]
        return out

    wa, wb = worst(base), worst(new)
    new_only = {(k[0], sev) for k, sev in wb.items() if k not in wa}
    worse = {
        (k[0], wa[k], sev)
        for k, sev in wb.items()
        if k in wa and SEVERITY_RANK[sev] > SEVERITY_RANK[wa[k]]
    }
    return {"new_only": [list(t) for t in sorted(new_only)],
            "worse": [list(t) for t in sorted(worse)]}  # fmt: skip


def finding_savings(
    base: list[dict], new: list[dict], per_a: int, per_b: int, top: int
) -> list[dict[str, Any]]:
    """Findings of either side matched by (analyzer, evidence key, rank, device), with their
    estimated saving (``saving_ns``) per step; None where no finding or not estimated.

    Kept: findings above ``info`` or with a saving; the ``top`` by saving, then severity.
    """

    def index(findings: list[dict]) -> dict[tuple, list[dict]]:
        out: dict[tuple, list[dict]] = {}
        for f in findings:
            key = (f["analyzer"], str(f["evidence"].get("key", "")), f["rank"], f["device"])
            out.setdefault(key, []).append(f)
        return out

    def saving(found: list[dict], steps: int) -> float | None:
        known = [f["saving_ns"] for f in found if f.get("saving_ns") is not None]
        return sum(known) / steps if known else None

    def worst(found: list[dict]) -> str | None:
        return max((f["severity"] for f in found), key=SEVERITY_RANK.get, default=None)

    ia, ib = index(base), index(new)
    rows = []
    for key in set(ia) | set(ib):
        fa, fb = ia.get(key, []), ib.get(key, [])
        sa, sb = saving(fa, per_a), saving(fb, per_b)
        sev_a, sev_b = worst(fa), worst(fb)
        if sa is None and sb is None and {sev_a, sev_b} <= {None, "info"}:
            continue
        row = _delta_row(
            {"analyzer": key[0], "key": key[1], "rank": key[2], "device": key[3],
             "title": (fb or fa)[0]["title"], "base_severity": sev_a, "new_severity": sev_b,
             "unprofiled_saving": key[0] in UNPROFILED_SAVINGS},
            sa, sb,
        )  # fmt: skip
        rows.append(row)
    rows.sort(
        key=lambda r: (
            -max(abs(r["base_ms"] or 0), abs(r["new_ms"] or 0)),
            -max(SEVERITY_RANK.get(r["base_severity"], -1), SEVERITY_RANK.get(r["new_severity"], -1)),
            r["analyzer"], r["rank"], -1 if r["device"] is None else r["device"], r["key"],
        )
    )  # fmt: skip
    return rows[:top]


def explain(result: dict[str, Any], a: dict, b: dict, max_regression: float) -> str:
    """The verdict's explanation: which per-GPU categories moved, and what the rows cannot show.

    When the median step changed beyond the noise (or the verdict is not 'no significant
    change'), the categories that moved the same way, largest first (each at least
    :data:`LEAD_SHARE` of the largest), and the largest that moved the other way when it is
    material. When the categories add up to less than :data:`ACCOUNTED_SHARE` of the change,
    why (:func:`_unaccounted`). Within the noise: the categories that moved by more than
    both the noise and the threshold, if any. '' when there is nothing to say.
    """
    s, att = result["step_time"], result["attribution"]
    base, d = s["base_median_ms"], s["delta_ms"]
    if not base or not att["gpus"]["base"] or not att["gpus"]["new"]:
        return ""
    moved = {p["category"]: p["delta_ms"] for p in att["parts"]}
    significant = result["verdict"] != "no significant change" or (
        s["pooled_std_ms"] is not None and abs(d) > s["noise_ms"]
    )
    if not significant or not d:
        limit = max(s["noise_ms"], max_regression * base)
        big = sorted((k for k, v in moved.items() if abs(v) > limit), key=lambda k: -abs(moved[k]))
        if not big:
            return ""
        bound = (
            "the noise" if s["pooled_std_ms"] is not None else "the threshold (no noise estimate)"
        )
        return (
            f"no step-time change beyond {bound}, but time moved between categories (per GPU): "
            + ", ".join(_moved(k, moved[k], result) for k in big)
        )
    sign = 1 if d > 0 else -1
    head = f"{'slower' if d > 0 else 'faster'}: {d:+.3f} ms/step ({pct_text(s['delta_pct'])})"
    with_sign = sorted((k for k in moved if sign * moved[k] > 0), key=lambda k: -abs(moved[k]))
    lead = [k for k in with_sign if abs(moved[k]) >= LEAD_SHARE * abs(moved[with_sign[0]])][:3]
    against = sorted((k for k in moved if sign * moved[k] < 0), key=lambda k: -abs(moved[k]))
    accounted = att["scope"]["delta_ms"]
    if not lead:
        text = (
            f"{head}, but no per-GPU category {'grew' if d > 0 else 'shrank'} "
            f"(they add up to {accounted:+.3f} ms/step)"
        )
    else:
        text = f"{head}; per GPU, mostly " + ", ".join(_moved(k, moved[k], result) for k in lead)
        if against and abs(moved[against[0]]) >= LEAD_SHARE * abs(d):
            k = against[0]
            text += f", partly offset by {_moved(k, moved[k], result)}"
    if not lead or sign * accounted < ACCOUNTED_SHARE * abs(d):
        reasons = _unaccounted(d, att, a, b)
        if lead:
            text += f"; these rows add up to {accounted:+.3f} ms/step"
        text += ": " + "; ".join(reasons)
    return text


def _moved(key: str, delta: float, result: dict[str, Any]) -> str:
    label = dict(PARTS)[key]
    return f"{label} {delta:+.3f} ms/step{_detail(key, delta, result)}"


def _detail(key: str, delta: float, result: dict[str, Any]) -> str:
    """What the report knows about a category's change: overlap %, the straggler, the copies."""
    if key == "exposed_comm":
        o = result["communication"]["overlap_pct"]
        if o["base"] is not None and o["new"] is not None:
            return f" (overlap {o['base']:.0f}% -> {o['new']:.0f}%)"
    if key == "rank_wait":
        stragglers = result["new" if delta > 0 else "base"].get("stragglers") or []
        if stragglers:
            return f" (last to arrive: rank {', '.join(map(str, stragglers))})"
    if key == "exposed_copies":
        rows = [r for r in result["copies"] if r["delta_ms"] * delta > 0]
        if rows:
            r = rows[0]
            return f" (largest change: {_copy_label(r)} {r['delta_ms']:+.3f} ms/step on all GPUs)"
    return ""


def _unaccounted(d: float, att: dict[str, Any], a: dict, b: dict) -> list[str]:
    """Why the per-GPU rows do not add up to the step-time change, from what the trace shows."""
    sign = 1 if d > 0 else -1
    dm, dr = att["step_mean"]["delta_ms"], att["rank_mean"]["delta_ms"]
    ds = att["scope"]["delta_ms"]
    material = REASON_SHARE * abs(d)
    reasons = []
    if sign * (d - dm) > material:
        reasons.append(
            f"the median step changed {d:+.3f} ms but the mean step {dm:+.3f} ms, and the rows "
            "are per-step means: a few outlier steps weigh in them"
        )
    if sign * (dm - dr) > material:
        changes = {
            r: (b["rank_steps"][r] - a["rank_steps"][r]) / 1e6
            for r in set(a["rank_steps"]) & set(b["rank_steps"])
        }
        rank = max(changes, key=lambda r: (sign * changes[r], -r), default=None)
        who = f"rank {rank}'s steps changed {changes[rank]:+.3f} ms" if rank is not None else ""
        reasons.append(
            "the step time is the slowest rank's and the rows are means over GPUs: "
            + (f"{who}, " if who else "")
            + f"the ranks' average {dr:+.3f} ms (the added time is on "
            + ("that rank" if who else "one rank")
            + ")"
        )
    if sign * (dr - ds) > material:
        reasons.append(
            f"the ranks' steps changed {dr:+.3f} ms but their GPUs' step scope {ds:+.3f} ms: the "
            "added time is host time outside the GPU step scope"
        )
    for label, side in (("base", a), ("new", b)):
        if side["world_size"] > len(side["ranks"]):
            reasons.append(
                f"{label} holds {len(side['ranks'])} of its {side['world_size']} ranks: the added "
                "time may be on a rank that was not captured"
            )
    if not reasons:
        reasons.append(
            "the rest is not GPU time inside the steps of the GPUs captured (host time outside "
            "the step scope, or a rank not in the comparison)"
        )
    return reasons


def _stragglers(rank_waits: list[dict]) -> list[int]:
    """Ranks that the waiting ranks (the report's ``rank_waits`` table) waited for, the most
    exposed wait caused first."""
    waits: dict[int, int] = {}
    for row in rank_waits:
        rank = int(row["straggler_rank"])
        waits[rank] = waits.get(rank, 0) + int(row["exposed_wait_ns"])
    return sorted(waits, key=lambda r: (-waits[r], r))


def sample_warnings(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why the step-time verdict may mislead: no step markers, or too few steps for a noise estimate."""
    out = []
    for label, side in (("base", base), ("new", new)):
        if side["source"] == "gpu_span":
            out.append(
                f"{label} has no step markers: its one 'step' is the GPU span of the whole capture, so "
                "the verdict compares capture lengths (add ProfilerStep or NVTX 'step N' ranges, or "
                "compare captures of the same length and work)"
            )
        elif len(side["steps"]) < 2:
            out.append(
                f"{label} has 1 step: no noise estimate, the verdict uses the threshold alone"
            )
    return out


def step_statistics(base: np.ndarray, new: np.ndarray, noise_k: float) -> dict[str, Any]:
    med_a, med_b = float(np.median(base)), float(np.median(new))
    sd_a = float(np.std(base, ddof=1)) if base.size > 1 else None
    sd_b = float(np.std(new, ddof=1)) if new.size > 1 else None
    if sd_a is not None and sd_b is not None:
        pooled = math.sqrt(
            ((base.size - 1) * sd_a**2 + (new.size - 1) * sd_b**2) / (base.size + new.size - 2)
        )
        noise = noise_k * pooled * math.sqrt(1 / base.size + 1 / new.size)
    else:
        pooled, noise = None, 0.0
    delta = med_b - med_a
    return {
        "base_median_ms": _ms(med_a),
        "new_median_ms": _ms(med_b),
        "delta_ms": _ms(delta),
        "delta_pct": round(delta / med_a * 100, 3) if med_a else None,
        "base_std_ms": _ms(sd_a),
        "new_std_ms": _ms(sd_b),
        "pooled_std_ms": _ms(pooled),
        "noise_ms": _ms(noise),
        "base_steps": int(base.size),
        "new_steps": int(new.size),
    }


def decide(step: dict[str, Any], max_regression: float) -> tuple[str, str]:
    base, delta, noise = step["base_median_ms"], step["delta_ms"], step["noise_ms"]
    allowed = max_regression * base
    noise_text = (
        f"noise {noise:.3f} ms" if step["pooled_std_ms"] is not None else "no noise estimate"
    )
    if not base:
        return "no significant change", "no step time in the baseline"
    pct = f"{abs(step['delta_pct']):.1f}%"
    for name, sign, word in (("regression", 1, "slower"), ("improvement", -1, "faster")):
        if sign * delta > allowed and sign * delta > noise:
            return name, (
                f"median step {abs(delta):.3f} ms ({pct}) {word}: beyond the "
                f"{max_regression * 100:g}% threshold ({allowed:.3f} ms) and the {noise_text}"
            )
    if abs(delta) > allowed:
        return "no significant change", (
            f"median step {delta:+.3f} ms ({pct}) is beyond {max_regression * 100:g}% but within the {noise_text}"
        )
    return "no significant change", (
        f"median step {delta:+.3f} ms ({pct}) is within the {max_regression * 100:g}% threshold"
    )


def kernel_deltas(a: dict, b: dict, per_a: int, per_b: int, top: int) -> list[dict[str, Any]]:
    """The ``top`` kernels by absolute change of GPU time per step."""
    rows = []
    for name in set(a) | set(b):
        ta, ca = a.get(name, (0, 0))
        tb, cb = b.get(name, (0, 0))
        row = _delta_row({"kernel": name}, ta / per_a, tb / per_b)
        row.update(base_launches=ca, new_launches=cb)
        rows.append(row)
    rows = [r for r in rows if r["delta_ms"]]
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["kernel"]))
    return rows[:top]


def _delta_row(key: dict[str, Any], base_ns: float | None, new_ns: float | None) -> dict[str, Any]:
    """``key`` plus base, new and delta in ms; the delta is None when either side is None."""
    delta = None if base_ns is None or new_ns is None else new_ns - base_ns
    return {
        **key,
        "base_ms": _ms(base_ns),
        "new_ms": _ms(new_ns),
        "delta_ms": _ms(delta),
        "delta_pct": round(delta / base_ns * 100, 3) if base_ns and delta is not None else None,
    }


def _job_name(store: Store, refs: list[TraceRef]) -> str | None:
    """The stored job's name (as named at upload or renamed), None for an unknown job."""
    if not refs or not store.has_job(refs[0].job_id):
        return None
    return store.job(refs[0].job_id).get("name")


def _describe(side: dict[str, Any]) -> dict[str, Any]:
    refs = side["refs"]
    return {
        "job": refs[0].job_id if refs else None,
        "job_name": side.get("job_name"),
        "traces": [r.trace_id for r in refs],
        "names": [r.meta.get("name") for r in refs],
        "step_source": side["source"],
        "gpus": side["gpus"],
        "stragglers": _stragglers(side["rank_waits"]),
    }


def _finding_counts(findings: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    return counts


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 6)


# -- rendering ---------------------------------------------------------------------

FORMATS = ("text", "json", "markdown", "html")
Table = tuple[str, list[str], list[list[str]]]  # title, header, rows of cells


def render_compare(result: dict[str, Any], fmt: str) -> str:
    """The comparison as ``text``, ``json``, ``markdown`` or ``html`` (one self-contained page)."""
    import json

    if fmt == "json":
        return json.dumps(result, indent=2, sort_keys=True) + "\n"
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    md = fmt == "markdown"
    title = f"stallscope compare: {result['verdict'].upper()}"
    paras = headline(result)
    if fmt == "html":
        return _html(title, result["verdict"], paras, compare_tables(result), result)
    lines = [("## " if md else "") + title, ""]
    for para in paras:
        lines += [para, ""]
    for i, table in enumerate(compare_tables(result, code=md)):
        lines += _grid(table[1], table[2], md, table[0])
        if i == 0:
            lines += [step_delta_text(result), ""]
    for note in finding_notes(result):
        lines += [note, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def headline(result: dict[str, Any]) -> list[str]:
    """The paragraphs under the verdict: its reason, its explanation, the warnings."""
    out = [f"{result['reason']}."]
    if result.get("explanation"):
        out.append(f"Why: {result['explanation']}.")
    return out + [f"Warning: {w}." for w in result["warnings"]]


def step_delta_text(result: dict[str, Any]) -> str:
    s, t = result["step_time"], result["thresholds"]
    return (
        f"delta {_signed(s['delta_ms'])} ms ({pct_text(s['delta_pct'])}); noise (k={t['noise_k']:g}) "
        f"{_num(s['noise_ms'])} ms; max regression {t['max_regression_pct']:g}%"
    )


def new_only_text(new_only: list) -> str:
    return "Findings only in new: " + ", ".join(f"{a} ({sev})" for a, sev in new_only)


def finding_notes(result: dict[str, Any]) -> list[str]:
    """The lines under the findings table: findings only in new or worse in new, and, when
    an unprofiled saving is shown, that profiled-to-profiled deltas include the profiler."""
    found = result["findings"]
    changes = []
    if found["new_only"]:
        changes.append(new_only_text(found["new_only"]))
    if found.get("worse"):
        worse = ", ".join(f"{a} ({sa} → {sb})" for a, sa, sb in found["worse"])
        changes.append(("worse in new: " if changes else "Findings worse in new: ") + worse)
    out = ["; ".join(changes)] if changes else []
    if any(r.get("unprofiled_saving") for r in found.get("savings", [])):
        out.append(
            "Savings marked (unprofiled) are estimated for the run without the profiler (its own cost "
            "taken out); the step-time deltas compare two profiled captures, so they include the "
            "profiler's own overhead."
        )
    return out


def compare_tables(result: dict[str, Any], *, code: bool = False, width: int = 60) -> list[Table]:
    """Every table of the comparison, as cells; the CLI formats and the Compare page share them.

    ``code`` quotes names as Markdown code; ``width`` shortens long kernel names."""
    tables = [
        _step_table(result),
        _parts_table(result),
        _causes_table(result),
        _comm_table(result),
        _copies_table(result),
        _kernels_table(result, code, width),
        _savings_table(result, width),
    ]
    inference = inference_table(result)
    return tables[:1] + [inference] + tables[1:] if inference else tables


def _step_table(result: dict[str, Any]) -> Table:
    s = result["step_time"]
    rows = []
    for side in ("base", "new"):
        names = result[side].get("job_name") or ", ".join(str(n) for n in result[side]["names"])
        rows.append(
            [side, f"{names} · {result[side]['job']}", _num(s[f"{side}_median_ms"]),
             _num(s[f"{side}_std_ms"]), str(s[f"{side}_steps"]), result[side]["step_source"]]
        )  # fmt: skip
    return "Step time", ["", "job", "step ms (median)", "std ms", "steps", "from"], rows


def _ms_cells(row: dict[str, Any]) -> list[str]:
    return [_num(row["base_ms"]), _num(row["new_ms"]), _signed(row["delta_ms"]), _pct_cell(row)]


def _pct_cell(row: dict[str, Any]) -> str:
    if row["delta_ms"] is None:
        return "-"
    return pct_text(row["delta_pct"]) if row["base_ms"] or not row["new_ms"] else "new"


def _shown(row: dict[str, Any]) -> bool:
    return bool(row["base_ms"] or row["new_ms"])


def _parts_table(result: dict[str, Any]) -> Table:
    att = result["attribution"]
    gpus = att["gpus"]
    rows = [[p["label"], *_ms_cells(p)] for p in att["parts"] if _shown(p)]
    if rows:
        rows += [
            ["= GPU step scope", *_ms_cells(att["scope"])],
            ["step time (mean, slowest rank)", *_ms_cells(att["step_mean"])],
            ["step time - GPU step scope", *_ms_cells(att["outside_scope"])[:3], ""],
        ]
    title = (
        f"Where one GPU's step goes (ms per step, mean over GPUs: {gpus['base']} base, "
        f"{gpus['new']} new)"
    )
    return title, ["per GPU and step", "base ms", "new ms", "delta ms", "delta %"], rows


def _causes_table(result: dict[str, Any]) -> Table:
    rows = [[f"{r['kind']}: {r['cause']}", *_ms_cells(r)] for r in result["causes"] if _shown(r)]
    return (
        "Time by cause (summed over GPUs, per step)",
        ["GPU time per step", "base ms", "new ms", "delta ms", "delta %"],
        rows,
    )


def _comm_table(result: dict[str, Any]) -> Table:
    comm = result["communication"]
    rows = []
    if _shown(comm["exposed"]) or comm["overlap_pct"]["base"] or comm["overlap_pct"]["new"]:
        rows.append(["exposed (no compute beside it), ms", *_ms_cells(comm["exposed"])])
        if comm["waiting"]["base_ms"] is not None or comm["waiting"]["new_ms"] is not None:
            rows.append(["waiting for other ranks, ms", *_ms_cells(comm["waiting"])])
        o = comm["overlap_pct"]
        rows.append(
            ["overlap with compute, %", _pct_value(o["base"]), _pct_value(o["new"]),
             "-" if o["delta_pp"] is None else f"{o['delta_pp']:+.1f} pp", ""]
        )  # fmt: skip
    return (
        "Communication (summed over GPUs, per step)",
        ["communication", "base", "new", "delta", "delta %"],
        rows,
    )


def _copy_label(row: dict[str, Any]) -> str:
    return f"{row['kind']} {row['memory']}".strip()


def _copies_table(result: dict[str, Any]) -> Table:
    rows = [
        [_copy_label(r), *_ms_cells(r), f"{r['base_mb']:.3f} -> {r['new_mb']:.3f}",
         f"{r['base_count']} -> {r['new_count']}"]
        for r in result["copies"]
    ]  # fmt: skip
    return (
        "Copies by kind (GPU ms per step, summed over GPUs)",
        ["copy", "base ms", "new ms", "delta ms", "delta %", "MB per step", "copies (total)"],
        rows,
    )


def _kernels_table(result: dict[str, Any], code: bool, width: int) -> Table:
    from stallscope.humanize import short_kernel_names

    names = short_kernel_names([r["kernel"] for r in result["kernels"]])
    rows = [
        [_code(_short(name, width), code), *_ms_cells(r),
         f"{r['base_launches']} -> {r['new_launches']}"]
        for name, r in zip(names, result["kernels"], strict=True)
    ]  # fmt: skip
    return (
        "Kernels with the largest change (GPU ms per step)",
        ["kernel", "base ms", "new ms", "delta ms", "delta %", "launches (total)"],
        rows,
    )


def _savings_table(result: dict[str, Any], width: int) -> Table:
    rows = []
    for r in result["findings"].get("savings", []):
        where = f"rank {r['rank']}" + ("" if r["device"] is None else f" GPU {r['device']}")
        rows.append(
            [f"{r['analyzer']}: {_short(r['title'], width)}", where,
             r["base_severity"] or "-", r["new_severity"] or "-",
             _saving(r["base_ms"], r), _saving(r["new_ms"], r), _signed(r["delta_ms"])]
        )  # fmt: skip
    return (
        "Findings: estimated saving if fixed (ms per step; — not estimated)",
        [
            "finding",
            "where",
            "base",
            "new",
            "base est. saving ms",
            "new est. saving ms",
            "delta ms",
        ],
        rows,
    )


def _grid(header: list[str], rows: list[list[str]], md: bool, title: str) -> list[str]:
    out = [("### " if md else "") + title, ""]
    if not rows:
        return out + ["(none)", ""]
    if md:
        esc = [[c.replace("|", "\\|") for c in r] for r in rows]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        out += ["| " + " | ".join(r) + " |" for r in esc]
    else:
        widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out += [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*r).rstrip() for r in rows]
    return out + [""]


def _html(title: str, verdict: str, paras: list[str], tables: list[Table], result) -> str:
    """One self-contained page (no script, style or font from the network)."""
    from html import escape

    from stallscope.render import _HTML_STYLE

    colour = {"regression": "#b71c1c", "improvement": "#2e7d32"}.get(verdict, "#37474f")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>stallscope compare</title>',
        f"<style>{_HTML_STYLE}</style></head><body>",
        f'<h1 style="color: {colour}">{escape(title)}</h1>',
    ]
    parts += [f"<p>{escape(p)}</p>" for p in paras]
    for i, (caption, header, rows) in enumerate(tables):
        parts.append(f"<h2>{escape(caption)}</h2>")
        if not rows:
            parts.append("<p>(none)</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table>")
        if i == 0:
            parts.append(f"<p>{escape(step_delta_text(result))}</p>")
    parts += [f"<p>{escape(note)}</p>" for note in finding_notes(result)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _code(text: str, md: bool) -> str:
    return f"`{text.replace('`', chr(39))}`" if md else text


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _saving(value: float | None, row: dict[str, Any] | None = None) -> str:
    """A saving cell; ``(unprofiled)`` after the savings of :data:`UNPROFILED_SAVINGS`."""
    if value is None:
        return "—"
    return f"{value:.3f}" + (" (unprofiled)" if row and row.get("unprofiled_saving") else "")


def _pct_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def pct_text(value: float | None) -> str:
    """A relative change for tables: 'new' from zero, '>+999%' when the base was tiny (JSON keeps it)."""
    if value is None:
        return "new"
    return ">+999%" if value > 999 else f"{value:+.1f}%"  # a decrease is -100% at most


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
