"""Nsight Systems SQLite ingest on exports built in code, with hand-known answers.

Each scenario is written by ``tests.nsys_builder`` in the old (2.9.1:
EXPORT_META_DATA, no ENUM tables) and the new (3.2x) schema generation, so the
same answers must come out of both layouts. Also: rank rules, the NCCL domain,
bad input (one-line error, store unchanged, no temporary file left) and
``.nsys-rep`` reports with and without ``nsys`` on PATH.
"""

from __future__ import annotations

import os
import shlex
import stat

import pyarrow.parquet as pq
import pytest

from stallscope.errors import InputError
from stallscope.ingest import ingest_paths
from tests.conftest import CORPUS
from tests.nsys_builder import NsysBuilder

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def tiny(schema: str = "new", enum_shift: int = 0) -> NsysBuilder:
    """One process (pid 100) on GPU 0: two launches, a copy, a memset, a sync, an all-reduce."""
    b = NsysBuilder(schema, enum_shift=enum_shift)
    b.process(100, "python3", {101: "main", 102: "comm"})
    b.gpu(0)
    b.kernel(100, 0, 7, 1000, 2000, 1, "gemm_kernel(float*)", grid=(4, 2, 1), block=(256, 1, 1),
             regs=40, smem=(1024, 2048))  # fmt: skip
    b.api(100, 101, 900, 950, 1, "cudaLaunchKernel_v7000")
    b.api(100, 101, 905, 948, 1, "cudaLaunchKernel", event_class=67)  # backtrace copy: skipped
    b.kernel(100, 0, 7, 2500, 3000, 2, "triton_fused_add")
    b.api(100, 101, 2000, 2100, 2, "cuLaunchKernel", event_class=1)
    b.memcpy(100, 0, 7, 3000, 3500, 3, 1024, "HTOD", "PAGEABLE", "DEVICE")
    b.api(100, 101, 2950, 3600, 3, "cudaMemcpyAsync_v3020")
    b.memset(100, 0, 7, 3600, 3700, 4, 64)
    b.api(100, 101, 3550, 3590, 4, "cudaMemsetAsync_v3020")
    b.sync(100, 0, 4294967295, 3700, 4000, 5, "STREAM_SYNCHRONIZE")
    b.api(100, 101, 3650, 4050, 5, "cudaStreamSynchronize_v3020")
    b.kernel(100, 0, 13, 4000, 4500, 6, NCCL_KERNEL)
    b.api(100, 102, 3900, 3950, 6, "cudaLaunchKernelExC_v11060")
    b.kernel(100, 0, 7, 0, 0, 7, "no_timestamps")  # CUPTI's "not collected": dropped
    b.api(100, 101, 700, 710, None, "cudaGetDevice_v3020")
    b.domain(100, 102, 1, "NCCL")
    b.nvtx(100, 102, 3890, 3960, "ncclAllReduce", domain_id=1)
    b.nvtx(100, 101, 800, 4600, "step 0")
    b.nvtx(100, 101, 800, 880, "data_loading", registered=True)
    b.nvtx(100, 101, 4700, None, "never ends")
    b.osrt(100, 101, 810, 870, "read")
    return b


def ingest_one(store, path):
    (result,) = ingest_paths(store, [str(path)])
    refs = sorted(store.traces(result.job_id), key=lambda r: r.meta["rank"])
    return result, refs


def rows(store, refs, sql):
    con = store.connect(refs)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(("schema", "shift"), [("new", 0), ("old", 0), ("new", 100), ("3.28", 0)])
def test_tiny_export_gives_the_known_tables(store, tmp_path, schema, shift):
    path = tiny(schema, shift).write(tmp_path / "tiny.sqlite")
    _, refs = ingest_one(store, path)
    (ref,) = refs
    meta = ref.meta
    assert (meta["source"], meta["rank"], meta["world_size"]) == ("nsys", 0, 1)
    assert meta["source_version"] == {"old": "2.9.1", "new": "3.20.3", "3.28": "3.28.1"}[schema]
    assert meta["kernel_count"] == 3 and meta["gpu_event_count"] == 6
    assert meta["span_ns"] == 3500  # 1000 .. 4500 (the sync is a wait, not work)
    assert meta["devices"] == [{"device": 0, "name": "NVIDIA H200", "sm_count": 132}]
    assert "dropped 1 GPU activities without valid timestamps" in meta["warnings"]
    assert "left out 1 NVTX ranges that never ended" in meta["warnings"]

    gpu = rows(
        store,
        refs,
        """SELECT g.kind, n.name, g.start_ns, g.end_ns, g.device, g.stream,
        g.correlation, g.copy_kind, g.src_kind, g.dst_kind, g.sync_kind, g.bytes, g.is_comm
        FROM gpu g JOIN names n USING (trace_id, name_id) ORDER BY g.start_ns, g.kind""",
    )
    assert gpu == [
        ("kernel", "gemm_kernel(float*)", 1000, 2000, 0, 7, 1, None, None, None, None, None, False),
        ("kernel", "triton_fused_add", 2500, 3000, 0, 7, 2, None, None, None, None, None, False),
        ("memcpy", "Memcpy HtoD (Pageable -> Device)", 3000, 3500, 0, 7, 3, "HtoD", "pageable",
         "device", None, 1024, False),
        ("memset", "Memset (Device)", 3600, 3700, 0, 7, 4, None, None, "device", None, 64, False),
        ("sync", "Stream Sync", 3700, 4000, 0, -1, 5, None, None, None, "stream_sync", None, False),
        ("kernel", NCCL_KERNEL, 4000, 4500, 0, 13, 6, None, None, None, None, None, True),
    ]  # fmt: skip
    launch = rows(
        store,
        refs,
        """SELECT grid_x, grid_y, grid_z, block_x, registers_per_thread,
        static_shared_mem_bytes, dynamic_shared_mem_bytes, shared_mem_bytes, est_occupancy_pct
        FROM gpu WHERE correlation = 1""",
    )
    assert launch == [(4, 2, 1, 256, 40, 1024, 2048, 3072, None)]

    host = rows(
        store,
        refs,
        """SELECT h.kind, n.name, h.tid, h.start_ns, h.end_ns, h.correlation
        FROM host h JOIN names n USING (trace_id, name_id) ORDER BY h.start_ns, h.kind""",
    )
    assert host == [
        ("runtime", "cudaGetDevice", 101, 700, 710, None),
        ("annotation", "data_loading", 101, 800, 880, None),
        ("annotation", "step 0", 101, 800, 4600, None),
        ("osrt", "read", 101, 810, 870, None),
        ("runtime", "cudaLaunchKernel", 101, 900, 950, 1),
        ("driver", "cuLaunchKernel", 101, 2000, 2100, 2),
        ("runtime", "cudaMemcpyAsync", 101, 2950, 3600, 3),
        ("runtime", "cudaMemsetAsync", 101, 3550, 3590, 4),
        ("runtime", "cudaStreamSynchronize", 101, 3650, 4050, 5),
        ("annotation", "ncclAllReduce", 102, 3890, 3960, None),
        ("runtime", "cudaLaunchKernelExC", 102, 3900, 3950, 6),
    ]
    assert {r[0] for r in rows(store, refs, "SELECT DISTINCT pid FROM host")} == {100}

    ranges = rows(
        store,
        refs,
        """SELECT r.kind, n.name, r.domain, r.tid, r.device, r.stream,
        r.start_ns, r.end_ns, r.step FROM ranges r JOIN names n USING (trace_id, name_id)
        ORDER BY r.kind, r.start_ns""",
    )
    assert ranges == [
        # Projected on the GPU: what the range's own thread launched inside it.
        ("gpu_annotation", "step 0", None, None, 0, 7, 1000, 3700, 0),
        ("gpu_annotation", "ncclAllReduce", "NCCL", None, 0, 13, 4000, 4500, None),
        ("nvtx", "data_loading", None, 101, None, None, 800, 880, None),
        ("nvtx", "ncclAllReduce", "NCCL", 102, None, None, 3890, 3960, None),
        ("step", "step 0", None, 101, None, None, 800, 4600, 0),
    ]
    coll = rows(
        store,
        refs,
        """SELECT c.rank, c.device, c.stream, c.op, c.order_in_group,
        c.from_metadata, c.correlation, c.start_ns FROM collectives c""",
    )
    assert coll == [(0, 0, 13, "allreduce", 0, True, 6, 4000)]
    threads = rows(store, refs, "SELECT pid, tid, kind, name FROM threads ORDER BY kind, tid")
    assert threads == [(100, None, "process", "python3"), (100, 101, "thread", "main"),
                       (100, 102, "thread", "comm")]  # fmt: skip
    dev = rows(
        store,
        refs,
        """SELECT device, name, sm_count, regs_per_sm, smem_per_sm,
        smem_per_block_optin, max_threads_per_sm, max_blocks_per_sm, warp_size FROM devices""",
    )
    assert dev == [(0, "NVIDIA H200", 132, 65536, 233472, 232448, 2048, 32, 32)]


def test_canonical_schemas_equal_kinetos(store, tmp_path):
    from tests.conftest import SAMPLES

    _, (nsys,) = ingest_one(store, tiny().write(tmp_path / "tiny.sqlite"))
    _, (kineto,) = ingest_one(store, SAMPLES / "kineto" / "healthy" / "healthy.pt.trace.json.gz")
    from stallscope.schema import TABLE_NAMES

    for table in TABLE_NAMES:
        ours = pq.read_schema(nsys.table_path(table)).remove_metadata()
        theirs = pq.read_schema(kineto.table_path(table)).remove_metadata()
        assert ours.equals(theirs), table


def test_gzipped_export_matches_plain(store, tmp_path):
    _, (a,) = ingest_one(store, tiny().write(tmp_path / "tiny.sqlite"))
    _, (b,) = ingest_one(store, tiny().write(tmp_path / "tiny.sqlite.gz"))
    for table in ("gpu", "host", "ranges", "collectives"):
        ta = pq.read_table(a.table_path(table)).drop_columns(["trace_id"])
        tb = pq.read_table(b.table_path(table)).drop_columns(["trace_id"])
        assert ta.equals(tb), table


def two_processes(mpi: bool) -> NsysBuilder:
    """pids 200 (GPU 0) and 201 (GPU 1) reuse the same correlation ids 1 and 2."""
    b = NsysBuilder("new")
    for pid, dev, ctx in ((200, 0, 1), (201, 1, 2)):
        b.process(pid, "python3", {pid: "main"})
        b.kernel(pid, dev, 7, 1000 + dev, 2000, 1, f"fwd_{pid}", context=ctx)
        b.api(pid, pid, 900 + dev, 950, 1, "cudaLaunchKernel_v7000")
        b.kernel(pid, dev, 7, 3000, 4000, 2, f"bwd_{pid}", context=ctx)
        b.api(pid, pid, 2900, 2950, 2, "cudaLaunchKernel_v7000")
        # nsys writes deviceId 0 on sync rows; the context says which GPU waited.
        b.sync(pid, 0, 7, 4000, 4100, 3, "EVENT_SYNCHRONIZE", context=ctx)
        b.api(pid, pid, 3990, 4150, 3, "cudaEventSynchronize_v3020")
        b.nvtx(pid, pid, 800, 4200, "step 0")
        b.gpu(dev)
        if mpi:
            b.mpi_rank(pid, pid, 201 - pid)  # deliberately the reverse of the GPU order
    return b


@pytest.mark.parametrize("mpi", [False, True])
def test_two_processes_are_two_ranks_joined_per_process(store, tmp_path, mpi):
    result, refs = ingest_one(store, two_processes(mpi).write(tmp_path / "job.sqlite"))
    assert [r.meta["rank"] for r in refs] == [0, 1]
    pid_of = {r.meta["rank"]: rows(store, [r], "SELECT DISTINCT pid FROM host")[0][0] for r in refs}
    assert pid_of == ({0: 201, 1: 200} if mpi else {0: 200, 1: 201})
    assert all(r.meta["world_size"] == 2 for r in refs)
    assert {r.meta["name"] for r in refs} == {
        "job.sqlite (pid 200, GPU 0)",
        "job.sqlite (pid 201, GPU 1)",
    }
    warned = any("ranks assigned by GPU index" in w for w in result.warnings)
    assert warned != mpi
    for ref in refs:
        pid = pid_of[ref.meta["rank"]]
        device = pid - 200
        # Launches joined within the trace (= within the process): each kernel meets its own call.
        joined = rows(
            store,
            [ref],
            """SELECT n.name, h.start_ns FROM gpu g
            JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation
            JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id
            WHERE g.kind = 'kernel' ORDER BY g.start_ns""",
        )
        assert joined == [(f"fwd_{pid}", 900 + device), (f"bwd_{pid}", 2900)]
        assert rows(store, [ref], "SELECT DISTINCT device FROM gpu") == [(device,)]
        assert rows(store, [ref], "SELECT count(*) FROM ranges WHERE kind = 'step'") == [(1,)]


def test_one_process_on_two_gpus_is_split_per_gpu(store, tmp_path):
    b = NsysBuilder("new")
    b.process(300, "python3", {300: "main"})
    for dev in (0, 1):
        b.gpu(dev)
        b.kernel(300, dev, 7, 1000, 2000, 10 + dev, f"k{dev}", context=dev + 1)
        b.api(300, 300, 900 + dev, 950, 10 + dev, "cudaLaunchKernel_v7000")
    b.api(300, 300, 100, 200, None, "cudaGetDeviceCount_v3020")
    b.nvtx(300, 300, 50, 3000, "step 7")
    result, refs = ingest_one(store, b.write(tmp_path / "dp.sqlite"))
    assert [(r.meta["rank"], r.meta["name"]) for r in refs] == [
        (0, "dp.sqlite (pid 300, GPU 0)"),
        (1, "dp.sqlite (pid 300, GPU 1)"),
    ]
    for dev, ref in enumerate(refs):
        names = rows(
            store,
            [ref],
            """SELECT n.name FROM host h JOIN names n USING (trace_id, name_id)
            WHERE h.kind = 'runtime' ORDER BY h.start_ns""",
        )
        # The call that launched the other GPU's kernel stays out; the uncorrelated one is in both.
        assert names == [("cudaGetDeviceCount",), ("cudaLaunchKernel",)]
        assert rows(store, [ref], "SELECT start_ns FROM host WHERE correlation IS NOT NULL") == [
            (900 + dev,)
        ]
        assert rows(store, [ref], "SELECT step FROM ranges WHERE kind = 'step'") == [(7,)]
    assert any("ranks assigned by process order" in w for w in result.warnings)


def test_single_process_files_take_rank_from_file_name(store, tmp_path):
    paths = []
    for rank in (1, 0):
        b = NsysBuilder("new")
        b.process(400 + rank, "python3")
        b.kernel(400 + rank, 0, 7, 1000, 2000, 1, "k")
        paths.append(str(b.write(tmp_path / f"rank{rank}.sqlite")))
    (result,) = ingest_paths(store, paths)
    refs = store.traces(result.job_id)
    assert sorted((r.meta["rank"], r.meta["file_name"].rsplit("/", 1)[-1]) for r in refs) == [
        (0, "rank0.sqlite"),
        (1, "rank1.sqlite"),
    ]


def test_nccl_payload_gives_rank_size_and_bytes(store, tmp_path):
    b = NsysBuilder("new")
    b.process(500, "python3", {500: "main"})
    b.kernel(500, 0, 13, 2000, 2500, 1, NCCL_KERNEL)
    b.api(500, 500, 1500, 1550, 1, "cudaLaunchKernel_v7000")
    b.domain(500, 500, 3, "NCCL")
    init = '{"NCCL communicator ID": 77, "No. of ranks": 8, "Rank": 5, "CUDA device": 0}'
    b.nvtx(500, 500, 100, 900, "ncclCommInitRankConfig", domain_id=3, json=init)
    op = '{"NCCL communicator ID": 77, "Message size [bytes]": 4096, "Reduction operation": "Sum"}'
    b.nvtx(500, 500, 1400, 1600, "ncclAllReduce", domain_id=3, json=op)
    _, (ref,) = ingest_one(store, b.write(tmp_path / "x.sqlite"))
    assert (ref.meta["rank"], ref.meta["world_size"], ref.meta["backend"]) == (5, 8, "nccl")
    coll = rows(
        store,
        [ref],
        "SELECT rank, pg_name, group_size, op, in_bytes, from_metadata FROM collectives",
    )
    assert coll == [(5, "77", 8, "allreduce", 4096, True)]


def test_unnamed_nccl_domain_and_profiler_steps(store, tmp_path):
    b = NsysBuilder("new")
    b.process(600, "python3", {600: "main"})
    b.kernel(600, 0, 7, 2000, 2500, 1, "ncclDevKernel_SendRecv")
    b.api(600, 600, 1500, 1550, 1, "cudaLaunchKernel_v7000")
    b.nvtx(600, 600, 1400, 1450, "ncclSend", domain_id=4)  # domain never created in the file
    b.nvtx(600, 600, 1450, 1600, "ncclGroupEnd", domain_id=4)
    b.nvtx(600, 600, 1000, 3000, "ProfilerStep#12")
    b.nvtx(600, 600, 1100, 2900, "step 3")  # not a step: the process has ProfilerStep ranges
    _, (ref,) = ingest_one(store, b.write(tmp_path / "x.sqlite"))
    got = rows(
        store,
        [ref],
        """SELECT r.kind, n.name, r.domain, r.step FROM ranges r
        JOIN names n USING (trace_id, name_id) WHERE r.kind <> 'gpu_annotation' ORDER BY r.start_ns""",
    )
    assert got == [
        ("step", "ProfilerStep#12", None, 12),
        ("nvtx", "step 3", None, None),
        ("nvtx", "ncclSend", "NCCL", None),
        ("nvtx", "ncclGroupEnd", "NCCL", None),
    ]
    assert rows(store, [ref], "SELECT op, from_metadata FROM collectives") == [("sendrecv", True)]


# -- bad input: one line, exit 3, store unchanged, no temporary file left --------------------


def _fails(cli, tmp_path, path, reason):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    done = cli("ingest", str(path), env={"TMPDIR": str(tmp)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3, done.stderr
    assert len(lines) == 1 and reason in lines[0], lines
    assert not any(cli.store_dir.glob("jobs/*")) and not any(cli.store_dir.glob("staging/*"))
    assert not any(tmp.iterdir())
    return lines[0]


def test_truncated_export_fails(cli, tmp_path):
    data = tiny().write(tmp_path / "full.sqlite").read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 2])
    _fails(cli, tmp_path, cut, "truncated SQLite file")


def test_truncated_gzipped_export_fails(cli, tmp_path):
    import gzip

    data = tiny().write(tmp_path / "full.sqlite").read_bytes()
    cut = tmp_path / "cut.sqlite.gz"
    cut.write_bytes(gzip.compress(data[: len(data) - 4096]))
    _fails(cli, tmp_path, cut, "truncated SQLite file")


def test_corrupt_export_fails(cli, tmp_path):
    data = bytearray(tiny().write(tmp_path / "full.sqlite").read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = b"\xff" * (len(data) - page)  # every page after the first: garbage
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(bytes(data))
    _fails(cli, tmp_path, bad, "corrupt or unreadable SQLite database")


def test_sqlite_that_is_not_an_export_fails(cli, tmp_path):
    import sqlite3

    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")  # a name nsys uses, nothing else
    con.commit()
    con.close()
    _fails(cli, tmp_path, path, "not an nsys export")


def test_cpu_only_export_fails(cli, tmp_path):
    b = tiny().drop(*[t for t in NsysBuilder().tables if t.startswith("CUPTI_")])
    _fails(cli, tmp_path, b.write(tmp_path / "cpu.sqlite"), "CPU-only capture")


def test_export_without_kernel_table_fails(cli, tmp_path):
    b = tiny().drop("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                    "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")  # fmt: skip
    line = _fails(cli, tmp_path, b.write(tmp_path / "nokernel.sqlite"), "without GPU activity")
    assert "no CUPTI_ACTIVITY_KIND_KERNEL" in line and "8 CUDA API calls" in line


# -- .nsys-rep / .qdrep ---------------------------------------------------------------------

REPORTS = sorted(CORPUS.rglob("*.nsys-rep")) + sorted(CORPUS.rglob("*.qdrep"))
needs_report = pytest.mark.corpus


@needs_report
def test_report_without_nsys_gives_the_export_command(cli, tmp_path):
    report = REPORTS[0]
    done = cli("ingest", str(report), env={"PATH": str(tmp_path), "STALLSCOPE_NSYS": ""})
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    stem = str(report).rsplit(".", 1)[0]
    command = (
        f"nsys export --type sqlite -o {shlex.quote(stem + '.sqlite')} {shlex.quote(str(report))}"
    )
    assert command in line and "nsys was not found" in line
    assert not any(cli.store_dir.glob("jobs/*"))


@needs_report
def test_report_is_exported_with_nsys_and_cached(cli, tmp_path):
    export = tiny().write(tmp_path / "made_by_fake_nsys.sqlite")
    bindir, log = tmp_path / "bin", tmp_path / "nsys.log"
    bindir.mkdir()
    fake = bindir / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {shlex.quote(str(log))}\n'
        'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
        f'cp {shlex.quote(str(export))} "$out"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "STALLSCOPE_NSYS_CACHE": str(tmp_path / "cache")}  # fmt: skip
    report = REPORTS[0]
    for attempt, store_dir in enumerate((tmp_path / "s1", tmp_path / "s2")):
        done = cli("ingest", "--json", str(report), store=store_dir, env=env)
        assert done.returncode == 0, done.stderr
        calls = log.read_text().splitlines()
        assert len(calls) == 1, calls  # the second ingest reads the cached export
        assert calls[0].startswith("export --type sqlite")
        assert calls[0].endswith(str(report))
        (trace,) = [p for p in (store_dir / "jobs").glob("*/*") if (p / "meta.json").is_file()]
        gpu = pq.read_table(trace / "gpu.parquet")
        assert gpu.num_rows == 6, attempt
    assert len(list((tmp_path / "cache").glob("*.sqlite"))) == 1


def test_report_export_failure_is_an_input_error(store, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"
    fake.write_text("#!/bin/sh\necho 'Error: unsupported report version' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("STALLSCOPE_NSYS", str(fake))
    monkeypatch.setenv("STALLSCOPE_NSYS_CACHE", str(tmp_path / "cache"))
    report = tmp_path / "x.nsys-rep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report 2099@1@1\n" + b"\0" * 64)
    with pytest.raises(
        InputError, match=r"nsys export failed \(exit 1: Error: unsupported report version\)"
    ):
        ingest_paths(store, [str(report)])
    assert not any(store.jobs_dir.iterdir())
    assert not any((tmp_path / "cache").glob("*"))
