"""The Python API: stallscope.load(path_or_id) -> Job with DataFrames and read-only SQL."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stallscope
from stallscope.errors import StallscopeError
from stallscope.sql import QueryError
from stallscope.store import Store
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace


@pytest.fixture
def idle_trace(tmp_path):
    """GPU busy 30 of 100 ms, nothing on the host: 70 % idle, cause unknown."""
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("a", 0, 10_000_000)
    t.kernel("b", 50_000_000, 10_000_000)
    t.kernel("c", 90_000_000, 10_000_000)
    t.step(1, 0, 100_000_000)
    return t.write(tmp_path / "idle.pt.trace.json")


def test_import_stays_light():
    code = "import sys, stallscope; print(sorted(m for m in ('duckdb', 'pandas', 'plotly', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_a_file(idle_trace, tmp_path):
    store = tmp_path / "s"
    job = stallscope.load(idle_trace, store=store)
    assert isinstance(job, stallscope.Job) and len(job.trace_ids) == 1
    assert list(job.traces["kernel_count"]) == [3]
    worst = job.findings.iloc[0]
    assert (worst.severity, worst.analyzer, worst.impact_ms) == ("critical", "gpu_idle", 70.0)
    m = job.metrics
    assert m[(m.name == "gpu_busy_pct") & (m.device == 0)].value.item() == 30.0
    assert job.metric("gpu_idle_pct", device=0) == 70.0
    assert job.report["schema"] == "stallscope.report/1"
    # the same files again: the stored job, not a copy; by id and by prefix too
    assert stallscope.load(str(idle_trace), store=store).job_id == job.job_id
    assert stallscope.load(job.job_id, store=Store(store)).trace_ids == job.trace_ids
    assert stallscope.load(job.trace_ids[0][:6], store=store).job_id == job.job_id


def test_typed_tables(idle_trace, tmp_path):
    job = stallscope.load(idle_trace, store=tmp_path / "s")
    kernels = job.table("kernels")
    assert list(kernels.columns[:4]) == ["trace", "rank", "device", "name"]
    assert sorted(kernels.name) == ["a", "b", "c"] and set(kernels.total_ns) == {10_000_000}
    (step,) = job.table("steps").itertuples()
    assert (step.step, step.compute_ns, step.idle_unknown_ns) == (1, 30_000_000, 70_000_000)
    assert job.table("comm_overlap").empty and "exposed_wait_ns" in job.table("comm_overlap")
    with pytest.raises(ValueError, match="no table 'nope'; the report's tables: kernels"):
        job.table("nope")


def test_sql_is_read_only_and_scoped_to_the_job(idle_trace, tmp_path):
    other = KinetoTrace()
    other.kernel("z", 0, 5)
    job = stallscope.load(idle_trace, store=tmp_path / "s")
    stallscope.load(other.write(tmp_path / "other.json"), store=tmp_path / "s")
    frame = job.sql(
        "SELECT n.name, g.end_ns - g.start_ns AS dur FROM gpu g JOIN names n USING (trace_id, name_id) "
        "WHERE g.kind = 'kernel' ORDER BY n.name"
    )
    assert list(frame.name) == ["a", "b", "c"] and set(frame.dur) == {10_000_000}
    assert job.sql("SELECT count(*) AS n FROM catalog").n.item() == 1
    with pytest.raises(QueryError):
        job.sql("CREATE TABLE x AS SELECT 1")
    with pytest.raises(QueryError):
        job.sql("SELECT * FROM read_csv('/etc/passwd')")


def test_thresholds_and_reanalyze(idle_trace, tmp_path):
    job = stallscope.load(idle_trace, store=tmp_path / "s")
    relaxed = job.reanalyze({"gpu_idle": {"share_pct_critical": 90, "share_pct_high": 80}})
    assert relaxed.findings.iloc[0].severity == "medium"
    assert job.findings.iloc[0].severity == "critical"


def test_errors(tmp_path, idle_trace):
    with pytest.raises(StallscopeError):
        stallscope.load("deadbeef0000", store=tmp_path / "s")
    with pytest.raises(StallscopeError, match="no such file"):
        stallscope.load([str(idle_trace), str(tmp_path / "missing.json")], store=tmp_path / "s")


def test_load_the_ranks_of_a_sample_job(tmp_path):
    ranks = sorted((SAMPLES / "kineto" / "ddp_straggler").glob("rank*.pt.trace.json.gz"))
    job = stallscope.load(ranks, store=tmp_path / "s")
    assert sorted(job.traces["rank"]) == [0, 1]
    assert "nccl_wait" in set(job.findings.analyzer)
