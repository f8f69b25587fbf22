"""host_sync on traces whose answers are worked out by hand, plus the real samples and corpus."""

from __future__ import annotations

import numpy as np
import pytest

from stallscope import host_ops
from stallscope.analyzers import host_sync
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, REPO
from tests.kineto_builder import KinetoTrace, linked_sync


def _run(store, tmp_path, trace: KinetoTrace, **overrides):
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = host_sync.run(job, host_sync.SPEC.params(overrides))
    calls = host_sync.blocking_calls(job, job.traces[0].trace_id)
    job.close()
    metrics = {(m.device, m.name): m.value for m in result.metrics}
    return metrics, result.findings, calls


def item_trace() -> KinetoTrace:
    """One .item() that drains the GPU, in ns (one thread, GPU 0, one ProfilerStep [0, 200 µs)):

    aten::mm  [0, 10k)      launches gemm                      GPU [5k, 105k)
    aten::item [12k, 110k) > aten::_local_scalar_dense [12.5k, 109.5k):
        cudaMemcpyAsync [13k, 14k)  DtoH into pinned memory     GPU [105k, 106k)  (not blocking)
        cudaStreamSynchronize [14.5k, 108k) + 'Stream Sync'     GPU [105k, 108k)
    aten::add [130k, 140k)  launches an elementwise kernel     GPU [135k, 145k)
    cudaStreamWaitEvent [141k, 142k)                           (a GPU-side wait: not a host sync)
    cudaDeviceSynchronize [150k, 150.5k), outside any operator, after the last GPU work

    The only idle gap is [106k, 135k) = 29 µs. It opens while cudaStreamSynchronize
    blocks (it drained the queue) and closes after it returned, so it is charged
    min(29 µs, host time blocked from 14.5k to 135k = 93.5 µs) = 29 µs.
    Span = 145k - 5k = 140k, so the share is 20.714 %.
    """
    t = KinetoTrace()
    t.step(0, 0, 200_000)
    t.cpu_op("aten::mm", 0, 10_000)
    t.runtime("cudaLaunchKernel", 1_000, 1_000, corr=t.kernel("gemm", 5_000, 100_000))
    t.cpu_op("aten::item", 12_000, 98_000)
    t.cpu_op("aten::_local_scalar_dense", 12_500, 97_000)
    copy = t.memcpy("DtoH", "Device", "Pinned", 105_000, 1_000, 4)
    t.runtime("cudaMemcpyAsync", 13_000, 1_000, corr=copy)
    linked_sync(t, "cudaStreamSynchronize", "Stream Sync", 14_500, 93_500, 105_000, 3_000)
    t.cpu_op("aten::add", 130_000, 10_000)
    kernel = t.kernel("vectorized_elementwise_kernel", 135_000, 10_000)
    t.runtime("cudaLaunchKernel", 131_000, 2_000, corr=kernel)
    t.runtime("cudaStreamWaitEvent", 141_000, 1_000)
    linked_sync(t, "cudaDeviceSynchronize", "Context Sync", 150_000, 500, 150_000, 500)
    return t


def test_item_sync_metrics_and_below_default_thresholds(store, tmp_path):
    metrics, findings, calls = _run(store, tmp_path, item_trace())
    assert sorted(calls["api"].tolist()) == ["cudaDeviceSynchronize", "cudaStreamSynchronize"]
    assert metrics[(None, "sync_count")] == 2
    assert metrics[(None, "sync_ns")] == 93_500 + 500
    assert metrics[(0, "sync_lost_ns")] == 29_000
    # 29 µs is below min_impact_ms (1 ms) and 2 syncs per step are below per_step_low (3)
    assert findings == []


def test_item_sync_finding(store, tmp_path):
    _, findings, _ = _run(store, tmp_path, item_trace(), min_impact_ms=0)
    (f,) = findings
    assert f.severity == "medium"  # 20.7 % of the span: >= 10 (medium), < 25 (high)
    assert f.impact_ns == 29_000
    assert f.windows == [[14_500, 135_000]]  # from the draining call's start to the GPU's restart
    ev = f.evidence
    assert ev["share_of_span_pct"] == pytest.approx(100 * 29_000 / 140_000, abs=1e-3)
    assert ev["blocking_calls"] == 2 and ev["blocked_ns"] == 94_000
    assert ev["calls_in_steps"] == 2 and ev["calls_per_step"] == 2.0
    assert ev["item_calls"] == 1
    assert ev["gpu_sync_events"] == {
        "context_sync": {"count": 1, "ns": 500},
        "stream_sync": {"count": 1, "ns": 3_000},
    }
    assert ev["call_sites"] == [
        {
            "call_site": "aten::item > aten::_local_scalar_dense",
            "count": 1,
            "blocked_ns": 93_500,
            "gpu_lost_ns": 29_000,
        },
        {
            "call_site": "cudaDeviceSynchronize (outside any operator)",
            "count": 1,
            "blocked_ns": 500,
            "gpu_lost_ns": 0,
        },
    ]
    assert ".item()" in f.recommendation and "torch.cuda.synchronize()" in f.recommendation


def test_gap_costs_by_hand():
    """Each gap against the calls, in ns (DRAIN_TOLERANCE_NS = 2 µs)."""
    calls = np.array(
        [
            [50_000, 150_000],  # A: drains gap [100k, 200k)
            [320_000, 330_000],  # B: starts inside gap [300k, 400k), already open
            [480_000, 600_000],  # C: gap [500k, 520k) opens and closes inside it
            [900_000, 1_010_000],  # D: drains gap [1000k, 5000k); host work after it
            [5_900_000, 6_000_000],  # E: GPU goes idle 1 µs after it returns (tolerance)
            [6_900_000, 7_000_000],  # F: GPU goes idle 3 µs after it returns
        ]
    )
    gaps = np.array(
        [
            [100_000, 200_000],
            [300_000, 400_000],
            [500_000, 520_000],
            [1_000_000, 5_000_000],
            [6_001_000, 6_100_000],
            [7_003_000, 7_100_000],
        ]
    )
    cost = host_sync.gap_costs(gaps[:, 0], gaps[:, 1], calls[:, 0], calls[:, 1])
    # A: min(100k gap, 100k blocked in [50k, 200k)); B, C: nothing; D: min(4000k, 110k blocked)
    # E: min(99k, 100k blocked in [5900k, 6100k)); F: not drained
    assert cost.lost.tolist() == [100_000, 0, 0, 110_000, 99_000, 0]
    assert cost.owner.tolist() == [0, -1, -1, 3, 4, -1]
    assert cost.window_start[[0, 3, 4]].tolist() == [50_000, 900_000, 5_900_000]
    # time inside graph-launch calls is taken off the gap: D keeps 4000k - 3990k = 10k
    launches = (np.array([1_005_000]), np.array([4_995_000]))
    cost = host_sync.gap_costs(gaps[:, 0], gaps[:, 1], calls[:, 0], calls[:, 1], launches)
    assert cost.lost.tolist() == [100_000, 0, 0, 10_000, 99_000, 0]


def copies_trace() -> KinetoTrace:
    """Which copy and sync calls block the host (runtime and driver API, CUDA and HIP names)."""
    t = KinetoTrace()
    t.kernel("k", 0, 1_000)

    def copy(api, kind, src, dst, nbytes, start, cat="cuda_runtime"):
        corr = t.memcpy(kind, src, dst, start + 500, 1_000, nbytes)
        t.runtime(api, start, 2_000, corr=corr, cat=cat)

    copy("hipMemcpyWithStream", "DtoH", "Device", "Host", 256, 10_000)  # synchronous: blocks
    copy("cudaMemcpy", "HtoD", "Pinned", "Device", 1024, 20_000)  # sync H2D <= 64 KiB: staged only
    copy("cudaMemcpy", "HtoD", "Pinned", "Device", 1 << 20, 30_000)  # sync H2D of 1 MiB: blocks
    copy("cudaMemcpyAsync", "DtoH", "Device", "Pageable", 64, 40_000)  # into pageable: blocks
    copy("cudaMemcpyAsync", "DtoH", "Device", "Pinned", 64, 50_000)  # into pinned: does not
    copy("cuMemcpyDtoH_v2", "DtoH", "Device", "Pageable", 64, 60_000, cat="cuda_driver")
    t.runtime("hipStreamSynchronize", 70_000, 1_000)
    t.runtime("cuStreamSynchronize", 80_000, 1_000, cat="cuda_driver")
    t.runtime("cudaStreamSynchronize_ptsz", 90_000, 1_000)
    t.runtime("cudaEventQuery", 100_000, 1_000)
    t.runtime("cudaStreamWaitEvent", 110_000, 1_000)
    t.kernel("k", 200_000, 1_000)
    return t


def test_which_calls_block(store, tmp_path):
    metrics, _, calls = _run(store, tmp_path, copies_trace())
    assert calls["api"].tolist() == [
        "hipMemcpyWithStream",
        "cudaMemcpy",
        "cudaMemcpyAsync",
        "cuMemcpyDtoH",
        "hipStreamSynchronize",
        "cuStreamSynchronize",
        "cudaStreamSynchronize",
    ]
    assert calls["bytes"][:4].tolist() == [256, 1 << 20, 64, 64]
    assert (calls["device"] == 0).all()  # one GPU: calls without a GPU row go to it
    assert metrics[(None, "sync_count")] == 7
    assert metrics[(None, "sync_ns")] == 4 * 2_000 + 3 * 1_000


def test_device_of_a_call_without_gpu_row(store, tmp_path):
    """On two GPUs, a sync with no GPU event belongs to the device its thread last launched on."""
    t = KinetoTrace()
    t.runtime("cudaLaunchKernel", 0, 1_000, corr=t.kernel("a", 2_000, 10_000, device=1), tid=100)
    t.runtime("cudaLaunchKernel", 0, 1_000, corr=t.kernel("b", 2_000, 10_000, device=0), tid=200)
    t.runtime("cudaDeviceSynchronize", 3_000, 9_500, tid=100)
    t.runtime("cudaStreamSynchronize", 4_000, 8_500, tid=200)
    _, _, calls = _run(store, tmp_path, t)
    assert dict(zip(calls["api"].tolist(), calls["device"].tolist(), strict=True)) == {
        "cudaDeviceSynchronize": 1,
        "cudaStreamSynchronize": 0,
    }


def test_many_syncs_per_step_make_a_low_finding(store, tmp_path):
    """3 steps of 1 ms, each with 3 syncs that drain the GPU:

    kernels [0, 200k) [230k, 400k) [430k, 600k) per step; syncs [10k, 201k) [260k, 401k)
    [460k, 601k). Lost per step: 30k + 30k, and for the gap to the next step (none after the
    last) only the 1k the sync still blocks: the 399k after it have no host activity recorded
    (gpu_idle's ``unknown``, not the sync's). Total 2 × 61k + 60k = 182k: under 1 ms,
    so only the per-step rule (>= 3 per step, share >= 1 %) applies -> low.
    """
    t = KinetoTrace()
    for step in range(3):
        base = step * 1_000_000
        t.step(step, base, 1_000_000)
        for k0, k1, s0, s1 in (
            (0, 200_000, 10_000, 201_000),
            (230_000, 400_000, 260_000, 401_000),
            (430_000, 600_000, 460_000, 601_000),
        ):
            t.kernel("gemm", base + k0, k1 - k0)
            t.runtime("cudaStreamSynchronize", base + s0, s1 - s0)
    metrics, findings, _ = _run(store, tmp_path, t)
    assert metrics[(0, "sync_lost_ns")] == 182_000
    (f,) = findings
    assert f.severity == "low"
    assert f.evidence["calls_per_step"] == 3.0
    assert f.impact_ns == 182_000
    assert len(f.windows) == 8


def test_only_gaps_inside_the_steps_count(store, tmp_path):
    """A sync that drains the GPU during setup, before the first step, costs nothing here."""
    t = KinetoTrace()
    t.kernel("setup", 0, 100_000)
    t.runtime("cudaDeviceSynchronize", 10_000, 91_000)  # drains gap [100k, 200k): before the step
    t.step(0, 150_000, 1_000_000)
    t.kernel("gemm", 200_000, 300_000)
    t.runtime("cudaStreamSynchronize", 210_000, 291_000)  # drains gap [500k, 540k)
    t.kernel("gemm", 540_000, 400_000)
    metrics, _, _ = _run(store, tmp_path, t)
    assert metrics[(0, "sync_lost_ns")] == 40_000


def test_enclosing_ops_innermost_and_outermost(store, tmp_path):
    """Nested operators on two threads; calls inside, between and outside them."""
    t = KinetoTrace()
    t.cpu_op("outer", 0, 100_000)
    t.cpu_op("mid", 10_000, 50_000)
    t.cpu_op("leaf_done", 12_000, 1_000)  # a finished sibling before the call
    t.cpu_op("leaf", 20_000, 10_000)
    t.cpu_op("other_thread", 0, 100_000, tid=200)
    t.kernel("k", 0, 1_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    stack = host_ops.op_stack(job, trace)
    pid = np.array([100, 100, 100, 100, 100, 100])
    tid = np.array([100, 100, 100, 100, 200, 300])
    start = np.array([21_000, 14_000, 70_000, 150_000, 5_000, 5_000])
    end = np.array([22_000, 15_000, 71_000, 151_000, 6_000, 6_000])
    inner, outer = host_ops.enclosing_ops(stack, pid, tid, start, end)
    names = host_ops.name_lookup(job, trace, stack.name_id)
    label = [names[int(stack.name_id[i])] if i >= 0 else None for i in inner]
    assert label == ["leaf", "mid", "outer", None, "other_thread", None]
    top = [names[int(stack.name_id[i])] if i >= 0 else None for i in outer]
    assert top == ["outer", "outer", "outer", None, "other_thread", None]
    job.close()


# --- the real H200 samples (in the repository) and the corpus ---


def _sample(store, name: str):
    folder = REPO / "sample_traces" / "kineto" / name
    results = ingest_paths(store, [str(p) for p in sorted(folder.glob("*.json.gz"))])
    job = JobData(store, store.traces(results[0].job_id))
    result = host_sync.run(job, host_sync.SPEC.params())
    job.close()
    return {(m.device, m.name): m.value for m in result.metrics}, result.findings


def test_healthy_sample_is_not_flagged(store):
    """One loss.item() per step: the CPU waits most of the step, the GPU only ~0.3 ms."""
    metrics, findings = _sample(store, "healthy")
    assert findings == []
    assert metrics[(None, "sync_count")] == 6
    assert 0 < metrics[(0, "sync_lost_ns")] < 0.03 * 5 * 16.7e6  # under 3 % of 5 steps


def test_pageable_sync_sample(store):
    """Planted: 4 .item() + 1 torch.cuda.synchronize() per step, and the blocking copy's sync."""
    _, findings = _sample(store, "pageable_sync")
    (f,) = findings
    assert f.severity == "low"
    ev = f.evidence
    assert ev["steps"] == 5 and ev["calls_per_step"] == 6.0
    assert {a["api"]: a["count"] for a in ev["by_api"]} == {
        "cudaStreamSynchronize": 25,
        "cudaDeviceSynchronize": 6,
    }
    sites = {s["call_site"]: s["count"] for s in ev["call_sites"]}
    assert sites["aten::item > aten::_local_scalar_dense"] == 20
    assert sites["aten::to > aten::copy_"] == 5
    assert ev["item_calls"] == 20


def test_cuda_graph_sample_is_not_flagged(store):
    """A sync after each graph replay: the next cudaGraphLaunch (2.3 ms under CUPTI, a profiler
    artifact) is what the GPU waits for after the sync, and it is not charged."""
    metrics, findings = _sample(store, "cuda_graph")
    assert findings == []
    assert metrics[(None, "sync_count")] == 4
    assert metrics[(0, "sync_lost_ns")] < 0.5e6


needs_corpus = pytest.mark.corpus


def _corpus(store, relative: str):
    results = ingest_paths(store, [str(CORPUS / relative)])
    job = JobData(store, store.traces(results[0].job_id))
    result = host_sync.run(job, host_sync.SPEC.params())
    job.close()
    return {(m.device, m.name): m.value for m in result.metrics}, result.findings


@needs_corpus
def test_corpus_alexnet_pageable_copies_and_syncs(store):
    """HTA's alexnet: 16 `.to(cuda)` copies each followed by a stream sync, 5 device syncs."""
    metrics, findings = _corpus(
        store, "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
    )
    assert metrics[(None, "sync_count")] == 21
    assert findings == []  # 0.6 ms lost over a 12.9 s span


@needs_corpus
def test_corpus_dlrm_syncs_per_step(store):
    metrics, findings = _corpus(
        store, "param/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz"
    )
    # 12 syncs per step, but only 0.12 ms (0.9 % of the span) of idle time is the syncs' own
    # (gpu_idle's host_sync): under per_step_share_pct (1 %), so no finding. It was 1.1 % when
    # host work after the syncs that gpu_idle gives to other causes was charged too.
    assert findings == []
    assert 0.1e6 < metrics[(0, "sync_lost_ns")] < 0.15e6
    assert metrics[(None, "sync_count")] == 13


@needs_corpus
def test_corpus_sync_waiting_on_invisible_work_is_not_charged(store):
    """sglang decode (ROCm): a 463 ms hipMemcpyWithStream starts while the GPU already looks
    idle (graph-replayed kernels are not in the trace); the gap it sits in is not charged."""
    metrics, findings = _corpus(
        store, "tracelens/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
    )
    assert metrics[(None, "sync_ns")] > 460e6
    assert metrics[(9, "sync_lost_ns")] < 1e6
    assert findings == []


def dataloader_after_sync_trace() -> KinetoTrace:
    """A .item() drains the GPU, then the host loads data (times in ns, one step [0, 300k)):

    aten::mm [0, 10k) launches gemm                          GPU [5k, 105k)
    aten::item [12k, 110k): cudaStreamSynchronize [14.5k, 108k) (drains the queue)
    python train.py [110k, 115k)                             (host work after the sync)
    enumerate(DataLoader) [115k, 215k)                       (loading the next batch)
    aten::add [215k, 220k) launches an elementwise kernel    GPU [220k, 230k)

    The one gap is [105k, 220k) = 115k. gpu_idle: host_sync 5k (inside aten::item) + 5k (the
    Python after it, exposed by the drain) = 10k, dataloader 100k, launch 5k (after the data
    loader: not the sync's). The step's edges are idle too: [0, 5k) while aten::mm launches
    (launch 5k more) and [230k, 300k) after the last kernel, nothing recorded (unknown 70k). The old counterfactual would charge min(115k, 93.5k blocked) = 93.5k,
    most of it data-loading time; the sync is charged only its own 10k.
    """
    t = KinetoTrace()
    t.step(0, 0, 300_000)
    t.cpu_op("aten::mm", 0, 10_000, args={"External id": 1})
    t.runtime("cudaLaunchKernel", 1_000, 1_000, corr=t.kernel("gemm", 5_000, 100_000), ext=1)
    t.cpu_op("aten::item", 12_000, 98_000)
    linked_sync(t, "cudaStreamSynchronize", "Stream Sync", 14_500, 93_500, 105_000, 3_000)
    t.cpu_op("train.py(10): step", 110_000, 5_000, cat="python_function", args={})
    t.cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 115_000, 100_000)
    t.cpu_op("aten::add", 215_000, 5_000, args={"External id": 2})
    kernel = t.kernel("vectorized_elementwise_kernel", 220_000, 10_000)
    t.runtime("cudaLaunchKernel", 216_000, 2_000, corr=kernel, ext=2)
    return t


def test_sync_is_not_charged_the_data_loader_time(store, tmp_path):
    from stallscope.idle import attribute_idle

    trace = dataloader_after_sync_trace()
    metrics, findings, _ = _run(store, tmp_path, trace, min_impact_ms=0)
    assert metrics[(0, "sync_lost_ns")] == 10_000
    (f,) = findings  # 10k of the 300k step: 3.3 % -> low
    assert f.severity == "low" and f.impact_ns == 10_000
    assert f.evidence["call_sites"][0]["gpu_lost_ns"] == 10_000
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t2.json"))])
    job = JobData(store, store.traces(res.job_id))
    totals = attribute_idle(job, job.traces[0].trace_id, 0).totals
    job.close()
    assert {k: v for k, v in totals.items() if v} == {
        "dataloader": 100_000,
        "host_sync": 10_000,
        "launch": 10_000,
        "unknown": 70_000,
    }


@pytest.mark.parametrize(
    "api", ["cudaThreadSynchronize", "hipCtxSynchronize", "cudaCtxSynchronize", "cuCtxSynchronize_v2",
            "cudaStreamSynchronize_ptsz", "hipDeviceSynchronize"],
)  # fmt: skip
def test_every_synchronize_call_is_host_sync_for_idle_and_host_sync(store, tmp_path, api):
    """One definition (stallscope/sync_calls.py): a draining sync is ``host_sync`` in both places.

    gemm GPU [5k, 105k); ``api`` blocks [14.5k, 108k) (no GPU sync event, as old APIs
    have none); aten::add [109k, 134k) launches at [131k, 133k) a kernel at GPU [135k, 145k).
    The gap [105k, 135k) = 30 µs opened while the call blocked: gpu_idle files all of it
    under host_sync (the sync, then the host work it exposed), and host_sync charges the
    call min(30 µs, 93.5 µs blocked to the gap's end) = 30 µs.
    """
    from stallscope.idle import attribute_idle
    from stallscope.sync_calls import is_sync_api

    assert is_sync_api(api)
    t = KinetoTrace()
    t.step(0, 0, 200_000)
    t.runtime("cudaLaunchKernel", 1_000, 1_000, corr=t.kernel("gemm", 5_000, 100_000))
    t.runtime(api, 14_500, 93_500)
    t.cpu_op("aten::add", 109_000, 25_000)
    kernel = t.kernel("vectorized_elementwise_kernel", 135_000, 10_000)
    t.runtime("cudaLaunchKernel", 131_000, 2_000, corr=kernel)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    idle = attribute_idle(job, trace, 0).totals
    result = host_sync.run(job, host_sync.SPEC.params({}))
    calls = host_sync.blocking_calls(job, trace)
    job.close()
    assert calls["api"].tolist() == [api.removesuffix("_v2").removesuffix("_ptsz")]
    assert idle["host_sync"] == 30_000 and idle["cpu"] == 0  # the rest: before/after the GPU work
    lost = {(m.device, m.name): m.value for m in result.metrics}[(0, "sync_lost_ns")]
    assert lost == idle["host_sync"]


def test_not_synchronize_calls():
    from stallscope.sync_calls import is_sync_api

    for name in ("cudaStreamWaitEvent", "cudaEventQuery", "cudaMemcpyAsync", "cudaLaunchKernel",
                 "cudaStreamSynchronizeX", "hipStreamWaitEvent"):  # fmt: skip
        assert not is_sync_api(name), name
