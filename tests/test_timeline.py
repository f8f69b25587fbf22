"""Server-side timeline aggregation: raw events when few, busy-share bins when many."""

from __future__ import annotations

import pandas as pd
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
    dense = frame[frame.lane == "rank 0 · GPU 0 · stream 7"]
    assert len(dense) == 100 and set(dense.kind) == {"bin"}
    assert dense.busy.round(6).eq(0.5).all() and dense["count"].sum() == 5000
    sparse = frame[frame.lane == "rank 0 · GPU 0 · stream 9"]
    assert list(sparse.name) == ["big0", "big1", "big2"]
    host = frame[frame.side == "host"]
    assert list(host.name) == ["aten::mm"]


def test_zoomed_window_shows_raw_events(job):
    trace = job.traces[0].trace_id
    frame = timeline_window(job, trace, Window(0, 20_000), bins=100, max_items_per_lane=1000)
    dense = frame[frame.lane == "rank 0 · GPU 0 · stream 7"]
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


def _event_frame(rows: list[dict]) -> pd.DataFrame:
    """A frame as timeline_window returns it, from a few hand-written events."""
    from stallscope.timeline import COLUMNS

    base = {
        "trace_id": "t", "rank": 0, "side": "gpu", "lane": "rank 0 · GPU 0 · stream 7",
        "key": "", "name": "k", "kind": "kernel", "category": "compute", "busy": 1.0,
        "count": 1, "d": 0, "s": 7, "correlation": None, "external_id": None, "grid": None,
        "block": None, "bytes": None,
    }  # fmt: skip
    frame = pd.DataFrame([{**base, **r} for r in rows])
    return frame[COLUMNS]


def test_bars_are_clipped_to_the_window():
    from stallscope.charts import timeline_figure

    frame = _event_frame([{"start_ns": 0, "end_ns": 5_000_000, "key": "a"}])
    fig = timeline_figure(frame, (2_000_000, 4_000_000))
    bars = [d for d in fig.data if d.mode == "lines"]
    (bar,) = bars
    assert list(bar.x)[:2] == [0.0, 2.0]
    assert list(fig.layout.xaxis.range) == [0, 2.0]


def test_figure_draws_one_webgl_trace_per_category_with_none_separators():
    from stallscope.charts import TIMELINE_COLORS, timeline_figure

    frame = _event_frame([
        {"start_ns": 0, "end_ns": 1_000, "key": "a", "grid": "4×1×1", "block": "128×1×1"},
        {"start_ns": 2_000, "end_ns": 3_000, "key": "b"},
        {"start_ns": 1_000, "end_ns": 2_500, "key": "c", "name": "ncclDevKernel_AllReduce",
         "category": "communication", "s": 17, "lane": "rank 0 · GPU 0 · stream 17"},
        {"start_ns": 0, "end_ns": 4_000, "kind": "bin", "busy": 0.3, "count": 9,
         "name": "9 events", "category": "compute", "lane": "rank 1 · GPU 1 · stream 7"},
    ])  # fmt: skip
    fig = timeline_figure(frame, (0, 4_000))
    lines = {}
    for d in fig.data:  # the first trace of each name: events before bins
        if d.type == "scattergl" and d.mode == "lines":
            lines.setdefault(d.name, d)
    compute = lines["compute kernel"]
    nan = float("nan")
    assert str(compute.x.tolist()) == str([0.0, 0.001, nan, 0.002, 0.003, nan])
    assert str(compute.y.tolist()) == str([0.0, 0.0, nan, 0.0, 0.0, nan])
    comm = lines["communication kernel (NCCL…)"]
    assert comm.line.color == TIMELINE_COLORS["communication"] != compute.line.color
    assert list(comm.y)[:2] == [-1, -1]  # the second lane, below the first
    points = {d.name: d for d in fig.data if d.mode == "markers"}
    hover = points["compute events"].text[0]
    assert "start 0.000 ms · 1.00 µs" in hover and "grid 4×1×1 · block 128×1×1" in hover
    assert all("busy" not in t for d in points.values() for t in d.text)  # single events
    (binned,) = [d for d in fig.data if d.mode == "lines" and d.opacity == 0.5]
    assert "busy 30%" in binned.text[0] and binned.showlegend is False  # compute already listed
    assert list(points["compute events"].customdata) == ["a", "b"]  # clickable; bins are not
    assert list(points["communication events"].customdata) == ["c"]
    # hover points along slices longer than 1/60 of the window: the 1.5 µs NCCL kernel gets
    # 1500 // (4000 / 60) = 22 of them, all naming it
    along = points["communication hover"]
    assert len(along.x) == 22 and set(along.customdata) == {"c"}
    assert min(along.x) > 0.001 and max(along.x) <= 0.0025


def test_labels_only_on_slices_wide_enough_in_pixels():
    from stallscope.timeline import Window, slice_labels

    frame = _event_frame([
        {"start_ns": 0, "end_ns": 50, "name": "void gemm_kernel<float, 128>(float*, int)"},
        {"start_ns": 100, "end_ns": 130, "name": "narrow_kernel"},
        {"start_ns": 200, "end_ns": 1_000, "side": "host", "kind": "cpu_op", "category": "cpu_op",
         "name": "aten::convolution_backward_with_a_very_long_name_that_does_not_fit"},
        {"start_ns": 0, "end_ns": 1_000, "kind": "bin", "name": "99 events"},
    ])  # fmt: skip
    labels = slice_labels(frame, Window(0, 1_000), plot_px=1_000, min_px=40, char_px=5)
    assert labels[0] == "gemm_kern…"  # 50 px: the short name (gemm_kernel<…>), cut to 10 chars
    assert labels[1] == ""  # 30 px: too narrow
    assert labels[2] == frame.name[2]  # 800 px: the whole operator name fits
    assert labels[3] == ""  # bins carry no label
    wider = slice_labels(frame, Window(0, 1_000), plot_px=10_000, min_px=40, char_px=5)
    assert wider[1] == "narrow_kernel"  # 300 px once the chart is 10x wider


def test_time_by_cause_draws_waiting_in_collectives_apart_from_transfer():
    from stallscope.charts import device_time_table, time_by_cause_figure

    def metric(trace, rank, name, value):
        return {"trace": trace, "rank": rank, "device": rank, "name": name, "value": value}

    def gpu(trace, rank, compute_only, under, alone, wait):
        return [
            metric(trace, rank, "gpu_span_ns", 100e6), metric(trace, rank, "compute_only_ns", compute_only),
            metric(trace, rank, "comm_under_compute_ns", under), metric(trace, rank, "comm_only_ns", alone),
            metric(trace, rank, "copy_only_ns", 0), metric(trace, rank, "exposed_comm_wait_ns", wait),
        ]  # fmt: skip

    # rank 0: 90 ms alone in communication, 70 of it waiting (the wait is clipped to it)
    report = {"metrics": gpu("a", 0, 10e6, 0, 90e6, 70e6) + gpu("b", 1, 15e6, 5e6, 0, 3e6)}
    table = device_time_table(report)
    assert table["comm_wait_ms"].tolist() == [70.0, 0.0]
    assert table["comm_transfer_ms"].tolist() == [20.0, 0.0]
    assert table["idle_other_ms"].tolist() == [0.0, 80.0]  # no gpu_idle metrics here
    names = [bar.name for bar in time_by_cause_figure(report).data]
    assert names == [
        "compute only", "communication under compute", "communication alone (exposed)",
        "communication alone: waiting for other ranks", "idle: cause not measured",
    ]  # fmt: skip


@pytest.fixture
def two_ranks(store, tmp_path):
    """Two ranks of one job; rank 1 starts its step 2 ms later. Rank 0 has: a compute kernel
    and an NCCL kernel launched by cudaLaunchKernel under aten::mm, a HtoD copy, a memset,
    a step. Times by hand (ns)."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    r0.step(0, 0, 1_000_000)
    r0.cpu_op("aten::mm", 10_000, 50_000)
    r0.runtime("cudaLaunchKernel", 20_000, 5_000, corr=501)
    r0.runtime("cudaLaunchKernel", 30_000, 5_000, corr=502)
    r0.kernel("void gemm_kernel<float>(float*)", 40_000, 100_000, corr=501, grid=(8, 2, 1))
    r0.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150_000, 200_000, corr=502, stream=9)
    r0.memcpy("HtoD", "Pageable", "Device", 400_000, 10_000, 4096)
    r0.memset(420_000, 1_000, 512)
    r1.step(0, 2_000_000, 1_000_000)
    r1.kernel("void gemm_kernel<float>(float*)", 2_100_000, 100_000, device=1)
    paths = [str(r0.write(tmp_path / "rank0.json")), str(r1.write(tmp_path / "rank1.json"))]
    (res,) = ingest_paths(store, paths)
    data = JobData(store, store.traces(res.job_id))
    yield data
    data.close()


def test_all_ranks_on_one_axis_with_lanes_per_rank(two_ranks):
    from stallscope.timeline import first_step_starts, lane_order

    ids = [r.trace_id for r in two_ranks.traces]
    frame = timeline_window(two_ranks, ids, Window(0, 3_000_000))
    assert lane_order(frame) == [
        "rank 0 · GPU 0 · stream 7", "rank 0 · GPU 0 · stream 9",
        "rank 0 · host 100 · thread 100", "rank 0 · host 100 · thread 100 · 1",
        "rank 0 · host 100 · thread 100 · ranges",
        "rank 1 · GPU 1 · stream 7", "rank 1 · host 100 · thread 100 · ranges",
    ]  # fmt: skip
    rank1 = frame[frame["rank"] == 1]
    assert set(rank1.trace_id) == {ids[1]} and rank1.start_ns.min() == 2_000_000
    assert first_step_starts(two_ranks, ids) == {ids[0]: 0, ids[1]: 2_000_000}


def test_categories_tell_communication_copies_and_calls_apart(two_ranks):
    trace = two_ranks.traces[0].trace_id
    frame = timeline_window(two_ranks, trace, Window(0, 3_000_000)).set_index("name")
    assert frame.loc["void gemm_kernel<float>(float*)", "category"] == "compute"
    assert frame.loc["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "category"] == "communication"
    assert frame.loc["Memcpy HtoD (Pageable -> Device)", "category"] == "memcpy HtoD"
    assert frame.loc["Memcpy HtoD (Pageable -> Device)", "bytes"] == 4096
    assert frame.loc["Memset (Device)", "category"] == "memset"
    assert frame.loc["aten::mm", "category"] == "cpu_op"
    assert set(frame.loc["cudaLaunchKernel", "category"]) == {"runtime"}
    assert frame.loc["ProfilerStep#0", "category"] == "step"
    assert frame.loc["void gemm_kernel<float>(float*)", "grid"] == "8×2×1"


def test_dense_lanes_bin_by_the_category_that_fills_most(store, tmp_path):
    t = KinetoTrace()
    for i in range(30):  # [0, 3 µs) of each 10 µs: compute 2 µs then NCCL 1 µs
        t.kernel("k", 10_000 * i, 2_000)
        t.kernel("ncclDevKernel_Broadcast", 10_000 * i + 2_000, 1_000)
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "d.json"))])
    job = JobData(store, store.traces(res.job_id))
    try:
        frame = timeline_window(job, job.traces[0].trace_id, Window(0, 300_000), bins=30,
                                max_items_per_lane=10)  # fmt: skip
    finally:
        job.close()
    assert set(frame.kind) == {"bin"} and set(frame.category) == {"compute"}
    assert frame.busy.round(6).eq(0.3).all() and frame["count"].sum() == 60


def test_launch_flows_both_ways_and_from_an_operator(two_ranks):
    from stallscope.timeline import event_key, launch_flows

    trace = two_ranks.traces[0].trace_id
    kernel = event_key(trace, "gpu", 0, 7, 40_000)
    (flow,) = launch_flows(two_ranks, kernel).itertuples()
    assert flow.launch_key == event_key(trace, "host", 100, 100, 20_000)
    assert (flow.launch_start_ns, flow.gpu_start_ns) == (20_000, 40_000)
    back = launch_flows(two_ranks, flow.launch_key)
    assert list(back.gpu_key) == [kernel]
    under_op = launch_flows(two_ranks, event_key(trace, "host", 100, 100, 10_000))  # aten::mm
    assert list(under_op.gpu_start_ns) == [40_000, 150_000]
    assert launch_flows(two_ranks, event_key(trace, "gpu", 0, 7, 41)).empty  # no such event
    assert launch_flows(two_ranks, "not a key").empty


def test_search_is_a_case_insensitive_substring_over_window_or_trace(two_ranks):
    from stallscope.timeline import search_events

    ids = [r.trace_id for r in two_ranks.traces]
    found, total = search_events(two_ranks, ids, "GEMM_kernel")
    assert total == 2 and list(found["rank"]) == [0, 1]
    assert list(found.start_ns) == [40_000, 2_100_000]
    found, total = search_events(two_ranks, ids, "gemm", Window(0, 1_000_000))
    assert total == 1 and found.lane[0] == "rank 0 · GPU 0 · stream 7"
    found, total = search_events(two_ranks, ids, "launch", limit=1)
    assert total == 2 and len(found) == 1
    assert search_events(two_ranks, ids, "  ")[1] == 0
    assert search_events(two_ranks, ids, "no such thing")[1] == 0


def test_window_around_an_event_and_default_ranks():
    from stallscope.timeline import default_ranks, window_around

    assert window_around(1_000_000, 1_100_000, Window(0, 10**9)) == Window(800_000, 1_300_000)
    assert window_around(5_000, 5_010, Window(0, 10**9)) == Window(0, 20_000)  # >= 20 µs, inside
    assert window_around(999_990, 1_000_000, Window(0, 1_000_000)) == Window(980_000, 1_000_000)
    assert default_ranks([0, 1, 2], set()) == [0, 1, 2]
    assert default_ranks(list(range(16)), {5, 11, 99}) == [0, 5, 11]
    # many ranks with findings (every rank of a large job waits): rank 0 and the first 7 given
    assert default_ranks(list(range(1024)), [900, 3, 900, 512, *range(100, 200)]) == [
        0,
        3,
        100,
        101,
        102,
        103,
        512,
        900,
    ]


def test_flow_arrow_drawn_from_launch_to_kernel(two_ranks):
    from stallscope.charts import timeline_figure
    from stallscope.timeline import event_key, lane_order, launch_flows

    trace = two_ranks.traces[0].trace_id
    frame = timeline_window(two_ranks, trace, Window(0, 1_000_000))
    lanes = lane_order(frame)
    kernel = event_key(trace, "gpu", 0, 7, 40_000)
    fig = timeline_figure(frame, (0, 1_000_000), lanes=lanes, flows=launch_flows(two_ranks, kernel),
                          selected=kernel)  # fmt: skip
    (arrow,) = fig.layout.annotations
    assert (arrow.ax, arrow.x) == (0.02, 0.04)  # launch start -> kernel start, ms
    assert lanes[-int(arrow.y)] == "rank 0 · GPU 0 · stream 7"
    assert lanes[-int(arrow.ay)].startswith("rank 0 · host 100 · thread 100")
    outlined = [s for s in fig.layout.shapes if s.yref == "y"]
    assert {(s.x0, s.x1) for s in outlined} == {(0.02, 0.025), (0.04, 0.14)}


def test_flow_arrow_to_the_window_edge_when_the_launch_is_outside(two_ranks):
    from stallscope.charts import timeline_figure
    from stallscope.timeline import event_key, lane_order, launch_flows

    trace = two_ranks.traces[0].trace_id
    window = (100_000, 1_000_000)  # the NCCL kernel (150 µs) is in, its launch (30 µs) is not
    frame = timeline_window(two_ranks, trace, Window(*window))
    kernel = event_key(trace, "gpu", 0, 9, 150_000)
    fig = timeline_figure(frame, window, lanes=lane_order(frame),
                          flows=launch_flows(two_ranks, kernel))  # fmt: skip
    (arrow,) = fig.layout.annotations
    assert (arrow.ax, arrow.x) == (0, 0.05) and arrow.text == "cudaLaunchKernel at -0.070 ms"
