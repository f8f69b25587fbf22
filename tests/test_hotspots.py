"""hotspots: name rules, and the tables on a trace whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from stallscope.analyzers import hotspots
from stallscope.analyzers.hotspots import category_of, precision_of, tensor_cores_of
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from tests.conftest import CORPUS, REPO
from tests.kineto_builder import H100, KinetoTrace

# (kernel name, kind, is_comm) -> (category, precision, tensor cores); names from real traces
NAMES = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm", "bf16", "yes"),
    # the name does not say the precision (its _h_/_v_ is a tile layout: both run in one bf16 trace)
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm", "unknown", "yes"),
    # cuDNN's generated SDPA says f16 in a bf16 model too (H200 capture): 16-bit, not which
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0", "attention", "16-bit (bf16 or fp16)", "yes"),
    ("ampere_sgemm_128x64_nn", "gemm", "fp32", "no"),
    ("volta_sgemm_64x64_nt", "gemm", "fp32", "no"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align1>(Params)", "gemm", "tf32", "yes"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8>(Params)", "gemm", "fp16", "yes"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "gemm", "fp16", "yes"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32", "gemm", "tf32", "yes"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1", "gemm", "bf16", "yes"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8_SN", "gemm", "fp16", "yes"),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1", "gemm", "fp32", "yes"),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1", "gemm", "fp4", "unknown"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)", "attention", "bf16", "yes"),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1>(float)", "attention", "bf16", "yes"),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "convolution", "fp32", "no"),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int)", "convolution", "fp32", "no"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16", "convolution", "tf32", "yes"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x64x32_wt32x32x8_ws1x1_wr1x2", "convolution", "bf16", "yes"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float)", "normalization", "fp32", "unknown"),
    ("std::enable_if<vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(int)", "normalization", "bf16", "unknown"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)", "normalization", "fp32", "unknown"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int)", "elementwise", "fp32", "unknown"),
    ("triton_poi_fused_add_cos_sin_0", "elementwise", "unknown", "unknown"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int)", "memory", "fp32", "unknown"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*)", "memory", "fp32", "unknown"),
    # the parameter list (fbgemm_gpu::FixedDivisor, ...) must not make this a GEMM
    ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>(fbgemm_gpu::FixedDivisor, int)", "memory", "fp16", "unknown"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4> >(float)", "reduction", "fp32", "unknown"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16>(c10::BFloat16*)", "reduction", "bf16", "unknown"),
    ("triton_red_fused__to_copy_add_mean_pow_rsqrt_0", "reduction", "unknown", "unknown"),
    ("triton_tem_fused_mm_0", "gemm", "unknown", "unknown"),
    ("some_custom_kernel", "other", "unknown", "unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "category", "precision", "tensor_cores"), NAMES)
def test_name_rules(name, category, precision, tensor_cores):
    assert category_of(name) == category
    assert precision_of(name) == precision
    assert tensor_cores_of(name) == tensor_cores


def test_communication_and_copies_come_first():
    assert category_of("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", True) == "communication"
    assert category_of("rcclGenericKernel", "kernel", True) == "communication"
    assert category_of("Memcpy HtoD (Pinned -> Device)", "memcpy") == "memory"
    assert category_of("Memset (Device)", "memset") == "memory"


def hand_trace() -> KinetoTrace:
    """GPU 0 (ns), one thread; every kernel launched inside an operator unless noted:

    aten::mm        sm90_xmma_gemm_bf16bf16_bf16f32_f32   [10k, 110k)  100 µs
    aten::mm        the same GEMM                         [110k, 170k)  60 µs
    aten::addmm     ampere_sgemm_128x64_nn (cuLaunchKernel, driver API) [170k, 210k) 40 µs
    aten::add       vectorized_elementwise_kernel<add>    [210k, 230k)  20 µs
    (no launch)     ncclDevKernel_AllReduce (comm)        [230k, 260k)  30 µs
    aten::copy_     Memcpy HtoD (Pinned -> Device)        [260k, 270k)  10 µs
    aten::_flash_attention_forward  flash_fwd_kernel<bf16>  [270k, 300k)  30 µs
    GPU 1: one Tensile fp16 GEMM of 10 µs, no launch record.

    GPU 0: 290 µs of GPU time, 280 µs in kernels. gemm 200 (68.966 %), attention 30
    (10.345 %), communication 30, elementwise 20 (6.897 %), memory 10 (3.448 %).
    Matrix kernels 230 µs: bf16 190 (82.609 %), fp32 40 (17.391 %); Tensor Cores 190.
    """
    t = KinetoTrace(device_props=[H100])

    def launched(op, op_start, kernel, start, dur, api="cudaLaunchKernel", cat="cuda_runtime"):
        t.cpu_op(op, op_start, 8_000)
        t.runtime(api, op_start + 1_000, 2_000, corr=t.kernel(kernel, start, dur), cat=cat)

    launched("aten::mm", 0, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 10_000, 100_000)
    launched("aten::mm", 20_000, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 110_000, 60_000)
    launched(
        "aten::addmm",
        40_000,
        "ampere_sgemm_128x64_nn",
        170_000,
        40_000,
        "cuLaunchKernel",
        "cuda_driver",
    )
    launched(
        "aten::add",
        60_000,
        "void at::native::vectorized_elementwise_kernel<4, add>(int)",
        210_000,
        20_000,
    )
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 230_000, 30_000, stream=20)
    t.cpu_op("aten::copy_", 70_000, 8_000)
    t.runtime(
        "cudaMemcpyAsync",
        71_000,
        2_000,
        corr=t.memcpy("HtoD", "Pinned", "Device", 260_000, 10_000, 1 << 20),
    )
    launched(
        "aten::_flash_attention_forward", 80_000,
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, cutlass::bfloat16_t>>(Params)",
        270_000, 30_000,
    )  # fmt: skip
    t.kernel("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8_SN", 0, 10_000, device=1)
    return t


@pytest.fixture
def hand(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params())
    job.close()
    metrics = {(m.device, m.name): m.value for m in result.metrics}
    return metrics, {f.device: f for f in result.findings}


def test_category_metrics(hand):
    metrics, _ = hand
    expected = {"gemm": 68.966, "attention": 10.345, "communication": 10.345}
    expected |= {"elementwise": 6.897, "memory": 3.448}
    for category in hotspots.CATEGORIES:
        assert metrics[(0, f"gpu_time_pct_{category}")] == expected.get(category, 0.0), category
    assert metrics[(0, "tensor_core_pct")] == 82.609
    assert metrics[(1, "gpu_time_pct_gemm")] == 100.0
    assert metrics[(1, "tensor_core_pct")] == 100.0


def test_top_kernels(hand):
    _, findings = hand
    f = findings[0]
    assert f.severity == "info" and f.impact_ns == 0
    top = f.evidence["top_kernels"]
    assert [k["name"][:20] for k in top] == [
        "sm90_xmma_gemm_bf16b",
        "ampere_sgemm_128x64_",
        "ncclDevKernel_AllRed",  # ties (30 µs) in name order
        "void pytorch_flash::",
        "void at::native::vec",
    ]
    assert top[0] | {"name": None} == {
        "name": None,
        "category": "gemm",
        "precision": "bf16",
        "tensor_cores": "yes",
        "count": 2,
        "total_ns": 160_000,
        "share_pct": 57.143,  # of 280 µs of kernel time
        "mean_ns": 80_000,
        "median_ns": 80_000,
        "bound": "unknown (no Nsight Compute profile)",
    }
    assert f.windows == [[10_000, 110_000], [110_000, 170_000]]  # the top kernel, longest first
    assert f.evidence["gpu_ns"] == 290_000 and f.evidence["kernel_ns"] == 280_000


def test_top_operators(hand):
    _, findings = hand
    ops = {o["name"]: o for o in findings[0].evidence["top_ops"]}
    assert ops["aten::mm"] == {
        "name": "aten::mm",
        "gpu_ns": 160_000,
        "kernels": 2,
        "calls": 2,
        "share_pct": 55.172,
    }
    assert ops["aten::addmm"]["gpu_ns"] == 40_000  # launched through the driver API
    assert ops["aten::_flash_attention_forward"]["gpu_ns"] == 30_000
    assert ops["(no launch record)"]["gpu_ns"] == 30_000  # the NCCL kernel
    assert ops["aten::copy_"]["gpu_ns"] == 10_000  # copies count too
    assert findings[0].evidence["top_ops"][0]["name"] == "aten::mm"


def test_precision_and_advice(hand, store, tmp_path):
    _, findings = hand
    ev = findings[0].evidence
    assert ev["matrix_ns"] == 230_000
    assert ev["precision"] == {
        "bf16": {"ns": 190_000, "pct": 82.609},
        "fp32": {"ns": 40_000, "pct": 17.391},
    }
    assert ev["tensor_cores"]["no"] == {"ns": 40_000, "pct": 17.391}
    assert ev["fp32_no_tensor_core_pct"] == 17.391
    assert "allow_tf32" not in findings[0].recommendation  # 17.4 % < fp32_matmul_pct (20)
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t2.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params({"fp32_matmul_pct": 10, "top_n": 2}))
    job.close()
    f = next(f for f in result.findings if f.device == 0)
    assert "allow_tf32" in f.recommendation
    assert len(f.evidence["top_kernels"]) == 2 and len(f.evidence["top_ops"]) == 2


def test_healthy_sample(store):
    """bf16 MLP on an H200: cuBLAS nvjet GEMMs on Tensor Cores dominate."""
    folder = REPO / "sample_traces" / "kineto" / "healthy"
    (res,) = ingest_paths(store, [str(p) for p in folder.glob("*.json.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params())
    job.close()
    metrics = {(m.device, m.name): m.value for m in result.metrics}
    assert metrics[(0, "gpu_time_pct_gemm")] > 80
    assert metrics[(0, "tensor_core_pct")] == 100.0
    (f,) = result.findings
    assert f.severity == "info"
    assert f.evidence["top_kernels"][0]["name"].startswith("nvjet_sm90")
    assert f.evidence["top_ops"][0]["name"] in ("aten::addmm", "aten::mm")


@pytest.mark.corpus
def test_corpus_fp32_gemms_get_the_tf32_advice(store):
    """PARAM's linear benchmark on a V100 runs volta_sgemm (FP32, no Tensor Cores)."""
    (res,) = ingest_paths(store, [str(CORPUS / "param/linear_kineto.json.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params())
    job.close()
    (f,) = result.findings
    assert f.evidence["top_kernels"][0]["name"].startswith("volta_sgemm")
    assert f.evidence["fp32_no_tensor_core_pct"] > 90
    assert "allow_tf32" in f.recommendation


def test_reports_hold_plain_json_values(store):
    """Metrics and evidence of all three analyzers are plain JSON types (no numpy scalars)."""
    from stallscope.analyzers import host_sync, memcpy

    folder = REPO / "sample_traces" / "kineto" / "pageable_sync"
    (res,) = ingest_paths(store, [str(p) for p in folder.glob("*.json.gz")])
    job = JobData(store, store.traces(res.job_id))

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or type(value) in (int, float, str, bool)

    for module in (host_sync, memcpy, hotspots):
        result = module.run(job, module.SPEC.params())
        assert result.findings, module.SPEC.id
        for finding in result.findings:
            # the analyzer's own evidence, not only the report's copy (to_dict turns NumPy
            # scalars into Python numbers on the way out)
            assert plain(finding.evidence), (module.SPEC.id, finding.evidence)
            assert plain(finding.to_dict()), (module.SPEC.id, finding.evidence)
        assert all(plain(m.to_dict()) for m in result.metrics), module.SPEC.id
        assert all(plain(m.value) for m in result.metrics), module.SPEC.id
    job.close()


def lead_trace(lead: str) -> KinetoTrace:
    """GPU 0: one 100 µs operation of the given kind, then a 20 µs bf16 GEMM and a 10 µs add.

    The lead operation is 100 / 130 = 77 % of GPU time; memory-bound kernels are
    10 / 130 = 7.7 % (under memory_bound_pct), so only the lead's advice is given.
    """
    t = KinetoTrace(device_props=[H100])
    if lead == "copy":
        t.memcpy("HtoD", "Pageable", "Device", 0, 100_000, 64 << 20)
    else:
        name = {
            "comm": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_big",
            "custom": "void moe_router_kernel<float>(float*, int)",
        }[lead]
        t.kernel(name, 0, 100_000)
    t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 100_000, 20_000)
    t.kernel("void at::native::vectorized_elementwise_kernel<4, add>(int)", 120_000, 10_000)
    return t


@pytest.mark.parametrize(
    "lead, says, not_says",
    [
        ("copy", ["77%", "pin_memory", "memcpy"], ["torch.compile", "cuBLAS", "Nsight Compute"]),
        ("comm", ["77%", "overlap", "nccl_wait"], ["cuBLAS", "torch.compile", "pin_memory"]),
        ("gemm", ["77%", "shapes", "cuBLAS"], ["Nsight Compute", "nccl_wait", "pin_memory"]),
        ("custom", ["moe_router_kernel", "Nsight Compute"], ["cuBLAS", "nccl_wait", "pin_memory"]),
    ],
)
def test_advice_fits_the_lead_work(store, tmp_path, lead, says, not_says):
    (res,) = ingest_paths(store, [str(lead_trace(lead).write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params())
    job.close()
    (f,) = result.findings
    assert f.evidence["memory_bound_pct"] == round(100 * 10 / 130, 3)  # copies are not counted
    assert all(s in f.recommendation for s in says), f.recommendation
    assert not any(s in f.recommendation for s in not_says), f.recommendation


@pytest.mark.parametrize(
    "scenario, rank, says, not_says",
    [
        ("pageable_sync", 0, "pin_memory", "torch.compile"),  # a 64 MiB pageable H2D copy leads
        ("ddp_straggler", 0, "nccl_wait", "cuBLAS"),  # rank 0's NCCL kernels wait for rank 1
    ],
)
def test_sample_advice_fits_the_lead_work(store, scenario, rank, says, not_says):
    folder = REPO / "sample_traces" / "kineto" / scenario
    (res,) = ingest_paths(store, [str(p) for p in folder.glob("*.json.gz")])
    job = JobData(store, store.traces(res.job_id))
    result = hotspots.run(job, hotspots.SPEC.params())
    job.close()
    f = next(f for f in result.findings if f.rank == rank)
    assert says in f.recommendation and not_says not in f.recommendation, f.recommendation
