"""The data the Distributed page reads, read faster (issue 15): the same numbers as before.

The catalog goes into DuckDB as one Arrow table, a job's views can cover some tables only,
the collectives' steps come from the rank cards inside the rows query, the wait matrix reads
the collectives alone (``match_waits``), and the clock skew's medians are one sort.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallscope.collectives import _skew, match_collectives, match_waits
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.rank_card import job_cards
from stallscope.store import Store, _insert_catalog_rows, create_catalog
from stallscope.views import overlap_rows, wait_matrix
from tests.ddp_builder import BUCKETS, MS, Plan, ddp_job

STEPS = 3


@pytest.fixture
def ddp(tmp_path):
    """Two ranks of 3 DDP steps, rank 1 loading data 20 ms longer each step (the straggler)."""
    traces, _ = ddp_job([Plan(), Plan(stall_ns=20 * MS)], steps=STEPS)
    paths = [str(t.write(tmp_path / f"rank{r}.pt.trace.json")) for r, t in enumerate(traces)]
    store = Store(tmp_path / "store").ensure()
    (res,) = ingest_paths(store, paths)
    return store, store.traces(res.job_id)


def _catalog(con) -> list[tuple]:
    return con.execute("SELECT * FROM catalog ORDER BY trace_id").fetchall()


def test_the_catalog_from_arrow_equals_the_one_from_parameters(ddp):
    import duckdb

    store, refs = ddp
    con = store.connect(refs)
    by_params = duckdb.connect()
    create_catalog(by_params, [])  # the table, empty
    _insert_catalog_rows(by_params, [r.meta for r in refs])
    assert _catalog(con) == _catalog(by_params)
    assert [row[5] for row in _catalog(con)] == sorted(int(r.meta["rank"]) for r in refs)


def test_a_hand_written_meta_goes_in_as_parameters_cast_by_duckdb():
    """A rank written as text and a size with a fraction: DuckDB casts them, as it always did
    (Arrow would refuse the text and truncate the fraction)."""
    import duckdb

    metas = [
        {"trace_id": "a", "rank": "3", "file_bytes": 1.5, "uploaded_by": "me"},
        {"trace_id": "b", "rank": 4, "file_bytes": 10},
    ]
    con = duckdb.connect()
    create_catalog(con, metas)
    rows = con.execute("SELECT trace_id, rank, file_bytes, uploaded_by FROM catalog").fetchall()
    assert rows == [("a", 3, 2, "me"), ("b", 4, 10, None)]


def test_views_of_some_tables_only(ddp):
    store, refs = ddp
    con = store.connect(refs, tables=("collectives",))
    views = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    names = {name for (name,) in views}
    assert names == {"collectives"}
    assert con.execute("SELECT count(*) FROM catalog").fetchone()[0] == len(refs)
    assert con.execute("SELECT count(*) FROM collectives").fetchone()[0] == 2 * STEPS * BUCKETS


def test_the_rows_query_reads_each_collectives_step_from_the_cards(ddp):
    """Steps read in the rows query (cards on disk) equal those read from the cards in memory
    (the analysis' order: triage loads them first), and the steps by hand."""
    store, refs = ddp
    fresh = JobData(store, refs)
    loaded = JobData(store, refs)
    try:
        job_cards(loaded)
        a, b = match_collectives(fresh), match_collectives(loaded)
        assert "rank_cards" not in fresh.cache  # the query read them, not job_cards
        by_hand = [k for _ in range(2) for k in range(STEPS) for _ in range(BUCKETS)]
        assert a.rows["step"].tolist() == b.rows["step"].tolist() == by_hand
        for name in a.rows:
            assert np.array_equal(a.rows[name], b.rows[name]), name
    finally:
        fresh.close()
        loaded.close()


def test_the_wait_matrix_match_is_the_whole_match_without_steps_and_algorithms(ddp):
    store, refs = ddp
    whole_job, waits_job = JobData(store, refs), JobData(store, refs, tables=("collectives",))
    try:
        whole, waits = match_collectives(whole_job), match_waits(waits_job)
        for name in whole.rows:
            if name != "step":
                assert np.array_equal(whole.rows[name], waits.rows[name]), name
        for name in whole.instances:
            if name != "algorithm":
                a, b = whole.instances[name], waits.instances[name]
                assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
        assert set(whole.instances["algorithm"]) == {"RING_LL"}
        assert set(waits.instances["algorithm"]) == {""} and set(waits.rows["step"]) == {-1}
        assert (whole.skew_ns, whole.methods) == (waits.skew_ns, waits.methods)
        # rank 0 waits for rank 1 in the first all-reduce of each step: 20 ms more loading
        frame = wait_matrix(waits_job)
        first = frame[(frame["rank"] == 0) & (frame["collective"] % BUCKETS == 0)]
        assert first["wait_ms"].tolist() == pytest.approx([20.0] * STEPS, abs=0.1)
        assert match_waits(whole_job) is whole  # the whole match serves when it is there
    finally:
        whole_job.close()
        waits_job.close()


def _skew_by_loop(inst, part, end, tolerance):
    """The per-participant loop _skew replaced (np.median per participant)."""
    skew = np.zeros(part.max() + 1, dtype=np.int64)
    corrected = np.zeros(part.max() + 1, dtype=bool)
    ref_end = np.full(inst.max() + 1, np.iinfo(np.int64).min)
    ref_end[inst[(inst >= 0) & (part == 0)]] = end[(inst >= 0) & (part == 0)]
    ok = inst >= 0
    usable = ok & (ref_end[np.where(ok, inst, 0)] != np.iinfo(np.int64).min)
    d, p = end[usable] - ref_end[inst[usable]], part[usable]
    for q in np.unique(p):
        dq = d[p == q]
        med = int(np.median(dq))
        mad = float(np.median(np.abs(dq - med)))
        skew[q] = med
        corrected[q] = abs(med) > tolerance and mad < abs(med) / 2 and dq.size >= 3
    return skew, corrected


def test_skew_medians_by_hand_and_as_np_median():
    """Participant 1 ends 10, 20, 30, 41 ns after participant 0: median 25, deviations
    15, 5, 5, 16 (median 10 < 25 / 2): corrected above a 5 ns tolerance. Participant 2 ends
    1 ns before, then 0 (median -0.5: 0, as int(np.median) gives): not corrected."""
    inst = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    part = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    end = np.array([100, 200, 300, 400, 110, 220, 330, 441, 99, 200], dtype=np.int64)
    skew, corrected = _skew(inst, part, end, 5)
    assert skew.tolist() == [0, 25, 0] and corrected.tolist() == [False, True, False]
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(2, 9))
        part = np.repeat(np.arange(n), 6)
        inst = np.tile(np.arange(6), n)
        inst[rng.random(inst.size) < 0.15] = -1
        inst[part == 0] = np.arange(6)
        scale = int(rng.choice([1, 1000, 10**9]))
        end = (rng.integers(-5, 6, inst.size) * scale + rng.integers(0, 2, inst.size)).astype(
            np.int64
        )
        tol = int(rng.integers(0, 3)) * scale
        a, b = _skew(inst, part, end, tol), _skew_by_loop(inst, part, end, tol)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_overlap_rows_from_the_report_table():
    report = {"tables": {"comm_overlap": [
        {"trace": "t1", "rank": 1, "device": 1, "comm_ns": 3_000_000, "comm_overlap_pct": 50.0,
         "exposed_comm_ns": 1_500_000, "exposed_wait_ns": 1_234_567},
        {"trace": "t0", "rank": 0, "device": 0, "comm_ns": 2_000_000, "comm_overlap_pct": 25.0,
         "exposed_comm_ns": 1_500_000, "exposed_wait_ns": 0},
    ]}}  # fmt: skip
    frame = overlap_rows(report)
    assert frame.to_dict("records") == [
        {"rank": 0, "GPU": 0, "comm ms": 2.0, "hidden %": 25.0, "exposed ms": 1.5, "waiting ms": 0.0},
        {"rank": 1, "GPU": 1, "comm ms": 3.0, "hidden %": 50.0, "exposed ms": 1.5, "waiting ms": 1.23},
    ]  # fmt: skip
    assert overlap_rows({"tables": {}}).empty and isinstance(overlap_rows({}), pd.DataFrame)


def test_compare_gpu_times_over_all_traces_at_once(tmp_path):
    """Rank 0 has steps [0, 10) and [10, 20) ms: a kernel launched at 5 ms counts, one launched
    at 25 ms (after the last step) does not, one launched in step 1 but running at 30 ms does
    (the launch call decides). Rank 1 has no steps: all its kernels and copies count."""
    from stallscope.compare import gpu_times
    from tests.kineto_builder import KinetoTrace

    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    r0.step(0, 0, 10 * MS)
    r0.step(1, 10 * MS, 10 * MS)
    r0.kernel("gemm", 5 * MS, 2 * MS)
    r0.kernel("gemm", 25 * MS, 1 * MS)
    corr = r0.kernel("late", 30 * MS, 3 * MS)
    r0.runtime("cudaLaunchKernel", 12 * MS, 10_000, corr=corr)
    r1.kernel("gemm", 1 * MS, 4 * MS, device=1)
    r1.kernel("gemm", 40 * MS, 4 * MS, device=1)
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in (r0, r1)]
    store = Store(tmp_path / "store").ensure()
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    try:
        kernels, _ = gpu_times(job)
    finally:
        job.close()
    assert kernels == {"gemm": (2 * MS + 8 * MS, 3), "late": (3 * MS, 1)}
