"""hotspots and launch_overhead count only GPU work launched inside the steps.

Nsight Systems captures the whole run: set-up copies and weight broadcasts
before the first step must not be measured (stallscope.scope). Without step
ranges the whole trace is measured.
"""

from __future__ import annotations

import pytest

from stallscope.analyzers import hotspots, launch_overhead
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import REPO
from tests.nsys_builder import NsysBuilder

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
ADD = "void at::native::vectorized_elementwise_kernel<4, add>(int)"


def setup_then_steps(steps: bool = True) -> NsysBuilder:
    """One process, GPU 0, times in ns.

    Set-up, launched before step 0 (5000 ns of GPU time):
      cudaMemcpyAsync [100, 200)   -> Memcpy HtoD            [300, 1300)    1000 ns
      cudaLaunchKernel [400, 450)  -> ncclDevKernel_Broadcast [1300, 5300)  4000 ns
    NVTX "step 0" [10_000, 20_000) and "step 1" [20_000, 30_000), each:
      cudaLaunchKernel [s+100, s+150) -> GEMM [s+200, s+500)  300 ns
      cudaLaunchKernel [s+200, s+250) -> add  [s+500, s+600)  100 ns
    After the steps: cudaMemcpyAsync [31_000, 31_050) -> Memcpy DtoH [31_100, 33_100) 2000 ns.

    In the steps: 800 ns, GEMM 600 (75 %), elementwise 200 (25 %), 4 launches.
    Whole trace: 7800 ns, communication 4000 (51.282 %), 7 operations, 5 kernel launches.
    """
    b = NsysBuilder("new")
    b.process(600, "python3", {600: "main"})
    b.gpu(0)
    b.api(600, 600, 100, 200, 1, "cudaMemcpyAsync_v3020")
    b.memcpy(600, 0, 7, 300, 1300, 1, 1 << 20, "HTOD", "PAGEABLE", "DEVICE")
    b.api(600, 600, 400, 450, 2, "cudaLaunchKernel_v7000")
    b.kernel(600, 0, 8, 1300, 5300, 2, "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage)")
    corr = 3
    for step, s in enumerate((10_000, 20_000)):
        if steps:
            b.nvtx(600, 600, s, s + 10_000, f"step {step}")
        for offset, (name, start, end) in enumerate(((GEMM, 200, 500), (ADD, 500, 600))):
            call = s + 100 + 100 * offset
            b.api(600, 600, call, call + 50, corr, "cudaLaunchKernel_v7000")
            b.kernel(600, 0, 7, s + start, s + end, corr, name)
            corr += 1
    b.api(600, 600, 31_000, 31_050, corr, "cudaMemcpyAsync_v3020")
    b.memcpy(600, 0, 7, 31_100, 33_100, corr, 1 << 21, "DTOH", "DEVICE", "PAGEABLE")
    return b


def analyze(store, path, module, **params):
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    result = module.run(job, module.SPEC.params(params))
    job.close()
    return result


@pytest.mark.parametrize("steps", [True, False])
def test_hotspots_leaves_out_setup_work(store, tmp_path, steps):
    result = analyze(store, setup_then_steps(steps).write(tmp_path / "t.sqlite"), hotspots)
    metrics = {m.name: m.value for m in result.metrics}
    (f,) = result.findings
    top = f.evidence["top_kernels"][0]
    if steps:
        assert metrics["gpu_time_pct_gemm"] == 75.0
        assert metrics["gpu_time_pct_elementwise"] == 25.0
        assert metrics["gpu_time_pct_communication"] == 0.0
        assert metrics["gpu_time_pct_memory"] == 0.0
        row = (top["name"], top["count"], top["total_ns"], top["share_pct"])
        assert row == (GEMM, 2, 600, 75.0)
        assert all(10_000 <= a < b <= 30_000 for a, b in f.windows)
    else:  # no steps: the whole trace
        assert metrics["gpu_time_pct_communication"] == round(100 * 4000 / 7800, 3)
        assert metrics["gpu_time_pct_memory"] == round(100 * 3000 / 7800, 3)
        assert top["name"].startswith("ncclDevKernel_Broadcast") and top["share_pct"] == 83.333


@pytest.mark.parametrize("steps, launches", [(True, 4), (False, 5)])
def test_launch_overhead_counts_launches_in_steps(store, tmp_path, steps, launches):
    path = setup_then_steps(steps).write(tmp_path / "t.sqlite")
    result = analyze(store, path, launch_overhead)
    metrics = {m.name: m.value for m in result.metrics}
    assert metrics["launch_count"] == launches


def test_nsys_tiny_kernels_sample_has_2000_launches_per_step(store):
    """The whole-run nsys capture also holds warm-up steps; only the 4 NVTX steps count."""
    path = REPO / "sample_traces" / "nsys" / "tiny_kernels.sqlite.gz"
    result = analyze(store, path, launch_overhead)
    (f,) = [f for f in result.findings if f.evidence.get("key") != "graph"]
    assert f.evidence["steps"] == 4
    assert f.evidence["launches"] == 2000 * 4 and f.evidence["kernels"] == 2000 * 4
    assert "2000 per step" in f.detail
