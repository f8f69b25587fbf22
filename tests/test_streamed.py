"""Canonical tables streamed to Parquet per trace (``ingest.streamed``), and the nsys ingest
that uses them: the same tables as materialising them, checked by hand and against the
non-streamed path."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stallscope.ingest.canonical import conform
from stallscope.ingest.formats import ParseContext
from stallscope.ingest.kineto.parse import parse_kineto
from stallscope.ingest.nsys.parse import parse_nsys_file
from stallscope.ingest.reader import expand_path
from stallscope.ingest.streamed import WrittenTable, write_split
from stallscope.schema import arrow_schema
from tests.kineto_builder import KinetoTrace
from tests.nsys_builder import NsysBuilder


def _host_rows(tix: list[int], starts: list[int], ends: list[int], names: list[int]) -> pa.Table:
    """Rows of the host table's query shape: ``tix`` first, then some declared columns."""
    return pa.table(
        {
            "tix": pa.array(tix, pa.int32()),
            "trace_id": pa.array([f"t{t}" for t in tix], pa.string()),
            "kind": pa.array(["runtime"] * len(tix), pa.string()),
            "start_ns": pa.array(starts, pa.int64()),
            "end_ns": pa.array(ends, pa.int64()),
            "name_id": pa.array(names, pa.int32()),
        }
    )


def test_rows_go_to_their_trace_with_stats(tmp_path: Path):
    # 3 traces; trace 1 has no rows; batches of 2 rows cut trace 0 and trace 2 in pieces.
    rows = _host_rows([0, 0, 0, 2, 2], [5, 1, 9, 100, 40], [6, 3, 8, 150, 90], [4, 4, 7, 1, 2])
    reader = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=2))
    paths = [tmp_path / f"{i}.parquet" for i in range(3)]
    written = write_split(reader, "host", paths)
    assert [w.num_rows for w in written] == [3, 0, 2]
    first = pq.read_table(paths[0])
    assert first.schema == arrow_schema("host")  # every declared column, in order
    assert first["start_ns"].to_pylist() == [5, 1, 9]
    # 9 -> 8 ends before it starts: counted, written with duration 0, bounds as parsed
    assert first["end_ns"].to_pylist() == [6, 3, 9]
    assert written[0].negative_durations == 1
    assert written[0].bounds == {"start_ns": (1, 9), "end_ns": (3, 8)}
    assert sorted(written[0].name_ids.to_pylist()) == [4, 7]
    assert pq.read_table(paths[1]).num_rows == 0
    assert pq.read_table(paths[1]).schema == arrow_schema("host")
    assert written[1].bounds == {"start_ns": (None, None), "end_ns": (None, None)}
    assert pq.read_table(paths[2])["trace_id"].to_pylist() == ["t2", "t2"]
    assert sorted(written[2].name_ids.to_pylist()) == [1, 2]
    # the same table as conforming the materialised rows of that trace
    expected = conform("host", rows.slice(3, 2).drop_columns(["tix"]))
    assert pq.read_table(paths[2]).equals(expected)


def test_a_column_of_another_type_is_left_to_the_caller(tmp_path: Path):
    rows = _host_rows([0], [1], [2], [3]).set_column(
        5, "name_id", pa.array([3], pa.int64())
    )  # conform would cast (or keep) the whole column: not streamed
    reader = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches())
    assert write_split(reader, "host", [tmp_path / "0.parquet"]) is None
    assert not (tmp_path / "0.parquet").exists()
    assert reader.read_all().num_rows == 1  # nothing was consumed


def _two_gpus() -> NsysBuilder:
    b = NsysBuilder("new")
    b.process(300, "python3", {300: "main", 301: "loader"})
    for dev in (0, 1):
        b.gpu(dev)
        b.kernel(300, dev, 7, 1000 + dev, 2000, 10 + dev, f"k{dev}", context=dev + 1)
        b.api(300, 300, 900 + dev, 950, 10 + dev, "cudaLaunchKernel_v7000")
    b.api(300, 300, 100, 200, None, "cudaGetDeviceCount_v3020")
    b.nvtx(300, 300, 50, 3000, "step 7")
    b.nvtx(300, 300, 60, 990, "forward")
    b.osrt(300, 301, 70, 80, "read")
    return b


def _assert_written_as_held(streamed, held, scratch: Path) -> None:
    """``streamed``'s host and ranges are files in ``scratch`` holding exactly ``held``'s rows
    (not empty), as the ingest would conform them."""
    for name in ("host", "ranges"):
        table = getattr(streamed.canonical, name)
        assert isinstance(table, WrittenTable)
        assert table.path.parent == scratch
        expected = conform(name, getattr(held.canonical, name))
        assert expected.num_rows > 0
        assert pq.read_table(table.path).equals(expected)


def test_nsys_streamed_tables_equal_the_materialised_ones(tmp_path: Path):
    export = _two_gpus().write(tmp_path / "dp.sqlite")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def parse(where: Path | None):
        ctx = ParseContext(name="dp", single=False, trace_id=lambda k: f"id-{k}", scratch=where)
        return parse_nsys_file(export, "dp", ctx)

    streamed, held = parse(scratch), parse(None)
    assert len(streamed) == len(held) == 2
    for mine, theirs in zip(streamed, held, strict=True):
        _assert_written_as_held(mine, theirs, scratch)
        assert mine.canonical.names.equals(theirs.canonical.names)
        assert mine.canonical.event_count == theirs.canonical.event_count
        assert mine.warnings == theirs.warnings


def test_rows_without_tix_go_to_the_one_path(tmp_path: Path):
    rows = _host_rows([0, 0, 0], [5, 1, 9], [6, 3, 12], [4, 4, 7]).drop_columns(["tix"])
    reader = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=2))
    [written] = write_split(reader, "host", [tmp_path / "one.parquet"])
    assert written.num_rows == 3
    assert written.bounds == {"start_ns": (1, 9), "end_ns": (3, 12)}
    assert pq.read_table(written.path).equals(conform("host", rows))
    written.move_to(tmp_path / "moved.parquet")
    assert written.path == tmp_path / "moved.parquet" and written.path.is_file()


def _kineto_trace() -> KinetoTrace:
    """Host rows on two threads written out of order, equal start times (file order breaks
    the tie), a step and a user annotation (ranges), kernels with their launches."""
    t = KinetoTrace(rank=0)
    t.step(1, 0, 10_000)
    t.cpu_op("aten::mm", 3_000, 500, tid=101)
    t.cpu_op("aten::add", 1_000, 200)
    t.cpu_op("aten::relu", 1_000, 100)  # same start as aten::add: after it (file order)
    t.cpu_op("forward", 500, 6_000, cat="user_annotation")
    for i in range(3):
        corr = t.kernel(f"k{i}", 2_000 + 1_000 * i, 400)
        t.runtime("cudaLaunchKernel", 1_900 + 1_000 * i, 50, corr=corr)
    return t


def test_kineto_streamed_tables_equal_the_materialised_ones(tmp_path: Path):
    trace = _kineto_trace().write(tmp_path / "rank0.json")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def parse(where: Path | None):
        ctx = ParseContext(name="r0", single=True, trace_id=lambda k: "tk", scratch=where)
        [source] = expand_path(str(trace))[1]
        return parse_kineto(source, source.read(), ctx)

    [streamed], [held] = parse(scratch), parse(None)
    _assert_written_as_held(streamed, held, scratch)
    host = pq.read_table(streamed.canonical.host.path)
    ids = held.canonical.names.to_pydict()
    names = dict(zip(ids["name_id"], ids["name"], strict=True))
    host_names = [names[i] for i in host["name_id"].to_pylist()]
    # (pid, tid, start, file order): thread 100 first; add before relu at 1,000 ns
    assert host_names == [
        "ProfilerStep#1", "forward", "aten::add", "aten::relu", "cudaLaunchKernel", "cudaLaunchKernel",
        "cudaLaunchKernel", "aten::mm",
    ]  # fmt: skip
    for name in ("gpu", "collectives", "names", "threads", "devices"):
        assert getattr(streamed.canonical, name).equals(getattr(held.canonical, name))
    assert streamed.warnings == held.warnings
    assert streamed.canonical.event_count == held.canonical.event_count
