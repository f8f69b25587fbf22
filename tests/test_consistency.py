"""Explanations agree with the evidence that owns them, on every sample and every corpus job.

* A straggler finding's causes are the straggler's own GPU idle causes (the attribution
  ``gpu_idle`` uses) in its lateness intervals: it never claims more idle time of a cause than
  the straggler's trace holds there.
* A fix never says there is nothing to fix when the title reports a loss.
* The per-step rows of ``step_breakdown`` sum to the device's idle totals by cause within 1 %
  (every idle nanosecond of the step scope in exactly one step's row).
* No finding blames a window outside the capture: its windows lie in the trace's recorded
  time, and a wait that comes from before the straggler's capture is not blamed on its host.
* ``--fail-on medium`` passes on the control captures (healthy, ddp_overlap) and on the
  CUDA-graph fixes of the launch-bound samples.

The checks are generic over analyzers (each finding's fields), so they hold for analyzers
changed elsewhere too. Corpus jobs are skipped when ../shared/corpus is absent.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from stallscope import schema
from stallscope.analyzers.base import SEVERITY_RANK
from stallscope.analyzers.nccl_wait import MAX_INTERVALS
from stallscope.analyzers.step_breakdown import MAX_STEPS_IN_EVIDENCE
from stallscope.collectives import covered_length
from stallscope.errors import InputError
from stallscope.idle import CAUSES, attribute_idle
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.preload import sample_jobs
from stallscope.report import analyze_job
from tests.conftest import CORPUS, SAMPLES

pytestmark = pytest.mark.slow

MULTI_RANK = {
    "param/dlrm_kineto": "param/dlrm_kineto/worker*.json.gz",
    "hta/trace_filter": "hta/trace_filter/sampled_rank-*.json.gz",
}
NOT_TRACES = ("memory_timeline.raw.gz", "benchmark_simple_add_et.json.gz")


def _sample_jobs() -> dict[str, list[Path]]:
    jobs = {}
    for folder in sorted((SAMPLES / "kineto").iterdir()):
        if folder.is_dir():
            jobs[f"kineto/{folder.name}"] = sorted(folder.glob("*.pt.trace.json.gz"))
    for paths, _ in sample_jobs(SAMPLES):  # every other format's samples: one file, one job
        path = Path(paths[0])
        if path.parent.parent == SAMPLES:
            jobs[f"{path.parent.name}/{path.name}"] = [path]
    return jobs


def _corpus_jobs() -> dict[str, list[Path]]:
    if not CORPUS.is_dir():
        return {}
    jobs, grouped = {}, set()
    for name, pattern in MULTI_RANK.items():
        files = sorted(CORPUS.glob(pattern))
        grouped |= set(files)
        jobs[f"corpus:{name}"] = files
    for path in sorted(CORPUS.rglob("*.json*")):
        if path.is_file() and path not in grouped and not path.name.endswith(NOT_TRACES):
            jobs[f"corpus:{path.relative_to(CORPUS).as_posix()}"] = [path]
    return jobs


SAMPLE_JOBS = _sample_jobs()
CORPUS_JOBS = _corpus_jobs()
# the captures without their fault: the clean references, and the CUDA-graph fixes of the
# launch-bound ones (a graph replay must not read as a fault, issue 18 class 6)
CONTROLS = (
    "kineto/healthy", "kineto/ddp_overlap", "nsys/healthy.sqlite.gz", "nsys/ddp_overlap.sqlite.gz",
    "kineto/cuda_graph", "kineto/train_cuda_graph", "kineto/train_small_graph", "kineto/decode_graph",
)  # fmt: skip
NOTHING_TO_FIX = re.compile(
    r"nothing to (fix|do|change)|no (action|change|fix) (is )?(needed|required)|is (fine|healthy) as is",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """Ingest and analyze a job once per module: name -> (job, findings) or None (not ingestible)."""
    from stallscope.store import Store

    store = Store(tmp_path_factory.mktemp("consistency") / "store").ensure()
    done: dict[str, tuple | None] = {}

    def get(name: str, files: list[Path]):
        if name not in done:
            try:
                (res,) = ingest_paths(store, [str(p) for p in files])
            except InputError:
                done[name] = None
                return None
            job = JobData(store, store.traces(res.job_id))
            done[name] = (job, analyze_job(job).findings)
        return done[name]

    yield get
    for value in done.values():
        if value:
            value[0].close()


def _check_job(job: JobData, findings) -> None:
    by_trace = {ref.trace_id: ref for ref in job.traces}
    for f in findings:
        _check_fix_matches_title(f)
        _check_launch_saving_within_its_idle(f)
        _check_windows_inside_capture(job, by_trace, f)
        if f.analyzer == "nccl_wait" and f.severity != "info":
            _check_straggler_causes(job, f)
        if f.analyzer == "step_breakdown" and f.evidence.get("key") == "table":
            _check_step_rows_sum_to_totals(job, f)


def _check_fix_matches_title(f) -> None:
    if f.severity != "info" and (f.impact_ns > 0 or (f.saving_ns or 0) > 0):
        assert not NOTHING_TO_FIX.search(f.recommendation), (f.id, f.recommendation)
        assert f.recommendation.strip(), f.id


def _check_launch_saving_within_its_idle(f) -> None:
    """A CUDA-graph saving never exceeds the idle the launches explain (its impact)."""
    if f.analyzer == "launch_overhead" and f.saving_ns is not None:
        assert 0 <= f.saving_ns <= f.impact_ns, (f.id, f.saving_ns, f.impact_ns)
        assert f.evidence["profiler_overhead_ns"] <= f.evidence["host_idle_ns"], f.id


def _check_step_rows_sum_to_totals(job: JobData, f) -> None:
    """Each device's step rows hold its idle time by cause: their sums match the totals."""
    rows = f.evidence["steps"]
    if len(rows) >= MAX_STEPS_IN_EVIDENCE:
        return  # the table is cut: its rows cannot sum to the totals
    for device in sorted({r["device"] for r in rows}):
        mine = [r for r in rows if r["device"] == device]
        totals = attribute_idle(job, f.trace, device).totals
        for cause, total in totals.items():
            got = sum(r[f"idle_{cause}_ns"] for r in mine)
            assert abs(got - total) <= 0.01 * total + 1_000, (f.id, device, cause, got, total)


def _capture_range(job: JobData, trace_id: str) -> tuple[int, int]:
    """The trace's recorded time: its host and GPU rows, and the instant events of any declared
    table (``ts_ns``: e.g. allocator events, all a memory snapshot records)."""
    lows = ["(SELECT min(start_ns) FROM host WHERE trace_id = $t)",
            "(SELECT min(start_ns) FROM gpu WHERE trace_id = $t)"]  # fmt: skip
    highs = [q.replace("min(start_ns)", "max(end_ns)") for q in lows]
    for table in (t.name for t in schema.TABLES if "ts_ns" in {c.name for c in t.columns}):
        lows.append(f"(SELECT min(ts_ns) FROM {table} WHERE trace_id = $t)")
        highs.append(f"(SELECT max(ts_ns) FROM {table} WHERE trace_id = $t)")
    sql = f"SELECT least({', '.join(lows)}), greatest({', '.join(highs)})"
    row = job.sql(sql, {"t": trace_id}).fetchone()
    return int(row[0]), int(row[1])


def _check_windows_inside_capture(job: JobData, by_trace, f) -> None:
    if f.trace not in by_trace or not f.windows or f.evidence.get("key") == "collectives":
        return  # the job-level summary's windows span ranks
    lo, hi = _capture_range(job, f.trace)
    slack = 1_000_000  # ranks' clocks may differ by skew; 1 ms covers it on these traces
    for a, b in f.windows:
        assert lo - slack <= a <= b <= hi + slack, (f.id, a, b, lo, hi)
    if f.analyzer == "nccl_wait":
        why = f.evidence.get("lateness") or {}
        outside = f.evidence.get("wait_outside_capture_ns", 0)
        if outside and outside >= why.get("explained_ns", 0):
            assert "remove" not in f.recommendation.lower(), f.id
            assert f.saving_ns is None and SEVERITY_RANK[f.severity] <= SEVERITY_RANK["low"]


def _check_straggler_causes(job: JobData, f) -> None:
    """Each idle cause claimed for the straggler is GPU idle time of that cause in its intervals."""
    why = f.evidence.get("lateness")
    if not why:
        return
    straggler = f.evidence["straggler_rank"]
    ref = next(r for r in job.traces if r.meta.get("rank") == straggler)
    (device,) = [d for d in job.devices(ref.trace_id)][:1] or [None]
    if device is None:
        return
    idle = attribute_idle(job, ref.trace_id, device)
    spans = np.array(why["intervals"], dtype=np.int64).reshape(-1, 2)
    if not idle.per_gap.size or not spans.size:
        return
    from stallscope import intervals

    union = intervals.union(spans[:, 0], spans[:, 1])
    share = covered_length(union, idle.gap_starts, idle.gap_ends) / np.maximum(
        idle.gap_ends - idle.gap_starts, 1
    )
    held = dict(zip(CAUSES, (idle.per_gap * share[:, None]).sum(axis=0), strict=True))
    loader_moved = why.get("dataloader_range_ns", 0)
    for cause, ns in why["causes_ns"].items():
        if cause not in held:
            continue  # extra_compute / slower_gpu: from kernels, not idle time
        have = held[cause] + (held["unknown"] if cause == "dataloader" and loader_moved else 0)
        # intervals listed are capped: compare only when all of them are listed
        if len(why["intervals"]) < MAX_INTERVALS:
            assert ns <= have * 1.01 + 1_000, (f.id, cause, ns, have)
    main = why.get("main_cause")
    if main in held and len(why["intervals"]) < MAX_INTERVALS:
        assert held[main] > 0 or (main == "dataloader" and loader_moved), (f.id, main)


@pytest.mark.parametrize("name", list(SAMPLE_JOBS))
def test_samples_are_consistent(analyzed, name):
    got = analyzed(name, SAMPLE_JOBS[name])
    assert got is not None, f"sample {name} did not ingest"
    _check_job(*got)


@pytest.mark.corpus
@pytest.mark.parametrize("name", list(CORPUS_JOBS) or ["none"])
def test_corpus_jobs_are_consistent(analyzed, name):
    got = analyzed(name, CORPUS_JOBS[name])
    if got is None:
        pytest.skip("not an ingestible trace (its refusal is tested in test_corpus.py)")
    _check_job(*got)


@pytest.mark.parametrize("name", CONTROLS)
def test_controls_pass_fail_on_medium(cli, name):
    target = SAMPLES / name
    out = cli("analyze", str(target), "--fail-on", "medium")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_straggler_sample_gets_its_saving(analyzed):
    """The consistency checks are not vacuous: the straggler sample has a checked finding."""
    job, findings = analyzed("kineto/ddp_straggler", SAMPLE_JOBS["kineto/ddp_straggler"])
    (f,) = [f for f in findings if f.analyzer == "nccl_wait" and f.severity != "info"]
    intervals = f.evidence["lateness"]["intervals"]
    assert 0 < len(intervals) < MAX_INTERVALS and f.saving_ns > 0  # all listed: causes checked
