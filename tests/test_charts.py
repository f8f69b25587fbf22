"""Charts draw what the report measured: copies included (a copy-bound GPU is not idle)."""

from __future__ import annotations

import pytest

from stallscope.charts import device_time_table, time_by_cause_figure
from stallscope.ingest import ingest_paths
from stallscope.report import build_report
from tests.test_utilization import hand_trace


def test_copies_with_no_kernel_beside_them_are_drawn(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    report = build_report(store, [store.traces(res.job_id)])
    table = device_time_table(report)
    gpu0 = table[table["device"] == 0].iloc[0]
    # hand_trace: memcpy [60,70) + memset [68,80) µs, no kernel beside them -> 20 µs of copies
    assert gpu0["copy_ms"] == pytest.approx(0.020)
    assert gpu0["compute_ms"] == pytest.approx(0.040)  # [0,30) + [90,100)
    names = [bar.name for bar in time_by_cause_figure(report).data]
    assert "copies (no kernel beside them)" in names


def test_step_stack_parts_sum_to_each_step(store, tmp_path):
    from stallscope.charts import IDLE_CAUSES, step_rows, step_stack_figure

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
