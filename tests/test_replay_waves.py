"""The participant-parallel replay (``method="waves"``) against the per-op sweep: the same
new start and end of every op, to the nanosecond, so the same savings.

On simulated DDP jobs (tests/ddp_builder.py) of 8 and 16 ranks with different planted faults
(data loading, host syncs, extra compute, a slower GPU, several faulty ranks at once), with
the straggler's own what-if cuts (:func:`stallscope.lateness.explain`) and with cuts on
several ranks; and on hand-built tables, including one the waves must decline.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallscope.collectives import match_collectives
from stallscope.critical_path import (
    Compression,
    dependencies,
    replay,
    replay_times,
    saving,
)
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.lateness import explain, graph, lateness, timeline
from tests.ddp_builder import MS, Plan, ddp_job
from tests.test_critical_path import NO_SYNCS, op, two_ranks

FAULTS = {
    "dataloader": {7: Plan(stall_ns=50 * MS)},
    "syncs": {7: Plan(syncs=20)},
    "extra compute": {7: Plan(scale=1.5, grid_scale=1.5)},
    "slower gpu": {7: Plan(scale=1.3)},
    "three faulty ranks": {2: Plan(stall_ns=20 * MS), 5: Plan(syncs=8), 7: Plan(scale=1.3)},
}


def job_timeline(store, tmp_path, plans: list[Plan]):
    traces, _ = ddp_job(plans, 3)
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in traces]
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    match = match_collectives(job)
    return job, match, timeline(job, match)


def waves_ran(g: pd.DataFrame, syncs: pd.DataFrame) -> bool:
    """Whether the waves computed the replay themselves (did not decline to the sweep)."""
    from stallscope import critical_path as cp

    seen = {}
    real = cp._waves

    def spy(*args):
        seen["out"] = real(*args)
        return seen["out"]

    cp._waves = spy
    try:
        replay_times(g, syncs, [], method="waves")
    finally:
        cp._waves = real
    return seen.get("out") is not None


def assert_same(g: pd.DataFrame, syncs: pd.DataFrame, cuts: list[Compression]) -> None:
    a_start, a_end = replay_times(g, syncs, cuts, method="sweep")
    b_start, b_end = replay_times(g, syncs, cuts, method="waves")
    assert np.array_equal(a_start, b_start)
    assert np.array_equal(a_end, b_end)


CASES = [(8, fault) for fault in FAULTS] + [(16, "syncs"), (16, "three faulty ranks")]


@pytest.mark.parametrize(("ranks", "fault"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_waves_equal_the_sweep_on_ddp_jobs(store, tmp_path, ranks, fault):
    plans = [Plan()] * ranks
    for r, plan in FAULTS[fault].items():
        plans[r * ranks // 8] = plan  # the same ranks' share of the job at 8 and 16
    job, match, tl = job_timeline(store, tmp_path, plans)
    g = graph(tl)
    assert g["part"].nunique() == ranks and tl.syncs.size > 0 and (g["inst"] >= 0).any()
    assert waves_ran(g, tl.syncs)
    late = lateness(match, tl)
    late = late[late["step"] >= 0]
    cuts = []
    for straggler in sorted(set(late.loc[late["last"] & (late["late_ns"] > 0), "part"])):
        mine = explain(job, tl, late, int(straggler)).cuts
        assert_same(g, tl.syncs, mine)  # one straggler's what-if, as nccl_wait asks it
        sweep = saving_by(g, tl.syncs, mine, "sweep")
        assert (
            saving(g, tl.syncs, mine)["saving_ns"] == sweep == saving_by(g, tl.syncs, mine, "waves")
        )
        cuts += mine
    assert cuts  # some rank was late
    assert_same(g, tl.syncs, cuts)  # all of them at once
    # arbitrary cuts on several ranks, and none
    span = int(g["end_ns"].max() - g["start_ns"].min())
    lo = int(g["start_ns"].min())
    other = [Compression(p, lo + span // 5, lo + span // 2, span // 10) for p in (0, ranks // 2)]
    assert_same(g, tl.syncs, other)
    s, e = replay_times(g, tl.syncs, [], method="waves")
    assert np.array_equal(s, g["start_ns"]) and np.array_equal(e, g["end_ns"])
    job.close()


def saving_by(g, syncs, cuts, method) -> int:
    """The summed step-time drop with the replay ``method`` (what :func:`saving` computes)."""
    from stallscope.critical_path import step_times

    s, e = replay_times(g, syncs, cuts, method=method)
    after = step_times(pd.DataFrame({"step": g["step"], "start_ns": s, "end_ns": e}))
    return max(0, int(step_times(g).sum() - after.sum()))


def test_waves_equal_the_sweep_on_hand_built_tables():
    """The what-ifs of test_critical_path, with a host sync carrying the earlier finish."""
    ops = pd.concat(
        [two_ranks(), pd.DataFrame([op(0, 7, 56, 60, launch=56, name="C")])], ignore_index=True
    )
    syncs = pd.DataFrame({"part": [0], "start_ns": [2 * MS], "end_ns": [55 * MS]})
    g = dependencies(ops)
    assert waves_ran(g, syncs)
    for cuts in ([], [Compression(1, 0, 40 * MS, 10 * MS)], [Compression(0, 0, 10 * MS, 0)]):
        assert_same(g, syncs, cuts)
    out = replay(g, syncs, [Compression(1, 0, 40 * MS, 10 * MS)], method="waves")
    c = out[out["name"] == "C"].iloc[0]
    assert (c["new_start_ns"], c["new_end_ns"]) == (26 * MS, 30 * MS)


def test_waves_decline_a_read_before_the_last_write():
    """Rank 0's B starts (observed) at 42, before rank 1 arrives at the all-reduce it follows
    (a clock off by more than the wait): the sweep reads the all-reduce's end before its
    last rank arrived. The waves decline (None) and the replay is the sweep's."""
    ops = pd.DataFrame(
        [
            op(0, 7, 0, 10, launch=0, name="gemm"),
            op(0, 7, 10, 41, launch=0, inst=0, transfer=5, name="allreduce"),
            op(0, 7, 42, 55, launch=1, name="B"),
            op(1, 7, 30, 43, launch=30, name="gemm"),
            op(1, 20, 43, 48, launch=30, inst=0, transfer=5, name="allreduce"),
        ]
    )
    g = dependencies(ops)
    assert not waves_ran(g, NO_SYNCS)
    cut = [Compression(1, 0, 40 * MS, 10 * MS)]
    assert_same(g, NO_SYNCS, cut)
