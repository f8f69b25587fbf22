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

from stallscope.jobdata import JobData
from stallscope.report import build_report
from stallscope.store import Store, TraceRef

COMPARE_SCHEMA = "stallscope.compare/1"
DEFAULT_MAX_REGRESSION = 0.05
DEFAULT_NOISE_K = 2.0
CAUSES = (
    ("compute", "busy"), ("comm", "busy"), ("memcpy", "busy"),
    ("dataloader", "idle"), ("host_sync", "idle"), ("memcpy", "idle"), ("launch", "idle"),
    ("cpu", "idle"), ("queued", "idle"), ("unknown", "idle"),
)  # fmt: skip


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


def kernel_times(job: JobData) -> dict[str, tuple[int, int]]:
    """Kernel name -> (total GPU ns, launches) over the job's traces."""
    rows = job.sql(
        "SELECT n.name, sum(g.end_ns - g.start_ns), count(*) FROM gpu g "
        "JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id "
        "WHERE g.kind = 'kernel' GROUP BY n.name"
    ).fetchall()
    return {name: (int(total), int(count)) for name, total, count in rows}


def cause_times(report: dict[str, Any]) -> dict[str, float]:
    """GPU ns by busy category and idle cause, summed over the report's GPUs."""
    per_device: dict[tuple, dict[str, float]] = {}
    for m in report["metrics"]:
        if m["device"] is not None:
            per_device.setdefault((m["trace"], m["device"]), {})[m["name"]] = m["value"] or 0
    out = {f"{side}:{name}": 0.0 for name, side in CAUSES}
    for values in per_device.values():
        span = values.get("gpu_span_ns", 0)
        for name, side in CAUSES:
            if side == "busy":
                out[f"busy:{name}"] += values.get(f"{name}_pct", 0) / 100 * span
            else:
                out[f"idle:{name}"] += values.get(f"idle_{name}_ns", 0)
    return out


def _side(store: Store, refs: list[TraceRef], overrides) -> dict[str, Any]:
    job = JobData(store, refs)
    try:
        steps, source = step_samples(job)
        kernels = kernel_times(job)
    finally:
        job.close()
    report = build_report(store, [refs], overrides)
    return {
        "refs": refs,
        "steps": steps,
        "source": source,
        "kernels": kernels,
        "causes": cause_times(report),
        "findings": report["findings"],
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
) -> dict[str, Any]:
    """The comparison dict; ``max_regression`` is a fraction (0.05 = 5 %)."""
    a, b = _side(store, base, overrides), _side(store, new, overrides)
    step = step_statistics(a["steps"], b["steps"], noise_k)
    verdict, reason = decide(step, max_regression)
    per_a, per_b = len(a["steps"]), len(b["steps"])
    return {
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
        "kernels": kernel_deltas(a["kernels"], b["kernels"], per_a, per_b, top),
        "findings": {
            "base": _finding_counts(a["findings"]),
            "new": _finding_counts(b["findings"]),
            "new_only": sorted(
                {(f["analyzer"], f["severity"]) for f in b["findings"]}
                - {(f["analyzer"], f["severity"]) for f in a["findings"]}
            ),
        },
    }


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


def _delta_row(key: dict[str, Any], base_ns: float, new_ns: float) -> dict[str, Any]:
    delta = new_ns - base_ns
    return {
        **key,
        "base_ms": _ms(base_ns),
        "new_ms": _ms(new_ns),
        "delta_ms": _ms(delta),
        "delta_pct": round(delta / base_ns * 100, 3) if base_ns else None,
    }


def _describe(side: dict[str, Any]) -> dict[str, Any]:
    refs = side["refs"]
    return {
        "job": refs[0].job_id if refs else None,
        "traces": [r.trace_id for r in refs],
        "names": [r.meta.get("name") for r in refs],
        "step_source": side["source"],
    }


def _finding_counts(findings: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    return counts


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 6)


# -- rendering ---------------------------------------------------------------------


def render_compare(result: dict[str, Any], fmt: str) -> str:
    import json

    if fmt == "json":
        return json.dumps(result, indent=2, sort_keys=True) + "\n"
    md = fmt == "markdown"
    s = result["step_time"]
    lines = [
        ("## " if md else "") + f"stallscope compare: {result['verdict'].upper()}",
        "",
        f"{result['reason']}.",
        "",
    ]
    if result["warnings"]:
        lines += [f"Warning: {w}." for w in result["warnings"]] + [""]
    base_names = ", ".join(str(n) for n in result["base"]["names"])
    new_names = ", ".join(str(n) for n in result["new"]["names"])
    step_rows = [
        ["base", f"{result['base']['job']} ({base_names})", _num(s["base_median_ms"]),
         _num(s["base_std_ms"]), str(s["base_steps"]), result["base"]["step_source"]],
        ["new", f"{result['new']['job']} ({new_names})", _num(s["new_median_ms"]),
         _num(s["new_std_ms"]), str(s["new_steps"]), result["new"]["step_source"]],
    ]  # fmt: skip
    lines += _grid(
        ["", "job", "step ms (median)", "std ms", "steps", "from"], step_rows, md, "Step time"
    )
    lines.append(
        f"delta {_signed(s['delta_ms'])} ms ({pct_text(s['delta_pct'])}); noise (k={result['thresholds']['noise_k']:g}) "
        f"{_num(s['noise_ms'])} ms; max regression {result['thresholds']['max_regression_pct']:g}%"
    )
    lines.append("")
    cause_rows = [
        [f"{r['kind']}: {r['cause']}", _num(r["base_ms"]), _num(r["new_ms"]),
         _signed(r["delta_ms"]), pct_text(r["delta_pct"])]
        for r in result["causes"] if r["base_ms"] or r["new_ms"]
    ]  # fmt: skip
    lines += _grid(
        ["GPU time per step", "base ms", "new ms", "delta ms", "delta %"],
        cause_rows,
        md,
        "Time by cause (summed over GPUs, per step)",
    )
    kernel_rows = [
        [_code(_short(r["kernel"], 60), md), _num(r["base_ms"]), _num(r["new_ms"]), _signed(r["delta_ms"]),
         pct_text(r["delta_pct"]), f"{r['base_launches']} -> {r['new_launches']}"]
        for r in result["kernels"]
    ]  # fmt: skip
    lines += _grid(
        ["kernel", "base ms", "new ms", "delta ms", "delta %", "launches (total)"],
        kernel_rows,
        md,
        "Kernels with the largest change (GPU ms per step)",
    )
    new_only = result["findings"]["new_only"]
    if new_only:
        lines.append("Findings only in new: " + ", ".join(f"{a} ({sev})" for a, sev in new_only))
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


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


def _code(text: str, md: bool) -> str:
    return f"`{text.replace('`', chr(39))}`" if md else text


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def pct_text(value: float | None) -> str:
    """A relative change for tables: 'new' from zero, '>+999%' when the base was tiny (JSON keeps it)."""
    if value is None:
        return "new"
    return ">+999%" if value > 999 else f"{value:+.1f}%"  # a decrease is -100% at most


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
