"""``inference``: serving traces: prefill and decode, time per output token, what holds decode back.

Iterations come from :mod:`stallscope.iterations` (engine or user ranges, or
CUDA-graph replays); each decode *period* (GPU completion of one decode
iteration to the next: the batch's time per output token) is split by
:mod:`stallscope.decode_periods` into GPU work, prefill work, and GPU idle
time by host cause. :func:`measure` turns that into numbers; the
``_*_finding`` functions write findings from those numbers only.

Metrics per trace and device: ``decode_iterations``, ``decode_iter_ms_median``,
``decode_iter_ms_p90``, ``decode_iter_ms_max``, ``decode_gpu_busy_pct``,
``prefill_iterations``, ``prefill_ms_median``, ``tokens_per_s``.
Documented in docs/analyzers/inference.md.
"""

from __future__ import annotations

import os

import numpy as np

from stallscope import job_settings
from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    graded_severity,
    graded_thresholds,
    pct,
)
from stallscope.decode_periods import HOST_WORK, DecodePeriods, measure_periods
from stallscope.iterations import Iterations, find_iterations
from stallscope.jobdata import JobData
from stallscope.report_types import IterationRow

THRESHOLDS = (
    *graded_thresholds(
        "share of the decode time (sum of the periods) lost to the cause",
        "time lost to the cause below which nothing is reported",
    ),
    Threshold(
        "stall_over_median",
        2.0,
        "x",
        "a decode period this many times the median is a stalled token",
        minimum=1,
    ),
    Threshold(
        "decode_batch",
        0,
        "sequences",
        "sequences per decode iteration when the trace's names do not say (0: unknown)",
    ),
)
ITERATION_RANGE_ENV = "STALLSCOPE_ITERATION_RANGE"  # fallback for the iteration_range setting
MAX_ROWS = 2000
MAX_WINDOWS = 20


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    name_regex = iteration_range(job)
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        for device in job.devices(ref.trace_id):
            its = find_iterations(job, ref.trace_id, int(device), name_regex)
            if its is None:
                continue
            periods = measure_periods(job, ref.trace_id, int(device), its)
            numbers = measure(its, periods, params)
            where = (ref.trace_id, rank, int(device))
            result.metrics.extend(_metrics(where, numbers))
            result.tables.iterations.extend(iteration_rows(where, its, periods))
            numbers["iteration_range"] = name_regex
            result.findings.extend(_findings(where, its, periods, numbers, params))
    return result


def iteration_range(job: JobData | None = None) -> str | None:
    """The regex naming the host ranges that are the iterations, or None (find them).

    The job's ``iteration_range`` setting (``analyze --iteration-range``, the
    Inference page; :mod:`stallscope.job_settings`), else
    ``$STALLSCOPE_ITERATION_RANGE``. Set it when the guess is wrong; an
    invalid pattern is a :class:`UsageError`.
    """
    setting = job_settings.of(job).iteration_range if job is not None else None
    value = setting or os.environ.get(ITERATION_RANGE_ENV, "").strip()
    if not value:
        return None
    job_settings.check_iteration_range(
        value, "--iteration-range" if setting else ITERATION_RANGE_ENV
    )
    return value


def measure(its: Iterations, periods: DecodePeriods | None, params: dict[str, float]) -> dict:
    """The numbers the metrics and findings are written from (ns unless named otherwise)."""
    prefill = np.concatenate([its.of_phase("prefill"), its.of_phase("mixed")])
    prefill_ns = its.gpu_busy[prefill]  # its GPU work, not the launch waits inside its window
    numbers: dict = {
        "source": its.source,
        "iterations": len(its),
        "prefill_iterations": int(prefill.size),
        "prefill_ns_median": float(np.median(prefill_ns)) if prefill.size else None,
        "decode_iterations": int(its.token_steps().size),
    }
    if periods is None:
        return numbers
    period = periods.period_ns
    total = int(period.sum())
    median = float(np.median(period))
    numbers.update(
        periods=int(period.size),
        total_ns=total,
        median_ns=median,
        p90_ns=float(np.percentile(period, 90)),
        p99_ns=float(np.percentile(period, 99)),
        max_ns=int(period.max()),
        decode_busy_ns=int(periods.decode_busy_ns.sum()),
        gpu_floor_ns=float(np.median(periods.decode_busy_ns)),
        idle={cause: int(v.sum()) for cause, v in periods.idle.items()},
        decode_launch_call_ns=int(periods.idle["launch"][_without_prefill(periods)].sum()),
        decode_issue_ns=int(periods.idle["issue"][_without_prefill(periods)].sum()),
        by_range={name: int(v.sum()) for name, v in periods.by_range.items()},
        tokens_per_s=_tokens_per_s(its, periods, params),
    )
    numbers["host_period_ns_median"] = float(np.median(np.diff(its.host_start[its.token_steps()])))
    numbers["host"] = _host_overhead(periods)
    numbers["stalls"] = _stalls(its, periods, median, params)
    numbers["launch_windows"] = _worst_windows(
        periods, (periods.idle["launch"] + periods.idle["issue"]) * _without_prefill(periods)
    )
    numbers["comm_ns"] = int(periods.exposed_comm_ns.sum())
    numbers["kv_copy_ns"] = int(periods.kv_copy_ns.sum())
    return numbers


def _without_prefill(periods: DecodePeriods) -> np.ndarray:
    return np.array([not p for p in periods.prefills], dtype=bool)


def _tokens_per_s(its: Iterations, periods: DecodePeriods, params) -> float | None:
    """Output tokens per second of the decode periods: batch per iteration / period."""
    batch = its.batch[periods.iteration].astype(float)
    batch[batch < 0] = params["decode_batch"] or np.nan
    if np.isnan(batch).any() or not periods.period_ns.sum():
        return None
    return round(float(batch.sum() / (periods.period_ns.sum() / 1e9)), 1)


def _host_overhead(periods: DecodePeriods) -> dict:
    """Host work (not launching) that held the GPU idle between decode iterations.

    ``per_token_ns`` is the median over the periods that do not cross a
    profiler step (those also hold the capture loop's own sync and
    ``prof.step()``); ``estimate_ns`` = that × the decode iterations.
    """
    per_period = sum(
        (periods.idle[c] for c in HOST_WORK), np.zeros(periods.start.size, dtype=np.int64)
    )
    inner = per_period[~periods.step_boundary] if (~periods.step_boundary).any() else per_period
    per_token = float(np.median(inner))
    ranges = sorted(periods.by_range.items(), key=lambda kv: -int(kv[1].sum()))
    return {
        "total_ns": int(per_period.sum()),
        "per_token_ns": per_token,
        "estimate_ns": int(per_token * (periods.start.size + 1)),
        "sync_ns": int(periods.idle["sync"].sum()),
        "cpu_ns": int(periods.idle["cpu"].sum()),
        "unknown_ns": int(periods.idle["unknown"].sum()),
        "graph_launch_ns": int(periods.idle["graph_launch"].sum()),
        "sync_calls_per_token": float(np.median(periods.sync_calls))
        if periods.sync_calls is not None
        else 0.0,
        "ranges": [{"name": name, "idle_ns": int(v.sum())} for name, v in ranges[:5]],
        "worst": _worst_windows(periods, per_period),
    }


def _stalls(its: Iterations, periods: DecodePeriods, median: float, params) -> dict:
    """Periods of at least ``stall_over_median`` × the median, and the prefills inside them."""
    period = periods.period_ns
    stalled = np.flatnonzero(period >= params["stall_over_median"] * median)
    named = sorted({i for k in stalled for i in periods.prefills[k]})
    excess = int((period[stalled] - median).sum())
    launch_wait = int((periods.idle["launch"] + periods.idle["issue"])[stalled].sum())
    return {
        "count": int(stalled.size),
        "excess_ns": excess,
        "launch_wait_ns": launch_wait,
        "estimate_ns": max(excess - launch_wait, 0),
        "with_prefill": int(sum(1 for k in stalled if periods.prefills[k])),
        "prefill_ns": int(periods.prefill_ns[stalled].sum()),
        "prefills": [
            {
                "name": its.names[i][:120],
                "gpu_ns": int(its.gpu_busy[i]),
                "tokens": int(its.tokens[i]),
                "window": [int(its.gpu_start[i]), int(its.gpu_end[i])],
            }
            for i in named[:20]
        ],
        "windows": [[int(periods.start[k]), int(periods.end[k])] for k in stalled[:MAX_WINDOWS]],
    }


def _worst_windows(periods: DecodePeriods, per_period: np.ndarray) -> list[list[int]]:
    order = np.argsort(-per_period)[:MAX_WINDOWS]
    return [[int(periods.start[k]), int(periods.end[k])] for k in order if per_period[k] > 0]


def _metrics(where: tuple, numbers: dict) -> list[Metric]:
    trace, rank, device = where

    def ms(key: str) -> float | None:
        return None if numbers.get(key) is None else round(numbers[key] / 1e6, 6)

    total = numbers.get("total_ns")
    values = (
        ("decode_iterations", numbers["decode_iterations"], "count"),
        ("decode_iter_ms_median", ms("median_ns"), "ms"),
        ("decode_iter_ms_p90", ms("p90_ns"), "ms"),
        ("decode_iter_ms_max", ms("max_ns"), "ms"),
        ("decode_gpu_busy_pct", pct(numbers["decode_busy_ns"], total) if total else None, "%"),
        ("prefill_iterations", numbers["prefill_iterations"], "count"),
        ("prefill_ms_median", ms("prefill_ns_median"), "ms"),
        ("tokens_per_s", numbers.get("tokens_per_s"), "tokens/s"),
    )
    return [Metric(trace, rank, device, name, value, unit) for name, value, unit in values]


def _findings(where, its, periods, numbers, params) -> list[Finding]:
    out = [_iterations_finding(where, its, periods, numbers)]
    if periods is None:
        return out
    for write in (_launch_finding, _host_finding, _prefill_finding, _comm_finding, _kv_finding):
        finding = write(where, numbers, params)
        if finding is not None:
            out.append(finding)
    return out


def _finding(
    where, severity, key, title, detail, recommendation, impact, evidence, windows, saving=None
):
    trace, rank, device = where
    return Finding(
        analyzer="inference",
        trace=trace,
        rank=rank,
        device=device,
        severity=severity,
        title=title,
        detail=detail,
        recommendation=recommendation,
        impact_ns=int(impact),
        evidence={"key": key, **evidence},
        windows=windows,
        saving_ns=saving,
    )


def _profiler_caveat(numbers: dict) -> str:
    return (
        f"The trace shows the profiled speed: {numbers['median_ns'] / 1e6:.2f} ms per token. A profiler slows "
        "host-bound loops (it records every operator and API call, and CUPTI lengthens each launch), so the "
        f"unprofiled period lies between the GPU time per token ({numbers['gpu_floor_ns'] / 1e6:.2f} ms) and "
        "that; time a token unprofiled (torch.cuda.Event or perf_counter around synchronized iterations) to "
        "know it."
    )


def _launch_finding(where, numbers, params) -> Finding | None:
    """The GPU waits for the host to issue each decode iteration kernel by kernel."""
    calls, issue = numbers["decode_launch_call_ns"], numbers["decode_issue_ns"]
    waited = calls + issue
    share = pct(waited, numbers["total_ns"])
    severity = graded_severity(share, waited, params)
    if severity is None:
        return None
    per_token = waited / max(numbers["periods"], 1)
    busy = pct(numbers["decode_busy_ns"], numbers["total_ns"])
    return _finding(
        where,
        severity,
        "launch_bound",
        f"Decode is launch-bound: the GPU waits {share:.0f}% of each token for the host to launch kernels",
        (
            f"{numbers['periods']} decode periods, median {numbers['median_ns'] / 1e6:.2f} ms per token; the GPU "
            f"computes {numbers['gpu_floor_ns'] / 1e6:.2f} ms of it (busy {busy:.1f}%) and waits "
            f"{per_token / 1e6:.2f} ms per token while the host issues the iteration's kernels one by one: "
            f"{calls / 1e6:.1f} ms in launch calls and the operators that made them, {issue / 1e6:.1f} ms in "
            "the step's other operators and Python between them. "
            + _profiler_caveat(numbers)
            + " launch_overhead and gpu_idle report the same GPU time over the whole span (launch wait, and "
            "other host work for the rest)."
        ),
        (
            "Replay the decode step as a CUDA graph: torch.compile(mode='reduce-overhead'), or torch.cuda.CUDAGraph "
            "around a static-shape step (static KV cache, fixed batch slots); in vLLM/SGLang keep CUDA graphs on "
            "(no enforce_eager / --disable-cuda-graph) and make the graph capture sizes cover the running batch "
            "sizes. Then the period approaches the GPU time per token."
        ),
        waited,
        {
            "periods": numbers["periods"],
            "median_period_ns": int(numbers["median_ns"]),
            "gpu_ns_per_token": int(numbers["gpu_floor_ns"]),
            "launch_wait_ns_per_token": int(per_token),
            "launch_call_ns": calls,
            "issue_ns": issue,
            "share_of_decode_pct": share,
            "note": "profiled speed; the unprofiled saving is not measurable from this trace",
        },
        numbers["launch_windows"],
    )


def _host_finding(where, numbers, params) -> Finding | None:
    """Host work between decode iterations (syncs, scheduling, Python) that leaves the GPU idle."""
    host = numbers["host"]
    share = pct(host["total_ns"], numbers["total_ns"])
    severity = graded_severity(share, host["total_ns"], params)
    if severity is None:
        return None
    ranges = (
        ", ".join(f"`{r['name']}` {r['idle_ns'] / 1e6:.1f} ms" for r in host["ranges"])
        or "no user range"
    )
    calls = host["sync_calls_per_token"]
    cause = _host_cause(host)
    return _finding(
        where,
        severity,
        "host_overhead",
        f"Host work between decode iterations idles the GPU {host['per_token_ns'] / 1e6:.2f} ms per token: {cause}",
        (
            f"Between consecutive decode iterations the GPU sat idle {host['total_ns'] / 1e6:.1f} ms "
            f"({share:.0f}% of the decode time) while the host ran: synchronizing reads {host['sync_ns'] / 1e6:.1f} ms "
            f"({calls:.0f} sync calls per token, e.g. .item()/.cpu() on the sampled tokens), other host work "
            f"{host['cpu_ns'] / 1e6:.1f} ms (Python, scheduler, input preparation), nothing recorded "
            f"{host['unknown_ns'] / 1e6:.1f} ms. Charged to the user ranges that hold it: {ranges}. "
            f"Median {host['per_token_ns'] / 1e6:.2f} ms per token (periods that cross a profiler step left out); "
            f"over the trace's {numbers['decode_iterations']} decode iterations about {host['estimate_ns'] / 1e6:.1f} ms. "
            f"Graph-launch time ({host['graph_launch_ns'] / 1e6:.1f} ms, inflated by CUPTI) is not counted. The "
            "profiler adds a little to each recorded call, so the unprofiled cost is somewhat lower."
        ),
        (
            "Keep the sampled tokens on the GPU and read them back once per iteration with one non_blocking copy "
            "into pinned memory (or every few iterations), not with per-sequence .item()/.cpu(); move scheduling, "
            "detokenization and input preparation off the critical path: overlap them with the GPU's next "
            "iteration (vLLM async scheduling, SGLang's overlap scheduler), so the host prepares iteration i+1 "
            "while the GPU runs iteration i."
        ),
        host["total_ns"],
        {
            "per_token_ns": int(host["per_token_ns"]),
            "sync_ns": host["sync_ns"],
            "cpu_ns": host["cpu_ns"],
            "unknown_ns": host["unknown_ns"],
            "graph_launch_ns": host["graph_launch_ns"],
            "sync_calls_per_token": calls,
            "ranges": host["ranges"],
            "share_of_decode_pct": share,
        },
        host["worst"],
        saving=host["estimate_ns"],
    )


def _host_cause(host: dict) -> str:
    """One phrase naming the host cause, from the range that owns most of it."""
    top = host["ranges"][0]["name"] if host["ranges"] else None
    parts = []
    if host["sync_ns"] and host["sync_calls_per_token"] >= 1:
        parts.append(
            f"{host['sync_calls_per_token']:.0f} syncs per token (.item()/cudaStreamSynchronize)"
        )
    if host["cpu_ns"] >= host["sync_ns"]:
        parts.append("Python/CPU work")
    what = " and ".join(parts) or "unrecorded host time"
    return f"{what} in `{top}`" if top else what


def _prefill_finding(where, numbers, params) -> Finding | None:
    """Decode tokens stalled behind prefills run in the same loop."""
    stalls = numbers["stalls"]
    if not stalls["with_prefill"]:
        return None
    share = pct(stalls["excess_ns"], numbers["total_ns"])
    severity = graded_severity(share, stalls["excess_ns"], params)
    if severity is None:
        return None
    names = "; ".join(
        f"`{p['name']}` ({p['gpu_ns'] / 1e6:.2f} ms GPU)" for p in stalls["prefills"][:5]
    )
    return _finding(
        where,
        severity,
        "prefill_interference",
        f"Prefills stall decode: {stalls['count']} of {numbers['periods']} tokens waited "
        f"{numbers['max_ns'] / 1e6:.1f} ms (max) against a {numbers['median_ns'] / 1e6:.2f} ms median",
        (
            f"Time per output token: median {numbers['median_ns'] / 1e6:.2f} ms, p90 {numbers['p90_ns'] / 1e6:.2f} ms, "
            f"p99 {numbers['p99_ns'] / 1e6:.2f} ms, max {numbers['max_ns'] / 1e6:.2f} ms. {stalls['count']} periods "
            f"took at least {params['stall_over_median']:g}x the median, {stalls['with_prefill']} of them with a prefill "
            f"on the GPU ({stalls['prefill_ns'] / 1e6:.1f} ms of prefill work): {names}. Those tokens waited "
            f"{stalls['excess_ns'] / 1e6:.1f} ms more than a median token, every sequence in the batch at once. "
            f"Of that, {stalls['launch_wait_ns'] / 1e6:.1f} ms is the GPU waiting for the prefills' own kernel "
            "launches, which the profiler lengthens; without it the prefills cost about "
            f"{stalls['estimate_ns'] / 1e6:.1f} ms."
        ),
        (
            "Bound the prefill work per iteration: chunked prefill with a token budget per iteration (vLLM "
            "enable_chunked_prefill / max_num_batched_tokens, SGLang --chunked-prefill-size) so a long prompt is "
            "split across iterations beside the decodes; or separate prefill from decode (prefill-decode "
            "disaggregation) when the time-per-token target is tight."
        ),
        stalls["excess_ns"],
        {
            "stalled_tokens": stalls["count"],
            "with_prefill": stalls["with_prefill"],
            "median_period_ns": int(numbers["median_ns"]),
            "p99_period_ns": int(numbers["p99_ns"]),
            "max_period_ns": numbers["max_ns"],
            "launch_wait_ns": stalls["launch_wait_ns"],
            "prefills": stalls["prefills"],
        },
        stalls["windows"],
        saving=stalls["estimate_ns"],
    )


def _comm_finding(where, numbers, params) -> Finding | None:
    """Tensor-parallel communication that no compute overlaps, per token."""
    exposed = numbers["comm_ns"]
    share = pct(exposed, numbers["total_ns"])
    severity = graded_severity(share, exposed, params)
    if severity is None:
        return None
    return _finding(
        where,
        severity,
        "tp_comm",
        f"Tensor-parallel communication exposed: {exposed / max(numbers['periods'], 1) / 1e3:.0f} µs per token",
        (
            f"Communication kernels ran {exposed / 1e6:.2f} ms ({share:.0f}% of the decode time) with no compute "
            "beside them, on the critical path of every token."
        ),
        (
            "For small decode all-reduces use a custom one-shot/two-shot all-reduce over NVLink (vLLM's custom "
            "all-reduce or symmetric memory, SGLang's custom all-reduce) rather than NCCL ring kernels, keep them "
            "inside the CUDA graph, and check that the tensor-parallel size is not larger than the model needs."
        ),
        exposed,
        {"exposed_comm_ns": exposed, "share_of_decode_pct": share},
        [],
    )


def _kv_finding(where, numbers, params) -> Finding | None:
    """Large host<->device copies (KV-cache swaps or offload) on the decode timeline."""
    copied = numbers["kv_copy_ns"]
    share = pct(copied, numbers["total_ns"])
    severity = graded_severity(share, copied, params)
    if severity is None:
        return None
    return _finding(
        where,
        severity,
        "kv_copies",
        f"KV-cache copies on the decode path: {copied / 1e6:.1f} ms of host<->device copies",
        (
            f"Copies of 1 MiB or more between host and device took {copied / 1e6:.2f} ms ({share:.0f}% of the "
            "decode time) with no kernel beside them: KV blocks swapped or offloaded while tokens waited."
        ),
        (
            "Give the KV cache more GPU memory (gpu_memory_utilization, a smaller max_num_seqs) so the engine "
            "preempts and swaps less, prefer recomputation over swapping for short sequences, and overlap "
            "offload copies on a side stream with pinned buffers."
        ),
        copied,
        {"kv_copy_ns": copied, "share_of_decode_pct": share},
        [],
    )


def _source_text(its: Iterations, numbers: dict) -> str:
    """How the iterations were found, in words (the names shown are the first few distinct)."""
    names = ", ".join(sorted(set(n[:60] for n in its.names)))[:300]
    if its.source == "shapes":
        return (
            f"Iterations found from input shapes (no iteration range in the trace): each call of the "
            f"token embedding (aten::embedding) starts a model forward, and its indices' shape gives "
            f"batch and tokens ({names}; [batch, 1] is a decode, [batch, seq] a prefill)."
        )
    if its.source == "option":
        return f"Iterations are the host ranges matching the iteration range `{numbers.get('iteration_range')}` ({names})."
    return f"Iterations found from {its.source} ranges ({names})."


def _iterations_finding(where, its: Iterations, periods, numbers) -> Finding:
    """The iteration table (info): for the Inference page and the report."""
    count = {
        phase: int(its.of_phase(phase).size) for phase in ("prefill", "decode", "mixed", "unknown")
    }
    median = numbers.get("median_ns")
    tpot = f", time per output token median {median / 1e6:.2f} ms" if median else ""
    host = numbers.get("host_period_ns_median")
    ahead = (
        f" The host started a decode iteration every {host / 1e6:.2f} ms (median): it ran ahead of the "
        "GPU, so its period is not the time per token."
        if median and host and host < 0.8 * median
        else ""
    )
    return _finding(
        where,
        "info",
        "iterations",
        f"Inference: {count['decode']} decode and {count['prefill'] + count['mixed']} prefill/mixed iterations{tpot}",
        (
            _source_text(its, numbers)
            + " A decode period runs from the GPU completion of one decode "
            "iteration to the next: the batch's time per output token." + ahead
        ),
        "Use the per-iteration table (Inference page) to see what each slow token waited for.",
        0,
        {
            "source": its.source,
            "iteration_range": numbers.get("iteration_range"),
            "phases": count,
            "host_period_ns_median": None if host is None else int(host),
            "iterations": _rows(its, periods),
        },
        [],
    )


def iteration_rows(
    where: tuple, its: Iterations, periods: DecodePeriods | None
) -> list[IterationRow]:
    """The device's rows of the report's ``iterations`` table (the same as the
    ``iterations`` finding's evidence)."""
    trace, rank, device = where
    return [
        IterationRow(trace=trace, rank=rank, device=device, **row) for row in _rows(its, periods)
    ]


def _rows(its: Iterations, periods: DecodePeriods | None) -> list[dict]:
    """One row per iteration (capped): phase, windows, and for decode its period and its idle causes."""
    by_iteration = {}
    if periods is not None:
        for k, index in enumerate(periods.iteration.tolist()):
            row = {"period_ns": int(periods.period_ns[k]), "prefill_ns": int(periods.prefill_ns[k])}
            row.update({f"idle_{c}_ns": int(v[k]) for c, v in periods.idle.items()})
            by_iteration[index] = row
    rows = []
    for i in range(min(len(its), MAX_ROWS)):
        row = {
            "index": i,
            "phase": its.phases[i],
            "name": its.names[i][:120],
            "tokens": int(its.tokens[i]),
            "batch": int(its.batch[i]),
            "host_start_ns": int(its.host_start[i]),
            "host_end_ns": int(its.host_end[i]),
            "gpu_start_ns": int(its.gpu_start[i]),
            "gpu_end_ns": int(its.gpu_end[i]),
            "gpu_busy_ns": int(its.gpu_busy[i]),
        }
        row.update(by_iteration.get(i, {}))
        rows.append(row)
    return rows


SPEC = AnalyzerSpec(
    id="inference",
    order=50,
    per_rank=True,
    title="Inference serving: prefill, decode, time per output token",
    description="Prefill/decode iterations, time per output token, and what holds the decode loop back.",
    run=run,
    thresholds=THRESHOLDS,
)
