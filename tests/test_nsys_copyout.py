"""Output rows written per trace by DuckDB's COPY (``ingest.nsys.copyout``): the same files
and records as streaming them through Arrow (``ingest.streamed.write_split``)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallscope.ingest.formats import ParseContext
from stallscope.ingest.nsys import copyout
from stallscope.ingest.nsys.copyout import MAX_TRACES, copy_split
from stallscope.ingest.nsys.parse import parse_nsys_file
from stallscope.ingest.streamed import write_split
from stallscope.schema import arrow_schema
from tests.test_streamed import _two_gpus

# Trace 1 has no rows; trace 0 has a row that ends before it starts (9 -> 8) and rows
# out of order (the ORDER BY puts them in order).
_ROWS = """
SELECT CAST(tix AS INTEGER) AS tix, 't' || tix AS trace_id, 'runtime' AS kind,
       CAST(s AS BIGINT) AS start_ns, CAST(e AS BIGINT) AS end_ns, CAST(n AS INTEGER) AS name_id
FROM (VALUES (0, 5, 6, 4), (0, 1, 3, 4), (0, 9, 8, 7), (2, 100, 150, 1), (2, 40, 90, NULL))
     v(tix, s, e, n)
"""
_ORDER = "tix, start_ns"


def test_copy_writes_what_the_arrow_route_writes(tmp_path: Path):
    con = duckdb.connect()
    copied = copy_split(con, _ROWS, _ORDER, "host", [tmp_path / f"c{i}.parquet" for i in range(3)])
    reader = con.sql(f"{_ROWS} ORDER BY {_ORDER}").to_arrow_reader(2)
    streamed = write_split(reader, "host", [tmp_path / f"s{i}.parquet" for i in range(3)])
    assert copied is not None
    for c, s in zip(copied, streamed, strict=True):
        a, b = pq.read_table(c.path), pq.read_table(s.path)
        assert a.schema == b.schema == arrow_schema("host")  # optional fields, as Arrow's
        assert a.equals(b)
        assert (c.num_rows, c.bounds, c.negative_durations) == (
            s.num_rows,
            s.bounds,
            s.negative_durations,
        )
        ids = [i for i in s.name_ids.to_pylist() if i is not None]  # a NULL name: no name id
        assert sorted(c.name_ids.to_pylist()) == sorted(ids)
        assert c.column_names == s.column_names
    first = pq.read_table(copied[0].path)
    assert first["start_ns"].to_pylist() == [1, 5, 9]
    assert first["end_ns"].to_pylist() == [3, 6, 9]  # repaired: duration 0
    assert copied[0].negative_durations == 1
    assert copied[0].bounds == {"start_ns": (1, 9), "end_ns": (3, 8)}  # as parsed
    assert copied[1].num_rows == 0 and copied[1].bounds["start_ns"] == (None, None)
    assert copied[2].name_ids.to_pylist() == [1]  # the NULL name is no name id


def test_a_column_of_another_type_is_left_to_the_caller(tmp_path: Path):
    con = duckdb.connect()
    rows = _ROWS.replace("CAST(n AS INTEGER)", "CAST(n AS BIGINT)")
    paths = [tmp_path / f"{i}.parquet" for i in range(3)]
    assert copy_split(con, rows, _ORDER, "host", paths) is None
    assert not any(p.exists() for p in paths)
    assert copy_split(con, _ROWS, _ORDER, "not_a_table", paths) is None
    many = [tmp_path / f"m{i}.parquet" for i in range(MAX_TRACES + 1)]  # one pass costs less
    assert copy_split(con, _ROWS, _ORDER, "host", many) is None
    assert not any(p.exists() for p in many)


def test_missing_declared_columns_are_typed_nulls(tmp_path: Path):
    con = duckdb.connect()
    [written] = copy_split(con, "SELECT * FROM (" + _ROWS + ") WHERE tix = 0", _ORDER, "host",
                           [tmp_path / "0.parquet"])  # fmt: skip
    table = pq.read_table(written.path)
    assert table["input_dims"].type == pa.string()
    assert table["input_dims"].null_count == table.num_rows == 3


def test_a_file_that_cannot_be_written_is_an_os_error(tmp_path: Path):
    con = duckdb.connect()
    paths = [tmp_path / "missing" / f"{i}.parquet" for i in range(3)]
    with pytest.raises(OSError, match="missing"):
        copy_split(con, _ROWS, _ORDER, "host", paths)


def test_an_export_of_many_traces_takes_the_arrow_route_with_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    export = _two_gpus().write(tmp_path / "dp.sqlite")

    def parse(folder: str):
        scratch = tmp_path / folder
        scratch.mkdir()
        ctx = ParseContext(name="dp", single=False, trace_id=lambda k: f"id-{k}", scratch=scratch)
        return parse_nsys_file(export, "dp", ctx)

    copied = parse("copied")
    monkeypatch.setattr(copyout, "MAX_TRACES", 1)  # 2 traces: more than the COPYs' limit
    streamed = parse("streamed")
    for mine, theirs in zip(copied, streamed, strict=True):
        for name in ("host", "ranges"):
            a, b = getattr(mine.canonical, name), getattr(theirs.canonical, name)
            assert a.path.parent.name == "copied" and b.path.parent.name == "streamed"
            assert "duckdb" in pq.ParquetFile(a.path).metadata.created_by.lower()
            assert "arrow" in pq.ParquetFile(b.path).metadata.created_by.lower()
            assert pq.read_table(a.path).equals(pq.read_table(b.path))
            assert (a.num_rows, a.bounds) == (b.num_rows, b.bounds) and a.num_rows > 0
        assert mine.canonical.names.equals(theirs.canonical.names)
