"""``stallscope compare`` from the ranks' stored summaries (rank_compare-N.parquet, issue #15):
known rows on a trace built in code, and the same output in every format as from the
ranks' tables (the fallback of a job stored before the summaries) on samples."""

from __future__ import annotations

import pytest

from stallscope.compare import FORMATS, compare_jobs, rank_data, render_compare
from stallscope.ingest import ingest_paths
from stallscope.rank_compare import COMPARE_FILE, stored_summaries
from stallscope.store import Store
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace
from tests.test_compare import copy_job

MS = 1_000_000


def _ingest(store: Store, paths) -> list:
    (res,) = ingest_paths(store, [str(p) for p in paths])
    return store.traces(res.job_id)


def test_rows_of_a_trace_built_in_code(tmp_path):
    """4 steps of a 9 ms 'gemm' and a 1 MB pageable copy (3 ms); a 'tail' kernel and a copy
    after the last step are outside every step, so not counted."""
    (t,) = copy_job(pageable=True)
    t.kernel("tail", 4 * 12 * MS + MS, 5 * MS)
    t.memcpy("DtoH", "Device", "Pinned", 4 * 12 * MS + 7 * MS, MS, 4096)
    store = Store(tmp_path / "store").ensure()
    refs = _ingest(store, [t.write(tmp_path / "rank0.pt.trace.json")])
    assert (refs[0].path / COMPARE_FILE).is_file()
    con = stored_summaries(refs)
    assert con is not None
    try:
        rows = con.execute(
            "SELECT kind, step, end_ns - start_ns, name, copy_kind, src_kind, dst_kind, "
            "total_ns, bytes, count FROM rank_compare ORDER BY kind, step, name"
        ).fetchall()
    finally:
        con.close()
    src = next(r[5] for r in rows if r[0] == "memcpy")  # the parser's name of pageable memory
    assert rows == [
        ("kernel", None, None, "gemm", None, None, None, 4 * 9 * MS, None, 4),
        ("memcpy", None, None, None, "HtoD", src, "device", 4 * 3 * MS, 4 << 20, 4),
        ("span", None, 4 * 12 * MS + 8 * MS, None, None, None, None, None, None, None),
        *[("step", k, 12 * MS, None, None, None, None, None, None, None) for k in range(4)],
    ]
    steps, source, kernels, copies, ranks = rank_data(store, refs)
    assert (steps.tolist(), source) == ([12 * MS] * 4, "steps")
    assert kernels == {"gemm": (36 * MS, 4)}
    assert copies == {("HtoD", src): [12 * MS, 4 << 20, 4]} and ranks == {0: 12 * MS}


def _without_summaries(refs) -> None:
    for ref in refs:
        (ref.path / COMPARE_FILE).unlink()
    assert stored_summaries(refs) is None


K, N = SAMPLES / "kineto", SAMPLES / "nsys"
PAIRS = {
    "ddp_overlap": (K / "ddp_overlap", K / "ddp_no_overlap"),
    "pageable_d2h": (K / "train_baseline", K / "train_pageable_d2h"),
    "graphs": (K / "tiny_kernels", K / "cuda_graph"),
    "nsys_ddp": (N / "ddp_overlap.sqlite.gz", N / "ddp_no_overlap.sqlite.gz"),
}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_same_comparison_as_from_the_tables(tmp_path, pair):
    """Every format of the comparison from the stored summaries equals the one from the
    ranks' tables (the same job after its summaries are removed)."""
    store = Store(tmp_path / "store").ensure()
    sides = []
    for path in PAIRS[pair]:
        files = sorted(path.glob("*.pt.trace.json.gz")) if path.is_dir() else [path]
        sides.append(_ingest(store, files))
    assert all(stored_summaries(refs) is not None for refs in sides)
    stored = compare_jobs(store, *sides)
    for refs in sides:
        _without_summaries(refs)
    from_tables = compare_jobs(store, *sides)
    assert stored == from_tables
    for fmt in FORMATS:
        assert render_compare(stored, fmt) == render_compare(from_tables, fmt)
    assert stored["kernels"] and stored["step_time"]["base_steps"] > 1


def test_without_steps_the_gpu_span_from_the_summaries(tmp_path):
    """Traces without step ranges: the sample is the GPU span, stored per rank; the ranks'
    kernels and copies summed."""
    traces = []
    for rank, (gap, last) in enumerate([(2, 3), (4, 1)]):
        t = KinetoTrace(rank=rank, world_size=2)
        t.kernel("a", 0, 5 * MS)
        t.kernel("b", (5 + gap) * MS, last * MS)
        t.memcpy("HtoD", "Pageable", "Device", 5 * MS, MS, (rank + 1) << 20)
        traces.append(t.write(tmp_path / f"rank{rank}.pt.trace.json"))
    store = Store(tmp_path / "store").ensure()
    refs = _ingest(store, traces)
    stored = rank_data(store, refs)
    assert (stored[0].tolist(), stored[1]) == ([10 * MS], "gpu_span")
    assert stored[2] == {"a": (10 * MS, 2), "b": (4 * MS, 2)}
    assert [v for v in stored[3].values()] == [[2 * MS, 3 << 20, 2]]
    _without_summaries(refs)
    tables = rank_data(store, refs)
    assert (tables[0].tolist(), tables[1:]) == (stored[0].tolist(), stored[1:])
