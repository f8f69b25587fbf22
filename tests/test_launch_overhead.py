"""launch_overhead on a launch-bound loop whose numbers are known by hand."""

from __future__ import annotations

import numpy as np

from stallscope.analyzers import launch_overhead
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace


def tiny_kernel_loop(
    n: int = 100, driver_every: int = 4, inner_gap: int | None = None
) -> KinetoTrace:
    """Op i (launching) at [10i, 10i+8) µs; its launch call [10i+2, 10i+7); kernel [10i+7.5, 10i+9.5).

    Gaps between kernels: 8 µs each (99 gaps). In each, the host is in unrecorded
    Python for 0.5 µs ([10i+9.5, 10i+10): a sliver, counted as launch time) and then
    inside the next launching op for 7.5 µs: the whole gap waits for the launch.
    Every 4th launch goes through the driver API (cuLaunchKernelEx, as Triton does).
    ``inner_gap`` (ns): each op also records an ``aten::empty`` child that ends that long
    before its launch call starts (the host's pace between recorded calls inside an op).
    """
    t = KinetoTrace()
    for i in range(n):
        base = 10_000 * i
        t.cpu_op("aten::mul", base, 8_000, args={"External id": 1000 + i})
        if inner_gap is not None:
            t.cpu_op("aten::empty", base + 100, 1_900 - inner_gap, args={"External id": 1000 + i})
        driver = i % driver_every == 0
        t.runtime(
            "cuLaunchKernelEx" if driver else "cudaLaunchKernel",
            base + 2_000, 5_000, corr=5000 + i, ext=1000 + i, cat="cuda_driver" if driver else "cuda_runtime",
        )  # fmt: skip
        t.kernel("vectorized_elementwise_kernel", base + 7_500, 2_000, corr=5000 + i)
    return t


def run(store, tmp_path, loop: KinetoTrace | None = None, **params):
    loop = loop or tiny_kernel_loop()
    (res,) = ingest_paths(store, [str(loop.write(tmp_path / "tiny.json"))])
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
    # no operator has recorded children: the host's pace is not measured, no slowdown
    assert f.evidence["host_slowdown"] == 1.0 and f.evidence["inner_gap_ns"] is None
    assert f.evidence["saving_upper_ns"] == f.saving_ns and "up to" not in f.recommendation
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


def test_profiler_share_of_a_slowed_host_by_hand():
    """Slowdown 2: besides 10 ns per event, the lead grows by half the time that passes.
    Gap A (end 100): 2 events (20) + (100 - 0) / 2 = 70, wanted 100: takes 70. Gap B (end 200):
    no event, (200 - 100) / 2 = 50. After the sync ending at 250, gap C (end 300) has the event
    at 260 (10) + (300 - 250) / 2 = 35."""
    from stallscope.launch_cost import profiler_share

    kwargs = dict(
        gap_ends=np.array([100, 200, 300]),
        waits=np.array([100, 100, 100]),
        consumes=np.array([100, 100, 100]),
        event_starts=np.array([0, 5, 260]),
        sync_ends=np.array([250]),
        event_cost_ns=10,
    )
    assert profiler_share(**kwargs, slowdown=2.0).tolist() == [70, 50, 35]
    assert profiler_share(**kwargs).tolist() == [20, 0, 10]  # slowdown 1: the events alone


def test_inner_gaps_and_host_slowdown_by_hand():
    """Thread 1: op A [0, 100) holds B [10, 30), C [40, 60) (D [45, 50) nested in C) and E [70, 80);
    F [120, 130) is top level. Transitions inside A: B->C 10, D->E 20 (E starts 20 after the
    last event ended). Thread 2: G [0, 50) holds H [5, 15) (a first child: no transition)."""
    from stallscope.launch_cost import (
        MIN_INNER_GAPS,
        REFERENCE_INNER_GAP_NS,
        host_slowdown,
        inner_gaps,
    )

    rows = [(1, 0, 100), (1, 10, 30), (1, 40, 60), (1, 45, 50), (1, 70, 80), (1, 120, 130), (2, 0, 50), (2, 5, 15)]  # fmt: skip
    thread, starts, ends = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
    assert sorted(inner_gaps(thread, starts, ends).tolist()) == [10, 20]
    assert host_slowdown(np.full(MIN_INNER_GAPS - 1, 10 * REFERENCE_INNER_GAP_NS)) == (1.0, None)
    slow = np.full(MIN_INNER_GAPS, 2 * REFERENCE_INNER_GAP_NS)
    assert host_slowdown(slow) == (2.0, 2 * REFERENCE_INNER_GAP_NS)
    assert host_slowdown(slow // 4)[0] == 1.0  # a faster host keeps the per-event cost
    # a microsecond clock (older Kineto traces) cannot measure a pace under a microsecond
    assert host_slowdown(np.full(MIN_INNER_GAPS, 2_000)) == (1.0, None)


def slow_loop(n: int = 101) -> KinetoTrace:
    """Op i at [20i, 20i+18) µs with its launch call [20i+2, 20i+17); kernel [20i+17.5, 20i+19.5).

    The host takes 20 µs per iteration where the host-work model expects 8.62 µs unprofiled
    (one operator 1.53 + one launch call 7.09): a host slowed beyond the per-call cost."""
    t = KinetoTrace()
    for i in range(n):
        base = 20_000 * i
        t.cpu_op("aten::mul", base, 18_000, args={"External id": 1000 + i})
        t.runtime("cudaLaunchKernel", base + 2_000, 15_000, corr=5000 + i, ext=1000 + i)
        t.kernel("vectorized_elementwise_kernel", base + 17_500, 2_000, corr=5000 + i)
    return t


def test_host_work_and_work_slowdown_by_hand():
    """3 operators, 2 launch calls and 1 other call: 3 x 1,530 + 2 x 7,090 + 13,600 = 32,370 ns.
    Busy 64,740 ns with 1 µs per event: f = 64,740 / (32,370 + 6,000); clamped to [1, 4]."""
    from stallscope.launch_cost import HostEvents, HostWork, host_work, host_work_ns, work_slowdown

    assert host_work_ns(3, 2, 1) == 32_370
    assert work_slowdown(HostWork(64_740, 3, 2, 1), 1_000) == 64_740 / 38_370
    assert work_slowdown(HostWork(10_000, 3, 2, 1), 1_000) == 1.0  # a faster host: 1
    assert work_slowdown(HostWork(10**9, 3, 2, 1), 1_000) == 10**9 / 38_370  # not clamped here
    assert work_slowdown(HostWork(10_000, 0, 0, 0), 0) == 1.0  # no recorded work
    # events start at 0, 10, 20, 30 (kinds op, launch, other, op); the other call (a sync)
    # waited 5 ns; span [5, 100): the event at 0 is outside, busy = 95 - 5
    host = HostEvents(
        starts=np.array([0, 10, 20, 30]),
        sync_ends=np.array([25]),
        inner_gaps=np.zeros(0, dtype=np.int64),
        kinds=np.array([0, 1, 2, 0], dtype=np.int8),
        wait_ns=np.array([0, 0, 5, 0]),
    )
    assert host_work(host, 5, 100) == HostWork(90, 1, 1, 1)  # no ends given: recorded 0
    # with ends: events [10, 40), [20, 25) (the sync), [30, 50) and [0, 8) (outside): one run
    # [10, 50) = 40 ns, less the 5 ns waited in the sync
    ended = HostEvents(**{**host.__dict__, "ends": np.array([8, 40, 25, 50])})
    assert host_work(ended, 5, 100) == HostWork(90, 1, 1, 1, recorded_ns=35)


def test_a_slowed_host_lowers_the_gain_and_says_what_the_trace_cannot_tell(store, tmp_path):
    """slow_loop(101): span 17.5 .. 2019.5 µs = 2,002 µs, no syncs, so the host was busy 2,002 µs;
    in it 100 operators and 100 launch calls (op 0 and its launch call precede the first kernel):
    work 862 µs. Cost 1 µs per event: f = 2002 / (862 + 200) = 1.885. 100 gaps of 18 µs all wait
    for launches (1,800 µs). Slowdown 1: gap 0 takes the 4 µs of the first four events, each later
    gap 2: 202 µs, gain 1800 - 202 - 10 = 1,588 µs (the upper end). Slowdown 1.885: the lead also
    grows by 1 - 1/f = 0.4695 of the time that passes: gap 0 (end 37.5 µs) 4 + 17.61 -> takes 18
    (3.61 left), gap 1 3.61 + 2 + 9.39 = 15.00, the other 98 gaps 11.39 each: 1,149.3 µs, gain
    1800 - 1149.3 - 10 = 640.7 µs."""
    result = run(store, tmp_path, slow_loop(), min_impact_ms=0, profiler_event_us=1)
    (f,) = result.findings
    e = f.evidence
    assert e["host_busy_ns"] == 2_002_000 and e["host_work_ns"] == 862_000
    assert e["host_slowdown"] == round(2002 / 1062, 2)
    assert f.impact_ns == 1_800_000 and e["saving_upper_ns"] == 1_588_000
    assert abs(f.saving_ns - 640_730) <= 100
    assert "1.9× what their recorded work" in f.detail and "cannot tell which" in f.detail
    assert "up to 1.59 ms" in f.recommendation


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


def test_tiny_kernels_sample_saving_is_within_20_percent_of_the_measured_one(store):
    """tiny_kernels (1,000 x mul_/add_ on 256 floats, no operator with recorded children) against
    cuda_graph (the same body as one graph): unprofiled step medians from their truth files, over
    the 3 profiled steps. Before the host-work model the estimate was +63 %: the pace of the
    inner gaps could not be measured there."""
    import json

    from tests.conftest import SAMPLES

    kineto = SAMPLES / "kineto"
    if not (kineto / "tiny_kernels").is_dir():
        import pytest

        pytest.skip("sample_traces absent")

    def truth(name: str) -> dict:
        return json.loads((kineto / name / f"{name}.truth.json").read_text())

    eager, graph = (
        truth(n)["measured"]["step_wall_ns_measure_phase_synced"]["median_ns"]
        for n in ("tiny_kernels", "cuda_graph")
    )
    steps = len(truth("tiny_kernels")["capture"]["profiled_steps"])
    (res,) = ingest_paths(store, [str(kineto / "tiny_kernels" / "tiny_kernels.pt.trace.json.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = launch_overhead.run(job, launch_overhead.SPEC.params({}))
    job.close()
    (f,) = [x for x in result.findings if x.saving_ns is not None]
    measured = steps * (eager - graph)
    assert 0.8 * measured <= f.saving_ns <= 1.2 * measured, (f.saving_ns, measured)
    assert f.evidence["host_slowdown"] > 1.0 and f.evidence["host_work_ns"] > 0


def test_linear_pair_sample_is_within_20_percent_and_its_inner_gaps_read_slow(store):
    """sample_traces/launch_pairs/linear_16 (2,000 x F.linear of 16 rows, one profiled step of a
    calibration pair, tools/capture/launch_pairs.py): its truth is read from the capture's log.
    The inner-gap pace reads > 2 µs here (aten::t -> aten::addmm) on the host where training
    reads ~1 µs: as a slowdown it gave a saving of ~0; the host-work model gives the measured one."""
    import json

    import pytest

    from tests.conftest import SAMPLES

    path = SAMPLES / "launch_pairs" / "linear_16.pt.trace.json.gz"
    log = SAMPLES / "logs" / "launch_pairs_2026-12-02.json"
    if not path.is_file():
        pytest.skip("sample_traces absent")
    measured = json.loads(log.read_text())["linear_16"]["saving_per_step_ns"]  # one step kept
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    result = launch_overhead.run(job, launch_overhead.SPEC.params({}))
    job.close()
    (f,) = [x for x in result.findings if x.saving_ns is not None]
    assert f.evidence["steps"] == 1 and f.evidence["inner_gap_ns"] > 1_900
    assert 0.8 * measured <= f.saving_ns <= 1.2 * measured, (f.saving_ns, measured)
