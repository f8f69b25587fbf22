"""nccl_wait and collective matching on multi-rank traces whose answers are known by hand.

Times in the builders are ns; ``MS`` = 1 ms.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from stallscope.analyzers import nccl_wait
from stallscope.collectives import match_collectives
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, SAMPLES
from tests.kineto_builder import KinetoTrace

MS = 1_000_000
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def meta(pg="0", ranks="[0, 1]", nelems=1_000_000, seq=None, op="allreduce") -> dict:
    args = {
        "Collective name": op,
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": ranks.count(",") + 1,
        "dtype": "Float",
        "Process Group Name": pg,
        "Process Group Description": "default_pg",
        "Process Group Ranks": ranks,
    }
    if seq is not None:
        args["Seq"] = seq
    return args


def analyze(store, tmp_path, traces: list[KinetoTrace], **params):
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in traces]
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    result = nccl_wait.run(job, nccl_wait.SPEC.params(params))
    return job, result


def metrics(result) -> dict:
    return {(m.rank, m.name): m.value for m in result.metrics}


def straggler_job(slow=("cpu_op", "slow_host_work")) -> list[KinetoTrace]:
    """3 steps of 100 ms. Rank 0: compute [0,10), all-reduce [10,45).

    Rank 1: host op ``slow_host_work`` [0,38) with its GPU idle, compute [38,40),
    all-reduce [40,45). So rank 0 waits 30 ms per step (40 - 10), both transfer 5 ms.
    ``slow``: the (category, name) of rank 1's slow host event.
    """
    ranks = [KinetoTrace(rank=r, world_size=2) for r in (0, 1)]
    for k in range(3):
        base = 100 * MS * k
        for t in ranks:
            t.step(k, base, 100 * MS)
        r0, r1 = ranks
        r0.kernel("gemm", base, 10 * MS)
        r0.kernel(ALLREDUCE, base + 10 * MS, 35 * MS, stream=20, extra=meta())
        r1.cpu_op(slow[1], base, 38 * MS, cat=slow[0])
        r1.kernel("gemm", base + 38 * MS, 2 * MS, device=1)
        r1.kernel(ALLREDUCE, base + 40 * MS, 5 * MS, device=1, stream=20, extra=meta())
    return ranks


def test_wait_transfer_and_straggler_by_hand(store, tmp_path):
    job, result = analyze(store, tmp_path, straggler_job())
    m = metrics(result)
    assert m[(0, "nccl_wait_ns")] == 3 * 30 * MS and m[(1, "nccl_wait_ns")] == 0
    assert m[(0, "collective_count")] == m[(1, "collective_count")] == 3
    match = match_collectives(job)
    assert match.rows["transfer_ns"].tolist() == [5 * MS] * 6
    (finding,) = [f for f in result.findings if f.severity != "info"]
    assert (finding.rank, finding.severity) == (0, "high")  # 90 of 245 ms
    ev = finding.evidence
    assert ev["straggler_rank"] == 1 and ev["straggler_main_cause_in"] == "3/3 steps"
    assert ev["exposed_wait_ns"] == finding.impact_ns == 90 * MS
    assert [s["wait_ns"] for s in ev["steps"]] == [30 * MS] * 3
    assert finding.windows[0] == [10 * MS, 40 * MS]
    job.close()


def test_collectives_outside_steps_are_matched_but_not_charged(store, tmp_path):
    """A shutdown all-reduce after the last step, where rank 0 waits 4 ms: matched, not counted."""
    r0, r1 = straggler_job()
    r0.kernel(ALLREDUCE, 310 * MS, 5 * MS, stream=20, extra=meta())
    r1.kernel(ALLREDUCE, 314 * MS, 1 * MS, device=1, stream=20, extra=meta())
    job, result = analyze(store, tmp_path, [r0, r1])
    assert metrics(result)[(0, "nccl_wait_ns")] == 3 * 30 * MS
    assert metrics(result)[(0, "collective_count")] == 3
    summary = next(f for f in result.findings if f.severity == "info")
    assert summary.evidence["matched"] == 4
    job.close()


def test_straggler_activity_shows_its_host_work(store, tmp_path):
    job, result = analyze(store, tmp_path, straggler_job())
    (finding,) = [f for f in result.findings if f.severity != "info"]
    doing = finding.evidence["straggler_activity"]
    # lateness intervals: [0,40) from the step start, then [45,140) and [145,240) from the
    # previous all-reduce's end, on rank 1's clock: 230 ms, 6 ms of compute in them
    assert doing["window_ns"] == 230 * MS
    assert doing["compute_pct"] == round(100 * 6 / 230, 1)
    top = doing["top_host_ops"][0]
    assert (top["name"], top["overlap_ns"]) == ("slow_host_work", 114 * MS)
    why = finding.evidence["lateness"]
    # rank 0 reaches each all-reduce 10 ms after the common point, rank 1 40 ms after: 3 x 30 ms,
    # all of it GPU idle while rank 1's host ran slow_host_work (cause cpu)
    assert why["late_ns"] == why["explained_ns"] == 90 * MS
    assert why["causes_ns"] == {"cpu": 90 * MS} and why["main_cause"] == "cpu"
    assert "Python/CPU work" in finding.recommendation
    assert why["cpu_in_range_ns"] == 0 and why["covering_range"] is None  # a recorded op
    job.close()


def test_time_only_inside_a_user_range_is_not_called_cpu_work(store, tmp_path):
    """Rank 1's slow part is a record_function range with nothing recorded under it: the
    trace shows the host was inside ``rank_extra``, not what it did there (a sleep, I/O or
    CPU work). The cause stays ``cpu`` (same numbers as a recorded host op), its words and
    advice say what the trace cannot tell."""
    job, result = analyze(store, tmp_path, straggler_job(("user_annotation", "rank_extra")))
    (finding,) = [f for f in result.findings if f.severity != "info"]
    why = finding.evidence["lateness"]
    assert why["causes_ns"] == {"cpu": 90 * MS} and why["main_cause"] == "cpu"
    assert why["cpu_in_range_ns"] == 90 * MS and why["covering_range"] == "rank_extra"
    assert (
        ": inside host range `rank_extra` with nothing recorded under it (sleep, I/O or CPU work: "
        "the trace cannot tell) 90.0 ms" in finding.detail
    )
    assert "Python/CPU work" not in finding.detail + finding.recommendation
    assert "`-t osrt`" in finding.recommendation and "py-spy" in finding.recommendation
    job.close()


def test_summary_has_bus_bandwidth_and_skew(store, tmp_path):
    job, result = analyze(store, tmp_path, straggler_job())
    (summary,) = [f for f in result.findings if f.severity == "info"]
    ev = summary.evidence
    assert ev["matched"] == 3 and ev["unmatched_kernels"] == 0 and ev["methods"] == {"0": "order"}
    assert ev["clock_skew_ns"] == {"0": 0, "1": 0} and ev["skew_corrected_ranks"] == []
    (op,) = ev["ops"]
    # 1e6 floats = 4 MB in 5 ms: 0.8 GB/s; all-reduce bus factor 2(n-1)/n = 1 for n = 2
    assert op["median_bytes"] == 4_000_000 and op["median_busbw_gbps"] == 0.8
    assert op["algorithms"] == ["RING_LL"] and ev["straggler_tally"] == {"0": 0, "1": 3}
    job.close()


def test_sequence_numbers_beat_order(store, tmp_path):
    """Rank 1's profiler missed seq 5: by order its first kernel would pair with rank 0's seq 5."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    for i, seq in enumerate((5, 6, 7)):
        r0.kernel(ALLREDUCE, i * 10 * MS, 4 * MS, stream=20, extra=meta(seq=seq))
    for seq in (6, 7):  # arrives 1 ms after rank 0, ends with it
        start = (seq - 5) * 10 * MS + 1 * MS
        r1.kernel(ALLREDUCE, start, 3 * MS, device=1, stream=20, extra=meta(seq=seq))
    job, result = analyze(store, tmp_path, [r0, r1])
    match = match_collectives(job)
    assert match.methods == {"0": "seq"}
    assert metrics(result)[(0, "nccl_wait_ns")] == 2 * MS
    summary = next(f for f in result.findings if f.severity == "info")
    assert summary.evidence["unmatched_kernels"] == 1
    job.close()


def test_count_mismatch_is_aligned_on_completion_and_warned(store, tmp_path):
    """No seq: rank 1 lacks rank 0's first all-reduce; aligned by end times, not by order."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    for i in range(4):
        r0.kernel(ALLREDUCE, i * 10 * MS, 4 * MS, stream=20, extra=meta())
    for i in range(1, 4):
        r1.kernel(ALLREDUCE, i * 10 * MS + 3 * MS, 1 * MS, device=1, stream=20, extra=meta())
    job, result = analyze(store, tmp_path, [r0, r1])
    assert metrics(result)[(0, "nccl_wait_ns")] == 3 * 3 * MS
    summary = next(f for f in result.findings if f.severity == "info")
    assert any("different counts" in w and "(+1)" in w for w in summary.evidence["data_quality"])
    assert not any(match_collectives(job).skew_corrected.values())
    job.close()


def test_count_mismatch_irregular_spacing_picks_the_steady_offset(store, tmp_path):
    """Rank 1 misses the last of 4 irregularly spaced all-reduces; its ends match at offset 0."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    starts = [0, 7 * MS, 19 * MS, 40 * MS]
    for s in starts:
        r0.kernel(ALLREDUCE, s, 4 * MS, stream=20, extra=meta())
    for s in starts[:3]:
        r1.kernel(ALLREDUCE, s + 1 * MS, 3 * MS, device=1, stream=20, extra=meta())
    job, result = analyze(store, tmp_path, [r0, r1])
    assert metrics(result)[(0, "nccl_wait_ns")] == 3 * MS
    job.close()


def test_name_fallback_groups_by_stream_and_ignores_hip_compute(store, tmp_path):
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    for i in range(3):
        r0.kernel("hipKernel_gemm_compute", i * 10 * MS, 1 * MS)
        r0.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", i * 10 * MS + 2 * MS, 4 * MS, stream=9)
        r1.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", i * 10 * MS + 5 * MS, 1 * MS, device=1, stream=9)  # fmt: skip
    job, result = analyze(store, tmp_path, [r0, r1])
    m = metrics(result)
    assert m[(0, "collective_count")] == 3 and m[(0, "nccl_wait_ns")] == 3 * 3 * MS
    assert match_collectives(job).methods == {"stream 9": "order"}
    job.close()


def test_clock_skew_between_hosts_is_estimated_and_corrected(store, tmp_path):
    """Rank 1's clock runs 5 ms ahead. Truly: rank 0 arrives at 0, rank 1 at 2 ms, both end at 3 ms."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    for i in range(4):
        base = i * 20 * MS
        r0.kernel(ALLREDUCE, base, 3 * MS, stream=20, extra=meta())
        r1.kernel(ALLREDUCE, base + 7 * MS, 1 * MS, device=1, stream=20, extra=meta())
    job, result = analyze(store, tmp_path, [r0, r1])
    match = match_collectives(job)
    assert list(match.skew_ns.values()) == [0, 5 * MS]
    assert list(match.skew_corrected.values()) == [False, True]
    assert metrics(result)[(0, "nccl_wait_ns")] == 4 * 2 * MS  # not 4 x 7 ms
    job.close()


def test_process_groups_are_matched_apart(store, tmp_path):
    """4 ranks: world all-reduce (rank 3 late by 2 ms), then pg '1' = [0, 1] (rank 1 late by 1 ms)."""
    traces = [KinetoTrace(rank=r, world_size=4) for r in range(4)]
    for i in range(2):
        base = i * 20 * MS
        for r, t in enumerate(traces):
            arrive = 2 * MS if r == 3 else 0
            t.kernel(ALLREDUCE, base + arrive, 3 * MS - arrive, device=r, stream=20, extra=meta(ranks="[0, 1, 2, 3]"))  # fmt: skip
        for r in (0, 1):
            arrive = 1 * MS if r == 1 else 0
            traces[r].kernel(ALLREDUCE, base + 5 * MS + arrive, 2 * MS - arrive, device=r, stream=21, extra=meta(pg="1"))  # fmt: skip
    job, result = analyze(store, tmp_path, traces, min_impact_ms=0)
    m = metrics(result)
    assert [m[(r, "nccl_wait_ns")] for r in range(4)] == [2 * 3 * MS, 2 * 2 * MS, 2 * 2 * MS, 0]
    summary = next(f for f in result.findings if f.severity == "info")
    assert summary.evidence["matched"] == 4
    assert summary.evidence["straggler_tally"] == {"0": 0, "1": 2, "2": 0, "3": 2}
    job.close()


def test_groups_listing_ranks_not_captured_are_warned(store, tmp_path):
    """Ranks 0 and 1 of 4: pg '0' lists [0, 1, 2, 3] (2 not captured: warned), pg '1' lists
    [0, 1] (all captured), pg '2' a truncated list (unknown: not warned). The list is read
    once per distinct text (the rows carry its hash)."""
    traces = [KinetoTrace(rank=r, world_size=4) for r in (0, 1)]
    for i in range(2):
        for r, t in enumerate(traces):
            base = i * 20 * MS
            t.kernel(ALLREDUCE, base, 3 * MS, device=r, stream=20, extra=meta(ranks="[0, 1, 2, 3]"))  # fmt: skip
            t.kernel(ALLREDUCE, base + 5 * MS, 2 * MS, device=r, stream=21, extra=meta(pg="1"))
            t.kernel(ALLREDUCE, base + 9 * MS, 2 * MS, device=r, stream=22, extra=meta(pg="2", ranks="[0, 1, ...]"))  # fmt: skip
    job, _ = analyze(store, tmp_path, traces, min_impact_ms=0)
    listed = [w for w in match_collectives(job).warnings if " lists " in w]
    assert listed == [
        "group 0 lists 4 ranks, the job holds 2 of them: waits are relative to the captured "
        "ranks only"
    ]
    job.close()


def test_single_rank_job_counts_only(store, tmp_path):
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel(ALLREDUCE, 0, 1 * MS, stream=20, extra=meta(ranks="[0]"))
    job, result = analyze(store, tmp_path, [t])
    assert metrics(result) == {(0, "collective_count"): 1}
    assert result.findings == []
    job.close()


# --- the real captures ------------------------------------------------------------------


def sample_job(store, scenario: str):
    files = sorted(str(p) for p in (SAMPLES / "kineto" / scenario).glob("*.pt.trace.json.gz"))
    (res,) = ingest_paths(store, files)
    return JobData(store, store.traces(res.job_id))


def test_ddp_straggler_names_rank_1_and_rank_0_waits_about_50ms_per_step(store):
    truth = json.loads(
        (SAMPLES / "kineto" / "ddp_straggler" / "ddp_straggler.truth.json").read_text()
    )
    sleep = truth["measured_per_rank"][1]["planted_sleep_ns_measured"]["median_ns"]  # 50.1 ms
    job = sample_job(store, "ddp_straggler")
    result = nccl_wait.run(job, nccl_wait.SPEC.params())
    (finding,) = [f for f in result.findings if f.severity != "info"]
    assert finding.rank == 0 and finding.severity in ("high", "critical")
    ev = finding.evidence
    assert ev["straggler_rank"] == 1 and ev["straggler_main_cause_in"] == "4/4 steps"
    for step in ev[
        "steps"
    ]:  # the first bucket waits out the sleep; later buckets wait ~0.6 ms each
        assert sleep <= step["largest_wait_ns"] <= sleep + 2 * MS
        assert step["largest_wait_ns"] <= step["wait_ns"] <= sleep + 8 * MS
    assert ev["straggler_activity"]["gpu_busy_pct"] < 30  # rank 1's GPU sat idle during its sleep
    # the sleep is unrecorded: the operations listed are not blamed for it
    assert "around the unrecorded time, not its cause" in finding.detail
    why = ev["lateness"]
    assert why["main_cause"] == "unknown" and "record_function" in finding.recommendation
    # lateness per step ~ the sleep, explained by unrecorded host time
    assert 4 * sleep <= why["causes_ns"]["unknown"] <= 4 * (sleep + 1 * MS)
    assert metrics(result)[(1, "nccl_wait_ns")] == 0
    job.close()


def test_ddp_straggler_saving_matches_the_measured_step_difference(store):
    """Fixing the straggler = ddp_overlap's job (same model, no sleep): the what-if saving over
    the 4 captured steps is within 20% of the unprofiled step-time difference x 4 (202.7 ms)."""

    def median_step(scenario: str) -> int:
        truth = json.loads((SAMPLES / "kineto" / scenario / f"{scenario}.truth.json").read_text())
        return truth["measured_per_rank"][0]["step_wall_ns_measure_phase_synced"]["median_ns"]

    measured = 4 * (median_step("ddp_straggler") - median_step("ddp_overlap"))
    job = sample_job(store, "ddp_straggler")
    result = nccl_wait.run(job, nccl_wait.SPEC.params())
    (finding,) = [f for f in result.findings if f.severity != "info"]
    assert abs(finding.saving_ns - measured) <= 0.2 * measured  # 192.3 vs 202.7 ms
    what_if = finding.evidence["what_if"]
    assert [s["step"] for s in what_if["steps"]] == [3, 4, 5, 6]
    # after: about ddp_overlap's profiled step (11-13.4 ms) plus rank 1's profiler overhead
    assert all(s["after_ns"] < 16 * MS < 60 * MS < s["before_ns"] for s in what_if["steps"])
    job.close()


def test_ddp_straggler_from_nsys_names_rank_1(store):
    (res,) = ingest_paths(store, [str(SAMPLES / "nsys" / "ddp_straggler.sqlite.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = nccl_wait.run(job, nccl_wait.SPEC.params())
    (finding,) = [f for f in result.findings if f.severity != "info"]
    assert finding.rank == 0 and finding.evidence["straggler_rank"] == 1
    assert finding.evidence["straggler_main_cause_in"] == "5/5 steps"
    assert all(50 * MS <= s["largest_wait_ns"] <= 52 * MS for s in finding.evidence["steps"])
    # captured with -t cuda,nvtx: the sleep sits in NVTX `straggler_sleep` with nothing recorded
    # under it, so the trace cannot say it was CPU work
    why = finding.evidence["lateness"]
    assert why["main_cause"] == "cpu" and why["covering_range"] == "straggler_sleep"
    assert why["cpu_in_range_ns"] >= 0.9 * why["causes_ns"]["cpu"]
    assert "inside host range `straggler_sleep` with nothing recorded under it" in finding.detail
    assert "Python/CPU work 2" not in finding.detail and "`-t osrt`" in finding.recommendation
    job.close()


def test_ddp_overlap_has_no_straggler(store):
    job = sample_job(store, "ddp_overlap")
    result = nccl_wait.run(job, nccl_wait.SPEC.params())
    assert [f.severity for f in result.findings] == ["info"]
    truth = json.loads((SAMPLES / "kineto" / "ddp_overlap" / "ddp_overlap.truth.json").read_text())
    steps = truth["trace_review"]["rank0.pt.trace.json.gz"]["per_step"]
    assert result.findings[0].evidence["matched"] == sum(s["nccl_kernels"] for s in steps) == 80
    job.close()


DLRM = CORPUS / "param" / "dlrm_kineto"


@pytest.mark.corpus
def test_dlrm_8_ranks_all_collectives_matched(store):
    (res,) = ingest_paths(store, sorted(str(p) for p in DLRM.glob("*.json.gz")))
    job = JobData(store, store.traces(res.job_id))
    result = nccl_wait.run(job, nccl_wait.SPEC.params())
    summary = next(f for f in result.findings if f.severity == "info")
    assert summary.evidence["matched"] == 8 and summary.evidence["unmatched_kernels"] == 0
    assert all(abs(s) <= 2_000 for s in summary.evidence["clock_skew_ns"].values())  # one host
    assert summary.evidence["straggler_tally"]["7"] == 5  # rank 7 arrives last in 5 of 8
    job.close()


def test_no_matched_collective_leaves_no_straggler(store, tmp_path):
    """Two ranks whose only collectives are in different groups: nothing matched, no crash."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    r0.kernel(ALLREDUCE, 0, 4 * MS, stream=20, extra=meta(pg="a", ranks="[0, 2]"))
    r1.kernel(ALLREDUCE, 1 * MS, 3 * MS, device=1, stream=20, extra=meta(pg="b", ranks="[1, 3]"))
    job, result = analyze(store, tmp_path, [r0, r1])
    assert [f.severity for f in result.findings] == ["info"]
    assert result.findings[0].evidence["critical_path"] == []
    job.close()


@pytest.mark.parametrize("tolerance_us", [None, 10_000.0])
def test_one_skew_tolerance_per_job(store, tmp_path, tolerance_us):
    """nccl_wait, overlap and the Distributed page's wait matrix use one clock correction.

    Rank 1's clock runs 5 ms ahead (as above). The default tolerance (100 µs)
    corrects it: rank 0 waits 2 ms per all-reduce. A 10 ms tolerance, set through
    the nccl_wait threshold, leaves the clocks as they are: rank 0 then waits 3 ms
    (its whole kernel). All three readers give the same wait either way.
    """
    from stallscope import job_settings
    from stallscope.report import analyze_job
    from stallscope.views import wait_matrix

    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    for i in range(4):
        base = i * 20 * MS
        r0.kernel(ALLREDUCE, base, 3 * MS, stream=20, extra=meta())
        r1.kernel(ALLREDUCE, base + 7 * MS, 1 * MS, device=1, stream=20, extra=meta())
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in (r0, r1)]
    (res,) = ingest_paths(store, paths)
    overrides = {} if tolerance_us is None else {"nccl_wait": {"skew_tolerance_us": tolerance_us}}
    job = JobData(store, store.traces(res.job_id))
    result = analyze_job(job, overrides)
    job.close()
    by_name = {(m.rank, m.name): m.value for m in result.metrics}
    waited = {name: by_name[(0, name)] for name in ("nccl_wait_ns", "exposed_comm_wait_ns")}
    page_job = JobData(store, store.traces(res.job_id))  # as the page opens it: its own JobData
    job_settings.apply(page_job, overrides)
    matrix = wait_matrix(page_job)
    page_job.close()
    page_wait = round(float(matrix.loc[matrix["rank"] == 0, "wait_ms"].sum()) * 1e6)
    expected = 4 * (2 if tolerance_us is None else 3) * MS
    assert waited == {"nccl_wait_ns": expected, "exposed_comm_wait_ns": expected}
    assert page_wait == expected


def test_summary_names_clock_skews_briefly_for_many_ranks():
    from stallscope.analyzers.nccl_wait import SKEWS_LISTED, _skew_text

    few = {str(r): 0 for r in range(SKEWS_LISTED)} | {"1": 20480}
    assert _skew_text(few) == str(few)  # up to 8 ranks: every one, as before
    many = {str(r): 0 for r in range(256)} | {"1": 20480, "9": -30000}
    assert _skew_text(many) == "0 on 254 of 256 ranks; rank 9 -30000, rank 1 20480"
    lots = {str(r): r for r in range(20)}
    assert _skew_text(lots).endswith("rank 12 12, and 11 more")  # 19 non-zero: 8 named


# --- measure, then speak (docs/architecture.md) -------------------------------------------


def test_measurement_of_the_straggler_job_by_hand(store, tmp_path):
    """straggler_job, measured: rank 0 waits 30 ms in each of 3 all-reduces for rank 1, with no
    compute beside it; the findings, metrics and tables are written from the measurement."""
    from stallscope.analyzers.base import Where

    job, result = analyze(store, tmp_path, straggler_job())
    params = nccl_wait.SPEC.params()
    m = nccl_wait.measure(job, params)
    p0, p1 = m.participants
    assert (p0.where.rank, p0.collectives, p0.waited_ns) == (0, 3, 90 * MS)
    assert (p1.where, p1.collectives, p1.waited_ns, p1.wait) == (
        Where(p1.where.trace, 1, 1), 3, 0, None
    )  # fmt: skip
    w = p0.wait
    assert (w.waited_ns, w.waits, w.exposed_ns) == (90 * MS, 3, 90 * MS)
    # the steps' windows: [0,100) and [100,200) to the next step, [200,245) to its last op
    assert w.span_ns == 245 * MS and w.share_pct == pytest.approx(100 * 90 / 245)
    assert (w.straggler, w.caused_ns, w.material, w.last_in, w.main_in) == (
        1,
        {1: 90 * MS},
        3,
        3,
        3,
    )
    assert [(s["step"], s["wait_ns"], s["straggler_rank"]) for s in w.steps] == [
        (k, 30 * MS, 1) for k in range(3)
    ]
    assert w.windows == [[10 * MS, 40 * MS], [110 * MS, 140 * MS], [210 * MS, 240 * MS]]
    assert (w.outside_ns, w.before_capture, w.clock_skew_ns) == (0, False, 0)
    # rank 1's lateness intervals (230 ms, see test_straggler_activity_shows_its_host_work)
    assert (w.activity.window_ns, w.activity.windows) == (230 * MS, 3)
    why = w.lateness
    assert (why.late_ns, why.explained_ns, why.main_cause) == (90 * MS, 90 * MS, "cpu")
    # step 0 were rank 1 on time: its gemm at [8,10) ms, the all-reduce [10,15): 45 -> 15 ms
    first = why.what_if["steps"][0]
    assert (first["before_ns"], first["after_ns"]) == (45 * MS, 15 * MS)
    assert w.saving_ns == why.what_if["saving_ns"] > 30 * MS
    s = m.summary
    assert (s.participants, s.matched, s.unmatched_kernels, s.material) == (2, 3, 0, 3)
    assert s.straggler_tally == {"0": 0, "1": 3} and s.wait_caused_ns == {"0": 0, "1": 90 * MS}
    assert s.worst == "1" and [p.time_ns for p in s.critical_path] == [45 * MS, 100 * MS, 100 * MS]
    # speaking reads the measurement alone and gives exactly what run() gives
    assert nccl_wait.speak(m, params) == result.findings
    assert nccl_wait.metrics(m) == result.metrics
    assert nccl_wait.rank_wait_rows(m) == result.tables.rank_waits
    assert nccl_wait.collective_op_rows(s) == result.tables.collective_ops
    assert nccl_wait.critical_path_rows(s) == result.tables.critical_path
    job.close()


def test_speaking_needs_no_job():
    """The functions that write read a measurement (and the thresholds), never the job."""
    import inspect

    def parameters(f) -> list[str]:
        return list(inspect.signature(f).parameters)

    assert parameters(nccl_wait.speak) == ["m", "params"]
    assert parameters(nccl_wait.speak_rank_wait) == ["w", "params"]
    for one in (nccl_wait.metrics, nccl_wait.rank_wait_rows, nccl_wait.speak_summary):
        assert len(parameters(one)) == 1


def hand_wait(**changes) -> nccl_wait.RankWait:
    """A hand-made measurement: rank 0 waited 40 ms in 4 collectives, 30 ms of it exposed, in
    100 ms of steps; rank 1 (late 30 ms loading data, all of it in its own trace) arrived last
    in 3 of them; were it on time, the steps would take 25 ms less."""
    from stallscope.analyzers.base import Where

    why = nccl_wait.Lateness(
        late_ns=30 * MS, explained_ns=30 * MS, knock_on_ns=0,
        causes_ns={"dataloader": 30 * MS}, main_cause="dataloader", reference_ranks=[0],
        intervals=[[0, 30 * MS]], kernels=[], host_ranges=[], dataloader_range_ns=30 * MS,
        covering_range=None, what_if={"saving_ns": 25 * MS, "steps": []},
    )  # fmt: skip
    fields = dict(
        where=Where("t0", 0, 0), waited_ns=40 * MS, waits=4, exposed_ns=30 * MS,
        span_ns=100 * MS, straggler=1, caused_ns={1: 40 * MS}, min_wait_ns=100_000,
        material=4, last_in=3, main_in=2, top_waits=[],
        steps=[{"step": k, "wait_ns": 20 * MS, "largest_wait_ns": 10 * MS,
                "exposed_wait_ns": 15 * MS, "straggler_rank": 1} for k in (1, 2)],
        activity=nccl_wait.StragglerActivity(window_ns=30 * MS, windows=1, gpu_busy_pct=10.0),
        lateness=why, outside_ns=0, clock_skew_ns=0, data_quality=[], windows=[[0, 10 * MS]],
    )  # fmt: skip
    return nccl_wait.RankWait(**(fields | changes))


def test_rank_wait_spoken_from_a_hand_made_measurement():
    params = nccl_wait.SPEC.params()
    w = hand_wait()
    f = nccl_wait.speak_rank_wait(w, params)
    assert f.severity == "high"  # 30 % of the span: high from 25 %
    assert f.title == "Rank 0 sat 30.0 ms (30% of GPU 0's time) in collectives waiting for rank 1"
    assert f.detail.startswith(
        "Rank 0 spent 40.00 ms inside 4 collectives before the last rank arrived, 30.00 ms of it "
        "with no compute of its own running. Rank 1 arrived last in 3 of the 4 collectives of the "
        "captured steps that rank 0 waited in with a wait of at least 100 µs and caused most of the "
        "wait in 2/2 steps. Aligned at the previous "
        "collective (or the step start), rank 1 took 30.0 ms longer"
    )
    assert "would take 25.0 ms less" in f.detail
    assert f.recommendation.startswith("Rank 1 was late because it waited for its input data")
    assert (f.impact_ns, f.saving_ns, f.windows) == (30 * MS, 25 * MS, [[0, 10 * MS]])
    ev = f.evidence
    assert (ev["straggler_last_in"], ev["straggler_ranks"]) == ("3/4 collectives", {"1": 40 * MS})
    assert ev["share_of_span_pct"] == 30.0 and ev["what_if"] == w.lateness.what_if
    assert "what_if" not in ev["lateness"] and ev["lateness"]["main_cause"] == "dataloader"
    row = nccl_wait.rank_wait_row(w)
    assert (row.straggler_rank, row.waited_ns, row.exposed_wait_ns, row.saving_ns) == (
        1, 40 * MS, 30 * MS, 25 * MS
    )  # fmt: skip


def test_wait_from_before_the_capture_is_low_and_claims_no_saving():
    """40 ms of the wait is the straggler's first step starting later, more than the 30 ms its
    own trace explains: the delay lies before its capture."""
    w = hand_wait(outside_ns=40 * MS)
    assert w.before_capture and w.saving_ns is None
    f = nccl_wait.speak_rank_wait(w, nccl_wait.SPEC.params())
    assert (f.severity, f.saving_ns, f.evidence["what_if"]) == ("low", None, None)
    assert "40.0 ms of this wait is rank 1's first captured step starting later" in f.detail
    assert f.recommendation.startswith("Capture what comes before this step on rank 1")
    assert nccl_wait.rank_wait_row(w).saving_ns is None
    assert not hand_wait(outside_ns=20 * MS).before_capture  # under what the trace explains


def test_straggler_that_alone_saves_little_is_low():
    """On time, rank 1 would save 1 ms of rank 0's 30 ms exposed wait (under a tenth)."""
    w = hand_wait(
        lateness=msgspec.structs.replace(hand_wait().lateness, what_if={"saving_ns": 1 * MS})
    )
    f = nccl_wait.speak_rank_wait(w, nccl_wait.SPEC.params())
    assert (f.severity, f.saving_ns) == ("low", 1 * MS)
    assert "making rank 1 on time recovers 1.0 ms" in f.detail
    assert f.recommendation.startswith("Rank 1 is not the only late rank")


def test_rank_wait_under_the_ladder_is_not_spoken():
    params = nccl_wait.SPEC.params()
    assert nccl_wait.speak_rank_wait(hand_wait(exposed_ns=900_000), params) is None  # < 1 ms
    assert nccl_wait.speak_rank_wait(hand_wait(exposed_ns=2 * MS), params) is None  # 2 % < 3 %


def test_summary_spoken_from_a_hand_made_measurement():
    from stallscope.analyzers.base import Where

    s = nccl_wait.JobCollectives(
        where=Where("t0", 0, None), participants=2, matched=3, unmatched_kernels=1,
        methods={"0": "seq"}, clock_skew_ns={"0": 0, "1": 5 * MS}, skew_corrected_ranks=[1],
        material=2, straggler_tally={"0": 0, "1": 2}, wait_caused_ns={"0": 1, "1": 9 * MS},
        ops=[], collectives=[], data_quality=[], critical_path=[], windows=[], min_wait_ns=250_000,
    )  # fmt: skip
    f = nccl_wait.speak_summary(s)
    assert (f.severity, f.rank, f.device) == ("info", 0, None)
    assert f.title == (  # each count says what it counts: all matched, then those with a wait
        "Collectives: 3 matched across 2 ranks (all captured, in steps or not); rank 1 arrived "
        "last in 2 of the 2 with a wait of at least 250 µs"
    )
    assert f.detail == (
        "3 collectives matched by seq (1 kernels unmatched). Clock skew per rank (ns, from "
        "completion times): {'0': 0, '1': 5000000}; corrected for ranks [1]."
    )
    quiet = nccl_wait.speak_summary(msgspec.structs.replace(s, material=0))
    assert quiet.title == "Collectives: 3 matched across 2 ranks (all captured, in steps or not)"
