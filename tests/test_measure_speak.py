"""Measure, then speak (docs/architecture.md): the split analyzers' typed measurements
hold the numbers known by hand, and their findings are written from those alone.

Each test builds a small trace in code, measures it, checks the measurement's
numbers, then checks that ``speak`` over that measurement (no job, no SQL) gives
exactly the findings and metrics of the analyzer's ``run``.
"""

from __future__ import annotations

import inspect

import msgspec
import pytest

from stallscope.analyzers import (
    gpu_idle,
    host_sync,
    hotspots,
    launch_overhead,
    memcpy,
    overlap,
    step_breakdown,
    utilization,
)
from stallscope.analyzers.base import Where
from stallscope.collectives import gpu_activity
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace
from tests.test_host_sync import item_trace
from tests.test_launch_overhead import tiny_kernel_loop
from tests.test_memcpy import copies_trace, copy_bound_trace
from tests.test_overlap import hand_trace

MS = 1_000_000
MiB = 1 << 20
SPLIT = (hotspots, overlap, host_sync, launch_overhead, gpu_idle, step_breakdown, utilization)


@pytest.fixture
def open_job(store, tmp_path):
    jobs = []

    def load(trace: KinetoTrace) -> JobData:
        (res,) = ingest_paths(store, [str(trace.write(tmp_path / f"t{len(jobs)}.json"))])
        jobs.append(JobData(store, store.traces(res.job_id)))
        return jobs[-1]

    yield load
    for job in jobs:
        job.close()


@pytest.mark.parametrize("module", SPLIT, ids=lambda m: m.SPEC.id)
def test_speaking_needs_no_job(module):
    """``speak`` and ``metrics`` read a measurement (and thresholds), never the job."""
    assert list(inspect.signature(module.speak).parameters) == ["m", "params"]
    assert len(inspect.signature(module.metrics).parameters) == 1
    measures = [getattr(module, name, None) for name in ("measure_trace", "measure_device")]
    assert any(measures)
    for measure in filter(None, measures):
        assert list(inspect.signature(measure).parameters)[:2] == ["job", "where"]


def test_launch_overhead_measurement_by_hand(open_job):
    job = open_job(tiny_kernel_loop())
    trace = job.traces[0].trace_id
    params = launch_overhead.SPEC.params({"min_impact_ms": 0})
    m = launch_overhead.measure_device(job, Where(trace, 0, 0), steps=0, params=params)
    assert isinstance(m, msgspec.Struct)
    assert (m.kernels, m.launches, m.driver_launches, m.graph_launches) == (100, 100, 25, 0)
    assert (m.short_kernels, m.single_kernels) == (100, 100)  # 2 µs kernels, 5 µs calls
    assert m.median_kernel_ns == 2_000 and m.median_launch_ns == 5_000
    assert m.span_ns == 992_000 and m.waited_ns == 99 * 8_000 and m.graph_wait_ns == 0
    # the profiler's 2.2 µs per recorded call explains 440 µs of the wait (launch_cost),
    # then one 10 µs replay (no steps): docs/analyzers/launch_overhead.md
    assert m.profiler_ns == 440_000 and m.host_idle_ns == 792_000
    assert m.gain_ns == 792_000 - 440_000 - 10_000
    assert m.share_pct == pytest.approx(100 * 792 / 992)
    result = launch_overhead.run(job, params)
    assert launch_overhead.speak(m, params) == result.findings
    assert launch_overhead.metrics(m) == result.metrics


def test_overlap_measurement_by_hand(open_job):
    job = open_job(hand_trace())
    trace = job.traces[0].trace_id
    params = overlap.SPEC.params({"min_impact_ms": 0})
    ops = gpu_activity(job)[(trace, 0)]
    no_waits = (ops["start_ns"][:0], ops["end_ns"][:0])
    m = overlap.measure_device(job, Where(trace, 0, 0), ops, no_waits)
    assert (m.comm_ns, m.exposed_ns, m.wait_ns) == (25 * MS, 15 * MS, 0)
    assert (m.copy_ns, m.copy_exposed_ns) == (3 * MS, 1 * MS)
    assert m.transfer_ns == 15 * MS and m.overlap_pct == 40.0
    assert m.span_ns == 42 * MS and m.scope == "steps"  # the steps' work: first start to last end
    assert [(s["comm_ns"], s["exposed_comm_ns"]) for s in m.steps] == [
        (10 * MS, 5 * MS),
        (15 * MS, 10 * MS),
    ]
    assert m.collectives.comm_streams == [20] and m.collectives.shared_streams == []
    assert m.collectives.comm_kernels == 2 and m.collectives.per_step == 1.0
    result = overlap.run(job, params)
    assert [overlap.speak(m, params)] == result.findings
    assert overlap.metrics(m) == result.metrics


def test_host_sync_measurement_by_hand(open_job):
    job = open_job(item_trace())
    trace = job.traces[0].trace_id
    params = host_sync.SPEC.params({"min_impact_ms": 0})
    t = host_sync.measure_trace(job, Where(trace, 0))
    assert (t.calls, t.blocked_ns) == (2, 93_500 + 500)
    (m,) = t.devices.values()
    assert m.where == Where(trace, 0, 0)
    assert (m.lost_ns, m.span_ns, m.gaps_charged) == (29_000, 140_000, 1)
    assert (m.calls, m.calls_in_steps, m.steps, m.per_step) == (2, 2, 1, 2.0)
    assert m.windows == [[14_500, 135_000]]
    assert m.pageable_d2h is False and m.item_calls == 1
    result = host_sync.run(job, params)
    assert [host_sync.speak(m, params)] == result.findings
    assert host_sync.metrics(t) == result.metrics


def test_hotspots_measurement_by_hand(open_job):
    """4 steps of a 10 ms sgemm and a 1 ms elementwise kernel."""
    t = KinetoTrace()
    for step in range(4):
        s = step * 20 * MS
        t.step(step, s, 20 * MS)
        t.runtime(
            "cudaLaunchKernel",
            s,
            5_000,
            corr=t.kernel("ampere_sgemm_128x64_tn", s + 10_000, 10 * MS),
        )
        t.runtime("cudaLaunchKernel", s + 11 * MS, 5_000, corr=t.kernel("vectorized_elementwise_kernel", s + 12 * MS, MS))  # fmt: skip
    job = open_job(t)
    trace = job.traces[0].trace_id
    params = hotspots.SPEC.params()
    result = hotspots.run(job, params)
    (finding,) = result.findings
    (m,) = hotspots.measure_trace(job, Where(trace, 0), params)
    assert m.where == Where(trace, 0, 0)
    assert (m.gpu_ns, m.kernel_ns, m.matrix_ns) == (44 * MS, 44 * MS, 40 * MS)
    assert (m.kernel_launches, m.kernel_names) == (8, 2)
    assert m.category_ns["gemm"] == 40 * MS and m.category_ns["elementwise"] == 4 * MS
    assert m.precision == {"fp32": {"ns": 40 * MS, "pct": 100.0}}
    assert m.fp32_no_tensor_core_pct == 100.0 and m.tensor_core_pct == 0.0
    assert m.memory_bound_pct == pytest.approx(100 * 4 / 44)
    assert [r["name"] for r in m.top_kernels] == [
        "ampere_sgemm_128x64_tn",
        "vectorized_elementwise_kernel",
    ]
    assert hotspots.speak(m, params) == finding
    assert hotspots.metrics(m) == result.metrics


def test_memcpy_measurements_by_hand(open_job):
    """Pageable host-to-device copies and copy-bound time (tests/test_memcpy.py's traces)."""
    params = memcpy.SPEC.params()
    for name in ("measure_pageable_h2d", "measure_copy_bound"):
        assert list(inspect.signature(getattr(memcpy, name)).parameters)[:2] == ["job", "c"]
    for name in ("speak_pageable_h2d", "speak_copy_bound"):
        assert list(inspect.signature(getattr(memcpy, name)).parameters) == ["m", "params"]

    job = open_job(copies_trace())
    (c,) = memcpy.device_copies(job, Where(job.traces[0].trace_id, 0))
    m = memcpy.measure_pageable_h2d(job, c, params)
    assert (m.count, m.outside_steps, m.steps) == (1, 1, 1)
    assert (m.nbytes, m.gpu_ns, m.span_ns) == (8 * MiB, 2 * MS, 10 * MS)
    assert m.gbps == pytest.approx(20.97152) and m.lost_ns == 1_599_000
    assert m.share_pct == pytest.approx(15.99)
    assert m.windows == [[1 * MS, 3 * MS]]
    (finding,) = [f for f in memcpy.run(job, params).findings if f.id.endswith(":pageable_h2d")]
    assert memcpy.speak_pageable_h2d(m, params) == finding
    # its pinned copies (200 + 50 + 2 µs HtoD, 2 x 1 µs DtoH) run with no kernel beside them,
    # 254 µs in all: measured, but under min_impact_ms, so nothing is said
    bound = memcpy.measure_copy_bound(job, c)
    assert (bound.copy_ns, bound.exposed_ns, bound.span_ns) == (254_000, 254_000, 10 * MS)
    assert memcpy.speak_copy_bound(bound, params) is None


def test_memcpy_copy_bound_by_hand(open_job):
    params = memcpy.SPEC.params()
    job = open_job(copy_bound_trace())
    (c,) = memcpy.device_copies(job, Where(job.traces[0].trace_id, 0))
    m = memcpy.measure_copy_bound(job, c)
    assert (m.copy_ns, m.exposed_ns, m.span_ns) == (34 * MS, 30 * MS, 50 * MS)
    assert m.share_pct == 60.0 and set(m.by_direction) == {"HtoD", "DtoH"}
    assert m.windows[0] == [10 * MS, 34 * MS]
    (finding,) = [f for f in memcpy.run(job, params).findings if f.id.endswith(":copy_bound")]
    assert memcpy.speak_copy_bound(m, params) == finding


def test_memcpy_d2h_and_sync_measurements_by_hand(open_job):
    """copies_trace: one pageable DtoH of 4 bytes in 1 µs inside the step (the GPU then idles
    until the gemm at 6 ms, capped at the copy's 1 µs), three DtoH copies in the one step, and
    one synchronous cudaMemcpy of 1 MiB in 50 µs (the 1 KiB one is exempt)."""
    params = memcpy.SPEC.params()
    for name in ("speak_pageable_d2h", "speak_d2h_in_step", "speak_sync_copies"):
        assert list(inspect.signature(getattr(memcpy, name)).parameters) == ["m", "params"]
    assert list(inspect.signature(memcpy.measure_pageable_d2h).parameters)[:2] == ["job", "c"]
    for name in ("measure_d2h_in_step", "measure_sync_copies", "metrics"):
        assert list(inspect.signature(getattr(memcpy, name)).parameters) == ["c"]

    job = open_job(copies_trace())
    (c,) = memcpy.device_copies(job, Where(job.traces[0].trace_id, 0))
    d2h = memcpy.measure_pageable_d2h(job, c, params)
    assert (d2h.count, d2h.nbytes, d2h.gpu_ns, d2h.exposed_ns) == (1, 4, 1_000, 1_000)
    assert (d2h.refill_ns, d2h.saving_ns, d2h.span_ns, d2h.steps) == (1_000, 1_000, 10 * MS, 1)
    assert d2h.share_pct == pytest.approx(0.01) and d2h.windows == [[4_210_000, 4_211_000]]
    assert memcpy.speak_pageable_d2h(d2h, params) is None  # 1 µs: under min_impact_ms
    in_step = memcpy.measure_d2h_in_step(c)
    assert (in_step.count, in_step.nbytes, in_step.pageable, in_step.sync_api) == (3, 12, 1, 0)
    assert in_step.per_step == 3.0
    sync = memcpy.measure_sync_copies(c)
    assert (sync.count, sync.by_direction, sync.apis) == (1, {"HtoD": 1}, ["cudaMemcpy"])
    assert (sync.nbytes, sync.gpu_ns, sync.host_ns, sync.in_steps) == (MiB, 50_000, 1_000, 1)
    result = memcpy.run(job, params)
    by_key = {f.evidence["key"]: f for f in result.findings}
    assert memcpy.speak_d2h_in_step(in_step, params) == by_key["d2h_in_step"]
    assert memcpy.speak_sync_copies(sync, params) == by_key["sync_copy"]
    assert memcpy.metrics(c) == result.metrics
    assert memcpy.speak_d2h_in_step(in_step, memcpy.SPEC.params({"d2h_per_step": 4})) is None


def test_memcpy_pageable_d2h_speaks_from_its_measurement(store):
    """The train_pageable_d2h sample's finding is written from its measurement alone."""
    from tests.conftest import SAMPLES

    (res,) = ingest_paths(store, [str(SAMPLES / "kineto" / "train_pageable_d2h")])
    job = JobData(store, store.traces(res.job_id))
    try:
        params = memcpy.SPEC.params()
        found = []
        for c in memcpy.device_copies(job, Where(job.traces[0].trace_id, 0)):
            m = memcpy.measure_pageable_d2h(job, c, params)
            if m is not None:
                found.append(memcpy.speak_pageable_d2h(m, params))
        findings = [f for f in memcpy.run(job, params).findings if f.id.endswith(":pageable_d2h")]
        assert findings and [f for f in found if f] == findings
        assert findings[0].saving_ns == m.saving_ns > 0
    finally:
        job.close()
