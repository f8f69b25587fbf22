"""launch_overhead on a launch-bound loop whose numbers are known by hand."""

from __future__ import annotations

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
    assert (
        f.evidence["estimated_gain_ns"] == 792_000 - 10_000
    )  # one replay of 10 µs (no step markers)
    assert len(f.windows) == 20 and all(b - a == 8_000 for a, b in f.windows)


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
