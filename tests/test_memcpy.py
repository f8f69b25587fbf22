"""memcpy on traces whose answers are worked out by hand, plus the real samples and corpus."""

from __future__ import annotations

import pytest

from stallscope.analyzers import memcpy
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, REPO
from tests.kineto_builder import H100, KinetoTrace

MiB = 1 << 20
MS = 1_000_000


def _run(store, tmp_path, trace: KinetoTrace, **overrides):
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = memcpy.run(job, memcpy.SPEC.params(overrides))
    job.close()
    metrics = {(m.device, m.name): m.value for m in result.metrics}
    return metrics, {f.evidence["key"]: f for f in result.findings}


def _copy(t, kind, src, dst, nbytes, host_start, gpu_start, gpu_dur, api="cudaMemcpyAsync"):
    corr = t.memcpy(kind, src, dst, gpu_start, gpu_dur, nbytes)
    t.runtime(api, host_start, 1_000, corr=corr)


def copies_trace() -> KinetoTrace:
    """GPU 0 (H100), one ProfilerStep [0, 10 ms), times in ns:

    pinned HtoD 4 MiB in 200 µs and (sync cudaMemcpy) 1 MiB in 50 µs: 20.97152 bytes/ns,
        the measured pinned bandwidth
    pageable HtoD 8 MiB in 2 ms, launched inside aten::to > aten::copy_: a pinned copy
        would take 8 MiB / 20.97152 + 1 µs = 401 µs, so 1,599,000 ns are lost
    pageable HtoD 1 MiB launched at 12 ms, after the step: reported, not counted
    3 DtoH copies inside the step (2 into pinned, 1 into pageable memory), from .item()
    a synchronous cudaMemcpy HtoD of 1 KiB (exempt: <= 64 KiB)
    span = 0 .. 12.1 ms, clipped to the step: 10 ms, so 1,599,000 ns is 15.99 % -> medium
    """
    t = KinetoTrace(device_props=[H100])
    t.step(0, 0, 10_000_000)
    _copy(t, "HtoD", "Pinned", "Device", 4 * MiB, 0, 0, 200_000)
    _copy(t, "HtoD", "Pinned", "Device", MiB, 300_000, 300_000, 50_000, api="cudaMemcpy")
    t.cpu_op("aten::to", 850_000, 2_250_000)
    t.cpu_op("aten::copy_", 880_000, 2_200_000)
    _copy(t, "HtoD", "Pageable", "Device", 8 * MiB, 900_000, 1_000_000, 2_000_000)
    for i, dst in enumerate(("Pinned", "Pinned", "Pageable")):
        base = 4_000_000 + i * 100_000
        t.cpu_op("aten::item", base, 50_000)
        t.cpu_op("aten::_local_scalar_dense", base + 1_000, 48_000)
        _copy(t, "DtoH", "Device", dst, 4, base + 2_000, base + 10_000, 1_000)
    _copy(t, "HtoD", "Pinned", "Device", 1024, 5_000_000, 5_000_000, 2_000, api="cudaMemcpy")
    t.kernel("gemm", 6_000_000, 3_000_000)
    _copy(t, "HtoD", "Pageable", "Device", MiB, 12_000_000, 12_000_000, 100_000)
    return t


def test_metrics(store, tmp_path):
    metrics, _ = _run(store, tmp_path, copies_trace())
    assert metrics[(0, "pageable_memcpy_bytes")] == 8 * MiB + MiB + 4
    assert metrics[(0, "pageable_memcpy_count")] == 3


def test_pageable_h2d_lost_time(store, tmp_path):
    _, findings = _run(store, tmp_path, copies_trace())
    f = findings["pageable_h2d"]
    assert f.impact_ns == 1_599_000
    assert f.severity == "medium"  # 16 % >= 10 (medium), < 25 (high)
    ev = f.evidence
    assert ev["count"] == 1 and ev["bytes"] == 8 * MiB and ev["gpu_ns"] == 2_000_000
    assert ev["outside_steps"] == 1
    assert ev["pinned_gbps"] == pytest.approx(20.97, abs=0.01)
    assert ev["pinned_gbps_source"].startswith("median of 2 pinned HtoD copies")
    assert ev["achieved_gbps"] == pytest.approx(4.19, abs=0.01)
    assert ev["span_ns"] == 10_000_000  # the GPU span clipped to the step: not the setup copy
    assert ev["share_of_span_pct"] == pytest.approx(15.99, abs=1e-3)
    assert ev["call_sites"] == [
        {"call_site": "aten::to > aten::copy_", "count": 1, "bytes": 8 * MiB, "gpu_ns": 2_000_000}
    ]
    assert f.windows == [[1_000_000, 3_000_000]]
    assert "pin_memory" in f.recommendation and "non_blocking=True" in f.recommendation


def test_pinned_bandwidth_from_threshold_and_generation(store, tmp_path):
    _, findings = _run(store, tmp_path, copies_trace(), pinned_gbps=16.777216)
    # pinned at 16.777216 bytes/ns: 8 MiB in 500 µs + 1 µs -> 1,499,000 ns lost
    assert findings["pageable_h2d"].impact_ns == 1_499_000
    assert findings["pageable_h2d"].evidence["pinned_gbps_source"] == "threshold pinned_gbps"
    _, findings = _run(store, tmp_path, copies_trace(), pinned_gbps=8.388608)
    assert "pageable_h2d" not in findings  # 999,000 ns lost: under min_impact_ms (1 ms)

    t = KinetoTrace(device_props=[H100])  # no pinned copy to measure: compute capability 9 -> 40
    t.kernel("gemm", 0, 10_000_000)
    _copy(t, "HtoD", "Pageable", "Device", 40 * 10**6, 10_000, 10_000, 5_000_000)
    _, findings = _run(store, tmp_path, t)
    f = findings["pageable_h2d"]
    assert f.evidence["pinned_gbps"] == 40.0
    assert f.impact_ns == 5_000_000 - (1_000_000 + 1_000)
    assert f.severity == "high"  # 40 % of the 10 ms span


def test_small_pageable_copies_are_not_reported(store, tmp_path):
    t = KinetoTrace()
    t.kernel("k", 0, 1_000_000)
    _copy(t, "HtoD", "Pageable", "Device", 256, 10_000, 10_000, 2_000)
    metrics, findings = _run(store, tmp_path, t)
    assert metrics[(0, "pageable_memcpy_count")] == 1
    assert "pageable_h2d" not in findings  # 2 µs lost < min_impact_ms


def test_d2h_in_step(store, tmp_path):
    _, findings = _run(store, tmp_path, copies_trace())
    f = findings["d2h_in_step"]
    assert f.severity == "info" and f.impact_ns == 0  # its GPU cost is host_sync's
    ev = f.evidence
    assert (ev["count"], ev["per_step"], ev["bytes"], ev["pageable"]) == (3, 3.0, 12, 1)
    assert ev["call_sites"][0]["call_site"] == "aten::item > aten::_local_scalar_dense"
    _, findings = _run(store, tmp_path, copies_trace(), d2h_per_step=4)
    assert "d2h_in_step" not in findings


def test_sync_copies(store, tmp_path):
    _, findings = _run(store, tmp_path, copies_trace())
    f = findings["sync_copy"]
    ev = f.evidence
    assert ev["count"] == 1  # the 1 KiB host-to-device cudaMemcpy is exempt
    assert ev["by_direction"] == {"HtoD": 1} and ev["bytes"] == MiB
    assert ev["apis"] == ["cudaMemcpy"]


def test_hip_synchronous_copy(store, tmp_path):
    t = KinetoTrace()
    t.kernel("Cijk_Ailk_Bljk_BBS_BH_MT64x64x32_MI16x16x1", 0, 100_000)
    _copy(t, "DtoH", "Device", "Host", 256, 110_000, 120_000, 2_000, api="hipMemcpyWithStream")
    _, findings = _run(store, tmp_path, t)
    assert findings["sync_copy"].evidence["by_direction"] == {"DtoH": 1}
    assert findings["sync_copy"].evidence["apis"] == ["hipMemcpyWithStream"]


def _sample(store, name: str):
    folder = REPO / "sample_traces" / "kineto" / name
    results = ingest_paths(store, [str(p) for p in sorted(folder.glob("*.json.gz"))])
    job = JobData(store, store.traces(results[0].job_id))
    result = memcpy.run(job, memcpy.SPEC.params())
    job.close()
    return {(m.device, m.name): m.value for m in result.metrics}, {
        f.evidence["key"]: f for f in result.findings
    }


def test_pageable_sync_sample(store):
    """Planted: a 64 MiB pageable host-to-device copy per step (about 7.5 ms at 8.8 GB/s)."""
    metrics, findings = _sample(store, "pageable_sync")
    f = findings["pageable_h2d"]
    assert f.evidence["count"] == 5 and f.evidence["bytes"] == 5 * 64 * MiB
    assert f.evidence["achieved_gbps"] == pytest.approx(8.8, abs=0.1)
    assert f.severity == "high"  # about 48 % of the span
    assert 25e6 < f.impact_ns < 35e6
    assert metrics[(0, "pageable_memcpy_bytes")] == 5 * 64 * MiB
    assert findings["d2h_in_step"].evidence["per_step"] == 4.0  # the four .item() calls


def test_healthy_sample_is_not_flagged(store):
    _, findings = _sample(store, "healthy")
    assert findings == {}  # one loss.item() per step, data already on the GPU


@pytest.mark.corpus
def test_corpus_resnet_pageable_copies(store):
    """PARAM's ResNet (RTX 2080 Ti, no steps): 61 pageable batches, 2.2 GB at 3.7 GB/s."""
    results = ingest_paths(store, [str(CORPUS / "param/resnet_kineto.json.gz")])
    job = JobData(store, store.traces(results[0].job_id))
    result = memcpy.run(job, memcpy.SPEC.params())
    job.close()
    (f,) = result.findings
    assert f.evidence["count"] == 61 and f.evidence["bytes"] == 2_312_140_804
    assert f.evidence["pinned_gbps"] == 10.0  # compute capability 7.x, nothing pinned to measure
    assert f.severity == "info"  # 0.4 s lost, but 2.7 % of a 14.5 s span


def copy_bound_trace() -> KinetoTrace:
    """GPU 0, times in ms, no steps (span 0..50):

    kernel [0, 10); pinned HtoD 100 MiB [2, 6) under it (hidden), pinned HtoD 600 MiB
    [10, 34) and pinned DtoH 50 MiB [34, 40) with no kernel (exposed 30); a DtoD [40, 46)
    (GPU memory work, not a transfer) and a pageable HtoD [46, 50) (the pageable
    finding's). Exposed transfer 30 of 50 ms = 60 % -> high.
    """
    t = KinetoTrace(device_props=[H100])
    t.kernel("gemm", 0, 10 * MS)
    _copy(t, "HtoD", "Pinned", "Device", 100 * MiB, 0, 2 * MS, 4 * MS)
    _copy(t, "HtoD", "Pinned", "Device", 600 * MiB, 1 * MS, 10 * MS, 24 * MS)
    _copy(t, "DtoH", "Device", "Pinned", 50 * MiB, 2 * MS, 34 * MS, 6 * MS)
    _copy(t, "DtoD", "Device", "Device", 50 * MiB, 3 * MS, 40 * MS, 6 * MS)
    _copy(t, "HtoD", "Pageable", "Device", 16 * MiB, 4 * MS, 46 * MS, 4 * MS)
    return t


def test_copy_bound_gpu_by_hand(store, tmp_path):
    _, found = _run(store, tmp_path, copy_bound_trace())
    f = found["copy_bound"]
    assert f.severity == "high"
    assert f.impact_ns == f.evidence["exposed_ns"] == 30 * MS
    assert f.evidence["copy_ns"] == 34 * MS  # 4 hidden + 30 exposed; DtoD and pageable left out
    assert f.evidence["share_of_span_pct"] == 60.0
    assert f.evidence["by_direction"]["HtoD"] == {
        "count": 2,
        "bytes": 700 * MiB,
        "gbps": round(700 * MiB / 0.028 / 1e9, 2),
    }
    assert set(f.evidence["by_direction"]) == {"HtoD", "DtoH"}
    assert f.windows[0] == [10 * MS, 34 * MS]


def test_copies_under_compute_are_not_copy_bound(store, tmp_path):
    t = KinetoTrace(device_props=[H100])
    t.kernel("gemm", 0, 50 * MS)
    _copy(t, "HtoD", "Pinned", "Device", 600 * MiB, 1 * MS, 10 * MS, 24 * MS)
    _, found = _run(store, tmp_path, t)
    assert "copy_bound" not in found
