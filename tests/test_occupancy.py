"""occupancy: hand-computed occupancy on four GPU generations, agreement with Nsight Compute on
every profiled kernel we have, and the H200 sample's planted low-occupancy kernel found alike
from the timeline alone and with ncu."""

from __future__ import annotations

import json

import pytest

from stallscope.analyzers import occupancy as analyzer
from stallscope.gpu_specs import ARCHES, device_limits, occupancy, regs_for_blocks, smem_for_blocks
from stallscope.ingest import ingest_paths
from stallscope.ingest.ncu.csv_pages import to_base
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, SAMPLES
from tests.test_ncu_ingest import kernel, raw_page

NCU = SAMPLES / "ncu"
KINETO = SAMPLES / "kineto" / "occupancy" / "occupancy.pt.trace.json.gz"
TRUTH = json.loads((SAMPLES / "kineto" / "occupancy" / "occupancy.truth.json").read_text())


def arch(name: str, sms: int = 100):
    return device_limits({"name": name, "sm_count": sms}) or ARCHES[name]


@pytest.mark.parametrize(
    "dev, threads, regs, smem, pct, limiter",
    [
        # V100 (sm_70): 64 regs x 32 = 2048/warp; 16384/2048 = 8 warps per sub-partition -> 32 warps -> 4 blocks
        ("V100", 256, 64, 0, 50.0, ["registers"]),
        # V100: 48 KiB static, no reserve, 256 B units: 98304 // 49152 = 2 blocks x 4 warps = 8 of 64
        ("V100", 128, 32, 49152, 12.5, ["shared_memory"]),
        # A100 (sm_80): 40960 + 1024 reserved = 41984 B, 167936 // 41984 = 4 blocks x 4 warps
        ("A100", 128, 32, 40960, 25.0, ["shared_memory"]),
        # A100: 41000 + 1024 -> 42112 (128 B units): only 3 blocks fit (4 without the reserve)
        ("A100", 128, 32, 41000, 18.75, ["shared_memory"]),
        # H100 (sm_90): 1024 threads x 64 regs = 65536 registers: 1 block of 32 warps
        ("H100", 1024, 64, 0, 50.0, ["registers"]),
        # H100: 72 regs -> 2304/warp x 32 warps = 73728 > 65536: cannot launch
        ("H100", 1024, 72, 0, 0.0, ["registers"]),
        # H200 sample GEMM: 168 regs -> 5376/warp, 3 warps per sub-partition = 12 = 1 block; smem 1 block
        ("H200", 384, 168, 213188, 18.75, ["registers", "shared_memory"]),
        # B200 (sm_100): 768 threads (24 warps) x 40 regs: 1280/warp, 12 per sub-partition = 48 warps = 2 blocks
        ("B200", 768, 40, 0, 75.0, ["registers", "warps"]),
        # MI300X (gfx942): 4 waves x 128 VGPRs (8192 per wave): 4 waves per SIMD = 16 per CU = 4 blocks of 32
        ("MI300X", 256, 128, 0, 50.0, ["registers"]),
        # MI300X: 32 KiB of LDS per workgroup: 2 per CU x 4 waves = 8 of 32
        ("MI300X", 256, 32, 32768, 25.0, ["shared_memory"]),
        # MI250: one-wave workgroups are not held to 16 per CU: 32 waves
        ("MI250", 64, 32, 0, 100.0, ["warps", "blocks"]),
        # MI250: 128-thread (2-wave) workgroups: 16 per CU x 2 = 32 waves (tie with warps)
        ("MI250", 128, 32, 0, 100.0, ["warps", "blocks"]),
    ],
)
def test_hand_computed_occupancy(dev, threads, regs, smem, pct, limiter):
    occ = occupancy(arch(dev), threads, regs, smem)
    assert occ.occupancy_pct == pytest.approx(pct)
    assert occ.limiters == limiter


def test_concrete_fix_numbers():
    h100 = arch("H100")
    # 1 block of 205824 B; 2 blocks need <= 233472 // 2 = 116736 -> 116736 - 1024 = 115712 B each
    assert smem_for_blocks(h100, 2) == 115712
    assert occupancy(h100, 32, 16, 115712).blocks_per_sm == 2
    assert occupancy(h100, 32, 16, 115713).blocks_per_sm == 1
    # 2 blocks of 12 warps: 6 warps per sub-partition -> 16384 // 6 = 2730 -> 2560/warp = 80 regs
    assert regs_for_blocks(h100, 384, 2) == 80
    assert occupancy(h100, 384, 80, 0).blocks_per_sm == 2
    assert occupancy(h100, 384, 88, 0).blocks_per_sm == 1


def test_device_limits_from_kineto_properties_and_tables():
    h200 = {"name": "NVIDIA H200", "compute_major": 9, "compute_minor": 0, "sm_count": 132,
            "regs_per_sm": 65536, "regs_per_block": 65536, "smem_per_sm": 233472,
            "smem_per_block_optin": 232448, "max_threads_per_sm": 2048, "warp_size": 32}  # fmt: skip
    dev = device_limits(h200)
    assert (dev.arch, dev.max_warps_per_sm, dev.max_blocks_per_sm, dev.reserved_smem_per_block) == (
        "sm_90",
        64,
        32,
        1024,
    )
    assert dev.source == "trace + built-in table"
    amd = device_limits({"name": "AMD Radeon Graphics", "warp_size": 64, "sm_count": 104})
    assert (amd.arch, amd.max_warps_per_sm, amd.sm_count) == ("gfx90a", 32, 104)
    assert device_limits({"compute_major": 8, "compute_minor": 6}).max_warps_per_sm == 48
    assert device_limits({"name": "mystery"}) is None


def _ncu_kernels(job: JobData, trace: str) -> list[dict]:
    """Per profiled kernel: launch configuration and ncu's own occupancy numbers."""
    rows = job.sql(
        "SELECT kernel_index, metric, value, unit, block_x * block_y * block_z FROM kernel_metrics "
        "WHERE trace_id = ? AND value IS NOT NULL AND metric IN ('launch__registers_per_thread', "
        "'launch__shared_mem_per_block_static', 'launch__shared_mem_per_block_dynamic', "
        "'sm__maximum_warps_per_active_cycle_pct', 'Registers Per Thread', 'Theoretical Occupancy', "
        "'Static Shared Memory Per Block', 'Dynamic Shared Memory Per Block')",
        [trace],
    ).fetchall()
    kernels: dict[int, dict] = {}
    for index, metric, value, unit, threads in rows:
        kernels.setdefault(index, {"threads": threads})[metric] = to_base(value, unit)
    return [{"index": i, **k} for i, k in sorted(kernels.items())]


def _agreement(store, path) -> list[tuple]:
    """(kernel, ours, ncu's) for every kernel of one ncu page that ncu could measure."""
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    (ref,) = job.traces
    cur = job.sql("SELECT * FROM devices WHERE trace_id = ?", [ref.trace_id])
    dev = device_limits(dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True)))
    out = []
    for k in _ncu_kernels(job, ref.trace_id):
        ncu = k.get("sm__maximum_warps_per_active_cycle_pct", k.get("Theoretical Occupancy"))
        if ncu is None:
            continue  # replay failed (sglang's flash-attention kernel): nothing to compare
        regs = k.get("launch__registers_per_thread", k.get("Registers Per Thread"))
        static = k.get(
            "launch__shared_mem_per_block_static", k.get("Static Shared Memory Per Block")
        )
        dynamic = k.get(
            "launch__shared_mem_per_block_dynamic", k.get("Dynamic Shared Memory Per Block")
        )
        ours = occupancy(dev, k["threads"], int(regs), round(static + dynamic)).occupancy_pct
        out.append((k["index"], ours, ncu))
    job.close()
    return out


NCU_PAGES = [NCU / "occupancy.raw.csv"] + sorted((CORPUS / "ncu-csv").glob("*.raw.csv.gz"))
NCU_PAGES += [CORPUS / "nsightful" / "copy_blocked.csv"]  # details page only (T4, sm_75)


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.corpus) if CORPUS in p.parents else p for p in NCU_PAGES],
    ids=lambda p: p.name,
)
def test_theoretical_occupancy_equals_ncu_for_every_profiled_kernel(store, path):
    rows = _agreement(store, path)
    assert rows, path
    for index, ours, ncu in rows:
        assert abs(ours - ncu) <= 0.1, (path.name, index, ours, ncu)


def _run(store, paths, **params):
    (res,) = ingest_paths(store, [str(p) for p in paths])
    job = JobData(store, store.traces(res.job_id))
    result = analyzer.run(job, analyzer.SPEC.params(params))
    job.close()
    return result


def _flagged(result) -> dict[str, object]:
    return {
        f.evidence["kernel"]: f
        for f in result.findings
        if f.evidence.get("key", "").startswith("kernel-")
    }


def _table(result) -> dict[str, dict]:
    (table,) = [f for f in result.findings if f.evidence.get("key") == "table"]
    return {row["kernel"]: row for row in table.evidence["kernels"]}


def test_sample_timeline_only(store):
    result = _run(store, [KINETO])
    planted = TRUTH["expected_findings"][0]
    (finding,) = _flagged(result).values()
    assert finding.evidence["kernel"] == planted["kernel"] and finding.severity == "high"
    assert finding.evidence["limiter"] == [planted["limiter"]]
    assert finding.evidence["theoretical_occupancy_pct"] == planted["theoretical_occupancy_pct"]
    assert "115712 B per block allows 2 blocks" in finding.recommendation
    # one warp per block: the budget for half occupancy, and bigger blocks
    assert "6272 B per block allows 32 blocks per SM (50% occupancy)" in finding.recommendation
    assert (
        "With 32 threads per block even 32 blocks per SM reach only 50%" in finding.recommendation
    )
    assert "not measured" in finding.detail and "ncu --set full" in finding.detail
    assert len(finding.windows) == 3
    assert not [
        f for f in result.findings if f.severity not in ("info", "high")
    ]  # GEMM: not above low
    rows = _table(result)
    gemm = rows["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]
    assert (gemm["theoretical_occupancy_pct"], gemm["limiter"]) == (
        18.75,
        ["registers", "shared_memory"],
    )
    assert gemm["kineto_est_achieved_occupancy_pct"] == 0.0  # Kineto's estimate, shown as such
    assert rows["well_occupied_axpy_kernel"]["theoretical_occupancy_pct"] == 100.0
    weighted = sum(r["theoretical_occupancy_pct"] * r["gpu_ns"] for r in rows.values()) / sum(
        r["gpu_ns"] for r in rows.values()
    )
    metrics = {m.name: m.value for m in result.metrics}
    assert metrics["occupancy_weighted_pct"] == round(weighted, 3)


def test_sample_with_ncu_agrees_and_explains(store):
    alone = _flagged(_run(store, [KINETO]))
    result = _run(store, [KINETO, NCU / "occupancy.raw.csv", NCU / "occupancy.details.csv"])
    flagged = _flagged(result)
    assert flagged.keys() == alone.keys() == {"low_occupancy_smem_kernel"}
    low, before = flagged["low_occupancy_smem_kernel"], alone["low_occupancy_smem_kernel"]
    assert (low.severity, low.evidence["limiter"]) == (before.severity, before.evidence["limiter"])
    ncu = low.evidence["ncu"]
    assert ncu["limiter"] == ["shared_memory"] and ncu["bound"] == "latency"
    assert ncu["achieved_occupancy_pct"] == pytest.approx(1.5625)
    assert ncu["top_stalls"][0]["reason"] == "long_scoreboard"
    assert "latency-bound" in low.detail
    gemm = _table(result)["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]["ncu"]
    assert gemm["bound"] == "compute" and gemm["compute_sol_pct"] > 90  # near its peak: not flagged
    assert (
        gemm["theoretical_occupancy_pct"] == 18.75 and gemm["roofline"]["flop_per_dram_byte"] > 100
    )
    metrics = {m.name: m.value for m in result.metrics}
    assert 7 < metrics["achieved_occupancy_weighted_pct"] < metrics["occupancy_weighted_pct"]


def test_details_page_alone_says_what_is_not_measured(store):
    result = _run(store, [NCU / "occupancy.details.csv"])
    low = _flagged(result)["low_occupancy_smem_kernel"]
    assert low.evidence["source"] == "ncu" and low.evidence["limiter"] == ["shared_memory"]
    assert "not measured" in low.evidence["ncu"]["top_stalls"]  # stall reasons are raw-page metrics
    assert "not measured" in low.evidence["ncu"]["roofline"]


COMMON = {
    "launch__registers_per_thread": "register/thread",
    "launch__shared_mem_per_block_static": "byte/block",
    "launch__shared_mem_per_block_dynamic": "byte/block",
    "sm__maximum_warps_per_active_cycle_pct": "%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "%",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__time_duration.sum": "ms",
}


def _ncu_only(tmp_path, name, regs, theo, achieved, sm, mem, block=256) -> str:
    cells = dict(zip(COMMON, [str(regs), "0", "0", theo, achieved, sm, mem, "5"], strict=True))
    text = raw_page([kernel(0, name=name, **{"Block Size": f"({block}, 1, 1)"}, **cells)], COMMON)
    path = tmp_path / f"{name}.raw.csv"
    path.write_text(text)
    return str(path)


def test_register_heavy_kernel_near_speed_of_light_is_not_flagged(store, tmp_path):
    # 255 regs x 256 threads: 8192 per warp, 2 warps per sub-partition = 1 block of 8 warps = 12.5 %
    path = _ncu_only(tmp_path, "my_matmul", 255, "12.5", "12.1", "85", "40")
    result = _run(store, [path])
    assert _flagged(result) == {}
    row = _table(result)["my_matmul"]
    assert row["theoretical_occupancy_pct"] == 12.5 and row["ncu"]["bound"] == "compute"
    slow = _run(store, [_ncu_only(tmp_path, "my_slow_matmul", 255, "12.5", "12.1", "20", "15")])
    (finding,) = _flagged(slow).values()
    assert (
        finding.evidence["limiter"] == ["registers"]
        and "__launch_bounds__(256, 2)" in finding.recommendation
    )


def test_achieved_far_below_theoretical(store, tmp_path):
    result = _run(store, [_ncu_only(tmp_path, "my_reduce", 32, "100", "35", "20", "30")])
    (finding,) = _flagged(result).values()
    assert finding.evidence["kind"] == "achieved_gap" and finding.severity == "high"
    assert finding.impact_ns == round(5_000_000 * (1 - 0.35))  # 1 launch of 5 ms
    near_gap = _run(store, [_ncu_only(tmp_path, "my_reduce2", 32, "100", "85", "20", "30")])
    assert _flagged(near_gap) == {}


def test_library_kernels_without_ncu_are_one_info_finding_claiming_no_time(store, tmp_path):
    from tests.kineto_builder import KinetoTrace

    t = KinetoTrace(device_props=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                   "computeMinor": 0, "numSms": 108}])  # fmt: skip
    for i in range(
        20
    ):  # a cuBLAS GEMM at 12.5 %; a custom kernel: 128 regs x 16 warps = 1 block, 25 %
        t.kernel("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn", i * 100_000, 60_000,
                 grid=(108, 1, 1), block=(256, 1, 1), regs=232, smem=0)  # fmt: skip
        t.kernel(
            "my_kernel",
            i * 100_000 + 60_000,
            30_000,
            grid=(1000, 1, 1),
            block=(512, 1, 1),
            regs=128,
        )
    result = _run(store, [t.write(tmp_path / "a100.json")], min_impact_ms=0)
    library = [f for f in result.findings if f.evidence.get("key") == "library"]
    assert len(library) == 1 and library[0].severity == "info" and library[0].impact_ns == 0
    (mine,) = _flagged(result).values()
    assert (
        mine.evidence["kernel"] == "my_kernel"
        and mine.evidence["theoretical_occupancy_pct"] == 25.0
    )


def test_grids_under_one_wave_are_named_in_the_headline(store, tmp_path):
    """1-block grids on a 108-SM A100: 100 % theoretical occupancy per SM, but 107 SMs empty.
    The 1000-block kernel (2 blocks of 512 threads per SM: 216 slots) is over four waves."""
    from tests.kineto_builder import KinetoTrace

    t = KinetoTrace(device_props=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                   "computeMinor": 0, "numSms": 108}])  # fmt: skip
    for i in range(30):
        t.kernel("tiny", i * 10_000, 3_000, grid=(1, 1, 1), block=(256, 1, 1), regs=16)
    t.kernel("big", 400_000, 10_000, grid=(1000, 1, 1), block=(512, 1, 1), regs=32)
    (table,) = [
        f
        for f in _run(store, [t.write(tmp_path / "w.json")]).findings
        if f.evidence.get("key") == "table"
    ]
    assert table.evidence["under_one_wave_pct"] == 90.0  # 90 of 100 µs of kernel time
    assert table.title.endswith(
        "; 90% of compute-kernel time in grids with fewer blocks than SMs (SMs left empty)"
    )


def test_grids_under_one_wave_leave_out_nccl_and_grids_over_the_sm_count(store, tmp_path):
    """On a 132-SM H200: an NCCL kernel of 2 blocks (it waits, it does not compute) and a
    200-block grid (1.5 blocks per SM: under one wave of 3 blocks per SM, yet every SM busy)
    are not "SMs left empty"; a 64-block GEMM is, for 20 of the 100 µs."""
    from tests.kineto_builder import H100, KinetoTrace

    t = KinetoTrace(device_props=[dict(H100, name="NVIDIA H200")])
    t.kernel(
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0, 50_000, grid=(2, 1, 1), block=(640, 1, 1)
    )
    t.kernel("fill", 60_000, 30_000, grid=(200, 1, 1), block=(256, 1, 1), regs=64)
    t.kernel("small_gemm", 100_000, 20_000, grid=(64, 1, 1), block=(256, 1, 1), regs=64)
    (table,) = [
        f
        for f in _run(store, [t.write(tmp_path / "w.json")]).findings
        if f.evidence.get("key") == "table"
    ]
    assert table.evidence["under_one_wave_pct"] == 20.0
    assert "fewer blocks than SMs" not in table.title  # under 25 %


# --- measure, then speak (docs/architecture.md) -------------------------------------------


def a100_gemm_and_kernel():
    """20 rounds on a 108-SM A100 of a cuBLAS GEMM (60 µs; 232 regs x 256 threads: 7424 regs
    per warp, 2 warps per sub-partition = 1 block of 8 warps = 12.5 %) and a custom kernel
    (30 µs; 128 regs x 512 threads = 65536 regs: 1 block of 16 warps = 25 %)."""
    from tests.kineto_builder import KinetoTrace

    t = KinetoTrace(device_props=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                   "computeMinor": 0, "numSms": 108}])  # fmt: skip
    for i in range(20):
        t.kernel("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn", i * 100_000, 60_000,
                 grid=(108, 1, 1), block=(256, 1, 1), regs=232, smem=0)  # fmt: skip
        t.kernel("my_kernel", i * 100_000 + 60_000, 30_000, grid=(1000, 1, 1), block=(512, 1, 1),
                 regs=128)  # fmt: skip
    return t


def test_measurement_by_hand(store, tmp_path):
    (res,) = ingest_paths(store, [str(a100_gemm_and_kernel().write(tmp_path / "a100.json"))])
    job = JobData(store, store.traces(res.job_id))
    params = analyzer.SPEC.params({"min_impact_ms": 0})
    (m,) = analyzer.measure(job, params)
    assert (m.where.rank, m.where.device, m.source, m.kineto) == (0, 0, "timeline", True)
    assert m.total_ns == 20 * 90_000 and m.limits.sm_count == 108
    gemm, mine = m.kernels  # most GPU time first
    assert (gemm.gpu_ns, gemm.theoretical_occupancy_pct, gemm.blocks_per_sm) == (1_200_000, 12.5, 1)
    assert (mine.gpu_ns, mine.theoretical_occupancy_pct, mine.limiter) == (
        600_000,
        25.0,
        ["registers"],
    )
    assert mine.waves_per_sm == round(1000 / 108, 3) and gemm.waves_per_sm == 1.0
    assert m.weighted_pct == pytest.approx((12.5 * 1.2 + 25 * 0.6) / 1.8)
    assert m.low_time_pct == 100.0 and m.under_sm_count_pct == 0.0  # both under 50 %, grids >= 108
    assert m.achieved_weighted_pct is None  # no Nsight Compute
    # lost = time x (1 - occupancy / 50 %): 1.2 ms x 0.75 and 0.6 ms x 0.5
    assert [(f.kernel.kernel[:6], f.kind, f.lost_ns, f.library) for f in m.low] == [
        ("ampere", "low_theoretical", 900_000, True),
        ("my_ker", "low_theoretical", 300_000, False),
    ]
    assert m.low[1].windows[0] == [60_000, 90_000] and len(m.low[1].windows) == 20
    result = analyzer.run(job, params)
    assert analyzer.speak(m, params) == result.findings
    assert analyzer.metrics(m) == result.metrics
    assert analyzer.occupancy_rows(m) == result.tables.occupancy
    job.close()


def test_speaking_reads_the_measurement_only():
    import inspect

    assert list(inspect.signature(analyzer.speak).parameters) == ["m", "params"]
    assert len(inspect.signature(analyzer.metrics).parameters) == 1
    assert len(inspect.signature(analyzer.occupancy_rows).parameters) == 1


def hand_device(lost_ns: int, kind: str = "achieved_gap") -> analyzer.DeviceOccupancy:
    """A hand-made measurement of an ncu-only job: one 10 ms kernel at 100 % theoretical and 35 %
    achieved occupancy, 20 % of compute and 30 % of memory speed-of-light."""
    from stallscope.analyzers.base import Where

    ncu = {"achieved_occupancy_pct": 35.0, "compute_sol_pct": 20.0, "memory_sol_pct": 30.0,
           "bound": "latency", "top_stalls": [{"reason": "long_scoreboard", "share_pct": 40.0}]}  # fmt: skip
    k = analyzer.KernelOccupancy(
        kernel="my_reduce", launches=4, gpu_ns=10_000_000, share_pct=100.0, is_comm=False,
        grid=[64, 1, 1], block=[256, 1, 1], registers_per_thread=32, shared_mem_bytes=0,
        theoretical_occupancy_pct=100.0, occupancy_from="Nsight Compute", limiter=["warps"],
        blocks_per_sm=None, limits_blocks_per_sm=None, waves_per_sm=None, tail_idle_pct=None,
        kineto_est_achieved_occupancy_pct=None, ncu=ncu,
    )  # fmt: skip
    low = analyzer.LowOccupancy(kernel=k, kind=kind, achieved_pct=35.0, lost_ns=lost_ns, library=False)  # fmt: skip
    return analyzer.DeviceOccupancy(
        where=Where("t0", 0, None), source="ncu", kineto=False, limits=None,
        total_ns=10_000_000, kernels=[k], weighted_pct=100.0, low_time_pct=0.0,
        achieved_weighted_pct=35.0, under_sm_count_pct=0.0, low=[low],
    )  # fmt: skip


def test_findings_spoken_from_a_hand_made_measurement():
    params = analyzer.SPEC.params()
    low, table = analyzer.speak(hand_device(6_500_000), params)
    assert (low.severity, low.impact_ns, low.saving_ns) == ("high", 6_500_000, 6_500_000)
    assert (
        low.title == "my_reduce: achieved occupancy 35.0% of a theoretical 100.0%, 100% of GPU time"
    )
    assert low.detail.startswith("4 launches, 10.00 ms. Warps are active only 35.0% of the time")
    assert low.detail.endswith("Nsight Compute: latency-bound (compute 20%, memory 30% of peak); "
                               "top warp stalls: long_scoreboard 40.0%.")  # fmt: skip
    assert (low.evidence["kind"], low.evidence["source"], low.evidence["estimated_loss_ns"]) == (
        "achieved_gap", "ncu", 6_500_000
    )  # fmt: skip
    assert "occ" not in low.evidence
    assert table.title == "Nsight Compute kernels: GPU-time-weighted theoretical occupancy 100.0%"
    assert [r["kernel"] for r in table.evidence["kernels"]] == ["my_reduce"]
    # 0.3 ms lost is under the 0.5 ms floor: only the table finding is written
    (only,) = analyzer.speak(hand_device(300_000), params)
    assert only.evidence["key"] == "table"
    (row,) = analyzer.occupancy_rows(hand_device(300_000))
    assert (row.ncu_achieved_occupancy_pct, row.ncu_bound, row.ncu_top_stall) == (
        35.0, "latency", "long_scoreboard 40.0%"
    )  # fmt: skip
    assert [(m.name, m.value) for m in analyzer.metrics(hand_device(300_000))] == [
        ("occupancy_weighted_pct", 100.0),
        ("low_occupancy_time_pct", 0.0),
        ("achieved_occupancy_weighted_pct", 35.0),
    ]
