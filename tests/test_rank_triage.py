"""Two-tier triage: above a rank count, the per-rank analyzers read the out-of-line ranks
and a few median ranks; the report says which and why."""

from __future__ import annotations

import pytest

from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.rank_triage import (
    DETAIL_ALL_UP_TO,
    MEDIAN_RANKS,
    out_of_line,
    screen,
    select_ranks,
)
from stallscope.report import analyze_job, build_report
from tests.ddp_builder import MS, Plan, ddp_job

RANKS, SLOW = 8, 5  # rank 5 loads data 30 ms longer every step: the others wait for it


@pytest.fixture(scope="module")
def job_store(tmp_path_factory):
    from stallscope.store import Store

    tmp = tmp_path_factory.mktemp("triage")
    plans = [Plan(stall_ns=30 * MS if r == SLOW else 0) for r in range(RANKS)]
    traces, _ = ddp_job(plans)
    paths = [str(t.write(tmp / f"rank{r}.pt.trace.json")) for r, t in enumerate(traces)]
    store = Store(tmp / "store").ensure()
    (res,) = ingest_paths(store, paths)
    return store, res.job_id


@pytest.fixture
def job(job_store):
    store, job_id = job_store
    data = JobData(store, store.traces(job_id))
    yield data
    data.close()


def test_out_of_line_is_two_sided_and_needs_three_values():
    values = {r: 50.0 for r in range(10)} | {10: 10.0, 11: 56.0, 12: 90.0}
    far = out_of_line(values)  # median 50, MAD 0: the cut is 10 % of the median, 5
    assert set(far) == {10, 11, 12} and far[10] == pytest.approx(8.0)  # |10 - 50| / 5
    assert out_of_line({0: 1.0, 1: 100.0}) == {}
    assert out_of_line({r: 3.0 for r in range(5)} | {5: 3.2}) == {}  # within 10 %


def test_screen_measures_every_rank_from_its_kernels_and_steps(job):
    metrics = screen(job)
    assert sorted(metrics) == list(range(RANKS))
    busy = {r: m["busy_pct"] for r, m in metrics.items()}
    comm = {r: m["comm_pct"] for r, m in metrics.items()}
    others = {r for r in metrics if r != SLOW}
    assert len({busy[r] for r in others}) == 1 and len({comm[r] for r in others}) == 1
    # the others sit in their all-reduces while rank 5 loads data: it never waits
    assert comm[SLOW] < 0.3 * comm[0]
    # its compute is the others' (the same kernels), its span shorter by its first stall
    assert busy[SLOW] > busy[0]
    steps = {m["step_ms"] for m in metrics.values()}
    assert max(steps) - min(steps) < 1  # a synchronous job: every rank steps alike


def test_small_jobs_are_analyzed_on_every_rank(job):
    assert RANKS <= DETAIL_ALL_UP_TO and select_ranks(job) is None


def test_a_large_job_is_analyzed_on_its_outlier_and_median_ranks(job):
    selection = select_ranks(job, threshold=4)
    assert selection.ranks == RANKS and not selection.all_ranks
    assert selection.analyzed[SLOW].startswith("out of line: communication (incl. waits)")
    median = [r for r, why in selection.analyzed.items() if why.startswith("median rank")]
    assert len(median) == MEDIAN_RANKS and SLOW not in median
    assert len(selection.analyzed) == 1 + MEDIAN_RANKS
    forced = select_ranks(job, threshold=4, all_ranks=True)
    assert forced.all_ranks and sorted(forced.analyzed) == list(range(RANKS))


def test_only_the_selected_ranks_get_per_rank_analysis(job):
    selection = select_ranks(job, threshold=4)
    result = analyze_job(job, ranks=selection.analyzed)
    by_analyzer: dict[str, set[int]] = {}
    for f in result.findings:
        by_analyzer.setdefault(f.analyzer, set()).add(f.rank)
    assert by_analyzer["utilization"] == set(selection.analyzed)  # per-rank: selected only
    assert len(by_analyzer["overlap"]) == RANKS  # cross-rank analyzers read every rank
    waiting = [f for f in result.findings if f.analyzer == "nccl_wait" and f.severity != "info"]
    assert {f.rank for f in waiting} == set(range(RANKS)) - {SLOW}
    assert all(f.evidence["straggler_rank"] == SLOW for f in waiting)
    idle = [f for f in result.findings if f.analyzer == "gpu_idle" and f.rank == SLOW]
    assert any(f.evidence.get("cause") == "dataloader" for f in idle)  # the straggler's cause


def test_the_report_says_which_ranks_were_analyzed_and_why(job_store, monkeypatch):
    from stallscope import rank_triage
    from stallscope.render import render

    store, job_id = job_store
    assert "rank_selection" not in build_report(store, [store.traces(job_id)])
    monkeypatch.setattr(rank_triage, "DETAIL_ALL_UP_TO", 4)
    report = build_report(store, [store.traces(job_id)])
    (entry,) = report["rank_selection"]
    assert entry["job"] == job_id and entry["ranks"] == RANKS and entry["threshold"] == 4
    assert [a["rank"] for a in entry["analyzed"]] == sorted(select_ranks_of(report))
    text = render(report, "text")
    assert f"Ranks analyzed in detail (job {job_id}): 3 of {RANKS}." in text
    assert f"  rank {SLOW}: out of line: communication" in text
    assert "Ranks analyzed in detail" in render(report, "markdown")
    assert "Ranks analyzed in detail" in render(report, "html")
    forced = build_report(store, [store.traces(job_id)], all_ranks=True)
    assert forced["rank_selection"][0]["all_ranks"]
    assert f"all {RANKS} (--all-ranks)" in render(forced, "text")


def select_ranks_of(report: dict) -> set[int]:
    """The ranks the per-rank analyzers reported on (utilization: one finding per GPU)."""
    return {f["rank"] for f in report["findings"] if f["analyzer"] == "utilization"}


def test_analyze_all_ranks_flag_and_its_help_agree_with_the_threshold():
    from stallscope.cli import build_parser

    parser = build_parser("analyze")
    assert parser.parse_args(["analyze", "x", "--all-ranks"]).all_ranks
    assert not parser.parse_args(["analyze", "x"]).all_ranks
    (action,) = parser._subparsers._group_actions  # the subcommands
    help_text = action.choices["analyze"].format_help()
    assert f"more than {DETAIL_ALL_UP_TO} ranks" in " ".join(help_text.split())
