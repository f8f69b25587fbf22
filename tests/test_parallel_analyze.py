"""``analyze --jobs N`` (``build_report(workers=N)``): jobs and ranks analyzed at once, by worker
processes, with the report of a sequential run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallscope.fanout import runs_of
from stallscope.ingest import ingest_paths
from stallscope.report import RANKS_WORTH_A_POOL, build_report, worth_a_pool
from stallscope.store import TraceRef

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "kineto"
DDP = ("ddp_straggler", "ddp_overlap", "ddp_no_overlap")


def _overlapping(timings) -> bool:
    """Whether two tasks of two processes ran at the same time."""
    return any(
        a.pid != b.pid and a.started < b.ended and b.started < a.ended
        for i, a in enumerate(timings)
        for b in timings[i + 1 :]
    )


@pytest.mark.slow
def test_jobs_and_ranks_are_analyzed_at_once_with_the_sequential_report(store):
    jobs = []
    for name in DDP:
        (result,) = ingest_paths(store, [str(SAMPLES / name)])
        jobs.append(store.traces(result.job_id))
    timings: list = []
    parallel = build_report(store, jobs, workers=2, timings=timings)
    assert parallel == build_report(store, jobs)
    # every job of two ranks (two processes: up to four tasks of ranks per job): a task per rank
    # (per-rank analyzers) and one for the cross-rank ones
    kinds = sorted((t.job_id, t.kind, t.rank) for t in timings)
    assert kinds == sorted(
        (refs[0].job_id, kind, rank)
        for refs in jobs
        for kind, rank in (("ranks", 0), ("ranks", 1), ("cross", None))
    )
    pids = {t.pid for t in timings}
    assert os.getpid() not in pids and len(pids) == 2  # both worker processes, never this one
    assert _overlapping(timings)  # at the same time, not one after the other


def _refs(job: str, ranks: int) -> list[TraceRef]:
    return [TraceRef(f"{job}{r}", job, Path("/nowhere"), {"rank": r}) for r in range(ranks)]


def test_a_pool_is_started_for_several_jobs_or_a_job_of_many_ranks():
    assert not worth_a_pool([_refs("a", 1)])
    assert not worth_a_pool([_refs("a", RANKS_WORTH_A_POOL - 1), []])
    assert worth_a_pool([_refs("a", 1), _refs("b", 1)])
    assert worth_a_pool([_refs("a", RANKS_WORTH_A_POOL)])


def test_ranks_are_cut_into_runs_of_consecutive_ranks():
    groups = [[ref] for ref in _refs("a", 10)]
    runs = runs_of(groups, 4)
    assert [len(run) for run in runs] == [3, 3, 2, 2]
    assert [g for run in runs for g in run] == groups  # all of them, in rank order
    assert runs_of(groups, 50) == [[g] for g in groups]
    assert runs_of(groups, 0) == [groups]


@pytest.mark.slow
def test_a_triaged_job_gets_rank_tasks_for_its_picked_ranks_only(store, tmp_path):
    import sys

    from stallscope.rank_triage import DETAIL_ALL_UP_TO

    sys.path.insert(0, str(SAMPLES.parents[1] / "benchmarks"))
    import bench_ranks  # the real 2-rank sample grown to N ranks, rank 1 the straggler

    sys.path.pop(0)
    world = DETAIL_ALL_UP_TO + 2
    bench_ranks.build_job(bench_ranks.load_sample(), world, tmp_path / "job")
    (result,) = ingest_paths(store, [str(tmp_path / "job")])
    jobs = [store.traces(result.job_id)]
    timings: list = []
    parallel = build_report(store, jobs, workers=2, timings=timings)
    assert parallel == build_report(store, jobs)
    (selection,) = parallel["rank_selection"]
    picked = sorted(entry["rank"] for entry in selection["analyzed"])
    assert 1 in picked and len(picked) < world
    assert sorted(t.rank for t in timings if t.kind == "ranks") == picked  # one task each (4 slots)
