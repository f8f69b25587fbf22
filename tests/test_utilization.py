"""utilization metrics on a trace whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from stallscope.analyzers import utilization
from stallscope.analyzers.base import Where
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace


def hand_trace() -> KinetoTrace:
    """GPU 0 timeline in µs (span 0..100):

    kernels  [0,20) [10,30)      -> compute union [0,30)        = 30
    nccl     [25,45)             -> comm [25,45)                = 20
    memcpy   [60,70), memset [68,80) -> copies [60,80)          = 20
    sync     [80,100)            -> not busy, not in the span
    kernel   [90,100)            -> compute [90,100)            = 10
    busy = [0,45) + [60,80) + [90,100) = 45 + 20 + 10 = 75 of span 100
    Steps of 10, 30 and 60 µs from 0, 10 and 40 µs (no launch records: each
    operation counts where it starts), ending with GPU 0's work at 100 µs: its span
    is [0, 100). GPU 1's kernel [0, 5) is done long before the steps end: its span
    runs to the last step's end, 100 µs (busy 5 of 100).
    """
    t = KinetoTrace()
    t.kernel("gemm_a", 0, 20_000)
    t.kernel("gemm_b", 10_000, 20_000, stream=8)
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 25_000, 20_000, stream=20)
    t.memcpy("HtoD", "Pinned", "Device", 60_000, 10_000, 4096)
    t.memset(68_000, 12_000, 4096)
    t.sync("Event Sync", 80_000, 20_000)
    t.kernel("relu", 90_000, 10_000)
    t.kernel("other_gpu", 0, 5_000, device=1)
    for i, (start, dur) in enumerate([(0, 10_000), (10_000, 30_000), (40_000, 60_000)]):
        t.step(i, start, dur)
    return t


@pytest.fixture
def metrics(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = utilization.run(job, utilization.SPEC.params())
    job.close()
    return {(m.device, m.name): m.value for m in result.metrics}, result.findings


def test_shares_of_span(metrics):
    values, _ = metrics
    assert values[(0, "gpu_span_ns")] == 100_000
    assert values[(0, "gpu_busy_pct")] == 75.0
    assert values[(0, "gpu_idle_pct")] == 25.0
    assert values[(0, "compute_pct")] == 40.0
    assert values[(0, "comm_pct")] == 20.0
    assert values[(0, "memcpy_pct")] == 20.0
    assert values[(0, "kernel_count")] == 4


def test_exclusive_parts_of_the_busy_time_by_hand(metrics):
    """hand_trace's GPU 0 (µs): compute [0,30) [90,100), comm [25,45), copies [60,80).
    Compute alone [0,25) + [90,100) = 35, comm beside compute [25,30) = 5, comm alone
    [30,45) = 15, copies with no kernel [60,80) = 20; with 25 idle: the span, 100."""
    values, _ = metrics
    parts = ("compute_only_ns", "comm_under_compute_ns", "comm_only_ns", "copy_only_ns")
    assert [values[(0, n)] for n in parts] == [35_000, 5_000, 15_000, 20_000]
    idle = values[(0, "gpu_span_ns")] * values[(0, "gpu_idle_pct")] / 100
    assert sum(values[(0, n)] for n in parts) + idle == values[(0, "gpu_span_ns")]
    # GPU 1: one compute kernel [0,5) µs, nothing else
    assert [values[(1, n)] for n in parts] == [5_000, 0, 0, 0]


def test_per_device_and_steps(metrics):
    values, _ = metrics
    assert values[(1, "gpu_busy_pct")] == 5.0
    assert values[(1, "gpu_span_ns")] == 100_000
    assert values[(1, "kernel_count")] == 1
    assert values[(None, "step_time_ms_median")] == 0.03  # steps of 10, 30, 60 µs
    assert values[(None, "step_count")] == 3


def test_headline_finding(metrics):
    _, findings = metrics
    by_device = {f.device: f for f in findings}
    assert {f.severity for f in findings} == {"info"}
    head = by_device[0]
    assert head.title == "GPU 0 busy 75.0%, idle 25.0% of 0.10 ms"
    assert head.impact_ns == 25_000
    assert head.windows[0][1] - head.windows[0][0] == 15_000  # [45,60) is the longest gap
    assert sorted(b - a for a, b in head.windows) == [10_000, 15_000]
    assert sum(head.evidence["idle_by_cause_ns"].values()) == 25_000
    assert by_device[1].impact_ns == 95_000  # idle after its kernel, while the steps ran


def widened_trace() -> KinetoTrace:
    """One step [100, 400) µs; times in µs.

    Set-up kernel S [0, 50) launched before the step (out of scope). In the step,
    the host loads data until 250, then launches A [260, 300) and B [320, 350); the
    host step runs on to 400 (logging, a sync). Scope: the in-step work [260, 350)
    widened back to the step's start 100 (S ended at 50, before it) and on to its
    end 400: span 300, busy 70, idle 230 in gaps [100, 260), [300, 320), [350, 400).
    """
    t = KinetoTrace()
    t.runtime("cudaLaunchKernel", 0, 5_000, corr=1)
    t.kernel("setup", 0, 50_000, corr=1)
    t.step(0, 100_000, 300_000)
    t.runtime("cudaLaunchKernel", 255_000, 5_000, corr=2)
    t.kernel("a", 260_000, 40_000, corr=2)
    t.runtime("cudaLaunchKernel", 300_000, 5_000, corr=3)
    t.kernel("b", 320_000, 30_000, corr=3)
    return t


def test_step_scope_holds_the_idle_time_at_the_steps_edges(store, tmp_path):
    (res,) = ingest_paths(store, [str(widened_trace().write(tmp_path / "w.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = utilization.run(job, utilization.SPEC.params())
    job.close()
    values = {m.name: m.value for m in result.metrics if m.device == 0}
    assert values["gpu_span_ns"] == 300_000
    assert values["gpu_busy_pct"] == round(100 * 70 / 300, 3)
    (head,) = result.findings
    assert sorted(map(tuple, head.windows)) == [
        (100_000, 260_000),
        (300_000, 320_000),
        (350_000, 400_000),
    ]


def test_step_scope_stops_at_earlier_and_later_gpu_work(store, tmp_path):
    """The same step, with set-up work running until 180 µs and a kernel launched after
    the step starting at 380 µs: the widened span is [180, 380)."""
    t = widened_trace()
    t.runtime("cudaLaunchKernel", 60_000, 5_000, corr=4)
    t.kernel("late_setup", 150_000, 30_000, corr=4)  # launched before the step, ends at 180
    t.runtime("cudaLaunchKernel", 401_000, 5_000, corr=5)
    t.kernel("after", 380_000, 50_000, corr=5)  # launched after the step
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "w2.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = utilization.run(job, utilization.SPEC.params())
    job.close()
    values = {m.name: m.value for m in result.metrics if m.device == 0}
    assert values["gpu_span_ns"] == 380_000 - 180_000


def test_scope_counts_operations_without_a_launch_record_where_they_start(store, tmp_path):
    """Steps [0,100) ms; one kernel launched by an API call, two with no launch record.

    Kernels [0,10) (launched at 0), [40,50) and [90,100) ms: all start inside the step,
    so the span is 100 ms and busy 30 %, not 10 ms at 100 %.
    """
    t = KinetoTrace()
    t.step(0, 0, 100_000_000)
    t.runtime("cudaLaunchKernel", 0, 1_000, corr=7, ext=7)
    t.kernel("launched", 0, 10_000_000, corr=7)
    t.kernel("no_launch_a", 40_000_000, 10_000_000, corr=8)
    t.kernel("no_launch_b", 90_000_000, 10_000_000, corr=9)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = utilization.run(job, utilization.SPEC.params())
    job.close()
    values = {(m.device, m.name): m.value for m in result.metrics}
    assert values[(0, "gpu_span_ns")] == 100_000_000
    assert values[(0, "gpu_busy_pct")] == 30.0


# Measure, then speak (#16): the numbers of hand_trace, and the headline from hand-made numbers.


def _gpu_ops(job, trace: str, device: int) -> dict:
    cols = job.numpy(
        "SELECT device, kind, is_comm, start_ns, end_ns FROM gpu WHERE trace_id = ? AND device = ? "
        "AND kind IN ('kernel', 'memcpy', 'memset') ORDER BY start_ns",
        [trace, device],
    )
    return {k: np.asarray(v) for k, v in cols.items()}


def test_measure_by_hand(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "m.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    gpu0 = utilization.measure_device(job, Where(trace, 0, 0), _gpu_ops(job, trace, 0))
    gpu1 = utilization.measure_device(job, Where(trace, 0, 1), _gpu_ops(job, trace, 1))
    steps = utilization.measure_steps(job, Where(trace, 0))
    job.close()
    assert (gpu0.span_ns, gpu0.busy_ns, gpu0.idle_ns, gpu0.stepped) == (
        100_000,
        75_000,
        25_000,
        True,
    )
    assert (gpu0.compute_ns, gpu0.comm_ns, gpu0.memcpy_ns, gpu0.kernel_count) == (
        40_000,
        20_000,
        20_000,
        4,
    )
    assert gpu0.gap_count == 2 and gpu0.windows == [[45_000, 60_000], [80_000, 90_000]]
    assert sum(gpu0.idle_by_cause_ns.values()) == 25_000 and gpu0.idle_pct == 25.0
    assert (gpu1.span_ns, gpu1.busy_ns, gpu1.windows) == (100_000, 5_000, [[5_000, 100_000]])
    assert (steps.count, steps.median_ns) == (3, 30_000)  # steps of 10, 30 and 60 µs


def test_measure_device_without_operations_is_none(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "o.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    assert utilization.measure_device(job, Where(trace, 0, 5), _gpu_ops(job, trace, 5)) is None
    job.close()


def _busy(span=1_000_000, busy=600_000, *, stepped=True, idle=None) -> utilization.DeviceBusy:
    return utilization.DeviceBusy(
        where=Where("t", 1, 2),
        span_ns=span,
        stepped=stepped,
        busy_ns=busy,
        compute_ns=busy,
        comm_ns=0,
        memcpy_ns=0,
        kernel_ns=busy,
        kernel_count=7,
        gap_count=3,
        windows=[[0, 10]],
        idle_by_cause_ns=idle
        or {"dataloader": 250_000, "launch": 100_000, "cpu": 50_000, "unknown": 0},
    )


def test_speak_writes_the_headline_from_the_numbers():
    f = utilization.speak(_busy(), {})
    assert (f.trace, f.rank, f.device, f.severity) == ("t", 1, 2, "info")
    assert f.title == "GPU 2 busy 60.0%, idle 40.0% of 1.00 ms"
    assert f.detail == (
        "Over its profiled steps GPU 2 ran kernels or copies for 0.60 ms and sat idle for "
        "0.40 ms in 3 gaps; idle by cause: dataloader 25.0%, launch 10.0%, cpu 5.0%."
    )
    assert f.impact_ns == 400_000 and f.saving_ns is None and f.windows == [[0, 10]]
    assert f.evidence["idle_ns"] == 400_000 and f.evidence["gap_count"] == 3
    assert "Nothing" not in f.recommendation  # idle time is a loss: point at its causes
    plain = utilization.speak(_busy(stepped=False, idle={"cpu": 0}), {})
    assert plain.detail.startswith("From its first to its last activity") and plain.detail.endswith(
        "3 gaps."
    )


def test_metrics_from_the_numbers():
    values = {m.name: m.value for m in utilization.metrics(_busy(busy=333_333))}
    assert values == {
        "gpu_busy_pct": 33.333, "compute_pct": 33.333, "comm_pct": 0.0, "memcpy_pct": 0.0,
        "gpu_idle_pct": 66.667, "kernel_count": 7, "gpu_span_ns": 1_000_000,
        "compute_only_ns": 333_333, "comm_under_compute_ns": 0, "comm_only_ns": 0,
        "copy_only_ns": 0,
    }  # fmt: skip
    steps = utilization.StepMedian(where=Where("t", 1), count=4, median_ns=2_500_000.0)
    assert [(m.name, m.value) for m in utilization.step_metrics(steps)] == [
        ("step_time_ms_median", 2.5),
        ("step_count", 4),
    ]
    none = utilization.StepMedian(where=Where("t", 1), count=0, median_ns=None)
    assert utilization.step_metrics(none) == []


def test_run_is_measure_then_speak(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "r.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace, params = job.traces[0].trace_id, utilization.SPEC.params()
    devices = [
        utilization.measure_device(job, Where(trace, 0, d), _gpu_ops(job, trace, d)) for d in (0, 1)
    ]
    steps = utilization.measure_steps(job, Where(trace, 0))
    result = utilization.run(job, params)
    job.close()
    assert result.findings == [utilization.speak(m, params) for m in devices]
    metrics = [x for m in devices for x in utilization.metrics(m)] + utilization.step_metrics(steps)
    assert result.metrics == metrics
