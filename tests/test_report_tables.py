"""The report's typed tables (``tables``: stallscope.report_types.Tables), on traces built in
code where every row is known by hand: what the analyzers' measure functions put there,
that it matches the findings' evidence (which stays the user's contract), and that a
report without tables (stored before they existed) is recomputed, never half drawn."""

from __future__ import annotations

import json

import msgspec

from stallscope import compare, report_store
from stallscope.charts import step_rows
from stallscope.ingest import ingest_paths
from stallscope.report import build_report, finding_order
from stallscope.report_types import (
    IDLE_CAUSES,
    IterationRow,
    StepRow,
    Tables,
    decode_report,
)
from stallscope.views import findings_of, table_of, table_places
from tests.kineto_builder import KinetoTrace
from tests.test_inference import prefill_loop
from tests.test_nccl_wait import straggler_job
from tests.test_overlap import hand_trace

MS = 1_000_000
GEMM, ELEMENTWISE = "ampere_sgemm_128x64_tn", "vectorized_elementwise_kernel"


def report_of(store, tmp_path, *traces: KinetoTrace) -> dict:
    paths = [str(t.write(tmp_path / f"t{i}.json")) for i, t in enumerate(traces)]
    results = ingest_paths(store, paths)
    jobs = dict.fromkeys(r.job_id for r in results)
    report = build_report(store, [store.traces(j) for j in jobs])
    decode_report(json.dumps(report))  # strict types: every row as declared
    return report


def training_trace(rank: int = 0, world_size: int = 1, slow_last: bool = False) -> KinetoTrace:
    """Steps 1-5 of 20 ms each (the last 60 ms with ``slow_last``), each: ``aten::mm``
    launching a 10 ms GEMM at +8 ms, then ``aten::add`` launching a 1 ms elementwise
    kernel at +18 ms. Per step: 11 ms of compute, 9 ms idle; kernel time 50 + 5 ms."""
    t = KinetoTrace(rank=rank, world_size=world_size)
    start = 0
    for step in range(1, 6):
        length = 60 * MS if slow_last and step == 5 else 20 * MS
        t.step(step, start, length)
        for name, op, at, dur in ((GEMM, "aten::mm", 8, 10), (ELEMENTWISE, "aten::add", 18, 1)):
            t.cpu_op(op, start + at * MS - 5_000, 20_000)
            corr = t.kernel(name, start + at * MS + 10_000, dur * MS)
            t.runtime("cudaLaunchKernel", start + at * MS, 5_000, corr=corr)
        start += length
    return t


def test_hotspot_tables_by_hand(store, tmp_path):
    report = report_of(store, tmp_path, training_trace())
    (trace,) = [t["id"] for t in report["traces"]]
    assert table_places(report, "kernels") == [(trace, 0, 0)]
    kernels = table_of(report, "kernels", trace, 0)
    assert [(k["name"], k["count"], k["total_ns"]) for k in kernels] == [
        (GEMM, 5, 50 * MS),
        (ELEMENTWISE, 5, 5 * MS),
    ]
    assert kernels[0]["share_pct"] == round(100 * 50 / 55, 3)
    assert kernels[0]["mean_ns"] == kernels[0]["median_ns"] == 10 * MS
    categories = {c["category"]: c["gpu_ns"] for c in table_of(report, "kernel_categories")}
    assert sum(categories.values()) == 55 * MS and categories["gemm"] == 50 * MS
    ops = {
        o["name"]: (o["gpu_ns"], o["kernels"], o["calls"]) for o in table_of(report, "operators")
    }
    assert ops == {"aten::mm": (50 * MS, 5, 5), "aten::add": (5 * MS, 5, 5)}
    # the same rows as the finding's evidence, which stays as it was
    (finding,) = [f for f in report["findings"] if f["analyzer"] == "hotspots"]
    assert finding["evidence"]["top_kernels"] == kernels
    assert finding["evidence"]["top_ops"] == table_of(report, "operators", trace, 0)
    assert finding["evidence"]["categories"] == table_of(report, "kernel_categories", trace, 0)


def test_step_table_by_hand(store, tmp_path):
    report = report_of(store, tmp_path, training_trace())
    steps = table_of(report, "steps")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert {(s["rank"], s["device"]) for s in steps} == {(0, 0)}
    assert all(s["compute_ns"] == s["busy_ns"] == 11 * MS for s in steps)
    assert all(s["comm_ns"] == s["memcpy_ns"] == 0 for s in steps)
    assert all(s["step_ms"] == 20.0 for s in steps)
    # every idle ns of a step is in one cause: the window is busy + idle
    for s in steps:
        assert s["window_ns"] == s["busy_ns"] + sum(s[f"idle_{c}_ns"] for c in IDLE_CAUSES)
    (table,) = [f for f in report["findings"] if f["id"].endswith(":table")
                and f["analyzer"] == "step_breakdown"]  # fmt: skip
    trace = report["traces"][0]["id"]
    assert table["evidence"]["steps"] == [
        {k: v for k, v in s.items() if k not in ("trace", "rank")} for s in steps
    ]
    assert table_of(report, "steps", trace, 0)[0]["step"] == 1


def test_overview_steps_once_each_with_a_jitter_finding(store, tmp_path):
    """The jitter finding carries the steps in its evidence too; the Overview's per-step
    chart reads the table, so each step is one bar, not two stacked."""
    report = report_of(store, tmp_path, training_trace(slow_last=True))
    assert any(f["id"].endswith(":jitter") for f in report["findings"])
    rows = step_rows(report)
    assert rows["step"].tolist() == [1, 2, 3, 4, 5]
    assert rows["compute_ms"].tolist() == [11.0] * 5


def test_ranks_each_have_their_rows(store, tmp_path):
    report = report_of(store, tmp_path, training_trace(0, 2), training_trace(1, 2))
    by_rank = {}
    for name in ("kernels", "steps"):
        for row in table_of(report, name):
            by_rank.setdefault((name, row["rank"]), []).append(row)
    assert {k: len(v) for k, v in by_rank.items()} == {
        ("kernels", 0): 2, ("kernels", 1): 2, ("steps", 0): 5, ("steps", 1): 5,
    }  # fmt: skip


def test_comm_overlap_table_by_hand(store, tmp_path):
    """tests/test_overlap.py's hand trace: comm 25 ms, 40 % hidden, 15 ms exposed, no one to
    wait for; copies 3 ms, 1 ms exposed."""
    report = report_of(store, tmp_path, hand_trace())
    (row,) = table_of(report, "comm_overlap")
    assert (row["rank"], row["device"]) == (0, 0)
    assert (row["comm_ns"], row["comm_overlap_pct"], row["exposed_comm_ns"]) == (
        25 * MS,
        40.0,
        15 * MS,
    )
    assert row["exposed_wait_ns"] == 0
    assert (row["memcpy_ns"], row["exposed_memcpy_ns"]) == (3 * MS, 1 * MS)


def test_nccl_wait_tables_by_hand(store, tmp_path):
    """tests/test_nccl_wait.py's straggler job: rank 0 waits 30 ms per step for rank 1 with
    no compute beside it (90 ms over 3 steps of 245 ms of GPU span); the three tables hold
    the waiting finding's and the summary's numbers."""
    report = report_of(store, tmp_path, *straggler_job())
    trace_of = {t["rank"]: t["id"] for t in report["traces"]}
    (row,) = table_of(report, "rank_waits")
    assert (row["trace"], row["rank"], row["device"]) == (trace_of[0], 0, 0)
    assert (row["straggler_rank"], row["waited_ns"], row["exposed_wait_ns"]) == (
        1,
        90 * MS,
        90 * MS,
    )
    (waiting,) = [f for f in findings_of(report, "nccl_wait") if f["severity"] != "info"]
    ev = waiting["evidence"]
    assert row == {
        "trace": waiting["trace"],
        "rank": 0,
        "device": 0,
        "straggler_rank": ev["straggler_rank"],
        "waited_ns": ev["nccl_wait_ns"],
        "exposed_wait_ns": ev["exposed_wait_ns"],
        "share_of_span_pct": ev["share_of_span_pct"],
        "wait_outside_capture_ns": ev["wait_outside_capture_ns"],
        "saving_ns": waiting["saving_ns"],
    }
    assert row["exposed_wait_ns"] == waiting["impact_ns"]
    # the summary's ops and critical path, as rows of the summary's place
    (summary,) = findings_of(report, "nccl_wait", key="collectives")
    place = (summary["trace"], summary["rank"], None)
    assert (
        table_places(report, "collective_ops") == table_places(report, "critical_path") == [place]
    )
    (op,) = table_of(report, "collective_ops", summary["trace"], None)
    assert op == summary["evidence"]["ops"][0]
    assert (op["count"], op["median_bytes"], op["median_busbw_gbps"]) == (3, 4_000_000, 0.8)
    path = table_of(report, "critical_path", summary["trace"], None)
    assert path == summary["evidence"]["critical_path"] and [s["step"] for s in path] == [0, 1, 2]
    # compare names the straggler from the table; a report without it names none
    assert compare._stragglers(table_of(report, "rank_waits")) == [1]
    old = {k: v for k, v in report.items() if k != "tables"}
    assert compare._stragglers(table_of(old, "rank_waits")) == []
    assert table_of({**report, "tables": {"steps": []}}, "critical_path") == []


def test_iteration_table_by_hand(store, tmp_path):
    """tests/test_inference.py's prefill loop: 10 decode iterations and one prefill; decode
    periods 8 x 1.2 ms and one 10.2 ms (the prefill between)."""
    report = report_of(store, tmp_path, prefill_loop())
    rows = table_of(report, "iterations")
    assert [r["phase"] for r in rows].count("decode") == 10
    assert [r["phase"] for r in rows].count("prefill") == 1
    periods = sorted(r["period_ns"] for r in rows if "period_ns" in r)
    assert periods == [1_200_000] * 8 + [10_200_000]
    assert all("period_ns" not in r for r in rows if r["phase"] == "prefill")  # omitted, not null
    (finding,) = [f for f in report["findings"] if f["id"].endswith(":iterations")]
    assert finding["evidence"]["iterations"] == table_of(report, "iterations", rows[0]["trace"], 0)


def test_occupancy_table_matches_the_evidence(store):
    from tests.conftest import SAMPLES

    results = ingest_paths(store, [str(SAMPLES / "kineto" / "occupancy")])
    report = build_report(store, [store.traces(results[0].job_id)])
    (finding,) = [f for f in report["findings"] if f["id"].endswith(":table")
                  and f["analyzer"] == "occupancy"]  # fmt: skip
    rows = table_of(report, "occupancy", finding["trace"], finding["device"])
    evidence = finding["evidence"]["kernels"]
    assert len(rows) == len(evidence) > 0
    for row, ev in zip(rows, evidence, strict=True):
        assert {k: row[k] for k in ("kernel", "launches", "gpu_ns", "block", "grid")} == {
            k: ev[k] for k in ("kernel", "launches", "gpu_ns", "block", "grid")
        }
        assert row["theoretical_occupancy_pct"] == ev["theoretical_occupancy_pct"]
        assert row["ncu_bound"] is None  # no Nsight Compute profile ingested


def test_a_report_without_tables_has_no_rows_and_is_not_reused(store, tmp_path):
    report = report_of(store, tmp_path, training_trace())
    old = {k: v for k, v in report.items() if k != "tables"}
    assert table_of(old, "kernels") == [] and step_rows(old).empty
    assert decode_report(json.dumps(old)).tables == Tables()  # /1 before tables still decodes
    refs = store.traces(report["traces"][0]["job"])
    key = report_store.report_key([r.trace_id for r in refs])
    assert report_store.save(store, refs[0].job_id, key, old)
    assert report_store.load(store, refs[0].job_id, key) is None  # recomputed, not half drawn
    again = build_report(store, [refs], reuse=True)
    assert again["tables"] == report["tables"]


def test_row_columns_follow_the_cause_lists():
    from stallscope import charts, compare, idle
    from stallscope.decode_periods import IDLE_CAUSES as DECODE_CAUSES

    assert charts.IDLE_CAUSES is compare.IDLE_CAUSES is idle.CAUSES is IDLE_CAUSES
    assert {f"idle_{c}_ns" for c in IDLE_CAUSES} <= set(StepRow.__struct_fields__)
    assert {f"idle_{c}_ns" for c in DECODE_CAUSES} <= set(IterationRow.__struct_fields__)


def test_one_finding_order_for_entries_and_json(store, tmp_path):
    report = report_of(store, tmp_path, training_trace(slow_last=True))
    entries = decode_report(json.dumps(report)).findings
    assert [f["id"] for f in report["findings"]] == [
        f.id for f in sorted(entries, key=finding_order)
    ]
    dicts = [msgspec.to_builtins(f) for f in reversed(entries)]
    assert [f["id"] for f in sorted(dicts, key=finding_order)] == [
        f["id"] for f in report["findings"]
    ]
