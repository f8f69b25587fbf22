"""The realistic one-GPU H200 samples (tools/capture/realistic_1gpu.py) against their truth.

Nine Kineto traces of a 270M-parameter GPT-like decoder (training and KV-cache decode,
clean and faulty variants) and one nsys export. Each truth file holds unprofiled,
interleaved step timings (the ground truth of each fault's saving) and a plain reading
of its own trace (``trace_readback``: ProfilerStep windows and GPU busy share).

These tests check only what stallscope already gets right: step times, GPU busy
share, step identity, and the counted facts of the planted faults. The savings and
causes that it still gets wrong are listed in sample_traces/README.md, not encoded here.
"""

from __future__ import annotations

import json

import pytest

from stallscope.analyzers.base import SEVERITY_RANK
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.report import analyze_job
from stallscope.store import Store
from tests.conftest import SAMPLES

pytestmark = pytest.mark.slow

KINETO = SAMPLES / "kineto"
NSYS = SAMPLES / "nsys" / "train_pageable_d2h.sqlite.gz"
TRAIN = [
    "train_baseline",
    "train_pageable_d2h",
    "train_cuda_graph",
    "train_small_eager",
    "train_small_graph",
]
DECODE = ["decode_eager", "decode_graph", "decode_graph_item_python", "decode_prefill_interference"]
REALISTIC = TRAIN + DECODE
CLEAN = ["train_baseline", "train_cuda_graph", "train_small_graph", "decode_graph"]
MiB = 1024 * 1024


def truth(scenario: str) -> dict:
    return json.loads((KINETO / scenario / f"{scenario}.truth.json").read_text())


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """{name: (result, truth)} for the nine Kineto samples and the nsys one ("nsys")."""
    store = Store(tmp_path_factory.mktemp("realistic") / "store").ensure()
    paths = {s: KINETO / s / f"{s}.pt.trace.json.gz" for s in REALISTIC}
    paths["nsys"] = NSYS
    truths = {s: truth(s) for s in REALISTIC}
    truths["nsys"] = json.loads((SAMPLES / "nsys" / "train_pageable_d2h.truth.json").read_text())
    out, jobs = {}, []
    for name, path in paths.items():
        (res,) = ingest_paths(store, [str(path)])
        job = JobData(store, store.traces(res.job_id))
        jobs.append(job)
        out[name] = (analyze_job(job), truths[name])
    yield out
    for job in jobs:
        job.close()


def metric(result, name: str):
    values = [m.value for m in result.metrics if m.name == name and m.rank == 0]
    assert values, name
    return values[0]


def findings(result, analyzer: str, floor: str = "info") -> list:
    return [
        f
        for f in result.findings
        if f.analyzer == analyzer and SEVERITY_RANK[f.severity] >= SEVERITY_RANK[floor]
    ]


def step_rows(result) -> list[dict]:
    (table,) = [f for f in findings(result, "step_breakdown") if f.evidence.get("key") == "table"]
    return table.evidence["steps"]


def test_the_realistic_samples_are_present():
    for s in REALISTIC:
        assert (KINETO / s / f"{s}.pt.trace.json.gz").is_file(), s
    assert NSYS.is_file()


@pytest.mark.parametrize("scenario", REALISTIC)
def test_step_time_and_gpu_busy_match_the_trace_truth(analyzed, scenario):
    result, t = analyzed[scenario]
    readback = t["trace_readback"]
    step_ns = metric(result, "step_time_ms_median") * 1e6
    assert step_ns == pytest.approx(readback["step_dur_ns_median"], rel=0.10)
    assert metric(result, "gpu_busy_pct") == pytest.approx(
        readback["gpu_busy_pct_over_steps"], abs=2.0
    )
    profiled = [f"ProfilerStep#{r['step']}" for r in step_rows(result)]
    assert profiled == t["capture"]["profiled_steps"]  # trimmed traces keep fewer


@pytest.mark.parametrize("scenario", CLEAN)
def test_clean_runs_keep_the_gpu_busy(analyzed, scenario):
    result, t = analyzed[scenario]
    assert t["trace_readback"]["gpu_busy_pct_over_steps"] >= 70
    assert metric(result, "gpu_busy_pct") >= 70


def test_truth_savings_are_the_difference_of_the_measured_medians(analyzed):
    for scenario in REALISTIC:
        _, t = analyzed[scenario]
        saving = t.get("expected_saving")
        if not saving or "saving_ns_per_prefill_step" in saving:
            continue  # the bimodal prefill case is checked below
        clean = truth(saving["clean_reference"])["measured"]["step_wall_ns"]["median_ns"]
        faulty = t["measured"]["step_wall_ns"]["median_ns"]
        steps = len(t["capture"]["profiled_steps"])
        assert saving["saving_ns_per_step"] == faulty - clean, scenario
        assert saving["saving_ns_over_profiled_steps"] == (faulty - clean) * steps, scenario


def test_pageable_d2h_copy_is_found_with_its_bytes(analyzed):
    result, t = analyzed["train_pageable_d2h"]
    planted = t["planted"][0]
    steps = len(t["capture"]["profiled_steps"])
    (finding,) = [f for f in findings(result, "memcpy") if f.evidence["key"] == "d2h_in_step"]
    assert finding.evidence["pageable"] == steps  # one planted .cpu() per step
    (site,) = [c for c in finding.evidence["call_sites"] if c["call_site"].startswith("aten::to")]
    assert site["bytes"] == planted["bytes_per_step"] * steps == 32 * MiB * steps
    assert site["count"] == steps


def test_the_clean_baseline_has_no_pageable_copy(analyzed):
    result, _ = analyzed["train_baseline"]
    assert all(f.evidence.get("pageable", 0) == 0 for f in findings(result, "memcpy"))


@pytest.mark.parametrize(
    "scenario, launches_per_step",
    [
        ("train_cuda_graph", 1),
        ("train_small_graph", 1),
        ("decode_graph", 8),
        ("decode_graph_item_python", 8),
        ("decode_prefill_interference", 8),
    ],
)
def test_graph_replays_are_counted(analyzed, scenario, launches_per_step):
    result, t = analyzed[scenario]
    steps = len(t["capture"]["profiled_steps"])
    assert metric(result, "graph_launch_count") == launches_per_step * steps
    assert metric(result, "launch_overhead_pct") < 3


@pytest.mark.parametrize("scenario", ["decode_eager", "train_small_eager"])
def test_eager_launch_bound_variants_are_launch_overhead(analyzed, scenario):
    result, _ = analyzed[scenario]
    assert findings(result, "launch_overhead", floor="high")


def measured_graph_saving(t: dict) -> int:
    """The truth file's unprofiled eager - graph step difference over the profiled steps."""
    block = t.get("saving_if_cuda_graphed") or t["expected_saving"]
    return block["saving_ns_over_profiled_steps"]


@pytest.mark.parametrize("scenario", ["train_small_eager", "train_baseline", "decode_eager"])
def test_the_cuda_graph_saving_is_within_20_percent_of_the_measured_one(analyzed, scenario):
    """saving_if_cuda_graphed: unprofiled eager step - graph-replay step, over the profiled steps.
    Before the profiler's per-event cost was taken out, train_baseline's was +99 %; before the
    host-work model, decode_eager's was +48 % (inner-gap pace) and +348 % (per-call cost only)."""
    result, t = analyzed[scenario]
    (finding,) = [f for f in findings(result, "launch_overhead") if f.saving_ns is not None]
    measured = measured_graph_saving(t)
    assert 0.8 * measured <= finding.saving_ns <= 1.2 * measured, (finding.saving_ns, measured)


def test_decode_eager_saving_takes_out_the_slowed_host_and_says_so(analyzed):
    """The profiler slowed decode_eager's whole host (~8 µs per recorded call, not 2.2): its
    launching threads were busy about 2.2 times what the host-work model and the per-call cost
    explain; the per-call-only figure stays an upper end, and the detail says the trace cannot
    tell a profiler-slowed host from a slower CPU."""
    result, t = analyzed["decode_eager"]
    (finding,) = [f for f in findings(result, "launch_overhead") if f.saving_ns is not None]
    measured = measured_graph_saving(t)
    assert finding.evidence["host_slowdown"] > 1.5
    assert finding.evidence["saving_upper_ns"] > 4 * measured  # the per-call cost alone
    assert "cannot tell which" in finding.detail


def test_a_gpu_bound_step_keeps_the_per_call_cost(analyzed):
    """train_baseline (GPU 82 % busy): the launch-path idle is under HOST_BOUND_SHARE of the span,
    so the host-work model is not applied there (slowdown 1)."""
    result, _ = analyzed["train_baseline"]
    (finding,) = [f for f in findings(result, "launch_overhead") if f.saving_ns is not None]
    assert finding.evidence["host_slowdown"] == 1.0
    assert finding.saving_ns == finding.evidence["saving_upper_ns"]


def test_item_reads_of_the_decode_loop_are_counted(analyzed):
    result, t = analyzed["decode_graph_item_python"]
    reads = t["planted"][0]["count_per_step"] * len(t["capture"]["profiled_steps"])
    (finding,) = findings(result, "host_sync", floor="low")
    assert finding.evidence["item_calls"] == reads == 16 * 8 * 5


def test_prefill_steps_are_the_slow_ones(analyzed):
    result, t = analyzed["decode_prefill_interference"]
    (jitter,) = [f for f in findings(result, "step_breakdown") if f.evidence["key"] == "jitter"]
    median = jitter.evidence["median_ns"]
    slow = [
        f"ProfilerStep#{r['step']}"
        for r in jitter.evidence["steps"]
        if r["step_ms"] * 1e6 > 1.5 * median
    ]
    assert slow == t["planted"][0]["profiled_steps_with_prefill"]
    # the extra time of the slow steps is the prefill's unprofiled cost, within 15 %
    saving = t["expected_saving"]
    assert jitter.impact_ns == pytest.approx(saving["saving_ns_over_profiled_steps"], rel=0.15)


def test_nsys_pageable_sample(analyzed):
    result, t = analyzed["nsys"]
    rows = step_rows(result)
    assert len(rows) == len(t["capture"]["profiled_steps"]) == 6
    step_ns = metric(result, "step_time_ms_median") * 1e6
    assert step_ns == pytest.approx(t["measured"]["step_wall_ns_under_nsys"]["median_ns"], rel=0.10)
    (finding,) = [f for f in findings(result, "memcpy") if f.evidence["key"] == "d2h_in_step"]
    assert finding.evidence["pageable"] == 6
    assert 6 * 32 * MiB <= finding.evidence["bytes"] < 6 * 32 * MiB + 4096
