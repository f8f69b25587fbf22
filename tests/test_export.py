"""stallscope export --perfetto: Chrome trace JSON that loads, counts right and ingests back the same."""

from __future__ import annotations

import gzip
import io
import json

import pytest

from stallscope import perfetto
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace

MS = 1_000_000


@pytest.fixture
def trace_file(tmp_path):
    """3 kernels (busy 30 of 100 ms, odd ns to test exact µs), a memcpy, a runtime call and a step."""
    t = KinetoTrace(rank=0, world_size=1, base_ns=1_700_000_000_000_000_123)
    t.step(1, 0, 100 * MS)
    for start, dur, name, stream in (
        (1, 10 * MS - 1, "gemm<float>", 7),
        (50 * MS, 10 * MS, 'odd "name" \\ kernel', 9),
        (90 * MS, 10 * MS, "c", 7),
    ):
        t.runtime(
            "cudaLaunchKernel",
            start - 1 if start else 0,
            1,
            corr=t.kernel(name, start, dur, stream=stream),
        )
    t.memcpy("HtoD", "Pageable", "Device", 20 * MS, 1_001, 4096)
    return t.write(tmp_path / "t.pt.trace.json")


def gpu_summary(report):
    metrics = {(m["device"], m["name"]): m["value"] for m in report["metrics"]}
    return report["traces"][0]["kernel_count"], metrics[(0, "gpu_busy_pct")]


def test_export_loads_counts_and_round_trips(cli, trace_file, tmp_path):
    out = tmp_path / "out.json"
    done = cli("export", str(trace_file), "--perfetto", str(out))
    assert done.returncode == 0, done.stderr
    assert ": 4 GPU and 4 host events, 3 launch flows" in done.stdout
    data = json.loads(out.read_text())
    events = data["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    gpu = [e for e in slices if e["cat"] in ("kernel", "gpu_memcpy")]
    assert len([e for e in gpu if e["cat"] == "kernel"]) == 3 and len(gpu) == 4
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"GPU 0", "stallscope findings"} <= names
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 0} == {
        "stream 7",
        "stream 9",
    }
    # µs with three decimals, exact from integer ns (ts as written, before float parsing)
    text = out.read_text()
    assert '"ts":1700000000000000.124,"dur":9999.999' in text
    # findings: on their own track, with the documented args
    found = [e for e in slices if e["cat"] == "stallscope_finding"]
    assert found and all(e["pid"] == perfetto.FINDINGS_PID for e in found)
    assert all(
        set(e["args"]) >= {"severity", "analyzer", "detail", "recommendation", "impact_ms"}
        for e in found
    )
    before = json.loads(cli("analyze", str(trace_file), "--format", "json").stdout)
    shown = {f["id"] for f in before["findings"] if f["severity"] != "info"}  # low+ by default
    assert {e["args"]["finding"] for e in found} == shown
    worst = before["findings"][0]
    slice_ = next(e for e in found if e["args"]["finding"] == worst["id"])
    assert (slice_["args"]["severity"], slice_["args"]["impact_ms"]) == (
        worst["severity"],
        worst["impact_ns"] / 1e6,
    )
    # round trip: the export ingests back with the same kernels and GPU busy %
    after = json.loads(cli("analyze", str(out), "--format", "json").stdout)
    assert gpu_summary(after) == gpu_summary(before) == (3, 30.001)
    assert after["traces"][0]["span_ns"] == before["traces"][0]["span_ns"]


def test_export_by_id_gz_and_stdout(cli, trace_file, tmp_path):
    (result,) = json.loads(cli("ingest", str(trace_file), "--json").stdout)
    gz = tmp_path / "out.json.gz"
    assert cli("export", result["trace_ids"][0], "--perfetto", str(gz)).returncode == 0
    assert len(json.loads(gzip.decompress(gz.read_bytes()))["traceEvents"]) > 5
    piped = cli("export", result["job_id"], "--perfetto", "-")  # a one-trace job's id works too
    assert (
        piped.returncode == 0
        and json.loads(piped.stdout)["stallscope"]["trace"] == result["trace_ids"][0]
    )


def test_a_job_of_several_ranks_needs_a_trace_id(cli, tmp_path):
    ranks = sorted((SAMPLES / "kineto" / "ddp_straggler").glob("rank*.pt.trace.json.gz"))
    (result,) = json.loads(cli("ingest", *map(str, ranks), "--json").stdout)
    out = cli("export", result["job_id"], "--perfetto", str(tmp_path / "x.json"))
    assert out.returncode == 3 and "export one of" in out.stderr
    assert not (tmp_path / "x.json").exists()
    rank1 = result["trace_ids"][1]
    ok = cli("export", rank1, "--perfetto", str(tmp_path / "r1.json"))
    assert ok.returncode == 0, ok.stderr
    events = json.loads((tmp_path / "r1.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "stallscope_finding" for e in events)


def test_streamed_in_batches_gives_the_same_bytes(store, trace_file, monkeypatch):
    (res,) = ingest_paths(store, [str(trace_file)])
    job = JobData(store, store.traces(res.job_id))
    whole = io.StringIO()
    perfetto.write_chrome_trace(job, res.trace_ids[0], whole, [])
    monkeypatch.setattr(perfetto, "BATCH_ROWS", 2)
    small = io.StringIO()
    counts = perfetto.write_chrome_trace(job, res.trace_ids[0], small, [])
    job.close()
    assert small.getvalue() == whole.getvalue()
    assert (counts["gpu"], counts["host"]) == (4, 4)
    json.loads(small.getvalue())


def test_merged_windows():
    assert perfetto.merged([[5, 9], [0, 2], [1, 3], [9, 10]]) == [[0, 3], [5, 10]]
    assert perfetto.us_text(-1_500) == "-1.500" and perfetto.us_text(7) == "0.007"


def canonical_rows(job: JobData, trace_id: str, table: str) -> set[tuple]:
    """Every row of a canonical table with its name, ids that differ per trace left out."""
    columns = [c[0] for c in job.sql(f"DESCRIBE {table}").fetchall()]
    kept = [c for c in columns if c not in ("trace_id", "name_id")]
    return set(
        job.sql(
            f"SELECT {', '.join('x.' + c for c in kept)}, n.name FROM {table} x LEFT JOIN names n "
            "ON n.trace_id = x.trace_id AND n.name_id = x.name_id WHERE x.trace_id = ?",
            [trace_id],
        ).fetchall()
    )


@pytest.mark.parametrize(
    "sample",
    [
        "dataloader_stall/dataloader_stall.pt.trace.json.gz",
        "ddp_overlap/rank0.pt.trace.json.gz",
        "shapes_decode/shapes_decode.pt.trace.json.gz",  # record_shapes: input shapes round-trip
    ],
)
def test_export_then_ingest_gives_the_same_canonical_tables(cli, store, sample, tmp_path):
    (source,) = ingest_paths(store, [str(SAMPLES / "kineto" / sample)])
    out = tmp_path / "export.json"
    done = cli("export", source.trace_ids[0], "--perfetto", str(out), store=store.root)
    assert done.returncode == 0, done.stderr
    events = json.loads(out.read_text())["traceEvents"]
    starts = [e for e in events if e["ph"] == "s" and e.get("cat") == "ac2g"]
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e.get("cat") == "ac2g"}
    assert starts and {e["id"] for e in starts} == set(ends)  # every arrow has both ends
    assert all(
        e.get("cat") != "stallscope_finding" or e["args"]["severity"] != "info" for e in events
    )
    (back,) = ingest_paths(store, [str(out)])
    job = JobData(store, store.traces(source.job_id) + store.traces(back.job_id))
    try:
        for table in ("gpu", "host", "ranges"):
            before = canonical_rows(job, source.trace_ids[0], table)
            assert before and canonical_rows(job, back.trace_ids[0], table) == before, table
        shapes = "SELECT count(input_dims), count(input_types) FROM host WHERE trace_id = ?"
        counts = job.sql(shapes, [back.trace_ids[0]]).fetchone()
        assert counts == job.sql(shapes, [source.trace_ids[0]]).fetchone()
        assert ("shapes" in sample) == (counts[0] > 0)
        launches = job.sql(
            "SELECT count(*) FROM gpu g JOIN host h ON h.trace_id = g.trace_id AND "
            "h.correlation = g.correlation AND h.kind IN ('runtime', 'driver') WHERE g.trace_id = ?",
            [source.trace_ids[0]],
        ).fetchone()[0]
        assert len(starts) == launches
    finally:
        job.close()


def test_findings_track_threshold(cli, trace_file, tmp_path):
    every, none = tmp_path / "all.json", tmp_path / "none.json"
    assert (
        cli("export", str(trace_file), "--perfetto", str(every), "--findings", "info").returncode
        == 0
    )
    assert (
        cli("export", str(trace_file), "--perfetto", str(none), "--findings", "none").returncode
        == 0
    )
    report = json.loads(cli("analyze", str(trace_file), "--format", "json").stdout)

    def slices(p):
        return {
            e["args"]["finding"]
            for e in json.loads(p.read_text())["traceEvents"]
            if e.get("cat") == "stallscope_finding"
        }  # noqa: E731

    assert slices(every) == {f["id"] for f in report["findings"]}
    assert slices(none) == set()
