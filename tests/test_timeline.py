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


def test_nested_host_ranges_get_a_sub_lane_per_depth():
    import pandas as pd

    from stallscope.timeline import MAX_DEPTH, nest_lanes

    lane = "host 1 · thread 1 · ranges"
    spans = [(0, 100), (10, 40), (20, 30), (22, 24), (23, 24), (50, 60), (200, 210)]
    events = pd.DataFrame(
        {"lane": lane, "start_ns": [a for a, _ in spans], "end_ns": [b for _, b in spans]}
    )
    lanes = nest_lanes(events)["lane"].tolist()
    depth = [0, 1, 2, 3, MAX_DEPTH, 1, 0]  # [23,24) is 4 deep: drawn on the last sub-lane
    assert lanes == [lane if d == 0 else f"{lane} · {d}" for d in depth]


def test_the_timeline_opens_on_the_steps(store, tmp_path):
    from stallscope.timeline import default_window

    t = KinetoTrace()
    t.kernel("setup", 0, 1_000_000)
    t.step(0, 5_000_000, 2_000_000)
    t.step(1, 7_000_000, 3_000_000)
    t.kernel("work", 6_000_000, 1_000_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "s.json"))])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    try:
        assert default_window(job, trace) == Window(5_000_000, 10_000_000)
        assert trace_bounds(job, trace).start_ns == 0
    finally:
        job.close()


def test_bars_are_clipped_to_the_window():
    import pandas as pd

    from stallscope.charts import timeline_figure

    frame = pd.DataFrame(
        {"side": "gpu", "lane": "GPU 0 · stream 7", "start_ns": [0], "end_ns": [5_000_000],
         "name": "k", "kind": "kernel", "busy": 1.0, "count": 1}
    )  # fmt: skip
    fig = timeline_figure(frame, (2_000_000, 4_000_000))
    (bar,) = fig.data
    assert list(bar.base) == [0.0] and list(bar.x) == [2.0]
    assert list(fig.layout.xaxis.range) == [0, 2.0]


def test_time_by_cause_draws_waiting_in_collectives_apart_from_transfer():
    from stallscope.charts import device_time_table, time_by_cause_figure

    def metric(trace, rank, name, value):
        return {"trace": trace, "rank": rank, "device": rank, "name": name, "value": value}

    report = {
        "metrics": [
            metric("a", 0, "gpu_span_ns", 100e6), metric("a", 0, "comm_pct", 90.0),
            metric("a", 0, "compute_pct", 10.0), metric("a", 0, "nccl_wait_ns", 70e6),
            metric("b", 1, "gpu_span_ns", 100e6), metric("b", 1, "comm_pct", 5.0),
            metric("b", 1, "compute_pct", 20.0), metric("b", 1, "nccl_wait_ns", 0),
        ]
    }  # fmt: skip
    table = device_time_table(report)
    assert table["comm_wait_ms"].tolist() == [70.0, 0.0]
    assert table["comm_transfer_ms"].tolist() == [20.0, 5.0]
    names = [bar.name for bar in time_by_cause_figure(report).data]
    assert names[:3] == ["compute", "communication", "communication: waiting for other ranks"]
