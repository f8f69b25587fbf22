"""step_breakdown on five steps whose per-step numbers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from stallscope.analyzers import step_breakdown
from stallscope.analyzers.base import Where
from stallscope.idle import CAUSES, attribute_idle
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.report_types import StepRow
from tests.kineto_builder import KinetoTrace

US = 1_000


def five_steps() -> KinetoTrace:
    """Step i on the host: [100i, 100i+100) µs, the last one 300 µs long.

    Launched in step i: two kernels on the GPU at [100i+50, 100i+70) and [100i+75, 100i+95),
    and an all-reduce at [100i+95, 100i+100). GPU window of step i: [100i+50, 100i+150)
    (the last: [450, 500)). Per window: compute 40 µs, comm 5 µs, busy 45 µs.
    """
    t = KinetoTrace()
    for i in range(5):
        base = 100 * US * i
        t.step(i, base, 300 * US if i == 4 else 100 * US)
        for offset, start, dur, name in (
            (10, 50, 20, "gemm"),
            (20, 75, 20, "relu"),
            (30, 95, 5, "ncclDevKernel_AllReduce"),
        ):
            corr = 100 * i + offset
            t.runtime("cudaLaunchKernel", base + offset * US, 2 * US, corr=corr, ext=corr)
            t.kernel(name, base + start * US, dur * US, corr=corr)
    return t


@pytest.fixture
def result(store, tmp_path):
    (res,) = ingest_paths(store, [str(five_steps().write(tmp_path / "steps.json"))])
    job = JobData(store, store.traces(res.job_id))
    out = step_breakdown.run(job, step_breakdown.SPEC.params())
    job.close()
    return out


def test_jitter_metrics(result):
    m = {x.name: x.value for x in result.metrics}
    assert m["step_time_ms_p90"] == 0.22  # numpy linear percentile of [100, 100, 100, 100, 300] µs
    assert m["step_time_ms_max"] == 0.3
    assert m["step_time_max_over_median"] == 3.0


def test_per_step_table(result):
    table = next(f for f in result.findings if f.severity == "info").evidence["steps"]
    assert [r["step"] for r in table] == [0, 1, 2, 3, 4]
    for row in table[:4]:
        assert (row["compute_ns"], row["comm_ns"], row["window_ns"], row["busy_ns"]) == (
            40 * US,
            5 * US,
            100 * US,
            45 * US,
        )
        idle = sum(v for k, v in row.items() if k.startswith("idle_"))
        assert idle == 55 * US  # the gaps [70,75) and [100,150) of the window
        # In the gap [100, 150): the next step's three 2 µs launch calls at 110, 120, 130,
        # with the Python slivers before and between them ([100,110), [112,120), [122,130));
        # [132,150) ends the gap after the handover and is longer than a launch latency.
        assert row["idle_launch_ns"] == 32 * US
        assert row["idle_unknown_ns"] == 18 * US
        assert row["idle_queued_ns"] == 5 * US  # [70, 75): relu was launched at 20-22
    # Each idle piece is in the step the host was in: the gap [100i+100, 100i+150) opens in
    # step i+1's host range (its launches), and step 0 holds the head gap [0, 50) of the scope.
    # The last step's host range [400, 700) holds the GPU's idle tail [500, 700).
    assert table[4]["window_ns"] == 300 * US and table[4]["busy_ns"] == 45 * US


def test_rows_sum_to_the_job_totals(result, store, tmp_path):
    (res,) = ingest_paths(store, [str(five_steps().write(tmp_path / "again.json"))])
    job = JobData(store, store.traces(res.job_id))
    totals = attribute_idle(job, job.traces[0].trace_id, 0).totals
    table = step_breakdown.run(job, step_breakdown.SPEC.params()).findings
    job.close()
    rows = next(f for f in table if f.severity == "info").evidence["steps"]
    for cause, value in totals.items():
        assert sum(r[f"idle_{cause}_ns"] for r in rows) == value, cause
    assert sum(r["window_ns"] for r in rows) == 700 * US  # the step scope [0, 700)


def test_jitter_finding(result):
    (jitter,) = [f for f in result.findings if f.severity != "info"]
    assert jitter.severity == "high"  # p90/median = 2.2
    assert jitter.impact_ns == 200 * US
    assert jitter.saving_ns == 200 * US  # steps brought down to the median
    assert jitter.windows == [[400 * US, 700 * US]]


def test_jitter_is_one_finding_per_job_naming_the_other_ranks(store, tmp_path):
    paths = []
    for rank in (0, 1):
        t = five_steps()
        t.rank, t.world_size = rank, 2
        paths.append(str(t.write(tmp_path / f"rank{rank}.json")))
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    result = step_breakdown.run(job, step_breakdown.SPEC.params())
    job.close()
    (jitter,) = [f for f in result.findings if f.severity != "info"]
    assert jitter.rank == 0  # a tie: the lower rank speaks for the job
    assert jitter.evidence["other_ranks"] == [{"rank": 1, "p90_over_median": 2.2}]
    assert "The same shows on rank(s) 1 (2.20x)" in jitter.detail
    assert len([f for f in result.findings if f.severity == "info"]) == 2  # a table per rank


def test_operations_without_a_launch_record_count_where_they_start(store, tmp_path):
    """No runtime events: each kernel belongs to the step its own start falls in (SQL NULL
    launch times must not read as 0, which put every kernel in no step or the first)."""
    from tests.kineto_builder import KinetoTrace

    t = KinetoTrace(base_ns=1_700_000_000_000_000_000)
    for n in range(3):
        t.step(n, n * 10_000_000, 10_000_000)
        t.kernel("k", n * 10_000_000 + 1_000_000, (n + 1) * 1_000_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = step_breakdown.run(job, step_breakdown.SPEC.params())
    job.close()
    (table,) = [f for f in result.findings if f.evidence.get("key") == "table"]
    busy = {row["step"]: row["busy_ns"] for row in table.evidence["steps"]}
    assert busy == {0: 1_000_000, 1: 2_000_000, 2: 3_000_000}


# Measure, then speak (#16): the numbers of five_steps, and findings from hand-made numbers.


def test_measure_trace_by_hand(store, tmp_path):
    (res,) = ingest_paths(store, [str(five_steps().write(tmp_path / "m.json"))])
    job = JobData(store, store.traces(res.job_id))
    m = step_breakdown.measure_trace(job, Where(job.traces[0].trace_id, 0))
    job.close()
    t = m.times  # steps of 100, 100, 100, 100, 300 µs
    assert (t.count, t.median_ns, t.max_ns) == (5, 100 * US, 300 * US)
    assert t.p90_ns == pytest.approx(220 * US)  # numpy's linear percentile
    assert (t.excess_ns, t.slowest) == (200 * US, [[400 * US, 700 * US]])
    assert [(r.step, r.device, r.busy_ns, r.compute_ns, r.comm_ns) for r in m.rows] == [
        (i, 0, 45 * US, 40 * US, 5 * US) for i in range(5)
    ]
    assert [r.window_ns for r in m.rows] == [100 * US] * 4 + [300 * US]
    assert m.step_count == 5 and step_breakdown.step_rows(m) == m.rows


def test_measure_trace_without_steps_is_none(store, tmp_path):
    t = KinetoTrace()
    t.kernel("k", 0, 1_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "nosteps.json"))])
    job = JobData(store, store.traces(res.job_id))
    assert step_breakdown.measure_trace(job, Where(job.traces[0].trace_id, 0)) is None
    job.close()


def _row(step: int, device: int = 0, **ns: int) -> StepRow:
    zero = {f"idle_{c}_ns": 0 for c in CAUSES}
    zero |= {"compute_ns": 0, "comm_ns": 0, "memcpy_ns": 0, "busy_ns": 0, "window_ns": 0}
    return StepRow(trace="t", rank=2, device=device, step=step, step_ms=1.0, **(zero | ns))


def _steps(durations_us: list[int], rows: list[StepRow]) -> step_breakdown.TraceSteps:
    starts = np.cumsum([0, *durations_us[:-1]]) * US
    ends = starts + np.array(durations_us) * US
    steps = {"step": np.arange(len(durations_us)), "start_ns": starts, "end_ns": ends}
    times = step_breakdown.measure_step_times(steps)
    return step_breakdown.TraceSteps(where=Where("t", 2), times=times, rows=rows)


PARAMS = step_breakdown.SPEC.params()


def test_measure_step_times_on_numbers():
    t = _steps([10, 10, 10, 10, 13, 16], []).times  # median 10, p90 14.5 µs
    assert (t.median_ns, t.p90_ns, t.max_ns, t.excess_ns) == (10 * US, 14.5 * US, 16 * US, 9 * US)
    assert t.slowest == [[53 * US, 69 * US], [40 * US, 53 * US]]  # slowest first


def test_speak_jitter_grades_p90_over_median():
    """p90 / median 1.45: low (1.2 <= x < 1.5); under min_steps steps, or a steady trace: none."""
    m = _steps([10, 10, 10, 10, 13, 16], [_row(0, busy_ns=5)])
    f = step_breakdown.speak_jitter(m, PARAMS)
    assert (f.trace, f.rank, f.device, f.severity) == ("t", 2, None, "low")
    assert f.title == "Step time varies: p90 is 1.45x the median"
    assert f.detail == (
        "6 steps: median 0.01 ms, p90 0.01 ms, max 0.02 ms. "
        "Steps slower than the median took 0.01 ms more in total."
    )
    assert f.impact_ns == f.saving_ns == 9 * US and f.windows == m.times.slowest
    assert (f.evidence["median_ns"], f.evidence["p90_ns"]) == (10 * US, 14_500)
    assert f.evidence["steps"] == [_evidence(m.rows[0])]
    assert step_breakdown.speak_jitter(m, PARAMS | {"min_steps": 7}) is None
    assert step_breakdown.speak_jitter(_steps([10] * 6, []), PARAMS) is None


def _evidence(row: StepRow) -> dict:
    keys = [
        "step",
        "device",
        "step_ms",
        "compute_ns",
        "comm_ns",
        "memcpy_ns",
        "busy_ns",
        "window_ns",
    ]
    return {k: getattr(row, k) for k in keys + [f"idle_{c}_ns" for c in CAUSES]}


def test_speak_table_counts_steps_not_rows():
    """Two devices in step 0: one step, two rows; the evidence holds the rows, in order."""
    rows = [_row(0, 0), _row(0, 1, busy_ns=3, window_ns=4, idle_cpu_ns=1)]
    f = step_breakdown.speak_table(_steps([20], rows))
    assert f.title == "Step breakdown: 1 step, median 0.02 ms" and f.severity == "info"
    assert f.evidence == {"key": "table", "steps": [_evidence(r) for r in rows]}
    assert list(f.evidence["steps"][1]) == list(_evidence(rows[1]))  # the documented key order


def test_run_is_measure_then_speak(store, tmp_path):
    (res,) = ingest_paths(store, [str(five_steps().write(tmp_path / "r.json"))])
    job = JobData(store, store.traces(res.job_id))
    m = step_breakdown.measure_trace(job, Where(job.traces[0].trace_id, 0))
    result = step_breakdown.run(job, PARAMS)
    job.close()
    jitter, table = step_breakdown.speak(m, PARAMS)  # run lists the job's one jitter last
    assert result.findings == [table, jitter] and jitter.evidence["key"] == "jitter"
    assert step_breakdown.metrics(m) == result.metrics
    assert result.tables.steps == m.rows


@pytest.mark.parametrize("seed", range(6))
def test_rows_by_step_are_each_steps_mask_in_row_order(seed):
    """rows_by_step (one stable sort) against a mask over every operation per step;
    -1 (outside every step) and steps owning nothing included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    owner = rng.integers(-1, n, 500)
    got = step_breakdown.rows_by_step(owner, n)
    assert len(got) == n
    for index in range(n):
        assert got[index].tolist() == np.flatnonzero(owner == index).tolist()
