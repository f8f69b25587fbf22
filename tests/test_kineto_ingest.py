"""Kineto -> canonical tables, on small traces built in code with known contents."""

from __future__ import annotations

import gzip
import json
import zipfile

import pyarrow.parquet as pq
import pytest

from stallscope.errors import InputError
from stallscope.ingest import ingest_paths
from tests.kineto_builder import H100, KinetoTrace

EPOCH = 1_712_195_495_519_689_047  # ns; as µs text "1712195495519689.047" (not exact in float64)


def _table(store, trace_id: str, name: str) -> list[dict]:
    (ref,) = store.resolve(trace_id)
    return pq.read_table(ref.table_path(name)).to_pylist()


def _names(store, trace_id: str) -> dict[int, str]:
    return {r["name_id"]: r["name"] for r in _table(store, trace_id, "names")}


def build_basic() -> KinetoTrace:
    t = KinetoTrace(rank=3, world_size=4, base_ns=EPOCH, device_props=[H100])
    t.step(1, 0, 100_000)
    t.cpu_op("aten::mm", 1_000, 5_000)
    t.runtime("cudaLaunchKernel", 2_000, 1_500, corr=42)
    t.kernel(
        "sm90_xmma_gemm_bf16",
        10_000,
        20_000,
        corr=42,
        grid=(132, 2, 1),
        block=(256, 1, 1),
        regs=168,
        smem=98_304,
    )
    t.runtime("cuLaunchKernelEx", 4_000, 1_000, corr=43, cat="cuda_driver")
    t.kernel("triton_poi_fused_add_0", 31_000, 2_000, corr=43)
    t.memcpy("HtoD", "Pageable", "Device", 40_000, 8_000, 1 << 20)
    t.memcpy("DtoH", "Device", "Pinned", 50_000, 1_000, 4)
    t.memset(52_000, 500, 256)
    t.sync("Stream Sync", 53_000, 30_000)
    t.kernel(
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 60_000, 10_000, stream=20,
        extra={"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 4,
               "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
               "Process Group Ranks": "[0, 1, 2, 3]"},
    )  # fmt: skip
    t.cpu_op("python_fn", 0, 10, cat="python_function")
    return t


@pytest.fixture
def basic(store, tmp_path):
    path = build_basic().write(tmp_path / "basic.pt.trace.json.gz", gz=True)
    (result,) = ingest_paths(store, [str(path)])
    return store, result.trace_ids[0]


def test_times_are_exact_integer_nanoseconds(basic):
    store, trace = basic
    names = _names(store, trace)
    gemm = next(
        r for r in _table(store, trace, "gpu") if names[r["name_id"]] == "sm90_xmma_gemm_bf16"
    )
    assert gemm["start_ns"] == EPOCH + 10_000
    assert gemm["end_ns"] == EPOCH + 30_000


def test_gpu_activities_and_their_attributes(basic):
    store, trace = basic
    names = _names(store, trace)
    rows = {names[r["name_id"]]: r for r in _table(store, trace, "gpu")}
    gemm = rows["sm90_xmma_gemm_bf16"]
    assert (gemm["kind"], gemm["device"], gemm["stream"], gemm["correlation"]) == (
        "kernel",
        0,
        7,
        42,
    )
    assert (gemm["grid_x"], gemm["grid_y"], gemm["block_x"], gemm["registers_per_thread"]) == (
        132,
        2,
        256,
        168,
    )
    assert gemm["shared_mem_bytes"] == 98_304
    assert gemm["is_comm"] is False
    h2d = rows["Memcpy HtoD (Pageable -> Device)"]
    assert (h2d["kind"], h2d["copy_kind"], h2d["src_kind"], h2d["dst_kind"], h2d["bytes"]) == (
        "memcpy", "HtoD", "pageable", "device", 1 << 20)  # fmt: skip
    d2h = rows["Memcpy DtoH (Device -> Pinned)"]
    assert (d2h["copy_kind"], d2h["src_kind"], d2h["dst_kind"]) == ("DtoH", "device", "pinned")
    assert rows["Memset (Device)"]["kind"] == "memset"
    sync = rows["Stream Sync"]
    assert (sync["kind"], sync["sync_kind"]) == ("sync", "stream_sync")
    nccl = next(r for n, r in rows.items() if n.startswith("ncclDevKernel"))
    assert nccl["is_comm"] is True and nccl["stream"] == 20


def test_host_activities_include_driver_launches(basic):
    store, trace = basic
    names = _names(store, trace)
    kinds = {names[r["name_id"]]: r["kind"] for r in _table(store, trace, "host")}
    assert kinds["aten::mm"] == "cpu_op"
    assert kinds["cudaLaunchKernel"] == "runtime"
    assert kinds["cuLaunchKernelEx"] == "driver"
    assert kinds["python_fn"] == "python"
    assert kinds["ProfilerStep#1"] == "annotation"
    launch = next(
        r for r in _table(store, trace, "host") if names[r["name_id"]] == "cuLaunchKernelEx"
    )
    assert launch["correlation"] == 43


def test_steps_become_ranges(basic):
    store, trace = basic
    steps = [r for r in _table(store, trace, "ranges") if r["kind"] == "step"]
    assert [(s["step"], s["end_ns"] - s["start_ns"]) for s in steps] == [(1, 100_000)]


def test_collectives_from_kernel_metadata(basic):
    store, trace = basic
    (coll,) = _table(store, trace, "collectives")
    assert coll["rank"] == 3
    assert (coll["op"], coll["pg_name"], coll["pg_desc"], coll["pg_ranks"], coll["group_size"]) == (
        "allreduce", "0", "default_pg", "[0, 1, 2, 3]", 4)  # fmt: skip
    assert (coll["in_nelems"], coll["dtype"], coll["in_bytes"]) == (1024, "BFloat16", 2048)
    assert coll["from_metadata"] is True
    assert coll["end_ns"] - coll["start_ns"] == 10_000


def test_catalog_row(basic):
    store, trace = basic
    (ref,) = store.resolve(trace)
    meta = ref.meta
    assert (meta["rank"], meta["world_size"], meta["source"], meta["source_version"]) == (
        3,
        4,
        "kineto",
        "1",
    )
    assert meta["kernel_count"] == 3
    # span: first GPU activity (10 µs) to last non-sync end (nccl ends at 70 µs)
    assert meta["span_ns"] == 60_000
    assert meta["devices"] == [{"device": 0, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132}]
    devices = _table(store, trace, "devices")
    assert devices[0]["smem_per_sm"] == 233472 and devices[0]["regs_per_sm"] == 65536


def test_2021_bare_array_with_capitalised_categories(store, tmp_path):
    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#7", "pid": 1, "tid": 2, "ts": 100, "dur": 50},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 101, "dur": 3,
         "args": {"correlation": 5, "external id": 9}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm", "pid": 0, "tid": "stream 7", "ts": 110, "dur": 20,
         "args": {"device": 0, "stream": 7, "correlation": 5, "external id": 9}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": "stream 7",
         "ts": 131, "dur": 4, "args": {"device": 0, "stream": 7, "correlation": 6, "bytes": 64}},
        {"ph": "s", "cat": "async", "name": "launch", "pid": 1, "tid": 2, "ts": 101, "id": 5},
    ]  # fmt: skip
    path = tmp_path / "worker0.pt.trace.json"
    path.write_text(json.dumps(events))
    (result,) = ingest_paths(store, [str(path)])
    (ref,) = store.resolve(result.trace_ids[0])
    gpu = pq.read_table(ref.table_path("gpu")).to_pylist()
    assert [(r["kind"], r["start_ns"], r["end_ns"], r["external_id"]) for r in gpu] == [
        ("kernel", 110_000, 130_000, 9), ("memcpy", 131_000, 135_000, None)]  # fmt: skip
    steps = pq.read_table(ref.table_path("ranges")).to_pylist()
    assert [(s["kind"], s["step"]) for s in steps] == [("step", 7)]
    assert ref.meta["kernel_count"] == 1 and ref.meta["event_count"] == 5


def test_rocm_trace_with_string_streams(store, tmp_path):
    events = {"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 9, "tid": 9, "ts": 1.5, "dur": 2,
         "args": {"correlation": 1, "stream": "0x55d1c3c0"}},
        {"ph": "X", "cat": "kernel", "name": "Cijk_Alik_Bljk_HHS_BH_MT128", "pid": 2, "tid": 0, "ts": 5.25,
         "dur": 10, "args": {"device": 2, "stream": 0, "correlation": 1, "kind": "Dispatch Kernel"}},
        {"ph": "X", "cat": "kernel", "name": "hipMemsetAsync_kernel", "pid": 2, "tid": 0, "ts": 20, "dur": 1,
         "args": {"device": 2, "stream": 0, "correlation": 2}},
    ]}  # fmt: skip
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps(events))
    (result,) = ingest_paths(store, [str(path)])
    (ref,) = store.resolve(result.trace_ids[0])
    gpu = pq.read_table(ref.table_path("gpu")).to_pylist()
    assert [(r["device"], r["start_ns"], r["is_comm"]) for r in gpu] == [
        (2, 5_250, False),
        (2, 20_000, False),
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
        ("void c10d::symmetric_memory::multimem_all_reduce_kernel<bf16, 4>(...)", True),
        ("void vllm::cross_device_reduce_1stage<half, 8>(...)", True),
        ("rcclKernel_AllReduce", True),
        ("hipMemsetAsync_kernel", False),
        ("hip_fused_adam_kernel", False),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", False),
    ],
)
def test_communication_kernels_by_name(store, tmp_path, name, expected):
    t = KinetoTrace()
    t.kernel(name, 0, 1_000)
    (result,) = ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    (ref,) = store.resolve(result.trace_ids[0])
    assert pq.read_table(ref.table_path("gpu")).to_pylist()[0]["is_comm"] is expected


def test_job_of_several_ranks_from_zip_and_directory(store, tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in range(2):
        t = KinetoTrace(rank=rank, world_size=2)
        t.kernel(f"k{rank}", 0, 1_000)
        t.write(folder / f"host.{rank}.pt.trace.json.gz", gz=True)
    (from_dir,) = ingest_paths(store, [str(folder)])
    assert sorted(r.meta["rank"] for r in store.traces(from_dir.job_id)) == [0, 1]
    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted(folder.iterdir()):
            zf.write(p, f"run/{p.name}")
        zf.writestr("__MACOSX/._junk", b"x")
    (from_zip,) = ingest_paths(store, [str(archive)])
    assert from_zip.job_id == from_dir.job_id and from_zip.existed  # same files -> same job


def test_rank_from_file_name_and_conflicts(store, tmp_path):
    paths = []
    for rank in (0, 1):
        t = KinetoTrace()
        t.kernel("k", rank * 10, 5)
        paths.append(str(t.write(tmp_path / f"trace_rank-{rank}.json")))
    (result,) = ingest_paths(store, paths)
    assert sorted(r.meta["rank"] for r in store.traces(result.job_id)) == [0, 1]
    a, b = KinetoTrace(rank=1, world_size=2), KinetoTrace(rank=1, world_size=2)
    a.kernel("a", 0, 5)
    b.kernel("b", 0, 5)
    with pytest.raises(InputError, match="rank 1 is also claimed"):
        ingest_paths(store, [str(a.write(tmp_path / "a.json")), str(b.write(tmp_path / "b.json"))])
    assert len(store.jobs()) == 1


def test_reingest_is_idempotent(store, tmp_path):
    path = build_basic().write(tmp_path / "x.json.gz", gz=True)
    (first,) = ingest_paths(store, [str(path)])
    (second,) = ingest_paths(store, [str(path)])
    assert (second.existed, second.job_id, second.trace_ids) == (
        True,
        first.job_id,
        first.trace_ids,
    )
    assert len(store.traces()) == 1


def test_concatenated_gzip_members(store, tmp_path):
    text = build_basic().render().encode()
    half = len(text) // 2
    path = tmp_path / "multi.json.gz"
    path.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    (result,) = ingest_paths(store, [str(path)])
    assert store.resolve(result.trace_ids[0])[0].meta["kernel_count"] == 3


def test_one_bad_job_publishes_none_of_the_others(store, tmp_path):
    good = build_basic().write(tmp_path / "good.json")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.json").write_text("{not json")
    with pytest.raises(InputError):
        ingest_paths(store, [str(good), str(folder)])
    assert store.jobs() == [] and not any((store.root / "staging").iterdir())


def test_events_no_query_reads_still_count_name_and_warn(store, tmp_path):
    """Flows and instants keep no columns, but their names, count and negative dur do."""
    from stallscope.ingest.kineto.decode import decode_kineto

    t = KinetoTrace(rank=0, world_size=1)
    t.cpu_op("aten::mm", 1_000, 5_000)
    t.kernel("gemm", 10_000, 2_000, corr=42)
    t.events += [
        '{"ph": "s", "id": 42, "pid": 100, "tid": 100, "ts": 1.0, "cat": "ac2g", "name": "ac2g"}',
        '{"ph": "f", "id": 42, "pid": 0, "tid": 7, "ts": 10.0, "cat": "ac2g", "name": "ac2g",'
        ' "bp": "e"}',
        '{"ph": "i", "cat": "cpu_instant_event", "name": "only_an_instant", "pid": 100,'
        ' "tid": 100, "ts": 3.0, "dur": -2.5, "s": "t"}',
        '{"ph": "C", "name": "a_counter", "pid": 100, "ts": 4.0, "args": {"value": 1}}',
    ]
    data = t.render().encode()
    decoded = decode_kineto("t.json", data)
    assert decoded.events["ph"].to_pylist() == ["X", "X"]
    assert decoded.gpu_args.num_rows == 1  # the kernel's launch args, on its row alone
    assert decoded.others.to_pylist() == [
        {"name": "ac2g", "negative_dur": False},
        {"name": "ac2g", "negative_dur": False},
        {"name": "only_an_instant", "negative_dur": True},
        {"name": "a_counter", "negative_dur": False},
    ]
    path = tmp_path / "rank0.json"
    path.write_bytes(data)
    (result,) = ingest_paths(store, [str(path)])
    [ref] = store.traces(result.job_id)
    names = pq.read_table(ref.path / "names.parquet")["name"].to_pylist()
    assert names == sorted(["aten::mm", "gemm", "ac2g", "only_an_instant", "a_counter"])
    assert ref.meta["event_count"] == 6
    assert result.warnings == [
        f"{path}: 1 events had a negative duration (dur < 0): given duration 0"
    ]


def test_shapes_columns_are_dropped_when_no_event_has_shapes(store, tmp_path):
    """No ``record_shapes``: no shapes columns decoded (memory), ``host`` has them null."""
    from stallscope.ingest.kineto.decode import SHAPE_COLUMNS, decode_kineto

    plain = KinetoTrace(rank=0, world_size=1)
    plain.cpu_op("aten::mm", 1_000, 5_000)
    shaped = KinetoTrace(rank=0, world_size=1)
    shaped.cpu_op("aten::mm", 1_000, 5_000, args={"Input Dims": [[2, 3], [3, 4]]})
    shaped.cpu_op("aten::relu", 7_000, 1_000)
    assert not set(SHAPE_COLUMNS) & set(
        decode_kineto("a", plain.render().encode()).events.column_names
    )
    events = decode_kineto("b", shaped.render().encode()).events
    assert events["input_dims"].to_pylist() == ["[[2, 3], [3, 4]]", None]
    for name, trace in (("plain", plain), ("shaped", shaped)):
        path = tmp_path / name / "rank0.json"
        path.parent.mkdir()
        path.write_text(trace.render())
        (result,) = ingest_paths(store, [str(path)])
        [ref] = store.traces(result.job_id)
        host = pq.read_table(ref.table_path("host"))
        assert host.schema.field("input_dims").type == "string"
        expected = ["[[2, 3], [3, 4]]", None] if name == "shaped" else [None]
        assert host["input_dims"].to_pylist() == expected
