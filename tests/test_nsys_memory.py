"""nsys CUDA memory usage events (``--cuda-memory-usage=true``) into the memory table, and the
memory analyzer on them: what nsys can show (reserved, churn) and what it cannot (allocated)."""

from __future__ import annotations

import json

import msgspec
import pytest

from stallscope.analyzers import memory as analyzer
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, SAMPLES
from tests.nsys_builder import NsysBuilder

M = 1 << 20
H200_BYTES = 150109880320  # NsysBuilder.gpu's totalMemory


def known_export(*, enum_shift: int = 0, steps: bool = True) -> NsysBuilder:
    """pid 100 on GPU 0. Device allocations: 100 MiB before the steps, then 50 MiB allocated and
    freed in step 0 and 20 MiB in step 1; reserved = 100, 150, 100, 120, 100 MiB (peak 150 MiB at
    t=3000). A pinned host buffer, a static ``__device__`` variable and pid 200's allocation
    are not this GPU's reservation."""
    b = NsysBuilder(enum_shift=enum_shift)
    b.process(100, "python3", {101: "main"})
    b.gpu(0)
    b.kernel(100, 0, 7, 500, 600, 1, "init_kernel")
    b.api(100, 101, 400, 450, 1, "cudaLaunchKernel_v7000")
    b.api(100, 101, 900, 1100, 11, "cudaMalloc_v3020")
    b.memory_usage(100, 0, 1000, 0x7F0000000000, 100 * M, corr=11)
    b.memory_usage(100, 0, 1500, 0x7F1000000000, 4, kind="PINNED")
    b.memory_usage(100, 0, 1600, 0x7F2000000000, 1024, kind="DEVICE_STATIC", name="table")
    b.memory_usage(200, 0, 1700, 0x7F3000000000, 999 * M)  # another process
    if steps:
        b.nvtx(100, 101, 2000, 5000, "step 0")
        b.nvtx(100, 101, 5000, 8000, "step 1")
    b.kernel(100, 0, 7, 2100, 4900, 2, "gemm")
    b.api(100, 101, 2050, 2090, 2, "cudaLaunchKernel_v7000")
    b.memory_usage(100, 0, 3000, 0x7F4000000000, 50 * M)
    b.memory_usage(100, 0, 4000, 0x7F4000000000, 50 * M, free=True)
    b.kernel(100, 0, 7, 5100, 7900, 3, "gemm")
    b.api(100, 101, 5050, 5090, 3, "cudaLaunchKernel_v7000")
    b.memory_usage(100, 0, 6000, 0x7F5000000000, 20 * M)
    b.memory_usage(100, 0, 7000, 0x7F5000000000, 20 * M, free=True)
    return b


def ingest(store, path):
    (res,) = ingest_paths(store, [str(path)])
    return store.traces(res.job_id)


def analyze(store, refs, params: dict | None = None):
    job = JobData(store, refs)
    try:
        return analyzer.run(job, analyzer.SPEC.params(params))
    finally:
        job.close()


def memory_rows(store, refs) -> list[dict]:
    con = store.connect(refs)
    try:
        cur = con.execute("SELECT * FROM memory ORDER BY seq")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def metrics(result) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics}


def by_key(result) -> dict[str, object]:
    return {f.evidence["key"]: f for f in result.findings}


@pytest.mark.parametrize("shift", [0, 3])  # ENUM ids read by name, not by number
def test_device_allocations_become_segment_rows(store, tmp_path, shift):
    refs = ingest(store, known_export(enum_shift=shift).write(tmp_path / "m.sqlite"))
    rows = memory_rows(store, refs)
    assert [(r["ts_ns"], r["bytes"], r["total_reserved"]) for r in rows] == [
        (1000, 100 * M, 100 * M),
        (3000, 50 * M, 150 * M),
        (4000, -50 * M, 100 * M),
        (6000, 20 * M, 120 * M),
        (7000, -20 * M, 100 * M),
    ]
    assert rows[0] | {"trace_id": None} == {
        "trace_id": None, "device": 0, "ts_ns": 1000, "bytes": 100 * M, "total_allocated": None,
        "total_reserved": 100 * M, "addr": 0x7F0000000000, "pid": 100, "tid": 101,
        "external_id": None, "seq": 0, "source": "nsys", "action": "segment_alloc", "stack": None,
    }  # fmt: skip
    assert [r["action"] for r in rows[1:3]] == ["segment_alloc", "segment_free"]
    assert rows[1]["tid"] is None  # no API call carries its correlation id


def test_reserved_peak_headroom_and_churn_known_by_hand(store, tmp_path):
    refs = ingest(store, known_export().write(tmp_path / "m.sqlite"))
    result = analyze(store, refs)
    assert metrics(result) == {
        "mem_reserved_peak_bytes": 150 * M,
        "mem_headroom_pct": round(100 * (H200_BYTES - 150 * M) / H200_BYTES, 3),
    }  # nothing about allocated memory or fragmentation: nsys does not see tensors
    found = by_key(result)
    assert set(found) == {"summary", "churn"}
    summary = found["summary"]
    assert summary.evidence["reserved_peak_ns"] == 3000
    assert summary.evidence["allocated_peak_bytes"] is None
    assert summary.evidence["allocated_known"] is False
    assert summary.windows == [[3000, 4000]]
    assert "(3 allocations, 2 frees)" in summary.detail
    assert "cannot be told from this trace" in summary.detail
    churn = found["churn"]
    assert churn.severity == "medium"
    steps = churn.evidence["steps"]
    assert [(s["reserved_changes"], s["driver_calls"]) for s in steps] == [(2, 0), (2, 0)]
    assert "same calls" in churn.detail


def test_without_steps_churn_needs_the_threshold(store, tmp_path):
    refs = ingest(store, known_export(steps=False).write(tmp_path / "m.sqlite"))
    assert "churn" not in by_key(analyze(store, refs))  # 4 changes < 10
    churn = by_key(analyze(store, refs, {"churn_events_no_steps": 4}))["churn"]
    assert churn.severity == "low" and churn.evidence["reserved_changes"] == 4


def test_headroom_finding_from_the_reservation(store, tmp_path):
    b = known_export()
    b.memory_usage(100, 0, 7500, 0x7F6000000000, H200_BYTES - 200 * M)  # 2 % would be left
    result = analyze(store, ingest(store, b.write(tmp_path / "m.sqlite")))
    found = by_key(result)
    assert found["headroom"].severity == "high"
    assert metrics(result)["mem_headroom_pct"] == round(100 * 100 * M / H200_BYTES, 3)


def test_exports_without_the_table_or_with_it_empty_have_no_memory_rows(store, tmp_path):
    b = known_export()
    b.rows.pop("CUDA_GPU_MEMORY_USAGE_EVENTS")  # the table exists, no rows
    refs = ingest(store, b.write(tmp_path / "empty.sqlite"))
    assert memory_rows(store, refs) == [] and analyze(store, refs).findings == []
    b.drop("CUDA_GPU_MEMORY_USAGE_EVENTS")
    refs = ingest(store, b.write(tmp_path / "none.sqlite"))
    assert memory_rows(store, refs) == []


PIPIT = CORPUS / "pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


@pytest.mark.skipif(not PIPIT.is_file(), reason="corpus not present")
def test_corpus_export_with_the_empty_table_still_ingests(store):
    refs = ingest(store, PIPIT)
    assert refs and memory_rows(store, refs) == []
    assert analyze(store, refs).findings == []


def h200(store, name: str):
    truth = json.loads((SAMPLES / "nsys" / f"{name}.truth.json").read_text())
    refs = ingest(store, SAMPLES / "nsys" / f"{name}.sqlite.gz")
    return truth["memory_truth"], analyze(store, refs), memory_rows(store, refs)


# Ten device allocations the caching allocator did not make (CUDA libraries' own buffers):
# in both captures nsys sees 10 more cudaMalloc than torch's segment.all.allocated, no more
# frees, and this many more bytes than torch.cuda.max_memory_reserved().
NOT_THE_ALLOCATORS = 134_532_616


@pytest.mark.parametrize("name", ["nsys_mem_train", "nsys_mem_churn"])
def test_h200_captures_reserved_is_the_allocators_plus_library_buffers(store, name):
    truth, result, rows = h200(store, name)
    values = metrics(result)
    assert set(values) == {"mem_reserved_peak_bytes", "mem_headroom_pct"}
    assert values["mem_reserved_peak_bytes"] == truth["max_memory_reserved"] + NOT_THE_ALLOCATORS
    actions = [r["action"] for r in rows]
    assert actions.count("segment_alloc") == truth["allocator_segments_allocated_in_process"] + 10
    assert actions.count("segment_free") == truth["allocator_segments_freed_in_process"]
    assert {r["total_allocated"] for r in rows} == {None}
    assert "cannot be told from this trace" in by_key(result)["summary"].detail


def test_h200_churn_matches_the_allocators_counters_step_by_step(store):
    truth, result, _ = h200(store, "nsys_mem_churn")
    churn = by_key(result)["churn"]
    expected = [
        s["cudaMalloc_by_allocator"] + s["cudaFree_by_allocator"] for s in truth["per_step"]
    ]
    assert [s["reserved_changes"] for s in churn.evidence["steps"]] == expected  # 133, 133, 132...
    assert [s["driver_calls"] for s in churn.evidence["steps"]] == expected


def test_h200_warm_allocator_has_no_churn(store):
    truth, result, _ = h200(store, "nsys_mem_train")
    assert truth["cudaMalloc_by_allocator_in_steps"] == 0
    assert set(by_key(result)) == {"summary"}


def test_memory_chart_draws_reserved_only(store, tmp_path):
    from stallscope.memory_charts import _thin, memory_figure, memory_frame

    refs = ingest(store, known_export().write(tmp_path / "m.sqlite"))
    result = analyze(store, refs)
    summary = next(f for f in result.findings if f.evidence["key"] == "summary")
    con = store.connect(refs)
    try:
        frame = memory_frame(con, refs[0].trace_id)
    finally:
        con.close()
    assert frame["allocated"].isna().all()
    assert list(frame["reserved"]) == [100 * M, 150 * M, 100 * M, 120 * M, 100 * M]
    assert _thin(frame, limit=3)["reserved"].max() == 150 * M  # the peak survives thinning
    (row,) = result.tables.memory_devices  # the page draws the table's row
    assert (row.source, row.allocated_peak_bytes, row.reserved_peak_bytes) == (
        "segments", None, summary.evidence["reserved_peak_bytes"])  # fmt: skip
    assert result.tables.memory_live_at_peak == []
    figure = memory_figure(frame, 0, msgspec.to_builtins(row))
    assert [t.name for t in figure.data] == ["reserved"]  # no allocated line, no allocated peak


def test_memory_page_on_an_nsys_job(store, tmp_path, monkeypatch):
    import streamlit as st

    from tests.test_memory import values_of
    from tests.test_pages import page

    st.cache_data.clear()
    (res,) = ingest_paths(store, [str(known_export().write(tmp_path / "m.sqlite"))])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    at = page("memory", job=res.job_id)
    assert not at.exception
    (chart,) = at.get("plotly_chart")
    series = {t["name"]: t for t in json.loads(chart.proto.spec)["data"]}
    assert set(series) == {"reserved"}
    assert values_of(series["reserved"]["y"]) == [100.0, 150.0, 100.0, 120.0, 100.0]
    assert "MEDIUM" in " ".join(w.value for w in at.warning)  # the churn finding
    assert "cannot be told" in " ".join(c.value for c in at.caption)
    assert not at.dataframe  # no live-at-peak table: nsys sees no tensors
