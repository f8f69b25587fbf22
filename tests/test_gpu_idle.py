"""gpu_idle: every idle nanosecond attributed to its host-side cause, by hand."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stallscope.analyzers import gpu_idle
from stallscope.analyzers.base import Where
from stallscope.idle import CAUSES, attribute_idle
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace

US = 1_000


def hand_trace() -> KinetoTrace:
    """Device 0, launch thread (100, 100); times in µs.

    gap1 [10,40):  DataLoader [12,37) -> dataloader 25; [10,12) unknown 2; launching op [37,40) -> launch 3
    gap2 [50,80):  cudaStreamSynchronize [45,60) -> host_sync 10; the sync drained the GPU, so
                   what follows up to the next launch is the sync's too: python [60,70) (cpu),
                   [70,74) and [79,80) (unknown slivers), launching op [74,79) (launch) -> host_sync 30
    gap3 [90,98):  cudaMemcpy (HtoD pageable) [90,98) -> memcpy 8
    gap4 [110,120): aten::item [110,125) -> host_sync 10
    gap5 [121,130): aten::item until 125 -> host_sync 4; drained, so [125,127) unknown and
                   cuLaunchKernelEx [127,130) -> host_sync 9 in all
    gap6 [140,145): kernel F was launched at 91 µs, long before: queued 5 (a GPU-side wait)
    A noise thread (100, 200) is busy the whole time: it launches nothing, so it is ignored.
    """
    t = KinetoTrace()
    t.runtime("cudaLaunchKernel", -5 * US, 1 * US, corr=1, ext=11)
    t.kernel("A", 0, 10 * US, corr=1)
    t.cpu_op(
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        12 * US,
        25 * US,
        cat="user_annotation",
    )
    t.cpu_op("aten::mm", 37 * US, 3 * US, args={"External id": 77})
    t.runtime("cudaLaunchKernel", 38 * US, 1500, corr=2, ext=77)
    t.kernel("B", 40 * US, 10 * US, corr=2)
    t.runtime("cudaStreamSynchronize", 45 * US, 15 * US, corr=50)
    t.cpu_op("train.py(33): step", 60 * US, 10 * US, cat="python_function", args={})
    t.cpu_op("aten::relu", 74 * US, 5 * US, args={"External id": 88})
    t.runtime("cudaLaunchKernel", 75 * US, 3 * US, corr=3, ext=88)
    t.kernel("C", 80 * US, 10 * US, corr=3)
    t.runtime("cudaMemcpy", 90 * US, 8 * US, corr=4)
    t.memcpy("HtoD", "Pageable", "Device", 98 * US, 2 * US, 1 << 20, corr=4)
    t.runtime("cudaLaunchKernel", 99 * US, 500, corr=5, ext=99)
    t.kernel("D", 100 * US, 10 * US, corr=5)
    t.cpu_op("aten::item", 110 * US, 15 * US, args={"External id": 60})
    t.runtime("cudaMemcpyAsync", 111 * US, 13 * US, corr=6, ext=60)
    t.memcpy("DtoH", "Device", "Pageable", 120 * US, 1 * US, 4, corr=6)
    t.runtime("cuLaunchKernelEx", 127 * US, 3 * US, corr=7, ext=70, cat="cuda_driver")
    t.kernel("E", 130 * US, 10 * US, corr=7)
    t.runtime("cudaLaunchKernel", 91 * US, 500, corr=8, ext=71)
    t.kernel("F", 145 * US, 5 * US, corr=8)
    t.cpu_op("pin_memory_loop", 0, 140 * US, tid=200)
    return t


@pytest.fixture
def job(store, tmp_path):
    path = hand_trace().write(tmp_path / "idle.json")
    (res,) = ingest_paths(store, [str(path)])
    data = JobData(store, store.traces(res.job_id))
    yield data
    data.close()


def test_attribution_by_hand(job):
    attribution = attribute_idle(job, job.traces[0].trace_id, 0)
    assert attribution.gap_starts.tolist() == [
        10 * US,
        50 * US,
        90 * US,
        110 * US,
        121 * US,
        140 * US,
    ]
    assert attribution.threads == [(100, 100)]
    expected = {
        "dataloader": 25,
        "host_sync": 49,
        "memcpy": 8,
        "launch": 3,
        "cpu": 0,
        "queued": 5,
        "unknown": 2,
    }
    assert attribution.totals == {c: expected[c] * US for c in CAUSES}
    assert attribution.per_gap.sum(axis=1).tolist() == [
        30 * US,
        30 * US,
        8 * US,
        10 * US,
        9 * US,
        5 * US,
    ]


def test_metrics_and_findings(job):
    result = gpu_idle.run(job, gpu_idle.SPEC.params({"min_impact_ms": 0}))
    metrics = {m.name: m.value for m in result.metrics}
    assert metrics["idle_dataloader_ns"] == 25 * US and metrics["idle_unknown_ns"] == 2 * US
    assert metrics["idle_queued_ns"] == 5 * US
    by_cause = {f.evidence["cause"]: f for f in result.findings}
    assert "launch" not in by_cause  # reported by launch_overhead
    # span 150 µs: dataloader 16.7 % -> medium; host_sync 16 % -> medium; memcpy 5.3 % -> low
    assert by_cause["dataloader"].severity == "medium"
    assert by_cause["dataloader"].impact_ns == 25 * US
    assert by_cause["dataloader"].windows == [[10 * US, 40 * US]]
    top = by_cause["dataloader"].evidence["top_host_ops"][0]
    assert top["name"].startswith("enumerate(DataLoader)") and top["overlap_ns"] == 25 * US
    assert by_cause["host_sync"].windows[0] == [50 * US, 80 * US]
    assert by_cause["memcpy"].severity == "low"
    assert "pin_memory" not in {
        op["name"] for f in result.findings for op in f.evidence["top_host_ops"]
    }


def test_min_impact_suppresses_small_traces(job):
    assert gpu_idle.run(job, gpu_idle.SPEC.params()).findings == []


@pytest.mark.parametrize("with_cpu_ops", [True, False])
def test_unrecorded_gap_advice_depends_on_what_was_captured(store, tmp_path, with_cpu_ops):
    """A 1 ms gap with nothing recorded: sample the unrecorded host work if CPU ops were
    captured (the profiler did see the host), else capture them."""
    t = KinetoTrace(rank=0, world_size=1)
    for i, start in enumerate((0, 1_100_000)):  # kernels of 100 µs, a 1 ms gap between them
        corr = t.next_corr()
        t.runtime("cudaLaunchKernel", start, 5_000, corr=corr)
        if with_cpu_ops:
            t.cpu_op("aten::mul", start - 1_000 if start else 0, 6_000)
        t.kernel(f"k{i}", start + 10_000, 90_000, corr=corr)
    path = t.write(tmp_path / f"gap{int(with_cpu_ops)}.json")
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    result = gpu_idle.run(job, gpu_idle.SPEC.params({"min_impact_ms": 0}))
    job.close()
    (finding,) = [f for f in result.findings if f.evidence["cause"] == "unknown"]
    assert finding.evidence["host_work_recorded"] is with_cpu_ops
    if with_cpu_ops:
        assert finding.recommendation == gpu_idle.UNRECORDED_WORK_FIX
    else:
        assert finding.recommendation.startswith("Capture with CPU activity")


def test_python_slivers_between_launches_are_launch_time(store, tmp_path):
    """A launch-bound loop, in ns: each 1 µs kernel ends, the host spends 3 µs in
    unrecorded Python, then 4 µs in an operator whose launch call runs in its middle,
    and the next kernel starts 1 µs after the operator returns. Each 8 µs gap is
    Python 3 + op 4 + device latency 1 (both unrecorded slivers): all ``launch``.
    Before kernel 3 the unrecorded stretch is 2.003 ms (a sleep): not a sliver, it
    stays ``unknown``, and that gap's op and latency are ``launch``."""
    t = KinetoTrace(rank=0, world_size=1)
    start = 10_000
    for i in range(6):
        if i:
            start += 1_000 + 8_000 + (2_000_000 if i == 3 else 0)
        corr = t.next_corr()
        t.cpu_op("aten::mul", start - 5_000, 4_000, args={"External id": 500 + i})
        t.runtime("cudaLaunchKernel", start - 4_000, 2_000, corr=corr, ext=500 + i)
        t.kernel(f"k{i}", start, 1_000, corr=corr)
    path = t.write(tmp_path / "loop.json")
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    attribution = attribute_idle(job, job.traces[0].trace_id, 0)
    job.close()
    totals = attribution.totals
    assert attribution.gap_starts.size == 5
    assert totals["unknown"] == 2_003_000
    assert totals["launch"] == 5 * 8_000 - 3_000
    assert sum(totals.values()) == 5 * 8_000 + 2_000_000


@pytest.mark.parametrize(
    ("labels", "lengths", "gaps", "expected"),
    [
        # unknown sliver beside a cpu op in a gap with no launch time: cpu
        (["unknown", "cpu", "unknown"], [3, 5, 2], [0, 0, 0], ["cpu", "cpu", "cpu"]),
        # the same gap with launch time anywhere in it: launch
        (["unknown", "cpu", "unknown", "launch"], [3, 5, 2, 1], [0, 0, 0, 0],
         ["launch", "cpu", "launch", "launch"]),
        # too long, or nothing recorded beside it, or beside host work of another gap only
        (["unknown", "launch", "unknown"], [60_000, 1, 3], [0, 0, 1], ["unknown", "launch", "unknown"]),
        # beside a dataloader stretch: stays unknown
        (["dataloader", "unknown", "launch"], [9, 60_001, 1], [0, 0, 0],
         ["dataloader", "unknown", "launch"]),
    ],
)  # fmt: skip
def test_sliver_rule(labels, lengths, gaps, expected):
    from stallscope.idle import _absorb_host_slivers

    index = [CAUSES.index(x) for x in labels]
    out = _absorb_host_slivers(
        np.array(index), np.array(gaps), np.array(lengths, dtype=np.int64) * US
    )
    assert [CAUSES[i] for i in out] == expected


# Measure, then speak (#16): the numbers of the hand trace, and findings from hand-made numbers.

NOTHING_TO_FIX = re.compile(r"nothing to (fix|do|change)|no (action|change|fix)", re.IGNORECASE)


def test_measure_device_by_hand(job):
    """hand_trace (no steps): span [0, 150) µs; the stall time of each cause and its gaps."""
    where = Where(job.traces[0].trace_id, 0, 0)
    m = gpu_idle.measure_device(job, where, gpu_idle.SPEC.params({"min_impact_ms": 0}))
    assert (m.span_ns, m.in_steps, m.streams, m.host_work_recorded) == (150 * US, False, 1, True)
    assert list(m.causes) == list(gpu_idle.REPORTED_CAUSES)  # launch: launch_overhead's
    c = m.causes["dataloader"]
    assert (c.impact_ns, c.gap_count, c.longest_ns) == (25 * US, 1, 25 * US)
    assert c.share_pct == pytest.approx(100 * 25 / 150)
    assert c.windows == [[10 * US, 40 * US]]
    assert c.host.top_host_ops[0]["name"].startswith("enumerate(DataLoader)")
    h = m.causes["host_sync"]  # gaps 2, 4 and 5: 30 + 10 + 9 µs, largest first
    assert (h.impact_ns, h.gap_count, h.longest_ns) == (49 * US, 3, 30 * US)
    assert h.windows == [[50 * US, 80 * US], [110 * US, 120 * US], [121 * US, 130 * US]]
    cpu = m.causes["cpu"]  # nothing: the drained gap's python time is host_sync's
    assert (cpu.impact_ns, cpu.gap_count, cpu.longest_ns, cpu.windows) == (0, 0, 0, [])
    q = m.causes["queued"]  # gap 6, 5 µs: not inside a graph replay (E and F: two launches)
    assert (q.impact_ns, q.windows) == (5 * US, [[140 * US, 145 * US]])
    assert q.host == gpu_idle.NO_HOST_ACTIVITY  # the host had handed the work over
    assert m.queued == gpu_idle.QueuedTime(
        queued_ns=5 * US, gap_count=1, graph_replay_ns=0, longest_ns=5 * US
    )
    assert m.totals == attribute_idle(job, where.trace, 0).totals


def test_measure_device_looks_at_the_host_only_for_reported_causes(job):
    """Under the default 1 ms floor no cause of the 150 µs trace is reported: the numbers are
    the same, the host activity is not measured."""
    where = Where(job.traces[0].trace_id, 0, 0)
    m = gpu_idle.measure_device(job, where, gpu_idle.SPEC.params())
    assert m.causes["host_sync"].impact_ns == 49 * US
    assert all(c.host is None for c in m.causes.values())
    assert gpu_idle.speak(m, gpu_idle.SPEC.params()) == []


def _idle(cause: str, impact_us: int, span_us: int = 1_000, **kw) -> gpu_idle.CauseIdle:
    return gpu_idle.CauseIdle(
        cause=cause,
        impact_ns=impact_us * US,
        span_ns=span_us * US,
        gap_count=kw.get("gaps", 2),
        longest_ns=kw.get("longest_us", impact_us) * US,
        windows=kw.get("windows", [[0, impact_us * US]]),
        host=kw.get("host"),
    )


def _device(*causes: gpu_idle.CauseIdle, span_us=1_000, queued=None, **kw) -> gpu_idle.DeviceIdle:
    zero = {c: 0 for c in gpu_idle.REPORTED_CAUSES}
    return gpu_idle.DeviceIdle(
        where=Where("t", 3, 1),
        span_ns=span_us * US,
        in_steps=kw.get("in_steps", True),
        totals={c: 0 for c in CAUSES} | {c.cause: c.impact_ns for c in causes},
        causes={c: _idle(c, zero[c]) for c in gpu_idle.REPORTED_CAUSES}
        | {c.cause: c for c in causes},
        queued=queued
        or gpu_idle.QueuedTime(queued_ns=0, gap_count=0, graph_replay_ns=0, longest_ns=0),
        streams=kw.get("streams", 1),
        host_work_recorded=kw.get("host_work_recorded", True),
    )


PARAMS = gpu_idle.SPEC.params({"min_impact_ms": 0})


def test_speak_writes_the_measured_numbers():
    """200 of 1,000 µs waiting for data, in 2 gaps (longest 150 µs): medium (10-25 %)."""
    host = gpu_idle.HostActivity(
        top_host_ops=[{"name": "collate", "kind": "cpu_op", "overlap_ns": 180 * US, "count": 2}],
        host_ranges=[],
    )
    m = _device(_idle("dataloader", 200, longest_us=150, host=host))
    (f,) = gpu_idle.speak(m, PARAMS)
    assert (f.trace, f.rank, f.device, f.severity) == ("t", 3, 1, "medium")
    assert f.title == "GPU 1 idle 20.0% of the time waiting for input data"
    assert f.detail.startswith(
        "GPU 1 was idle 0.20 ms (20.0% of its 1.00 ms span) waiting for input data, in 2 gaps "
        "(longest 0.150 ms). The host was mostly in: collate (0.18 ms)."
    )
    assert f.impact_ns == f.saving_ns == 200 * US
    assert f.evidence["longest_gap_ns"] == 150 * US and f.evidence["scope"] == "steps"
    assert f.evidence["top_host_ops"] == host.top_host_ops and f.windows == [[0, 200 * US]]
    assert "host_work_recorded" not in f.evidence


def test_speak_fits_the_fix_to_the_trace():
    ranges = [{"name": "log_metrics", "overlap_ns": 90 * US, "windows": 1, "thread": 100}]
    cpu = _idle("cpu", 100, host=gpu_idle.HostActivity(top_host_ops=[], host_ranges=ranges))
    (f,) = gpu_idle.speak(_device(cpu), PARAMS)
    assert f.recommendation.startswith("The GPU waits while the host is in `log_metrics`")
    assert "In the 1 longest gaps the host was in `log_metrics`" in f.detail
    for recorded, start in ((True, gpu_idle.UNRECORDED_WORK_FIX), (False, "Capture with CPU")):
        m = _device(_idle("unknown", 100), host_work_recorded=recorded)
        (f,) = gpu_idle.speak(m, PARAMS)
        assert f.recommendation.startswith(start) and f.evidence["host_work_recorded"] is recorded
    for streams in (1, 3):
        (f,) = gpu_idle.speak(_device(_idle("queued", 100), streams=streams), PARAMS)
        assert (f.recommendation == gpu_idle.QUEUED_MULTI_STREAM_FIX) is (streams > 1)


def test_queued_time_that_is_no_stall_is_an_info_note_and_never_a_loss():
    """400 µs of queued time, all inside graph replays or under 1 µs (none counted): one
    info note, impact 0 and no saving; its 'nothing to fix' never sits under a loss."""
    queued = gpu_idle.QueuedTime(
        queued_ns=400 * US, gap_count=900, graph_replay_ns=300 * US, longest_ns=900
    )
    (note,) = gpu_idle.speak(_device(queued=queued), PARAMS)
    assert note.severity == "info" and note.impact_ns == 0 and note.saving_ns is None
    assert note.title == (
        "GPU 1: 40.0% of the time in device-side gaps between queued kernels (not a stall)"
    )
    assert "0.30 ms of it between the kernels of one CUDA graph replay" in note.detail
    assert "(longest 0.90 µs)" in note.detail
    # the same time counted as a stall: a loss, whose fix is never "nothing to fix"
    losses = gpu_idle.speak(_device(_idle("queued", 400), queued=queued), PARAMS)
    assert [f.severity for f in losses] == ["high"]
    for m in (_device(_idle(c, 300)) for c in gpu_idle.REPORTED_CAUSES):
        for f in gpu_idle.speak(m, PARAMS):
            assert f.impact_ns > 0 and not NOTHING_TO_FIX.search(f.recommendation), f.title


def test_run_is_measure_then_speak(job):
    params = gpu_idle.SPEC.params({"min_impact_ms": 0})
    m = gpu_idle.measure_device(job, Where(job.traces[0].trace_id, 0, 0), params)
    result = gpu_idle.run(job, params)
    assert gpu_idle.speak(m, params) == result.findings and len(result.findings) == 4
    assert gpu_idle.metrics(m) == result.metrics


@pytest.mark.parametrize("recorded_under_it", [False, True])
def test_time_only_inside_a_user_range_is_not_called_host_work(store, tmp_path, recorded_under_it):
    """A 1 ms gap inside a record_function range ``wait_here``: with nothing recorded under
    the range the trace shows only that the host was inside it (a sleep, I/O or CPU work),
    so the finding says that; with an operator under it, it is the host running other work."""
    t = KinetoTrace(rank=0, world_size=1)
    t.cpu_op("wait_here", 150_000, 900_000, cat="user_annotation")
    if recorded_under_it:
        t.cpu_op("aten::mul", 200_000, 800_000)
    for i, start in enumerate((0, 1_100_000)):  # kernels of 100 µs, a 1 ms gap between them
        corr = t.next_corr()
        t.runtime("cudaLaunchKernel", start, 5_000, corr=corr)
        t.kernel(f"k{i}", start + 10_000, 90_000, corr=corr)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / f"r{int(recorded_under_it)}.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = gpu_idle.run(job, gpu_idle.SPEC.params({"min_impact_ms": 0}))
    job.close()
    (finding,) = [f for f in result.findings if f.evidence["cause"] == "cpu"]
    only = finding.evidence["range_only_ns"]
    if (
        recorded_under_it
    ):  # the op covers [200, 1000) µs: only [150, 200) and [1000, 1050) are range-only
        assert only == 100_000
    else:
        assert only == finding.impact_ns > 0
        assert "inside `wait_here` with nothing recorded under it" in finding.title
        assert "host ran other work" not in finding.detail
        assert "-t osrt" in finding.recommendation and "py-spy" in finding.recommendation
