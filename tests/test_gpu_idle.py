"""gpu_idle: every idle nanosecond attributed to its host-side cause, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from stallscope.analyzers import gpu_idle
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
