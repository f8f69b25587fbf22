"""memory: the allocator's [memory] events into the memory table, and the memory analyzer's
peaks, fragmentation, headroom, live ops and churn on traces where each is known by hand."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from stallscope.analyzers import memory as analyzer
from stallscope.ingest import ingest_paths
from stallscope.ingest.kineto.memory import memory_table
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, SAMPLES
from tests.kineto_builder import H100, KinetoTrace, us

M = 1 << 20


def mem_event(
    trace: KinetoTrace,
    t: int,
    delta: int,
    addr: int,
    allocated: int | None,
    reserved: int | None,
    *,
    device: int = 0,
    device_type: int = 1,
    tid: int = 100,
) -> None:
    """One Kineto ``[memory]`` instant event at ``t`` ns, written as PyTorch writes it."""
    args = {"Bytes": delta, "Addr": addr, "Device Id": device, "Device Type": device_type}
    if allocated is not None:
        args |= {"Total Allocated": allocated, "Total Reserved": reserved}
    trace.events.append(
        '{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", '
        f'"pid": 100, "tid": {tid}, "ts": {us(trace.base_ns + t)}, "args": {json.dumps(args)}}}'
    )


def churning_trace() -> KinetoTrace:
    """Two steps; allocated peaks at 300 MiB at t=200 µs (aten::mm 100 MiB + aten::relu 200 MiB);
    reserved peaks at 320 MiB; the reservation changes inside both steps."""
    t = KinetoTrace(base_ns=1_700_000_000_000_000_123, device_props=[H100])
    t.step(1, 0, 1_000_000)
    t.step(2, 1_000_000, 1_000_000)
    t.cpu_op("aten::mm", 50_000, 100_000)
    t.cpu_op("aten::empty", 90_000, 20_000)  # the mm's output: charged to aten::mm
    t.cpu_op("aten::relu", 180_000, 40_000)
    t.kernel("sgemm", 60_000, 50_000)
    mem_event(t, 100_000, 100 * M, 1, 100 * M, 128 * M)
    mem_event(t, 200_000, 200 * M, 2, 300 * M, 320 * M)  # the peak
    mem_event(t, 300_000, -100 * M, 1, 200 * M, 320 * M)
    mem_event(t, 400_000, 50 * M, 3, 250 * M, 320 * M)
    mem_event(t, 500_000, -200 * M, 2, 50 * M, 320 * M)
    mem_event(t, 600_000, -50 * M, 3, 0, 128 * M)  # empty_cache()
    mem_event(t, 1_100_000, 100 * M, 4, 100 * M, 320 * M)  # grows again in step 2
    mem_event(t, 1_200_000, -100 * M, 4, 0, 320 * M)
    mem_event(t, 1_300_000, 4096, 99, None, None, device=-1, device_type=0)  # CPU: skipped
    return t


def tight_trace(*, malloc_in_step2: bool = False) -> KinetoTrace:
    """A 1000 MiB device holding 960 MiB reserved (4 % headroom) of which 700 MiB is the most
    ever allocated at the reserved peak: 260/960 = 27.083 % unused; reserved grows in step 1 only."""
    device = dict(H100, totalGlobalMem=1000 * M)
    t = KinetoTrace(device_props=[device])
    t.step(1, 0, 1_000_000)
    t.step(2, 1_000_000, 1_000_000)
    t.kernel("k", 10_000, 10_000)
    mem_event(t, 100_000, 500 * M, 1, 500 * M, 512 * M)
    mem_event(t, 200_000, 200 * M, 2, 700 * M, 960 * M)
    mem_event(t, 300_000, -200 * M, 2, 500 * M, 960 * M)
    mem_event(t, 1_100_000, 150 * M, 3, 650 * M, 960 * M)
    if malloc_in_step2:
        t.runtime("cudaMalloc", 1_099_000, 500_000)
    return t


def run(store, tmp_path, trace: KinetoTrace, params: dict | None = None):
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    try:
        return job, analyzer.run(job, analyzer.SPEC.params(params))
    finally:
        job.close()


def metrics(result) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics}


def by_key(result) -> dict[str, object]:
    return {f.evidence["key"]: f for f in result.findings}


def test_memory_table_keeps_cuda_rows_with_exact_times(tmp_path):
    trace = churning_trace()
    table, unreadable = memory_table(trace.render().encode(), "T")
    assert unreadable == 0
    assert table.num_rows == 8  # the CPU row is left out
    rows = table.to_pylist()
    assert rows[0]["ts_ns"] == 1_700_000_000_000_100_123  # epoch µs with 3 decimals, exact
    assert rows[1] | {"trace_id": None} == {
        "trace_id": None, "device": 0, "ts_ns": 1_700_000_000_000_200_123, "bytes": 200 * M,
        "total_allocated": 300 * M, "total_reserved": 320 * M, "addr": 2, "pid": 100,
        "tid": 100, "external_id": None, "seq": 1, "source": "kineto", "action": "alloc",
        "stack": None,
    }  # fmt: skip


def test_no_memory_events_gives_an_empty_table():
    trace = KinetoTrace()
    trace.kernel("k", 0, 10)
    table, unreadable = memory_table(trace.render().encode(), "T")
    assert (table.num_rows, unreadable) == (0, 0)


def test_a_damaged_memory_event_is_counted_not_fatal():
    text = churning_trace().render().replace('"Bytes": 209715200', '"Bytes": 2097152OOPS', 1)
    table, unreadable = memory_table(text.encode(), "T")
    assert (table.num_rows, unreadable) == (7, 1)


def test_peaks_live_ops_and_churn_known_by_hand(store, tmp_path):
    job, result = run(store, tmp_path, churning_trace())
    assert metrics(result) == {
        "mem_allocated_peak_bytes": 300 * M,
        "mem_reserved_peak_bytes": 320 * M,
        "mem_fragmentation_pct": 6.25,  # (320 - 300) / 320
        "mem_headroom_pct": round(100 * (85029158912 - 320 * M) / 85029158912, 3),
    }
    found = by_key(result)
    assert set(found) == {"summary", "churn"}  # 6.25 % unused, 99.6 % free: nothing else
    summary = found["summary"]
    assert summary.evidence["allocated_peak_ns"] == 1_700_000_000_000_200_123
    assert summary.windows == [[1_700_000_000_000_200_123, 1_700_000_000_000_300_123]]
    assert summary.evidence["live_at_peak"] == [
        {"op": "aten::relu", "bytes": 200 * M, "count": 1},
        {"op": "aten::mm", "bytes": 100 * M, "count": 1},  # made inside aten::empty
    ]
    churn = found["churn"]
    assert churn.severity == "medium"
    assert [s["reserved_changes"] for s in churn.evidence["steps"]] == [2, 1]


def test_headroom_and_fragmentation_findings(store, tmp_path):
    _, result = run(store, tmp_path, tight_trace())
    values = metrics(result)
    assert values["mem_fragmentation_pct"] == 27.083  # (960 - 700) / 960
    assert values["mem_headroom_pct"] == 4.0  # (1000 - 960) / 1000
    found = by_key(result)
    assert found["headroom"].severity == "high"
    assert found["fragmentation"].severity == "medium"
    assert "expandable_segments:True" in found["fragmentation"].recommendation
    assert "churn" not in found  # the reservation changed in step 1 only
    assert found["summary"].evidence["live_at_peak"][0] == {
        "op": "(outside any op)", "bytes": 700 * M, "count": 2,
    }  # fmt: skip


def test_thresholds_move_the_findings(store, tmp_path):
    _, result = run(store, tmp_path, tight_trace(), {"headroom_pct": 3, "fragmentation_pct": 30})
    assert set(by_key(result)) == {"summary"}


def test_cuda_malloc_calls_count_as_churn(store, tmp_path):
    _, result = run(store, tmp_path, tight_trace(malloc_in_step2=True))
    steps = by_key(result)["churn"].evidence["steps"]
    assert [(s["reserved_changes"], s["driver_calls"]) for s in steps] == [(1, 0), (0, 1)]


def test_old_traces_without_totals_use_the_running_sum(store, tmp_path):
    t = KinetoTrace()
    t.kernel("k", 0, 10_000)
    mem_event(t, 1_000, 10 * M, 1, None, None)
    mem_event(t, 2_000, 30 * M, 2, None, None)
    mem_event(t, 3_000, -10 * M, 1, None, None)
    _, result = run(store, tmp_path, t)
    assert metrics(result) == {"mem_allocated_peak_bytes": 40 * M}  # no device memory known
    summary = by_key(result)["summary"]
    assert summary.evidence["allocated_from_deltas"] is True
    assert "allocated before the capture" in summary.detail


def test_capacity_by_name_when_the_trace_has_no_total():
    assert analyzer.capacity_bytes({"name": "NVIDIA H200", "total_mem_bytes": None}) == (
        141 * 10**9, "product table (H200)",
    )  # fmt: skip
    assert analyzer.capacity_bytes({"name": "NVIDIA A100-SXM4-40GB"})[0] == 40 * (1 << 30)
    assert analyzer.capacity_bytes({"name": "NVIDIA A100-SXM4-80GB"})[0] == 80 * (1 << 30)
    assert analyzer.capacity_bytes({"name": "Tesla T4"}) == (None, "unknown")


def test_a_store_without_memory_files_reads_an_empty_view(store, tmp_path):
    (res,) = ingest_paths(store, [str(churning_trace().write(tmp_path / "t.json"))])
    (ref,) = store.traces(res.job_id)
    ref.table_path("memory").unlink()  # as written before the memory table existed
    job = JobData(store, [ref])
    try:
        assert job.sql("SELECT count(*) FROM memory").fetchone() == (0,)
        assert analyzer.run(job, analyzer.SPEC.params()).findings == []
    finally:
        job.close()


BERT = CORPUS / "tracelens" / "traces" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"


@pytest.mark.skipif(not BERT.is_file(), reason="corpus not present")
def test_corpus_trace_peaks_match_a_direct_reading(store):
    events = json.loads(gzip.decompress(BERT.read_bytes()))["traceEvents"]
    cuda = [
        e["args"]
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1
    ]
    (res,) = ingest_paths(store, [str(BERT)])
    job = JobData(store, store.traces(res.job_id))
    try:
        assert job.sql("SELECT count(*) FROM memory").fetchone() == (len(cuda),)
        values = metrics(analyzer.run(job, analyzer.SPEC.params()))
    finally:
        job.close()
    assert values["mem_allocated_peak_bytes"] == max(a["Total Allocated"] for a in cuda)
    assert values["mem_reserved_peak_bytes"] == max(a["Total Reserved"] for a in cuda)
    assert 0 <= values["mem_fragmentation_pct"] < 100
    assert values["mem_headroom_pct"] > 99  # a small BERT on an 80 GB H100


@pytest.fixture
def page_jobs(store, tmp_path, monkeypatch):
    import streamlit as st

    from tests.test_utilization import hand_trace

    st.cache_data.clear()
    ids = {}
    for name, trace in (("mem", tight_trace()), ("plain", hand_trace())):
        (res,) = ingest_paths(store, [str(trace.write(tmp_path / f"{name}.pt.trace.json"))])
        ids[name] = res.job_id
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return ids


def values_of(data) -> list[float]:
    """A Plotly JSON array, plain or binary-encoded (``{"dtype": "f8", "bdata": base64}``)."""
    if isinstance(data, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(data)


def test_memory_page_draws_the_timeline_peak_and_findings(page_jobs):
    from tests.test_pages import page

    at = page("memory", job=page_jobs["mem"])
    assert not at.exception
    (chart,) = at.get("plotly_chart")
    figure = json.loads(chart.proto.spec)
    series = {t["name"]: t for t in figure["data"]}
    assert values_of(series["allocated"]["y"]) == [500.0, 700.0, 500.0, 650.0]
    assert values_of(series["reserved"]["y"]) == [512.0, 960.0, 960.0, 960.0]
    assert values_of(series["allocated"]["x"]) == [0.0, 0.1, 0.2, 1.0]  # ms since the first event
    peak = series["allocated peak"]
    assert (values_of(peak["x"]), values_of(peak["y"])) == ([0.1], [700.0])
    warnings = " ".join(w.value for w in at.warning)
    assert "HIGH" in warnings and "MEDIUM" in warnings and "expandable" in warnings
    assert at.dataframe[0].value["MiB"].tolist() == [700.0]


def test_memory_page_without_allocator_events_says_how_to_capture(page_jobs):
    from tests.test_pages import page

    at = page("memory", job=page_jobs["plain"])
    assert not at.exception
    assert any("profile_memory=True" in i.value for i in at.info)


def test_thinning_keeps_every_peak():
    import numpy as np
    import pandas as pd

    from stallscope.memory_charts import _thin

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {"device": 0, "ts_ns": np.arange(100_000), "allocated": rng.integers(0, 1000, 100_000)}
    )
    frame["reserved"] = frame["allocated"] + 5
    frame.loc[77_777, ["allocated", "reserved"]] = [5000, 6000]
    thin = _thin(frame, 3000)
    assert len(thin) <= 3000 and thin["allocated"].max() == 5000 and thin["reserved"].max() == 6000


# -- CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles) -------------------------

SEG_A, SEG_B = 0x7F0000000000, 0x7F0010000000


def frames(name: str, where: str) -> list[dict]:
    file, line = where.split(":")
    return [
        {"filename": "/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
        {"filename": f"/work/{file}", "line": int(line), "name": name},
    ]


def snapshot() -> dict:
    """Peak 76 MiB allocated at t=14 µs (attention 40 + mlp 20 + forward 16); reserved 96 MiB
    from t=13 µs; 20/96 = 20.833 % unused at the reserved peak; largest free block 48 MiB."""
    trace = [
        {"action": "segment_alloc", "addr": SEG_A, "size": 64 * M, "time_us": 10},
        {"action": "alloc", "addr": SEG_A, "size": 16 * M, "time_us": 11,
         "frames": frames("forward", "train.py:10")},
        {"action": "alloc", "addr": SEG_A + 16 * M, "size": 40 * M, "time_us": 12,
         "frames": frames("attention", "model.py:20")},
        {"action": "segment_alloc", "addr": SEG_B, "size": 32 * M, "time_us": 13},
        {"action": "alloc", "addr": SEG_B, "size": 20 * M, "time_us": 14,
         "frames": frames("mlp", "model.py:30")},
        {"action": "free_requested", "addr": SEG_B, "size": 20 * M, "time_us": 15},
        {"action": "free_completed", "addr": SEG_B, "size": 20 * M, "time_us": 16},
        {"action": "free_completed", "addr": SEG_A + 16 * M, "size": 40 * M, "time_us": 17},
    ]  # fmt: skip
    segments = [
        {"device": 0, "address": SEG_A, "total_size": 64 * M, "allocated_size": 16 * M,
         "is_expandable": False, "blocks": [
             {"address": SEG_A, "size": 16 * M, "state": "active_allocated"},
             {"address": SEG_A + 16 * M, "size": 48 * M, "state": "inactive"}]},
        {"device": 0, "address": SEG_B, "total_size": 32 * M, "allocated_size": 0,
         "is_expandable": False, "blocks": [
             {"address": SEG_B, "size": 20 * M, "state": "inactive"},
             {"address": SEG_B + 20 * M, "size": 12 * M, "state": "inactive"}]},
    ]  # fmt: skip
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_snapshot_pickle_gives_the_timeline_peak_and_stacks(store, tmp_path, protocol):
    import pickle

    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot(), protocol=protocol))
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    try:
        rows = job.sql(
            "SELECT ts_ns, action, total_allocated // 1048576, total_reserved // 1048576 "
            "FROM memory WHERE action <> 'free_block' ORDER BY seq"
        ).fetchall()
        result = analyzer.run(job, analyzer.SPEC.params())
    finally:
        job.close()
    assert rows == [
        (10_000, "segment_alloc", 0, 64), (11_000, "alloc", 16, 64), (12_000, "alloc", 56, 64),
        (13_000, "segment_alloc", 56, 96), (14_000, "alloc", 76, 96),
        (16_000, "free_completed", 56, 96), (17_000, "free_completed", 16, 96),
    ]  # fmt: skip
    assert metrics(result) == {
        "mem_allocated_peak_bytes": 76 * M,
        "mem_reserved_peak_bytes": 96 * M,
        "mem_fragmentation_pct": 20.833,
    }  # no device memory in a snapshot: no headroom
    found = by_key(result)
    assert found["fragmentation"].evidence["largest_free_block_bytes"] == 48 * M
    assert "largest free block was 48.0 MiB" in found["fragmentation"].detail
    assert found["summary"].evidence["live_at_peak"] == [
        {"op": "attention (model.py:20)", "bytes": 40 * M, "count": 1},
        {"op": "mlp (model.py:30)", "bytes": 20 * M, "count": 1},
        {"op": "forward (train.py:10)", "bytes": 16 * M, "count": 1},
    ]


def test_snapshot_only_churn_says_host_calls_were_not_recorded(store, tmp_path):
    """A snapshot alone records no host calls and no steps: the churn finding says so instead
    of counting 0 cudaMalloc/cudaFree calls or asking for step markers. The hand-built
    snapshot's reserved total changes once (64 -> 96 MiB at 13 µs) over 7 µs."""
    import pickle

    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    try:
        result = analyzer.run(job, analyzer.SPEC.params({"churn_events_no_steps": 1}))
    finally:
        job.close()
    churn = by_key(result)["churn"]
    assert churn.detail == (
        "The reserved total changed 1 times over 0.0 ms; host calls not recorded (snapshot only)."
    )
    assert "cudaMalloc" not in churn.detail and "step markers" not in churn.detail
    assert churn.evidence["host_calls_recorded"] is False
    assert churn.recommendation.startswith("Pair the snapshot with a profiler trace")


class _Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/stallscope-memory-pwned",))


def test_a_pickle_with_code_is_refused_and_never_run(cli, tmp_path):
    import pickle
    from pathlib import Path

    marker = Path("/tmp/stallscope-memory-pwned")
    marker.unlink(missing_ok=True)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[_Exploit()]]}, protocol=4))
    out = cli("ingest", str(path))
    assert out.returncode == 3 and "refused to load" in out.stderr and "Traceback" not in out.stderr
    assert not marker.exists()


def test_a_plain_pickle_that_is_no_snapshot_is_refused(cli, tmp_path):
    import pickle

    path = tmp_path / "list.pkl"
    path.write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    out = cli("ingest", str(path))
    assert out.returncode == 3 and "not a CUDA memory snapshot" in out.stderr


def test_every_page_opens_on_a_snapshot_only_job(store, tmp_path, monkeypatch):
    """A job with allocator rows and no GPU activity: per-device memory metrics without a span
    must not reach the GPU-time tables (the overview once failed on them)."""
    import pickle

    import streamlit as st

    from tests.test_pages import page

    st.cache_data.clear()
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    (res,) = ingest_paths(store, [str(path)])
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    for name in ("overview", "memory", "timeline", "kernels", "distributed", "occupancy"):
        at = page(name, job=res.job_id)
        assert not at.exception, name
    assert any("No GPU activity" in w.value for w in page("overview", job=res.job_id).warning)


def test_churn_without_steps_is_low_and_says_what_it_cannot_tell(store, tmp_path):
    t = KinetoTrace(device_props=[H100])
    t.kernel("k", 0, 10_000)
    for i in range(5):  # 5 grow + 5 shrink = 10 reservation changes (the threshold)
        mem_event(t, 1_000 + 4 * i * 1000, 8 * M, i + 1, 8 * M, 24 * M)
        mem_event(t, 3_000 + 4 * i * 1000, -8 * M, i + 1, 0, 4 * M)
    mem_event(t, 0, 0, 99, 0, 4 * M)
    _, result = run(store, tmp_path, t)
    churn = by_key(result)["churn"]
    assert churn.severity == "low" and churn.evidence["reserved_changes"] == 10
    assert "cannot be told" in churn.detail
    _, quiet = run(store, tmp_path, t, {"churn_events_no_steps": 11})
    assert "churn" not in by_key(quiet)


MEMORY_SAMPLES = SAMPLES / "kineto"


def sample_result(store, path):
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    try:
        return job, analyzer.run(job, analyzer.SPEC.params())
    finally:
        job.close()


@pytest.mark.parametrize("name", ["memory_gpt", "memory_gpt_ckpt", "memory_fragment"])
def test_h200_captures_match_torch_peaks(store, name):
    """Kineto traces captured on an H200 (tools/capture/memory_capture.py): the peaks equal
    torch.cuda.max_memory_allocated/reserved over the profiled steps, to the byte."""
    folder = MEMORY_SAMPLES / name
    truth = json.loads((folder / f"{name}.truth.json").read_text())
    _, result = sample_result(store, folder / f"{name}.pt.trace.json.gz")
    values = metrics(result)
    assert values["mem_allocated_peak_bytes"] == truth["max_memory_allocated"]
    assert values["mem_reserved_peak_bytes"] == truth["max_memory_reserved"]
    held = truth["total_memory"] - truth["max_memory_reserved"]
    assert values["mem_headroom_pct"] == round(100 * held / truth["total_memory"], 3)
    found = by_key(result)
    if name == "memory_gpt":  # warm cache, 12.8 % unused: nothing to flag
        assert set(found) == {"summary"}
    if name == "memory_fragment":  # 40 odd sizes, half freed, 80 MiB blocks, empty_cache()
        assert found["fragmentation"].severity == "medium"
        assert found["churn"].severity == "low" and found["churn"].evidence["driver_calls"] > 100


def test_h200_checkpointing_lowers_the_peak(store, tmp_path):
    peaks = {}
    for name in ("memory_gpt", "memory_gpt_ckpt"):
        path = MEMORY_SAMPLES / name / f"{name}.pt.trace.json.gz"
        peaks[name] = metrics(sample_result(store, path)[1])["mem_allocated_peak_bytes"]
    assert peaks["memory_gpt_ckpt"] < 0.75 * peaks["memory_gpt"]  # 1347 vs 1915 MiB


def test_h200_snapshot_ends_in_the_state_torch_reported(store):
    folder = SAMPLES / "memory_snapshot"
    truth = json.loads((folder / "memory_fragment.snapshot.truth.json").read_text())
    job, result = sample_result(store, folder / "memory_fragment.snapshot.pickle.gz")
    job = JobData(store, job.traces)
    try:
        last, low = job.sql(
            "SELECT (SELECT [total_allocated, total_reserved] FROM memory "
            "WHERE action <> 'free_block' ORDER BY seq DESC LIMIT 1), "
            "min(least(total_allocated, total_reserved)) FROM memory"
        ).fetchone()
    finally:
        job.close()
    assert last == [truth["allocated_at_snapshot"], truth["reserved_at_snapshot"]]
    assert low >= 0  # rebuilt backwards from the segments: never below zero
    values = metrics(result)
    # the snapshot's history starts one step before the profiled ones: its peak is at least theirs
    assert values["mem_allocated_peak_bytes"] >= truth["max_memory_allocated_since_reset"]
    assert values["mem_reserved_peak_bytes"] >= truth["max_memory_reserved_since_reset"]
    summary = by_key(result)["summary"]
    assert summary.evidence["largest_free_block_bytes"] > 0
    assert "memory_capture.py" in summary.evidence["live_at_peak"][0]["op"]


def test_innermost_op_lookup_reaches_past_many_finished_siblings():
    import numpy as np

    n = 2000  # more finished siblings than the lookup's first window
    starts = np.array([0, *range(10, 10 + 10 * n, 10), 50_000, 50_000], dtype=np.int64)
    ends = np.array([100_000, *range(15, 15 + 10 * n, 10), 50_100, 50_100], dtype=np.int64)
    names = ["train_step", *["aten::add"] * n, "aten::mm", "aten::empty"]
    index = analyzer._OpIndex({"tid": np.full(starts.size, 7), "start_ns": starts,
                               "end_ns": ends, "name": np.array(names, dtype=object)})  # fmt: skip
    assert index.enclosing(7, 30_000) == "train_step"  # past 2000 finished aten::add
    assert index.enclosing(7, 50_050) == "aten::mm"  # aten::empty is charged to its parent
    lone = analyzer._OpIndex({"tid": np.array([1]), "start_ns": np.array([0]),
                              "end_ns": np.array([10]), "name": np.array(["aten::empty"], dtype=object)})  # fmt: skip
    assert lone.enclosing(1, 5) == "aten::empty"  # nothing else holds it: keep its own name
    assert index.enclosing(7, 12) == "aten::add"
    assert index.enclosing(7, 200_000) == analyzer.OUTSIDE
    assert index.enclosing(8, 12) == analyzer.OUTSIDE


def test_memory_page_on_a_report_without_memory_tables(page_jobs, monkeypatch):
    """A report written before the memory tables: the summaries' text and how to draw the
    timeline, never a crash."""
    from stallscope.pages import memory as memory_page
    from tests.test_pages import page

    real = memory_page.report_for

    def old_report(job_id, traces):
        report = dict(real(job_id, traces))
        tables = dict(report["tables"])
        del tables["memory_devices"], tables["memory_live_at_peak"]
        return {**report, "tables": tables}

    monkeypatch.setattr(memory_page, "report_for", old_report)
    at = page("memory", job=page_jobs["mem"])
    assert not at.exception
    assert any("before the memory tables" in i.value for i in at.info)
    assert "memory peak" in at.subheader[0].value and not at.get("plotly_chart")


@pytest.mark.parametrize("seed", range(6))
def test_counts_within_is_a_mask_per_range(seed):
    """counts_within (one sort, sorted searches) against a mask over every time per range:
    closed ranges, ties on both edges, reversed ranges, unsorted times."""
    rng = np.random.default_rng(seed)
    times = rng.integers(0, 1_000, 400)
    lows = np.r_[rng.integers(-10, 1_000, 40), times[:10]]
    highs = np.r_[lows[:40] + rng.integers(-30, 300, 40), times[10:20]]
    got = analyzer.counts_within(times, lows, highs)
    want = [int(((times >= a) & (times <= b)).sum()) for a, b in zip(lows, highs, strict=True)]
    assert got.tolist() == want
