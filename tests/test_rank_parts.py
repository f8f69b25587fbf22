"""Per-rank parts (JobData.rank_parts / part_of) give the same report as the whole job.

``report.analyze_job`` runs the per-rank analyzers (``SPEC.per_rank``) on one rank's files
at a time and the others with per-rank reads through ``part_of``; the
reference here is the old way: every analyzer's ``run`` over one connection
to all the job's files.
"""

from __future__ import annotations

import importlib.util

import msgspec
import pytest

from stallscope.analyzers import all_specs, per_rank_ids
from stallscope.analyzers.base import AnalyzerResult
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.report import analyze_job
from stallscope.report_types import plain_number
from tests.conftest import CORPUS, REPO, SAMPLES
from tests.kineto_builder import KinetoTrace

US = 1_000


def whole_job_result(job: JobData) -> AnalyzerResult:
    """Every analyzer over the whole job's connection (no parts): the reference."""
    combined = AnalyzerResult()
    for spec in all_specs():
        combined.extend(spec.run(job, spec.params()))
    return combined


def as_dicts(result: AnalyzerResult) -> tuple[list[dict], list[dict], dict]:
    """Findings, metrics and the typed tables' rows, as the report writes them."""
    tables = msgspec.to_builtins(result.tables, enc_hook=plain_number)
    return [f.to_dict() for f in result.findings], [m.to_dict() for m in result.metrics], tables


def both_ways(store, job_id: str) -> tuple[tuple, tuple]:
    """(parts, whole job) results of one stored job, each on a fresh JobData."""
    parts = JobData(store, store.traces(job_id))
    whole = JobData(store, store.traces(job_id))
    try:
        return as_dicts(analyze_job(parts)), as_dicts(whole_job_result(whole))
    finally:
        parts.close()
        whole.close()


def replicated(world: int, folder) -> list[str]:
    """The 2-rank ddp_straggler sample grown to ``world`` ranks (benchmarks/bench_ranks.py)."""
    spec = importlib.util.spec_from_file_location(
        "bench_ranks", REPO / "benchmarks" / "bench_ranks.py"
    )
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return [str(p) for p in module.build_job(module.load_sample(), world, folder)]


@pytest.mark.parametrize("scenario", ["ddp_straggler", "ddp_overlap", "ddp_no_overlap"])
def test_two_rank_samples_match_the_whole_job(store, scenario):
    (res,) = ingest_paths(store, [str(SAMPLES / "kineto" / scenario)])
    assert len(store.traces(res.job_id)) == 2
    by_parts, whole = both_ways(store, res.job_id)
    assert by_parts[0], "the sample has findings"
    assert by_parts == whole


def test_replicated_job_matches_the_whole_job_and_names_the_straggler(store, tmp_path):
    (res,) = ingest_paths(store, replicated(6, tmp_path / "job"))
    by_parts, whole = both_ways(store, res.job_id)
    assert by_parts == whole
    waits = [f for f in by_parts[0] if "straggler_rank" in f["evidence"]]
    assert sorted(f["rank"] for f in waits) == [0, 2, 3, 4, 5]
    assert all(f["analyzer"] == "nccl_wait" and f["evidence"]["straggler_rank"] == 1 for f in waits)


def test_dlrm_eight_ranks_match_the_whole_job(store):
    folder = CORPUS / "param" / "dlrm_kineto"
    if not folder.is_dir():
        pytest.skip("corpus absent")
    files = sorted(str(p) for p in folder.glob("worker*_step_12.*.pt.trace.json*"))
    (res,) = ingest_paths(store, files)
    assert len(store.traces(res.job_id)) == 8
    by_parts, whole = both_ways(store, res.job_id)
    assert by_parts == whole


def jittery(rank: int, last_us: int) -> KinetoTrace:
    """Five 100 µs steps, the last ``last_us`` long, one kernel each (p90/median known)."""
    t = KinetoTrace(rank=rank, world_size=2)
    for i in range(5):
        base = 1_000 * US * i
        t.step(i, base, last_us * US if i == 4 else 100 * US)
        corr = t.next_corr()
        t.runtime("cudaLaunchKernel", base + 5 * US, 2 * US, corr=corr)
        t.kernel("gemm", base + 10 * US, 50 * US, device=rank, corr=corr)
    return t


def test_step_jitter_of_several_ranks_is_one_finding_naming_the_others(store, tmp_path):
    # p90 of [100, 100, 100, 100, L] µs is 100 + 0.6 (L - 100): 2.2x for L = 300, 3.4x for 500.
    files = [
        str(jittery(r, last).write(tmp_path / f"r{r}.json")) for r, last in ((0, 300), (1, 500))
    ]
    (res,) = ingest_paths(store, files)
    by_parts, whole = both_ways(store, res.job_id)
    assert by_parts == whole
    (jitter,) = [f for f in by_parts[0] if f["id"].endswith(":jitter")]
    assert jitter["rank"] == 1 and jitter["evidence"]["p90_over_median"] == 3.4
    assert jitter["evidence"]["other_ranks"] == [{"rank": 0, "p90_over_median": 2.2}]


def test_parts_read_one_rank_and_are_freed(store, tmp_path):
    (res,) = ingest_paths(store, replicated(3, tmp_path / "job"))
    job = JobData(store, store.traces(res.job_id))
    seen = []
    for part in job.rank_parts():
        ids = {r[0] for r in part.sql("SELECT DISTINCT trace_id FROM gpu").fetchall()}
        assert ids == {r.trace_id for r in part.traces} and len(part.traces) == 1
        if seen:
            assert "con" not in seen[-1].__dict__, "the previous rank's connection is closed"
        seen.append(part)
    assert [p.traces[0].meta["rank"] for p in seen] == [0, 1, 2]
    second = job.traces[1].trace_id
    part = job.part_of(second)
    assert job.part_of(second) is part and part.traces == [job.traces[1]]
    assert part.devices(second) and part.cache
    third = job.part_of(job.traces[2].trace_id)
    assert third is not part and third.traces == [job.traces[2]]
    assert not part.cache, "the other rank's derived data is dropped"
    assert job.part_of(second) is part, "its views stay open for the next pass"
    with pytest.raises(KeyError):
        job.part_of("not-a-trace")
    job.close()
    assert "con" not in part.__dict__ and "con" not in third.__dict__


def test_rank_parts_run_on_one_thread_and_the_settings_come_back(store, tmp_path):
    """While its rank parts are analyzed the job's database runs with rank_phase_settings
    (one thread, fewer optimizer passes); the settings it had come back after the loop, and
    after an error inside a ``rank_phase`` block."""
    (res,) = ingest_paths(store, replicated(2, tmp_path / "job"))
    job = JobData(store, store.traces(res.job_id))
    setting = "SELECT current_setting('threads'), current_setting('disabled_optimizers')"
    job.sql("SET threads = 3")
    before = job.sql(setting).fetchall()
    assert before == [(3, "")]
    for part in job.rank_parts():
        threads, disabled = part.sql(setting).fetchall()[0]
        assert (
            threads == 1 and "join_order" in disabled and "statistics_propagation" not in disabled
        )
    assert job.sql(setting).fetchall() == before
    with pytest.raises(RuntimeError), job.rank_phase():
        assert job.sql(setting).fetchall()[0][0] == 1
        raise RuntimeError("an analyzer failed")
    assert job.sql(setting).fetchall() == before
    job.close()


def test_rank_phase_skips_passes_this_duckdb_does_not_know(store, tmp_path, monkeypatch):
    """pyproject allows older DuckDBs, which lack some passes (and newer ones may rename
    them): an unknown name must not make ``SET disabled_optimizers`` fail the analysis."""
    from stallscope import jobdata

    monkeypatch.setattr(
        jobdata, "RANK_PHASE_DISABLED_PASSES", ("no_such_pass", "join_order", "later_pass")
    )
    (res,) = ingest_paths(store, replicated(2, tmp_path / "job"))
    job = JobData(store, store.traces(res.job_id))
    with job.rank_phase():
        assert job.sql("SELECT current_setting('disabled_optimizers')").fetchone()[0] == (
            "join_order"
        )
    job.close()


def test_a_one_rank_job_is_its_own_part(store):
    (res,) = ingest_paths(store, [str(SAMPLES / "kineto" / "healthy")])
    job = JobData(store, store.traces(res.job_id))
    assert list(job.rank_parts()) == [job]
    assert job.part_of(job.traces[0].trace_id) is job
    job.close()


def test_cross_rank_analyzers_are_the_ones_left_out():
    assert {s.id for s in all_specs()} - per_rank_ids() == {"overlap", "nccl_wait"}


def test_a_parts_catalog_and_tables_are_its_ranks_alone(store, tmp_path):
    """A part's catalog (a filter of the job's) holds the rows a catalog of its own traces
    would, in order; its loaded tables and its views give the rows of its files alone."""
    import duckdb

    from stallscope.store import create_catalog

    (res,) = ingest_paths(store, replicated(3, tmp_path / "job"))
    job = JobData(store, store.traces(res.job_id))
    for part in job.rank_parts():
        own = duckdb.connect()
        create_catalog(own, [r.meta for r in part.traces])
        assert (
            part.sql("SELECT * FROM catalog").fetchall()
            == own.sql("SELECT * FROM catalog").fetchall()
        )
        kinds = dict(part.sql("SELECT table_name, table_type FROM information_schema.tables "
                              "WHERE table_schema = 'main' AND table_catalog = 'temp'").fetchall())  # fmt: skip
        assert kinds["gpu"] == "LOCAL TEMPORARY" and kinds["memory"] == "VIEW"
        mine = [r.trace_id for r in part.traces]
        for table in ("gpu", "host", "memory", "devices"):
            rows = part.sql(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
            marks = ", ".join("?" for _ in mine)
            query = f"SELECT * FROM {table} WHERE trace_id IN ({marks}) ORDER BY ALL"
            assert rows == job.sql(query, mine).fetchall(), table
    assert len(job.sql("SELECT * FROM catalog").fetchall()) == 3
    job.close()


def test_kernel_metrics_is_read_only_where_nsight_compute_results_are():
    from stallscope.store import may_hold

    assert not may_hold({"kineto"}, "kernel_metrics") and not may_hold({"nsys"}, "kernel_metrics")
    assert may_hold({"kineto", "ncu"}, "kernel_metrics")
    assert may_hold({"kineto"}, "gpu") and not may_hold({"ncu"}, "gpu")
    assert may_hold({"a-format-not-known-here"}, "kernel_metrics"), "unknown: may hold anything"
    assert may_hold({None}, "kernel_metrics"), "a catalog row without its source"
