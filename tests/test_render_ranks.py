"""Text, Markdown and HTML reports of many ranks, on report dicts built here (no ingest):
metrics as distributions, findings grouped, the HTML chart narrowed to the idlest GPUs."""

from __future__ import annotations

from stallscope.render import CHART_GPUS_MAX, TABLE_ROWS_MAX, render

MS = 1_000_000


def report_of(ranks: int) -> dict:
    """``ranks`` one-GPU ranks: rank r busy (50 + r % 40) %, rank 7 idle 95 %; each rank waits
    10 ms in collectives for rank 7 (rank 3: 40 ms); every rank a 0-impact hotspot fact."""
    traces = [{"id": f"t{r:03d}", "name": f"rank{r}.json", "job": "j", "rank": r,
               "source": "kineto", "warnings": []} for r in range(ranks)]  # fmt: skip
    metrics, findings = [], []
    for r in range(ranks):
        busy = 5.0 if r == 7 else 50.0 + r % 40
        for name, value, unit in (
            ("gpu_busy_pct", busy, "%"), ("gpu_idle_pct", 100 - busy, "%"),
            ("compute_pct", busy, "%"), ("comm_pct", 1.0, "%"), ("memcpy_pct", 0.0, "%"),
            ("kernel_count", 100 + r, "count"), ("gpu_span_ns", 100 * MS, "ns"),
        ):  # fmt: skip
            metrics.append({"trace": f"t{r:03d}", "rank": r, "device": 0, "name": name,
                            "value": value, "unit": unit})  # fmt: skip
        metrics.append({"trace": f"t{r:03d}", "rank": r, "device": None,
                        "name": "step_time_ms_median", "value": 60.0 + r, "unit": "ms"})  # fmt: skip
        base = {"trace": f"t{r:03d}", "rank": r, "device": 0, "detail": "d", "recommendation": "f",
                "saving_ns": None, "windows": []}  # fmt: skip
        if r != 7:
            findings.append(base | {"id": f"nccl_wait:t{r:03d}:0", "analyzer": "nccl_wait",
                "severity": "high", "title": f"Rank {r} waited for rank 7",
                "impact_ns": (40 if r == 3 else 10) * MS, "evidence": {"straggler_rank": 7}})  # fmt: skip
        findings.append(base | {"id": f"hotspots:t{r:03d}:0", "analyzer": "hotspots",
            "severity": "info", "title": f"GPU 0 time (rank {r})", "impact_ns": 0, "evidence": {}})  # fmt: skip
    return {"schema": "stallscope.report/1", "traces": traces, "metrics": metrics,
            "findings": findings}  # fmt: skip


def test_metrics_of_many_gpus_are_distributions_naming_the_extremes():
    text = render(report_of(100), "text")
    lines = text.splitlines()
    assert lines[0] == "stallscope report (100 traces, 199 findings in 2 entries)"
    assert "Headline metrics of 100 GPUs in 100 traces (ranks)" in lines[2]
    header = lines[3].split()
    assert header == ["metric", "GPUs", "min", "at", "median", "p99", "max", "at"]
    busy = lines[5].split()
    # busy: 50 + r % 40 except rank 7 (5 %); max 89 first at rank 39. Sorted: the 5, then
    # 50-65 three times each (57 twice: rank 7's) = 48 values, then 66 at the 49th-51st: the median
    assert busy[:7] == ["busy", "%", "100", "5.00", "rank", "7", "66.0"] and busy[-3:] == [
        "89.0",
        "rank",
        "39",
    ]
    step = next(line for line in lines if line.startswith("step ms")).split()
    assert step[3:7] == ["100", "60.0", "rank", "0"] and step[-3:] == ["159.0", "rank", "99"]
    assert len(lines) < 30


def test_findings_are_one_entry_per_kind_with_the_spread_and_outliers():
    text = render(report_of(100), "text")
    assert (
        "[HIGH] Rank 3 waited for rank 7  (nccl_wait; trace t003 rank 3 gpu 0; 40.00 ms lost)"
        in text
    )
    assert (
        "    Same finding on 99 ranks (0-6, 8-99): ms lost per rank min 10.00, median 10.00, "
        "p99 40.00, max 40.00; outliers: rank 3 (40.00 ms)." in text  # p99 of 99: the 99th
    )
    assert "[INFO] GPU 0 time (rank 0)" in text  # zero-impact facts: the lowest rank leads
    markdown = render(report_of(100), "markdown")
    assert "### Findings (199 in 2 entries)" in markdown
    assert "  - Same finding on 99 ranks (0-6, 8-99)" in markdown


def test_few_gpus_keep_one_row_each():
    lines = render(report_of(TABLE_ROWS_MAX), "text").splitlines()
    assert lines[2].split()[:4] == ["trace", "name", "rank", "gpu"]
    assert sum(line.startswith("t00") for line in lines) == TABLE_ROWS_MAX


def test_html_groups_and_charts_the_idlest_gpus():
    page = render(report_of(100), "html")
    assert "199 finding(s) in 2 entries" in page and "<h2>Findings (199 in 2 entries)</h2>" in page
    assert page.count('<td class="sev ') == 2
    assert f"GPU time by cause: the {CHART_GPUS_MAX} idlest of 100 GPUs" in page
    assert '"rank 7, GPU 0"' in page and '"rank 39, GPU 0"' not in page  # 39 is the busiest
