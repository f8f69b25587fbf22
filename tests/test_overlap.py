"""overlap on traces whose answers are known by hand, and on the DDP captures.

Times in the builders are ns; ``MS`` = 1 ms.
"""

from __future__ import annotations

import json

import pytest

from stallscope.analyzers import overlap
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace
from tests.test_nccl_wait import ALLREDUCE, meta

MS = 1_000_000


def hand_trace(comm_stream: int = 20) -> KinetoTrace:
    """GPU 0, in ms: compute [0,10) [20,30) on stream 7; all-reduce [5,15) [25,40);
    copies [12,14) (under comm) and [41,42) (exposed). Steps [0,20) and [20,45).

    comm union 25, hidden [5,10)+[25,30) = 10 -> 40 % overlapped, 15 exposed;
    copies 3, exposed 1 -> 66.667 %. Step 0: comm 10, exposed 5; step 1: comm 15, exposed 10.
    """
    t = KinetoTrace(rank=0, world_size=1)
    t.step(0, 0, 20 * MS)
    t.step(1, 20 * MS, 25 * MS)
    t.kernel("gemm", 0, 10 * MS)
    t.kernel("gemm", 20 * MS, 10 * MS)
    t.kernel(ALLREDUCE, 5 * MS, 10 * MS, stream=comm_stream, extra=meta(ranks="[0]"))
    t.kernel(ALLREDUCE, 25 * MS, 15 * MS, stream=comm_stream, extra=meta(ranks="[0]"))
    t.memcpy("DtoD", "Device", "Device", 12 * MS, 2 * MS, 1 << 20)
    t.memcpy("DtoH", "Device", "Pinned", 41 * MS, 1 * MS, 1 << 20)
    return t


def analyze(store, tmp_path, traces, **params):
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in traces]
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    result = overlap.run(job, overlap.SPEC.params(params))
    job.close()
    return result


def metrics(result) -> dict:
    return {(m.rank, m.name): m.value for m in result.metrics}


def test_metrics_by_hand(store, tmp_path):
    m = metrics(analyze(store, tmp_path, [hand_trace()]))
    assert m[(0, "comm_overlap_pct")] == 40.0
    assert m[(0, "exposed_comm_ns")] == 15 * MS and m[(0, "comm_ns")] == 25 * MS
    assert (0, "exposed_comm_wait_ns") not in m  # one rank: no one to wait for
    assert m[(0, "memcpy_overlap_pct")] == round(100 * 2 / 3, 3)
    assert m[(0, "exposed_memcpy_ns")] == 1 * MS


def test_finding_per_step_and_windows(store, tmp_path):
    (f,) = analyze(store, tmp_path, [hand_trace()]).findings
    assert f.severity == "high"  # 15 of 42 ms = 35.7 %
    assert f.impact_ns == f.evidence["exposed_transfer_ns"] == 15 * MS
    steps = [(s["step"], s["comm_ns"], s["exposed_comm_ns"], s["comm_overlap_pct"]) for s in f.evidence["steps"]]  # fmt: skip
    assert steps == [(0, 10 * MS, 5 * MS, 50.0), (1, 15 * MS, 10 * MS, 33.333)]
    assert f.windows == [[30 * MS, 40 * MS], [10 * MS, 15 * MS]]
    assert f.evidence["shared_streams"] == []
    # no backward op: forward-only, so tensor-parallel advice, not gradient/DDP advice
    assert "records no backward pass" in f.recommendation and "tensor-parallel" in f.recommendation
    assert (
        "DistributedDataParallel" not in f.recommendation
        and "bucket_cap_mb" not in f.recommendation
    )


def test_gradient_advice_only_with_a_backward_pass(store, tmp_path):
    t = hand_trace()
    t.cpu_op("autograd::engine::evaluate_function: MmBackward0", 0, 1 * MS)
    (f,) = analyze(store, tmp_path, [t]).findings
    assert "use DistributedDataParallel" in f.recommendation and "bucket_cap_mb" in f.recommendation
    assert "records no backward pass" not in f.recommendation


def test_work_outside_the_steps_is_left_out(store, tmp_path):
    """A start-up all-reduce at [60,65) ms, after the last step: not in the step-scoped numbers."""
    t = hand_trace()
    t.kernel(ALLREDUCE, 60 * MS, 5 * MS, stream=20, extra=meta(ranks="[0]"))
    result = analyze(store, tmp_path, [t])
    m = metrics(result)
    assert m[(0, "comm_overlap_pct")] == 40.0 and m[(0, "exposed_comm_ns")] == 15 * MS
    assert result.findings[0].evidence["scope"] == "steps"
    # nor in the collectives summary: 2 all-reduces in 2 steps, not 3
    assert "Collectives: 2 allreduce (1.0 per step" in result.findings[0].detail


def test_a_job_missing_ranks_says_waiting_may_read_as_transfer(store, tmp_path):
    t = hand_trace()
    t.world_size = 8  # rank 0 of 8, alone in the job
    (f,) = analyze(store, tmp_path, [t]).findings
    assert (f.evidence["ranks_present"], f.evidence["world_size"]) == (1, 8)
    assert "Only 1 of the job's 8 ranks are in this analysis" in f.detail
    (tmp_path / "whole").mkdir()
    (g,) = analyze(store, tmp_path / "whole", [hand_trace()]).findings  # world size 1
    assert g.evidence["ranks_present"] is None and "Only" not in g.detail


def test_comm_on_the_compute_stream_is_called_out(store, tmp_path):
    (f,) = analyze(store, tmp_path, [hand_trace(comm_stream=7)]).findings
    assert f.evidence["shared_streams"] == [7] and "own" in f.recommendation


def test_small_exposure_is_info_only(store, tmp_path):
    (f,) = analyze(store, tmp_path, [hand_trace()], min_impact_ms=20).findings
    assert f.severity == "info"


def test_waiting_for_a_late_rank_is_not_counted_as_exposed_transfer(store, tmp_path):
    """Rank 0's all-reduce [0,10) waits 9 ms for rank 1 (arrives at 9): 1 ms exposed transfer."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    r0.kernel(ALLREDUCE, 0, 10 * MS, stream=20, extra=meta())
    r1.kernel("gemm", 0, 9 * MS, device=1)
    r1.kernel(ALLREDUCE, 9 * MS, 1 * MS, device=1, stream=20, extra=meta())
    result = analyze(store, tmp_path, [r0, r1], min_impact_ms=0)
    f0 = next(f for f in result.findings if f.rank == 0)
    assert f0.evidence["exposed_wait_ns"] == 9 * MS and f0.impact_ns == 1 * MS
    assert metrics(result)[(0, "exposed_comm_ns")] == 10 * MS


def test_no_comm_no_comm_metrics(store, tmp_path):
    t = KinetoTrace()
    t.kernel("hipLaunchKernelGGL_gemm", 0, 5 * MS)  # a hip* compute kernel is not communication
    t.memcpy("HtoD", "Pinned", "Device", 6 * MS, 1 * MS, 4096)
    result = analyze(store, tmp_path, [t])
    assert metrics(result) == {(0, "memcpy_overlap_pct"): 0.0, (0, "exposed_memcpy_ns"): 1 * MS}
    assert result.findings == []


# --- the real captures ------------------------------------------------------------------


def sample(store, scenario: str):
    files = sorted(str(p) for p in (SAMPLES / "kineto" / scenario).glob("*.pt.trace.json.gz"))
    (res,) = ingest_paths(store, files)
    job = JobData(store, store.traces(res.job_id))
    result = overlap.run(job, overlap.SPEC.params())
    job.close()
    truth = json.loads(next((SAMPLES / "kineto" / scenario).glob("*.truth.json")).read_text())
    return result, truth


@pytest.mark.parametrize("scenario", ["ddp_overlap", "ddp_no_overlap", "ddp_straggler"])
def test_per_step_overlap_matches_the_truth_files(store, scenario):
    """Truth ``trace_review`` per step (CPU step windows); ours uses launch-based step windows."""
    result, truth = sample(store, scenario)
    for rank in (0, 1):
        review = truth["trace_review"][f"rank{rank}.pt.trace.json.gz"]["per_step"]
        (f,) = [f for f in result.findings if f.rank == rank]
        ours = f.evidence["steps"]
        assert len(ours) == len(review)
        for mine, theirs in zip(ours, review, strict=True):
            assert abs(mine["comm_overlap_pct"] - 100 * theirs["nccl_overlap_frac"]) < 1.0
            assert abs(mine["exposed_comm_ns"] / 1e6 - theirs["nccl_exposed_ms"]) < 0.05


def test_ddp_overlap_is_high_and_no_overlap_is_zero(store):
    healthy, truth = sample(store, "ddp_overlap")
    serial, _ = sample(store, "ddp_no_overlap")
    for rank in (0, 1):
        review = truth["trace_review"][f"rank{rank}.pt.trace.json.gz"]["per_step"]
        steps = sorted(100 * s["nccl_overlap_frac"] for s in review)
        overall = metrics(healthy)[(rank, "comm_overlap_pct")]
        # Over all steps: between the worst and best step, and high (most steps 84-89%;
        # one slow step per rank overlapped less, 41.5% and 76.6%).
        assert steps[0] <= overall <= steps[-1] and overall >= 80
        assert metrics(serial)[(rank, "comm_overlap_pct")] == 0.0
    # The control: nothing above low (rank 0's slow step left 3.1 ms exposed, 3.4% of its span).
    assert {f.severity for f in healthy.findings} <= {"info", "low"}
    assert {f.severity for f in serial.findings} == {"medium"}
    # the advice fits the code: the overlap capture uses DDP, the serial one an all_reduce loop
    low = [f for f in healthy.findings if f.severity == "low"]
    assert low and all("DistributedDataParallel is in use" in f.recommendation for f in low)
    assert all("use DistributedDataParallel" in f.recommendation for f in serial.findings)


def test_ddp_straggler_exposure_is_waiting_not_transfer(store):
    result, _ = sample(store, "ddp_straggler")
    f0 = next(f for f in result.findings if f.rank == 0)
    assert (
        f0.severity == "info"
        and f0.evidence["exposed_wait_ns"] > 0.9 * f0.evidence["exposed_comm_ns"]
    )


@pytest.mark.parametrize("scenario", ["ddp_overlap", "ddp_no_overlap", "ddp_straggler"])
def test_nsys_exports_match_their_truth_per_step(store, scenario):
    """Both ranks in one nsys report, start-up broadcasts included: the step windows still agree."""
    (res,) = ingest_paths(store, [str(SAMPLES / "nsys" / f"{scenario}.sqlite.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = overlap.run(job, overlap.SPEC.params())
    job.close()
    truth = json.loads((SAMPLES / "nsys" / f"{scenario}.truth.json").read_text())
    reviews = [p["per_step"] for p in truth["trace_review"]["processes"]]
    ours = [f.evidence["steps"] for f in sorted(result.findings, key=lambda f: f.rank)]
    assert len(ours) == len(reviews) == 2
    for mine, theirs in zip(ours, reviews, strict=True):
        assert [abs(a["comm_overlap_pct"] - 100 * b["nccl_overlap_frac"]) < 1.0 for a, b in zip(mine, theirs, strict=True)] == [True] * len(theirs)  # fmt: skip


def test_exposed_wait_metric_on_a_straggler(store, tmp_path):
    """straggler_job: rank 0 waits [10,40) ms per step with no compute beside it (3 steps)."""
    from tests.test_nccl_wait import straggler_job

    m = metrics(analyze(store, tmp_path, straggler_job()))
    assert m[(0, "exposed_comm_wait_ns")] == 3 * 30 * MS and m[(0, "comm_ns")] == 3 * 35 * MS
    assert m[(1, "exposed_comm_wait_ns")] == 0 and m[(1, "exposed_comm_ns")] == 3 * 5 * MS


def test_all_devices_at_once_equal_each_alone(store, tmp_path):
    """measure_devices (every device on one axis) gives measure_device's numbers, per step
    rows and windows, on three ranks: steps in order, no steps, steps out of time order
    (that one is measured alone)."""
    import msgspec
    import numpy as np

    from stallscope.analyzers.base import Where
    from stallscope.collectives import gpu_activity, match_collectives

    ranks = [hand_trace(), hand_trace(), hand_trace()]
    for r, t in enumerate(ranks):
        t.rank, t.world_size = r, 3
    ranks[1].events = [e for e in ranks[1].events if "ProfilerStep#" not in e]
    swap = {"ProfilerStep#0": "ProfilerStep#1", "ProfilerStep#1": "ProfilerStep#0"}
    ranks[2].events = [  # steps 0 and 1 swap names: step 1 runs first
        next((e.replace(a, b) for a, b in swap.items() if a in e), e) for e in ranks[2].events
    ]
    paths = [str(t.write(tmp_path / f"rank{r}.json")) for r, t in enumerate(ranks)]
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    act = gpu_activity(job)
    wheres = [Where(ref.trace_id, int(ref.meta.get("rank", 0)), d) for ref in job.traces for (t, d) in act if t == ref.trace_id]  # fmt: skip
    match = match_collectives(job)
    together = overlap.measure_devices(job, wheres, match, ranked=True)
    opss = [act[(w.trace, w.device)] for w in wheres]
    batch = overlap._Batch(opss, [match.waits_of(w.trace, w.device) for w in wheres])
    assert batch.irregular.tolist() == [False, False, True]  # rank 2 is measured alone
    scopes = []
    for w, m in zip(wheres, together, strict=True):
        waits = match.waits_of(w.trace, w.device) if match else (np.zeros(0, np.int64),) * 2
        alone = overlap.measure_device(job, w, act[(w.trace, w.device)], waits, ranked=True)
        assert msgspec.to_builtins(m) == msgspec.to_builtins(alone)
        scopes.append((m.scope, [s["step"] for s in m.steps]))
    assert sorted(scopes) == [("steps", [0, 1]), ("steps", [0, 1]), ("trace", [])]
    job.close()
