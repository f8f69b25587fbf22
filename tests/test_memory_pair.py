"""A Kineto trace and its CUDA memory snapshot given together: one job, the snapshot paired
with the trace's rank, the memory analyzer reading both (docs/analyzers/memory.md#paired)."""

from __future__ import annotations

import json
import pickle

import pytest

from stallscope.analyzers import memory as analyzer
from stallscope.errors import InputError
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import SAMPLES
from tests.kineto_builder import H100, KinetoTrace
from tests.test_bad_input import _snapshot as store_files
from tests.test_memory import M, by_key, frames, mem_event, metrics

BASE = 1_700_000_000_000_000_000  # the trace's epoch ns (ts written as epoch µs, no base)


def trace(rank: int | None = None, device: int = 0, world: int | None = None) -> KinetoTrace:
    """Allocated peaks at 64 MiB at t=2 µs (inside aten::mm), reserved 128 MiB: 50 % unused;
    the last allocator event at t=8 µs."""
    t = KinetoTrace(rank=rank, world_size=world, base_ns=BASE, device_props=[H100 | {"id": device}])
    t.kernel("k", 0, 10_000, device=device)
    t.cpu_op("aten::mm", 1_000, 5_000)
    mem_event(t, 2_000, 64 * M, 0xA000, 64 * M, 128 * M, device=device)
    mem_event(t, 8_000, -64 * M, 0xA000, 0, 128 * M, device=device)
    return t


SEG_A, SEG_B = 0x7F0000000000, 0x7F0010000000


def snap(device: int = 0, at_us: int | None = (BASE + 20_000) // 1000) -> dict:
    """A snapshot whose 8 events are 1 µs apart from ``at_us`` (None: the same events at
    10..17 µs, no epoch clock). When taken: segments 96 MiB, 16 MiB allocated by
    ``forward (train.py:10)``, so 83.333 % free; free blocks 48, 20 and 12 MiB."""
    start = 10 if at_us is None else at_us
    entries = [
        ("segment_alloc", SEG_A, 64 * M, None), ("alloc", SEG_A, 16 * M, ("forward", "train.py:10")),
        ("alloc", SEG_A + 16 * M, 40 * M, ("attention", "model.py:20")),
        ("segment_alloc", SEG_B, 32 * M, None), ("alloc", SEG_B, 20 * M, ("mlp", "model.py:30")),
        ("free_requested", SEG_B, 20 * M, None), ("free_completed", SEG_B, 20 * M, None),
        ("free_completed", SEG_A + 16 * M, 40 * M, None),
    ]  # fmt: skip
    trace_ = [
        {"action": a, "addr": addr, "size": size, "time_us": start + i}
        | ({"frames": frames(*where)} if where else {})
        for i, (a, addr, size, where) in enumerate(entries)
    ]
    segments = [
        {"device": device, "address": SEG_A, "total_size": 64 * M, "allocated_size": 16 * M,
         "blocks": [{"address": SEG_A, "size": 16 * M, "state": "active_allocated"},
                    {"address": SEG_A + 16 * M, "size": 48 * M, "state": "inactive"}]},
        {"device": device, "address": SEG_B, "total_size": 32 * M, "allocated_size": 0,
         "blocks": [{"address": SEG_B, "size": 20 * M, "state": "inactive"},
                    {"address": SEG_B + 20 * M, "size": 12 * M, "state": "inactive"}]},
    ]  # fmt: skip
    traces = [[] for _ in range(device)] + [trace_]
    return {"segments": segments, "device_traces": traces, "allocator_settings": {}}


def write_snap(path, **kw):
    path.write_bytes(pickle.dumps(snap(**kw)))
    return path


def analyze(store, job_id: str):
    job = JobData(store, store.traces(job_id))
    try:
        return job, analyzer.run(job, analyzer.SPEC.params())
    finally:
        job.close()


def test_trace_and_snapshot_are_one_job_and_the_memory_analysis_reads_both(store, tmp_path):
    (tmp_path / "alone").mkdir()
    (alone,) = ingest_paths(store, [str(trace().write(tmp_path / "alone" / "t.json"))])
    _, only_trace = analyze(store, alone.job_id)
    folder = tmp_path / "run"
    folder.mkdir()
    trace().write(folder / "t.json")
    write_snap(folder / "snapshot.pickle")
    (res,) = ingest_paths(store, [str(folder)])  # one folder holding both
    refs = store.traces(res.job_id)
    assert sorted((r.meta["source"], r.meta["rank"]) for r in refs) == [
        ("kineto", 0),
        ("memory-snapshot", 0),
    ]
    assert store.job(res.job_id)["world_size"] == 1
    timeline = next(r.trace_id for r in refs if r.meta["source"] == "kineto")
    snapshot = next(r.trace_id for r in refs if r.meta["source"] == "memory-snapshot")
    _, result = analyze(store, res.job_id)
    # the peaks, fragmentation and headroom are the trace's, as without the snapshot
    assert metrics(result) == metrics(only_trace)
    assert metrics(result)["mem_fragmentation_pct"] == 50.0
    (row,) = result.tables.memory_devices
    assert (row.trace, row.rank, row.device, row.source) == (timeline, 0, 0, "allocator")
    assert (row.allocated_peak_bytes, row.reserved_peak_bytes) == (64 * M, 128 * M)
    assert row.snapshot_trace == snapshot
    assert row.snapshot_ns == BASE + 27_000  # its last event, on the trace's clock
    assert (row.snapshot_reserved_bytes, row.snapshot_allocated_bytes) == (96 * M, 16 * M)
    assert row.snapshot_fragmentation_pct == 83.333
    assert row.largest_free_block_bytes == 48 * M
    assert [(r.op, r.bytes, r.count) for r in result.tables.memory_live_at_peak] == [
        ("aten::mm", 64 * M, 1)
    ]
    assert [(r.trace, r.op, r.bytes, r.count) for r in result.tables.memory_live_at_snapshot] == [
        (timeline, "forward (train.py:10)", 16 * M, 1)
    ]
    found = by_key(result)
    summaries = [f for f in result.findings if f.evidence["key"] == "summary"]
    assert len(summaries) == 1  # one device, one summary: the snapshot is not a second device
    summary = found["summary"]
    assert summary.evidence["snapshot"]["after_trace_ns"] == 19_000
    assert summary.evidence["snapshot"]["free_blocks"] == 3
    assert "snapshot.pickle (its last event 0.019 ms after this trace's last allocator" in (
        summary.detail
    )
    assert "96.0 MiB, 16.0 MiB of it allocated (83.3% free" in summary.detail
    assert "peaks, headroom and churn are from this trace" in summary.detail
    frag = found["fragmentation"]
    assert "83.3% of its 96.0 MiB of segments was free, the largest free block 48.0 MiB" in (
        frag.detail
    )
    assert frag.evidence["largest_free_block_bytes"] == 48 * M


def test_two_paths_give_the_same_job_as_the_folder(store, tmp_path):
    a = trace().write(tmp_path / "t.json")
    b = write_snap(tmp_path / "snapshot.pickle")
    (res,) = ingest_paths(store, [str(b), str(a)])
    assert {r.meta["rank"] for r in store.traces(res.job_id)} == {0}
    _, result = analyze(store, res.job_id)
    assert result.tables.memory_devices[0].snapshot_allocated_bytes == 16 * M


def test_a_snapshot_off_the_trace_clock_is_not_placed_on_it(store, tmp_path):
    a = trace().write(tmp_path / "t.json")
    b = write_snap(tmp_path / "snapshot.pickle", at_us=None)  # 10 µs after 1970: no clock
    (res,) = ingest_paths(store, [str(a), str(b)])
    _, result = analyze(store, res.job_id)
    (row,) = result.tables.memory_devices
    assert row.snapshot_ns is None and row.snapshot_reserved_bytes == 96 * M
    assert "its times cannot be placed on this trace's clock" in by_key(result)["summary"].detail


def two_ranks(tmp_path, devices=(0, 0)) -> list[str]:
    return [
        str(trace(rank=r, device=d, world=2).write(tmp_path / f"r{r}.json"))
        for r, d in enumerate(devices)
    ]


def test_the_rank_in_the_snapshot_name_picks_its_trace(store, tmp_path):
    snap_path = write_snap(tmp_path / "rank1.snapshot.pickle")
    (res,) = ingest_paths(store, [*two_ranks(tmp_path), str(snap_path)])
    refs = store.traces(res.job_id)
    assert store.job(res.job_id)["world_size"] == 2
    snapshot = next(r for r in refs if r.meta["source"] == "memory-snapshot")
    assert snapshot.meta["rank"] == 1
    _, result = analyze(store, res.job_id)
    rows = {r.rank: r for r in result.tables.memory_devices}
    assert set(rows) == {0, 1}
    assert rows[0].snapshot_trace is None and rows[1].snapshot_trace == snapshot.trace_id


def test_the_snapshot_device_picks_the_rank_that_ran_on_it(store, tmp_path):
    snap_path = write_snap(tmp_path / "snapshot.pickle", device=1)
    (res,) = ingest_paths(store, [*two_ranks(tmp_path, devices=(0, 1)), str(snap_path)])
    snapshot = next(r for r in store.traces(res.job_id) if r.meta["source"] == "memory-snapshot")
    assert snapshot.meta["rank"] == 1


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("snapshot.pickle", "cannot tell which rank this memory snapshot belongs to (the job has "
         "ranks 0, 1, and its GPUs do not tell): put the rank in its file name, e.g. rank1"),
        ("rank5.pickle", "the file name says rank 5, but the job's traces are of ranks 0, 1"),
    ],
)  # fmt: skip
def test_a_snapshot_whose_rank_cannot_be_told_is_refused_and_nothing_written(
    store, tmp_path, name, message
):
    paths = [*two_ranks(tmp_path), str(write_snap(tmp_path / name))]
    before = store_files(store.root)
    with pytest.raises(InputError, match="memory snapshot|rank 5") as err:
        ingest_paths(store, paths)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert store_files(store.root) == before


def test_two_snapshots_of_one_rank_are_refused(store, tmp_path):
    a = trace().write(tmp_path / "t.json")
    b, c = write_snap(tmp_path / "one.pickle"), tmp_path / "two.pickle"
    c.write_bytes(pickle.dumps(snap() | {"allocator_settings": {"other": 1}}))  # not the same file
    before = store_files(store.root)
    with pytest.raises(InputError, match="rank 0 is also claimed by"):
        ingest_paths(store, [str(a), str(b), str(c)])
    assert store_files(store.root) == before


def test_the_cli_says_it_in_one_line_with_exit_3(cli, tmp_path):
    paths = [*two_ranks(tmp_path), str(write_snap(tmp_path / "snapshot.pickle"))]
    out = cli("ingest", *paths)
    assert out.returncode == 3, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "put the rank in its file name" in out.stderr
    assert not (tmp_path / "store" / "jobs").is_dir() or not any(
        (tmp_path / "store" / "jobs").iterdir()
    )


SNAP = SAMPLES / "memory_snapshot" / "memory_fragment.snapshot.pickle.gz"
TRACE = SAMPLES / "kineto" / "memory_fragment" / "memory_fragment.pt.trace.json.gz"


def test_the_h200_fragment_trace_with_the_snapshot_of_the_same_run(store):
    """tools/capture/memory_capture.py recorded both in one process: the profiled steps
    (Kineto) and, from one step before them to 4 big and 20 small blocks left live, the
    snapshot. The trace's figures stay the trace's; the snapshot's state is torch's."""
    truth = json.loads((SNAP.parent / "memory_fragment.snapshot.truth.json").read_text())
    trace_truth = json.loads((TRACE.parent / "memory_fragment.truth.json").read_text())
    (res,) = ingest_paths(store, [str(TRACE), str(SNAP)])
    _, result = analyze(store, res.job_id)
    values = metrics(result)
    assert values["mem_allocated_peak_bytes"] == trace_truth["max_memory_allocated"]
    assert values["mem_reserved_peak_bytes"] == trace_truth["max_memory_reserved"]
    (row,) = result.tables.memory_devices
    assert row.snapshot_reserved_bytes == truth["reserved_at_snapshot"]
    assert row.snapshot_allocated_bytes == truth["allocated_at_snapshot"]
    # baseTimeNanoseconds lines the clocks up: the dump came after the profiler stopped
    after = by_key(result)["summary"].evidence["snapshot"]["after_trace_ns"]
    assert 0 < after < 100_000_000
    live = {r.op.split(" ←")[0]: (r.bytes, r.count) for r in result.tables.memory_live_at_snapshot}
    assert live["fragment (memory_capture.py:118)"] == (4 * 80 * M, 4)  # the 4 big blocks
    assert live["fragment (memory_capture.py:116)"][1] == 20  # every other of 40 small ones
    assert sum(b for b, _ in live.values()) == truth["allocated_at_snapshot"]


def test_every_page_opens_on_a_paired_job(store, tmp_path, monkeypatch):
    import streamlit as st

    from tests.test_pages import page

    st.cache_data.clear()
    (res,) = ingest_paths(
        store, [str(trace().write(tmp_path / "t.json")), str(write_snap(tmp_path / "s.pickle"))]
    )
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    for name in ("overview", "memory", "timeline", "kernels", "distributed", "occupancy"):
        at = page(name, job=res.job_id)
        assert not at.exception, name
    memory = page("memory", job=res.job_id)
    assert any("Live when the memory snapshot was taken" in m.value for m in memory.markdown)
    assert len(memory.subheader) == 1  # one device, not one per trace


def test_speak_writes_the_findings_from_the_measurement_alone():
    """No job, no store: a hand-made measurement gives the findings its numbers call for."""
    from stallscope.analyzers.base import Where

    m = analyzer.DeviceMeasure(
        where=Where("t", 0, 0), source="allocator", events=4, first_ns=0, last_ns=9_000,
        peaks=analyzer.Peaks(60 * M, 2_000, 1, 100 * M, 1_000, 60 * M, 40.0),
        capacity_bytes=102 * M, capacity_source="devices.total_mem_bytes", held_bytes=100 * M,
        headroom_pct=1.961, window=[2_000, 3_000], live_at_peak=[{"op": "aten::mm", "bytes": 60 * M, "count": 1}],
        largest_free_block=None, driver_frees=0, steps=[], whole={"reserved_changes": 3, "driver_calls": 0},
    )  # fmt: skip
    found = {f.evidence["key"]: f for f in analyzer.speak(m, analyzer.SPEC.params())}
    assert list(found) == ["summary", "headroom", "fragmentation"]  # 3 changes: no churn
    assert found["headroom"].title == "GPU 0 has 2.0% memory headroom"
    assert "no segment map" in found["fragmentation"].detail
    assert [(r.op, r.bytes) for r in analyzer.live_rows(m)] == [("aten::mm", 60 * M)]
    assert analyzer.device_row(m).snapshot_trace is None
    names = [x.name for x in analyzer.metrics(m)]
    assert names == ["mem_allocated_peak_bytes", "mem_reserved_peak_bytes",
                     "mem_fragmentation_pct", "mem_headroom_pct"]  # fmt: skip


def test_the_paired_sample_job_is_consistent(tmp_path):
    """The memory_fragment trace with the snapshot of the same process, as one job, passes the
    checks every sample job passes (tests/test_consistency.py)."""
    from stallscope.report import analyze_job
    from stallscope.store import Store
    from tests.test_consistency import SAMPLE_JOBS, _check_job

    store = Store(tmp_path / "store").ensure()
    files = [*SAMPLE_JOBS["kineto/memory_fragment"],
             SAMPLES / "memory_snapshot" / "memory_fragment.snapshot.pickle.gz"]  # fmt: skip
    (res,) = ingest_paths(store, [str(p) for p in files])
    job = JobData(store, store.traces(res.job_id))
    try:
        _check_job(job, analyze_job(job).findings)
    finally:
        job.close()


def test_sniff_names_a_pickle_a_memory_snapshot():
    from stallscope.ingest.sniff import sniff

    assert sniff("s.pickle", b"\x80\x04\x95") == "memory-snapshot"
