"""Rank cards: the per-rank summary each ingest worker writes for the cross-rank step."""

from __future__ import annotations

import pytest

from stallscope.collectives import gpu_activity
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.rank_card import CARD_FILE, card_rows, collective_summaries, job_cards
from stallscope.rank_triage import screen
from tests.ddp_builder import (
    BUCKETS,
    BWD_NS,
    BWD_PER_BUCKET,
    FWD_KERNELS,
    FWD_NS,
    MS,
    OPT_KERNELS,
    OPT_NS,
    Plan,
    ddp_job,
)

STEPS = 3
COMPUTE_PER_STEP = FWD_KERNELS * FWD_NS + BUCKETS * BWD_PER_BUCKET * BWD_NS + OPT_KERNELS * OPT_NS


@pytest.fixture
def job(tmp_path):
    from stallscope.store import Store

    traces, _ = ddp_job([Plan(), Plan(stall_ns=20 * MS)], steps=STEPS)
    paths = [str(t.write(tmp_path / f"rank{r}.pt.trace.json")) for r, t in enumerate(traces)]
    store = Store(tmp_path / "store").ensure()
    (res,) = ingest_paths(store, paths)
    data = JobData(store, store.traces(res.job_id))
    yield data
    data.close()


def test_ingest_writes_a_card_per_rank_with_the_known_totals(job):
    assert all((ref.path / CARD_FILE).is_file() for ref in job.traces)
    devices = card_rows(job, "device")
    assert sorted(devices["device"].tolist()) == [0, 1]
    # every rank runs the same compute kernels: 95 ms a step, 3 steps
    assert devices["compute_ns"].tolist() == [STEPS * COMPUTE_PER_STEP] * 2
    comm = job.sql(
        "SELECT trace_id, sum(end_ns - start_ns) FROM gpu WHERE is_comm GROUP BY 1"
    ).fetchall()
    by_trace = dict(zip(devices["trace_id"].tolist(), devices["comm_ns"].tolist(), strict=True))
    assert by_trace == {t: int(ns) for t, ns in comm}
    assert not devices["flag"].any()  # no DistributedDataParallel range in these traces
    kernels = card_rows(job, "kernel")
    top = [
        (n, c, t)
        for n, c, t in zip(kernels["name"], kernels["count"], kernels["compute_ns"], strict=True)
    ]
    assert top[0] == (
        "bwd_gemm",
        STEPS * BUCKETS * BWD_PER_BUCKET,
        STEPS * BUCKETS * BWD_PER_BUCKET * BWD_NS,
    )
    assert len(card_rows(job, "step")["step"]) == 2 * STEPS


def test_a_collectives_step_is_its_kernels_step(job):
    coll = card_rows(job, "collective")
    assert coll["step"].tolist() == [
        k for _ in range(2) for k in range(STEPS) for _ in range(BUCKETS)
    ]
    activity = gpu_activity(job)  # the same step as the GPU timeline gives the kernel
    for trace, device, start, step in zip(
        coll["trace_id"], coll["device"], coll["start_ns"], coll["step"], strict=True
    ):
        ops = activity[(trace, int(device))]
        assert int(ops["step"][ops["start_ns"].tolist().index(int(start))]) == int(step)


def test_overlap_summary_and_triage_screen_come_from_the_cards(job):
    summary = collective_summaries(job)
    assert {k: v["ops"] for k, v in summary.items()} == {
        (ref.trace_id, r): {"allreduce": STEPS * BUCKETS} for r, ref in enumerate(job.traces)
    }
    assert all(v["median_bytes"] == 25_000_000 for v in summary.values())  # 6.25 M floats
    metrics = screen(job)
    steps = dict(
        job.sql(
            "SELECT trace_id, median(end_ns - start_ns) FROM ranges WHERE kind = 'step' GROUP BY 1"
        ).fetchall()
    )
    for rank, ref in enumerate(job.traces):
        assert metrics[rank]["step_ms"] == pytest.approx(steps[ref.trace_id] / 1e6)


def test_a_rank_stored_without_a_card_gets_one_on_demand(job):
    before = job_cards(job)
    for ref in job.traces:
        (ref.path / CARD_FILE).unlink()
    fresh = JobData(job.store, job.traces)
    try:
        again = job_cards(fresh)
    finally:
        fresh.close()
    assert sorted(map(repr, again.to_pylist())) == sorted(map(repr, before.to_pylist()))
    assert all((ref.path / CARD_FILE).is_file() for ref in job.traces)  # stored for next time


def test_stored_operations_read_as_the_query_over_every_rank(job):
    from stallscope.collectives import JOB_OPS_SQL, _ops_columns
    from stallscope.rank_card import OPS_FILE, stored_ops

    assert all((ref.path / OPS_FILE).is_file() for ref in job.traces)
    stored = _ops_columns(stored_ops(job))
    queried = _ops_columns(job.con.sql(JOB_OPS_SQL).to_arrow_table())
    assert stored["bounds"].keys() == queried["bounds"].keys()
    for key, (lo, hi) in stored["bounds"].items():
        qlo, qhi = queried["bounds"][key]
        for column in ("stream", "start_ns", "end_ns", "launch_ns", "step", "grid", "is_comm"):
            assert stored[column][lo:hi].tolist() == queried[column][qlo:qhi].tolist()
        names = stored["names"][stored["name_code"][lo:hi]]
        assert names.tolist() == queried["names"][queried["name_code"][qlo:qhi]].tolist()
    (job.traces[0].path / OPS_FILE).unlink()  # one rank without: the query serves the job
    assert stored_ops(job) is None
