"""Server-side timeline aggregation: raw events when few, busy-share bins when many."""

from __future__ import annotations

import pytest

from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.timeline import Window, timeline_window, trace_bounds
from tests.kineto_builder import KinetoTrace


@pytest.fixture
def job(store, tmp_path):
    t = KinetoTrace()
    for i in range(5000):  # stream 7: 1 µs kernels every 2 µs over [0, 10 ms): busy half the time
        t.kernel("tiny", 2_000 * i, 1_000, stream=7)
    for i in range(3):  # stream 9: three 1 ms kernels
        t.kernel(f"big{i}", 3_000_000 * i, 1_000_000, stream=9)
    t.cpu_op("aten::mm", 0, 10_000_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    data = JobData(store, store.traces(res.job_id))
    yield data
    data.close()


def test_bounds(job):
    assert trace_bounds(job, job.traces[0].trace_id) == Window(0, 10_000_000)


def test_dense_lane_is_binned_and_sparse_lane_is_raw(job):
    trace = job.traces[0].trace_id
    frame = timeline_window(job, trace, Window(0, 10_000_000), bins=100, max_items_per_lane=1000)
    dense = frame[frame.lane == "GPU 0 · stream 7"]
    assert len(dense) == 100 and set(dense.kind) == {"bin"}
    assert dense.busy.round(6).eq(0.5).all() and dense["count"].sum() == 5000
    sparse = frame[frame.lane == "GPU 0 · stream 9"]
    assert list(sparse.name) == ["big0", "big1", "big2"]
    host = frame[frame.side == "host"]
    assert list(host.name) == ["aten::mm"]


def test_zoomed_window_shows_raw_events(job):
    trace = job.traces[0].trace_id
    frame = timeline_window(job, trace, Window(0, 20_000), bins=100, max_items_per_lane=1000)
    dense = frame[frame.lane == "GPU 0 · stream 7"]
    assert len(dense) == 10 and set(dense.name) == {"tiny"}
