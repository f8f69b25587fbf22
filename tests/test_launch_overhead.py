"""launch_overhead on a launch-bound loop whose numbers are known by hand."""

from __future__ import annotations

import numpy as np

from stallscope.analyzers import launch_overhead
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace


def tiny_kernel_loop(n: int = 100, driver_every: int = 4) -> KinetoTrace:
    """Op i (launching) at [10i, 10i+8) µs; its launch call [10i+2, 10i+7); kernel [10i+7.5, 10i+9.5).

    Gaps between kernels: 8 µs each (99 gaps). In each, the host is in unrecorded
    Python for 0.5 µs ([10i+9.5, 10i+10): a sliver, counted as launch time) and then
    inside the next launching op for 7.5 µs: the whole gap waits for the launch.
    Every 4th launch goes through the driver API (cuLaunchKernelEx, as Triton does).
    """
    t = KinetoTrace()
    for i in range(n):
        base = 10_000 * i
        t.cpu_op("aten::mul", base, 8_000, args={"External id": 1000 + i})
        driver = i % driver_every == 0
        t.runtime(
            "cuLaunchKernelEx" if driver else "cudaLaunchKernel",
            base + 2_000, 5_000, corr=5000 + i, ext=1000 + i, cat="cuda_driver" if driver else "cuda_runtime",
        )  # fmt: skip
        t.kernel("vectorized_elementwise_kernel", base + 7_500, 2_000, corr=5000 + i)
    return t


def run(store, tmp_path, **params):
    (res,) = ingest_paths(store, [str(tiny_kernel_loop().write(tmp_path / "tiny.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = launch_overhead.run(job, launch_overhead.SPEC.params(params))
    job.close()
    return result


def test_metrics_by_hand(store, tmp_path):
    result = run(store, tmp_path)
    m = {x.name: x.value for x in result.metrics}
    # span 7.5 .. 999.5 µs = 992 µs; waited for launches 99 x 8 µs = 792 µs
    assert m["launch_overhead_pct"] == round(100 * 792_000 / 992_000, 3)
    assert m["launch_count"] == 100 and m["graph_launch_count"] == 0
    assert m["short_kernel_pct"] == 100.0  # 2 µs kernels, 5 µs launch calls


def test_finding_with_gain_estimate(store, tmp_path):
    result = run(store, tmp_path, min_impact_ms=0)
    (f,) = result.findings
    assert f.severity == "critical"  # 79.8 % of the span
    assert f.title.startswith("GPU 0 starved by kernel launches")
    assert f.impact_ns == 792_000
    assert f.evidence["driver_launches"] == 25
    assert f.evidence["median_kernel_ns"] == 2_000 and f.evidence["median_launch_ns"] == 5_000
    # The profiler's cost (2.2 µs per recorded op or API call) comes out first: each
    # iteration records 2 (the op and its launch call), all 200 before the last gap ends and
    # no sync resets the host's lead, so 440 µs of the 792 µs wait is the profiler's; then one
    # replay of 10 µs (no step markers): 792 - 440 - 10 = 342 µs.
    assert f.evidence["host_idle_ns"] == 792_000  # no `cpu` idle: all of it waits for launches
    assert f.evidence["profiler_overhead_ns"] == 440_000
    assert f.evidence["estimated_gain_ns"] == f.saving_ns == 342_000
    assert "0.44 ms" in f.detail
    assert len(f.windows) == 20 and all(b - a == 8_000 for a, b in f.windows)


def test_without_profiler_cost_the_gain_is_the_wait_less_one_replay(store, tmp_path):
    result = run(store, tmp_path, min_impact_ms=0, profiler_event_us=0)
    (f,) = result.findings
    assert f.evidence["profiler_overhead_ns"] == 0
    assert f.saving_ns == 792_000 - 10_000


def test_profiler_share_by_hand():
    """Cost 10 ns per event. Gap A (end 10) takes the lead of events at 0 and 5 (20): 15 of it;
    the sync ending at 12 restarts the lead, so gap B (end 20) has only the event at 13's 10;
    gap C (end 30, a data-loader wait: counted 0) spends 8 of the event at 25's 10 without
    credit; gap D (end 40) has 2 + 10 and takes its 5."""
    from stallscope.launch_cost import profiler_share

    got = profiler_share(
        gap_ends=np.array([10, 20, 30, 40]),
        waits=np.array([15, 30, 0, 5]),
        consumes=np.array([15, 30, 8, 5]),
        event_starts=np.array([0, 5, 13, 25, 35]),
        sync_ends=np.array([12]),
        event_cost_ns=10,
    )
    assert got.tolist() == [15, 10, 0, 5]


def test_default_min_impact_keeps_tiny_traces_quiet(store, tmp_path):
    assert run(store, tmp_path).findings == []


def test_graph_launch_wait_is_kept_apart_as_info(store, tmp_path):
    """One cudaGraphLaunch [0,100) µs; its 10 kernels run [20+8i, 22+8i): 9 gaps of 6 µs inside the call."""
    t = KinetoTrace()
    t.runtime("cudaGraphLaunch", 0, 100_000, corr=900, ext=900)
    for i in range(10):
        t.kernel("graph_node_kernel", 20_000 + 8_000 * i, 2_000, corr=900)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "graph.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = launch_overhead.run(job, launch_overhead.SPEC.params({"min_impact_ms": 0}))
    job.close()
    m = {x.name: x.value for x in result.metrics}
    assert m["launch_overhead_pct"] == 0.0
    assert m["graph_launch_wait_pct"] == round(100 * 54_000 / 74_000, 3)
    assert m["graph_launch_count"] == 1 and m["short_kernel_pct"] == 0.0
    (f,) = result.findings
    assert (f.severity, f.impact_ns, f.evidence["key"]) == ("info", 54_000, "graph")
