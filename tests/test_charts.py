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
