"""The memory analyzer's report tables (``memory_devices``, ``memory_live_at_peak``;
stallscope/report_tables/memory.py) on traces built in code and on the memory samples: every
row is the summary finding's evidence (tests/test_report_tables.py for the other tables)."""

from __future__ import annotations

import json

import pytest

from stallscope.ingest import ingest_paths
from stallscope.report import build_report
from stallscope.report_types import decode_report
from stallscope.views import table_of
from tests.kineto_builder import KinetoTrace
from tests.test_report_tables import report_of

M = 1 << 20
MEMORY_ROW_FROM_EVIDENCE = (
    "allocated_peak_bytes",
    "allocated_peak_ns",
    "reserved_peak_bytes",
    "reserved_peak_ns",
    "allocated_at_reserved_peak_bytes",
    "capacity_bytes",
    "largest_free_block_bytes",
    "events",
)


def assert_memory_tables_are_the_evidence(report: dict) -> list[dict]:
    """Each memory summary finding has one ``memory_devices`` row with its evidence's figures and
    ``memory_live_at_peak`` rows equal to its ``live_at_peak``; the rows (returned) have no other."""
    summaries = [f for f in report["findings"] if f["analyzer"] == "memory"]
    summaries = [f for f in summaries if f["evidence"]["key"] == "summary"]
    rows = table_of(report, "memory_devices")
    assert [(r["trace"], r["rank"], r["device"]) for r in rows] == [
        (f["trace"], f["rank"], f["device"]) for f in summaries
    ]
    for f, row in zip(summaries, rows, strict=True):
        e = f["evidence"]
        assert {k: row[k] for k in MEMORY_ROW_FROM_EVIDENCE} == {
            k: e[k] for k in MEMORY_ROW_FROM_EVIDENCE
        }
        live = table_of(report, "memory_live_at_peak", f["trace"], f["device"])
        assert live == e["live_at_peak"]
        deltas, known = e["allocated_from_deltas"], e.get("allocated_known", True)
        assert row["source"] == (
            "segments" if not known else "allocator_deltas" if deltas else "allocator"
        )
    assert len(table_of(report, "memory_live_at_peak")) == sum(
        len(f["evidence"]["live_at_peak"]) for f in summaries
    )
    return rows


def test_memory_tables_by_hand(store, tmp_path):
    from tests.test_memory import churning_trace

    report = report_of(store, tmp_path, churning_trace())
    (trace,) = [t["id"] for t in report["traces"]]
    (row,) = assert_memory_tables_are_the_evidence(report)
    capacity = 85029158912  # the builder's H100
    assert row == {
        "trace": trace,
        "rank": 0,
        "device": 0,
        "source": "allocator",
        "events": 8,
        "allocated_peak_bytes": 300 * M,
        "allocated_peak_ns": 1_700_000_000_000_200_123,
        "reserved_peak_bytes": 320 * M,
        "reserved_peak_ns": 1_700_000_000_000_200_123,
        "allocated_at_reserved_peak_bytes": 300 * M,
        "capacity_bytes": capacity,
        "capacity_source": "devices.total_mem_bytes",
        "headroom_pct": round(100 * (capacity - 320 * M) / capacity, 3),
        "fragmentation_pct": 6.25,
        "largest_free_block_bytes": None,
    }
    assert table_of(report, "memory_live_at_peak", trace, 0) == [
        {"op": "aten::relu", "bytes": 200 * M, "count": 1},
        {"op": "aten::mm", "bytes": 100 * M, "count": 1},
    ]


def test_memory_tables_without_totals(store, tmp_path):
    from tests.test_memory import mem_event

    t = KinetoTrace()
    t.kernel("k", 0, 10_000)
    mem_event(t, 1_000, 10 * M, 1, None, None)
    mem_event(t, 2_000, 30 * M, 2, None, None)
    mem_event(t, 3_000, -10 * M, 1, None, None)
    report = report_of(store, tmp_path, t)
    (row,) = assert_memory_tables_are_the_evidence(report)
    assert (row["source"], row["allocated_peak_bytes"], row["reserved_peak_bytes"]) == (
        "allocator_deltas", 40 * M, None)  # fmt: skip
    assert (row["fragmentation_pct"], row["headroom_pct"], row["capacity_source"]) == (
        None, None, "unknown")  # fmt: skip


def memory_samples() -> list[str]:
    from tests.conftest import SAMPLES

    return [
        *(f"kineto/{n}/{n}.pt.trace.json.gz" for n in ("memory_gpt", "memory_gpt_ckpt")),
        "kineto/memory_fragment/memory_fragment.pt.trace.json.gz",
        "memory_snapshot/memory_fragment.snapshot.pickle.gz",
        *(f"nsys/{n}.sqlite.gz" for n in ("nsys_mem_churn", "nsys_mem_train")),
    ] if SAMPLES.is_dir() else []  # fmt: skip


@pytest.mark.parametrize("sample", memory_samples())
def test_memory_tables_are_the_evidence_on_the_samples(store, sample):
    from tests.conftest import SAMPLES

    (res,) = ingest_paths(store, [str(SAMPLES / sample)])
    report = build_report(store, [store.traces(res.job_id)])
    decode_report(json.dumps(report))
    rows = assert_memory_tables_are_the_evidence(report)
    assert rows, "every memory sample has allocator events"
    kinds = {r["source"] for r in rows}
    if sample.startswith("nsys/"):
        assert kinds == {"segments"} and not table_of(report, "memory_live_at_peak")
        assert all(r["allocated_peak_bytes"] is None for r in rows)
    else:
        assert kinds == {"allocator"} and table_of(report, "memory_live_at_peak")
    if sample.startswith("memory_snapshot/"):
        assert all(r["largest_free_block_bytes"] for r in rows)
