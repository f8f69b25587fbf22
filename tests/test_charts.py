"""Charts draw what the report measured: copies included (a copy-bound GPU is not idle), and
per-GPU parts that never overlap and sum to the GPU's span."""

from __future__ import annotations

import pytest

from stallscope.charts import IDLE_CAUSES, busy_shares, device_time_table, time_by_cause_figure
from stallscope.ingest import ingest_paths
from stallscope.report import build_report
from tests.kineto_builder import KinetoTrace
from tests.test_nccl_wait import ALLREDUCE, meta
from tests.test_utilization import hand_trace

MS = 1_000_000


def test_copies_with_no_kernel_beside_them_are_drawn(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    report = build_report(store, [store.traces(res.job_id)])
    table = device_time_table(report)
    gpu0 = table[table["device"] == 0].iloc[0]
    # hand_trace: memcpy [60,70) + memset [68,80) µs, no kernel beside them -> 20 µs of copies
    assert gpu0["copy_ms"] == pytest.approx(0.020)
    assert gpu0["compute_only_ms"] == pytest.approx(0.035)  # [0,25) + [90,100)
    names = [bar.name for bar in time_by_cause_figure(report).data]
    assert "copies alone (no kernel beside them)" in names


def two_rank_wait() -> list[KinetoTrace]:
    """No steps; in ms. Rank 0 (GPU 0): gemm [0,4), all-reduce [2,10), copy [11,12), gemm
    [13,14): span 14. Rank 1 (GPU 1): gemm [0,9), all-reduce [9,10): span 10. Rank 1 arrives
    at 9, so rank 0 waits [2,9), of which [4,9) = 5 with no compute beside it.

    Rank 0: compute only [0,2) + [13,14) = 3, communication under compute [2,4) = 2,
    communication alone [4,10) = 6 (5 waiting, 1 transfer), copies alone 1, idle [10,11) +
    [12,13) = 2: 3 + 2 + 5 + 1 + 1 + 2 = 14. Rank 1: compute only 9, communication alone 1
    (no waiting: it came last), nothing idle: 10. Busy 12 + 10 of 24 ms = 91.667 %;
    without the 5 ms of waiting 17 of 24 = 70.833 %."""
    r0, r1 = KinetoTrace(rank=0, world_size=2), KinetoTrace(rank=1, world_size=2)
    r0.kernel("gemm", 0, 4 * MS)
    r0.kernel(ALLREDUCE, 2 * MS, 8 * MS, stream=20, extra=meta())
    r0.memcpy("DtoH", "Device", "Pinned", 11 * MS, 1 * MS, 1 << 20)
    r0.kernel("gemm", 13 * MS, 1 * MS)
    r1.kernel("gemm", 0, 9 * MS, device=1)
    r1.kernel(ALLREDUCE, 9 * MS, 1 * MS, device=1, stream=20, extra=meta())
    return [r0, r1]


PARTS = ["compute_only_ms", "comm_under_ms", "comm_wait_ms", "comm_transfer_ms", "copy_ms"]


def test_per_gpu_parts_are_exclusive_and_sum_to_the_span(store, tmp_path):
    paths = [str(t.write(tmp_path / f"rank{t.rank}.json")) for t in two_rank_wait()]
    (res,) = ingest_paths(store, paths)
    report = build_report(store, [store.traces(res.job_id)])
    table = device_time_table(report)
    rank0, rank1 = (table[table["rank"] == r].iloc[0] for r in (0, 1))
    assert [rank0[c] for c in PARTS] == pytest.approx([3, 2, 5, 1, 1])
    assert [rank1[c] for c in PARTS] == pytest.approx([9, 0, 0, 1, 0])
    idle = [f"idle_{c}_ms" for c in IDLE_CAUSES] + ["idle_other_ms"]
    assert rank0[idle].sum() == pytest.approx(2) and rank1[idle].sum() == pytest.approx(0)
    for row in (rank0, rank1):
        assert row[PARTS + idle].sum() == pytest.approx(row["span_ms"], abs=1e-9)
    assert (rank0["span_ms"], rank1["span_ms"]) == (14, 10)
    # the chart stacks exactly these parts: each bar's length is its GPU's span
    bars = time_by_cause_figure(report).data
    assert [sum(bar.x[i] for bar in bars) for i in range(2)] == pytest.approx([14, 10])
    assert "idle: cause not measured" not in [bar.name for bar in bars]
    shares = busy_shares(table)
    assert shares["busy_pct"] == pytest.approx(100 * 22 / 24, abs=1e-3)
    assert shares["busy_no_wait_pct"] == pytest.approx(100 * 17 / 24, abs=1e-3)


def test_busy_without_waiting_only_with_matched_collectives(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    report = build_report(store, [store.traces(res.job_id)])
    assert "busy_no_wait_pct" not in busy_shares(device_time_table(report))  # one rank


def test_step_stack_parts_sum_to_each_step(store, tmp_path):
    from stallscope.charts import step_rows, step_stack_figure

    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    report = build_report(store, [store.traces(res.job_id)])
    rows = step_rows(report)
    assert not rows.empty
    parts = rows["compute_ms"] + rows["exposed_ms"]
    for cause in IDLE_CAUSES:
        parts += rows[f"idle_{cause}_ms"]
    assert parts.to_list() == pytest.approx(rows["window_ms"].to_list(), abs=1e-6)
    # hand_trace step 2 ([40, 100) µs on GPU 0) launched the copies [60,80) and relu [90,100);
    # the gaps [45,60) and [80,90) are its idle time (no host activity: unknown)
    gpu0 = rows[(rows["device"] == 0) & (rows["step"] == 2)].iloc[0]
    assert gpu0["compute_ms"] == pytest.approx(0.010)
    assert gpu0["exposed_ms"] == pytest.approx(0.020)
    assert gpu0["idle_unknown_ms"] == pytest.approx(0.025)
    assert gpu0["window_ms"] == pytest.approx(0.055)
    # step 1 ([10, 40)) launched gemm_b [10,30) and the all-reduce [25,45): 15 µs exposed
    gpu0_1 = rows[(rows["device"] == 0) & (rows["step"] == 1)].iloc[0]
    assert (gpu0_1["compute_ms"], gpu0_1["exposed_ms"]) == pytest.approx((0.020, 0.015))
    assert len(step_stack_figure(rows[rows["device"] == 0]).data) >= 2
