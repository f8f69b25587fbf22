"""Nsight Compute ingest: CSV pages built in code, the real corpus pages, pairing with a timeline."""

from __future__ import annotations

import gzip
import os
import stat
import sys

import pyarrow.parquet as pq
import pytest

from stallscope.errors import InputError
from stallscope.ingest import ingest_paths
from stallscope.ingest.ncu.csv_pages import parse_number, read_ncu_csv, to_base
from stallscope.ingest.sniff import sniff
from stallscope.kernel_names import kernel_base_name
from tests.conftest import CORPUS, SAMPLES
from tests.kineto_builder import KinetoTrace

IDS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
       "Block Size", "Grid Size", "Device", "CC"]  # fmt: skip
NCU = SAMPLES / "ncu"
KINETO = SAMPLES / "kineto" / "occupancy" / "occupancy.pt.trace.json.gz"


def csv_line(cells) -> str:
    return ",".join('"' + str(c).replace('"', '""') + '"' for c in cells)


def raw_page(kernels: list[dict], metrics: dict[str, str], ids=IDS, prefix: str = "") -> str:
    """A ``--page raw`` export: header, units row, one row per kernel ({column: text})."""
    lines = [csv_line(ids + list(metrics)), csv_line([""] * len(ids) + list(metrics.values()))]
    lines += [csv_line([k.get(c, "") for c in ids + list(metrics)]) for k in kernels]
    return prefix + "\n".join(lines) + "\n"


def kernel(index: int, name: str = "void k<int, 2>(float*, int)", **cells) -> dict:
    base = {"ID": str(index), "Process ID": "77", "Process Name": "python", "Host Name": "h",
            "Kernel Name": name, "Context": "1", "Stream": "7", "Block Size": "(128, 1, 1)",
            "Grid Size": "(1,024, 1, 1)", "Device": "0", "CC": "9.0"}  # fmt: skip
    base.update(cells)
    return base


def rows_of(table) -> dict[tuple, tuple]:
    return {
        (k, m): (v, t, u)
        for k, m, v, t, u in zip(
            table.kernel, table.metric, table.value, table.value_text, table.unit, strict=True
        )
    }


def test_raw_page_units_separators_and_quoted_names():
    text = raw_page(
        [
            kernel(
                0,
                **{
                    "gpu__time_duration.sum": "1,234.5",
                    "launch__grid_size": "2,209,728",
                    "launch__func_cache_config": "CachePreferNone",
                    "x.pct": "nan",
                },
            ),
            kernel(1, name='say "hi", twice', **{"gpu__time_duration.sum": "7"}),
        ],  # fmt: skip
        {
            "gpu__time_duration.sum": "usecond",
            "launch__grid_size": "",
            "launch__func_cache_config": "",
            "x.pct": "%",
        },
    )
    table = read_ncu_csv("r.csv", text.encode())
    assert table.page == "raw" and sorted(table.kernels) == [0, 1]
    rows = rows_of(table)
    assert rows[(0, "gpu__time_duration.sum")] == (1234.5, None, "usecond")
    assert rows[(0, "launch__grid_size")] == (2209728.0, None, None)
    assert rows[(0, "launch__func_cache_config")] == (None, "CachePreferNone", None)
    assert rows[(0, "x.pct")] == (None, "nan", "%")
    assert (1, "x.pct") not in rows  # empty cells are not stored
    k0, k1 = table.kernels[0], table.kernels[1]
    assert k0.name == "void k<int, 2>(float*, int)" and k1.name == 'say "hi", twice'
    assert (k0.block, k0.grid, k0.device, k0.cc, k0.pid) == ((128, 1, 1), None, 0, "9.0", 77)


def test_missing_columns_fall_back_to_launch_metrics():
    ids = [
        "ID",
        "Process ID",
        "Process Name",
        "Host Name",
        "Kernel Name",
        "Kernel Time",
        "Context",
        "Stream",
    ]
    dims = {f"launch__{kind}_dim_{a}": "" for kind in ("block", "grid") for a in "xyz"}
    cells = {"launch__block_dim_x": "256", "launch__block_dim_y": "1", "launch__block_dim_z": "1",
             "launch__grid_dim_x": "4,096", "launch__grid_dim_y": "2", "launch__grid_dim_z": "1",
             "launch__device_id": "3"}  # fmt: skip
    text = raw_page([kernel(0, **cells)], dims | {"launch__device_id": ""}, ids=ids)
    (k,) = read_ncu_csv("old.csv", text.encode()).kernels.values()
    assert (k.block, k.grid, k.device, k.cc) == ((256, 1, 1), (4096, 2, 1), 3, None)


def test_decimal_comma_locale_and_prof_lines():
    text = raw_page(
        [kernel(0, **{"a": "27.595.520", "b": "3,20", "c": "1.234,5", "d": "12"})],
        {"a": "byte", "b": "Ghz", "c": "%", "d": ""},
        prefix="==PROF== Connected to process 1 (/usr/bin/python3)\nsome program output\n",
    )
    assert sniff("x.csv", text.encode()) == "ncu"
    rows = rows_of(read_ncu_csv("eu.csv", text.encode()))
    assert [rows[(0, m)][0] for m in "abcd"] == [27595520.0, 3.2, 1234.5, 12.0]
    assert parse_number("1 234,5", True) == 1234.5 and parse_number("1\u202f234.5") == 1234.5
    assert parse_number("n/a") is None and parse_number("(32, 1, 1)") is None


def test_details_page_sections_units_and_rules():
    header = IDS + ["Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name",
                    "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]  # fmt: skip
    ident = [kernel(0)[c] for c in IDS]
    lines = [
        csv_line(header),
        csv_line(ident + ["Occupancy", "Theoretical Occupancy", "%", "18.75"]),  # shorter row
        csv_line(ident + ["Launch Statistics", "# SMs", "SM", "132"]),
        csv_line(
            ident
            + [
                "Occupancy",
                "",
                "",
                "",
                "TheoreticalOccupancy",
                "OPT",
                "Limited by registers, and shared memory.",
                "global",
                "9.516",
            ]
        ),  # fmt: skip
    ]
    table = read_ncu_csv("d.csv", ("\n".join(lines) + "\n").encode())
    rows = {(s, m): (v, t, u) for s, m, v, t, u in
            zip(table.section, table.metric, table.value, table.value_text, table.unit, strict=True)}  # fmt: skip
    assert table.page == "details"
    assert rows[("Occupancy", "Theoretical Occupancy")] == (18.75, None, "%")
    assert rows[("Occupancy", "rule:TheoreticalOccupancy")] == (
        9.516,
        "OPT: Limited by registers, and shared memory.",
        "% (global)",
    )


def test_to_base_units():
    assert to_base(205.824, "Kbyte/block") == pytest.approx(205824)
    assert to_base(2.74, "ms") == pytest.approx(2_740_000) and to_base(5, "usecond") == 5000
    assert to_base(3.4, "Tbyte/s") == pytest.approx(3.4e12) and to_base(
        1.98, "Ghz"
    ) == pytest.approx(1.98e9)
    assert to_base(7.0, "%") == 7.0 and to_base(None, "ms") is None


@pytest.mark.parametrize(
    "text, reason",
    [
        (csv_line(IDS) + "\n", "no profiled kernels"),
        (
            raw_page([kernel(0, x="1")], {"x": ""}).replace('"0","77"', '"zero","77"'),
            "result ID 'zero' is not a number",
        ),
        (raw_page([kernel(0, x="1"), kernel(0, x="2")], {"x": ""}), "result ID 0 appears twice"),
        (
            raw_page([kernel(0, x="1")], {"x": ""}) + csv_line(["1"] * 14) + "\n",
            "line 4 has 14 fields, the header has 12",
        ),
        (
            raw_page([kernel(0, x="1")], {"x": ""}).replace('"CC"', '"Device"'),
            "names the column 'Device' twice",
        ),
        (raw_page([kernel(0, x="1")], {"x": ""}) + '"1","2,"3\n', "malformed Nsight Compute CSV"),
    ],  # fmt: skip
)
def test_bad_csv_is_one_line_input_error(store, tmp_path, text, reason):
    path = tmp_path / "bad.raw.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        ingest_paths(store, [str(path)])
    assert reason in str(info.value) and "\n" not in str(info.value)
    assert not list(store.jobs_dir.iterdir())


def test_missing_required_column():
    text = raw_page([kernel(0, x="1")], {"x": ""}).replace('"Kernel Name"', '"Name"')
    with pytest.raises(InputError, match="without a 'Kernel Name' column"):
        read_ncu_csv("k.csv", text.encode())


def test_kernel_base_name():
    assert kernel_base_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                            "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
                            ) == "vectorized_elementwise_kernel"  # fmt: skip
    assert kernel_base_name("void at::<unnamed>::dist_kernel<float>(int)") == kernel_base_name(
        "void at::(anonymous namespace)::dist_kernel<float>(int)"
    )
    assert kernel_base_name("low_occupancy_smem_kernel") == "low_occupancy_smem_kernel"


def test_sample_with_timeline_is_one_job_matched_in_order(store):
    paths = [str(KINETO), str(NCU / "occupancy.raw.csv"), str(NCU / "occupancy.details.csv")]
    (res,) = ingest_paths(store, paths)
    refs = {
        r.meta["source"] + ":" + r.meta["name"].split(" ")[0]: r for r in store.traces(res.job_id)
    }
    assert {r.meta["rank"] for r in refs.values()} == {0} and {
        r.meta["world_size"] for r in refs.values()
    } == {1}
    assert not any(r.meta["warnings"] for r in refs.values())
    timeline = refs["kineto:occupancy.pt.trace.json.gz"]
    raw = refs["ncu:occupancy.raw.csv"]
    con = store.connect(store.traces(res.job_id))
    matches = con.execute(
        "SELECT k.kernel_index, n.name, k.timeline_correlation, k.timeline_start_ns, g.correlation, g.start_ns "
        "FROM (SELECT DISTINCT kernel_index, timeline_trace_id, timeline_name_id, timeline_correlation, "
        "timeline_start_ns FROM kernel_metrics WHERE trace_id = ?) k "
        "JOIN names n ON n.trace_id = k.timeline_trace_id AND n.name_id = k.timeline_name_id "
        "JOIN gpu g ON g.trace_id = k.timeline_trace_id AND g.correlation = k.timeline_correlation "
        "ORDER BY k.kernel_index",
        [raw.trace_id],
    ).fetchall()
    names = [
        "low_occupancy_smem_kernel",
        "well_occupied_axpy_kernel",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
    ]
    assert [m[1] for m in matches] == names * 2
    assert [m[2] for m in matches] == [
        109,
        125,
        152,
        202,
        218,
        245,
    ]  # the first two steps, in order
    assert all(m[3] == m[5] for m in matches)
    units = dict(con.execute(
        "SELECT metric, unit FROM kernel_metrics WHERE trace_id = ? AND kernel_index = 2", [raw.trace_id]
    ).fetchall())  # fmt: skip
    assert (
        units["launch__shared_mem_per_block_dynamic"] == "Kbyte/block"
        and units["gpu__time_duration.sum"] == "ms"
    )
    dev = con.execute("SELECT name, sm_count, smem_per_sm, max_blocks_per_sm FROM devices WHERE trace_id = ?",
                      [raw.trace_id]).fetchone()  # fmt: skip
    assert dev == ("NVIDIA H200", 132, 233472, 32)
    assert con.execute(
        "SELECT count(*) FROM kernel_metrics WHERE trace_id = ?", [timeline.trace_id]
    ).fetchone() == (0,)
    con.close()


def test_two_raw_pages_on_one_rank_clash(store, tmp_path):
    other = tmp_path / "other.raw.csv"
    other.write_text(raw_page([kernel(0, x="1")], {"x": ""}))
    with pytest.raises(InputError, match="rank 0 is also claimed by"):
        ingest_paths(store, [str(KINETO), str(NCU / "occupancy.raw.csv"), str(other)])


def _two_rank_job(tmp_path) -> list[str]:
    paths = []
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2)
        t.kernel("my_kernel", 1000, 5000, device=rank, grid=(1024, 1, 1))
        paths.append(str(t.write(tmp_path / f"trace_{rank}.json")))
    return paths


def test_ncu_rank_from_name_or_device_or_error(store, tmp_path):
    page = raw_page(
        [kernel(0, name="my_kernel", Device="1", **{"Grid Size": "(1024, 1, 1)", "x": "1"})],
        {"x": ""},
    )
    (tmp_path / "by_device.raw.csv").write_text(page)
    (res,) = ingest_paths(store, _two_rank_job(tmp_path) + [str(tmp_path / "by_device.raw.csv")])
    ncu = [r for r in store.traces(res.job_id) if r.meta["source"] == "ncu"]
    assert [r.meta["rank"] for r in ncu] == [1]
    km = pq.read_table(ncu[0].table_path("kernel_metrics")).to_pylist()
    assert (
        km[0]["timeline_correlation"] is not None and km[0]["timeline_trace_id"] != ncu[0].trace_id
    )
    ambiguous = page.replace('"1","9.0"', '"5","9.0"')
    (tmp_path / "ambiguous.csv").write_text(ambiguous)
    with pytest.raises(InputError, match="cannot tell which rank"):
        ingest_paths(store, _two_rank_job(tmp_path) + [str(tmp_path / "ambiguous.csv")])
    (tmp_path / "prof_rank0.csv").write_text(ambiguous)
    (res,) = ingest_paths(store, _two_rank_job(tmp_path) + [str(tmp_path / "prof_rank0.csv")])
    assert [r.meta["rank"] for r in store.traces(res.job_id) if r.meta["source"] == "ncu"] == [0]


def test_ncu_rep_without_and_with_ncu_on_path(store, tmp_path, monkeypatch):
    report = tmp_path / "my report.ncu-rep"
    report.write_bytes(b"NVR\x00" + os.urandom(64))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(InputError) as info:
        ingest_paths(store, [str(report)])
    assert (
        "ncu --import" in str(info.value)
        and "--page raw" in str(info.value)
        and "--page details" in str(info.value)
    )
    fake = tmp_path / "bin" / "ncu"  # prints our sample pages, like `ncu --import R --csv --page P`
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\npage = sys.argv[sys.argv.index('--page') + 1]\n"
                    f"sys.stdout.write(open({str(NCU)!r} + f'/occupancy.{{page}}.csv').read())\n")  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(fake.parent))
    (res,) = ingest_paths(store, [str(report)])
    (ref,) = store.traces(res.job_id)
    assert ref.meta["source"] == "ncu" and "Nsight Compute report" in ref.meta["name"]
    sections = pq.read_table(ref.table_path("kernel_metrics"), columns=["section"])["section"]
    assert sections.null_count > 0 and len(set(sections.to_pylist())) > 5  # raw and details pages


CORPUS_CSV = sorted((CORPUS / "ncu-csv").glob("*.csv.gz")) if (CORPUS / "ncu-csv").is_dir() else []


@pytest.mark.corpus
@pytest.mark.parametrize("path", CORPUS_CSV or [CORPUS / "ncu-csv"], ids=lambda p: p.name)
def test_corpus_pages_ingest(store, path):
    table = read_ncu_csv(path.name, gzip.decompress(path.read_bytes()))
    (res,) = ingest_paths(store, [str(path)])
    (ref,) = store.traces(res.job_id)
    km = pq.read_table(ref.table_path("kernel_metrics"))
    assert ref.meta["source"] == "ncu" and ref.meta["rank"] == 0
    assert km.num_rows == len(table.metric) > 100 and len(
        set(km["kernel_index"].to_pylist())
    ) == len(table.kernels)
    assert km["unit"].null_count < km.num_rows
    if "sglang" in path.name:  # its flash-attention kernel failed to profile: said, not hidden
        assert any("no measured values" in w for w in ref.meta["warnings"])


def test_profiles_are_keyed_like_timeline_kernels(store):
    from stallscope.jobdata import JobData
    from stallscope.ncu_metrics import profiles

    paths = [str(KINETO), str(NCU / "occupancy.raw.csv"), str(NCU / "occupancy.details.csv")]
    (res,) = ingest_paths(store, paths)
    job = JobData(store, store.traces(res.job_id))
    timeline = next(r for r in job.traces if r.meta["source"] == "kineto")
    by_key = profiles(job, timeline=timeline.trace_id)
    gemm = by_key[("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", (2, 66, 1), (384, 1, 1))]
    assert gemm.results == 2  # two profiled launches, raw and details pages merged
    assert gemm.get("theoretical_pct") == 18.75 and gemm.limiters() == [
        "registers",
        "shared_memory",
    ]
    assert (
        gemm.get("dynamic_smem_bytes") == 213188
    )  # raw page (Kbyte) preferred to the rounded details
    assert gemm.bound(60) == "compute" and gemm.top_stalls()[0]["reason"] == "barrier"
    assert gemm.get("duration_ns") == pytest.approx((177024 + 176480) / 2)
    job.close()
