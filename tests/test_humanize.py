"""Evidence in human units and kernel names people can read and tell apart."""

from __future__ import annotations

import pandas as pd

from stallscope.humanize import (
    MISSING,
    dashed,
    evidence_tables,
    label,
    records_table,
    short_kernel_name,
    short_kernel_names,
    significant,
    value_text,
)

CLAMP = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::"
    "ClampLimits)::{lambda()#1}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "std::array<char*, 2u> >(int, at::native::FillFunctor<float>, std::array<char*, 2u>)"
)
FILL_F32 = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "std::array<char*, 1u> >(int, at::native::FillFunctor<float>, std::array<char*, 1u>)"
)
FILL_BF16 = FILL_F32.replace("FillFunctor<float>", "FillFunctor<c10::BFloat16>")
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)"


def test_short_name_drops_return_type_arguments_and_templates():
    assert short_kernel_name(FILL_F32) == "at::native::vectorized_elementwise_kernel<…>"
    assert short_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(Args<4096ul>)") == (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    )
    assert short_kernel_name("nvjet_sm90_tst_256x128") == "nvjet_sm90_tst_256x128"


def test_distinct_kernels_keep_distinct_short_names():
    names = [CLAMP, FILL_F32, FILL_BF16, GEMM, "nvjet_sm90_tst_256x128"]
    short = short_kernel_names(names)
    assert len(set(short)) == len(names)
    assert short[1] == "vectorized_elementwise_kernel<4, FillFunctor<float>, array<char*, 1u> >"
    assert short[2] == "vectorized_elementwise_kernel<4, FillFunctor<BFloat16>, array<char*, 1u> >"
    assert short[0].startswith("vectorized_elementwise_kernel<8, launch_clamp_scalar")
    assert short[3] == "Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
    assert all(len(s) < 90 for s in short)


def test_evidence_in_human_units():
    assert label("longest_gap_ns") == "Longest gap (ms)"
    assert label("share_of_span_pct") == "Share of span (%)"
    facts, tables = evidence_tables(
        {
            "key": "pageable_h2d",
            "longest_gap_ns": 30_950_663,
            "bytes": 335_544_320,
            "achieved_gbps": 8.8,
            "call_sites": [{"call_site": "aten::to", "count": 5, "gpu_ns": 38_121_403}],
            "idle_by_cause_ns": {"dataloader": 82_770},
        }
    )
    values = dict(zip(facts["what"], facts["value"], strict=True))
    assert values == {
        "Longest gap (ms)": "30.951",
        "Bytes (MiB)": "320.00",
        "Achieved (GB/s)": "8.80",
    }
    (sites_title, sites), (idle_title, idle) = tables
    assert sites_title == "Call sites" and list(sites["GPU (ms)"]) == ["38.121"]
    assert idle_title == "Idle by cause (ms)" and list(idle["Value (ms)"]) == ["0.083"]


def test_missing_values_and_lists_of_words_read_as_text():
    """None/NaN is a dash, not ``None``; a list of names is comma-joined, not ``['RING_LL']``."""
    assert value_text("count", None) == MISSING == "—"
    assert value_text("median_bytes", float("nan")) == "—"
    assert value_text("algorithms", ["RING_LL"]) == "RING_LL"
    assert value_text("algorithms", ["RING_LL", "TREE"]) == "RING_LL, TREE"
    assert value_text("shape", [8, 1024]) == "8 × 1024"
    table = records_table(
        [
            {"op": "allreduce", "algorithms": ["RING_LL"], "bytes": 2**20},
            {"op": "broadcast", "algorithms": [], "bytes": None},
        ]
    )
    assert list(table["Algorithms"]) == ["RING_LL", ""]
    assert list(table["Bytes (MiB)"]) == ["1.00", "—"]


def test_dashed_shows_a_dash_for_missing_numbers():
    frame = pd.DataFrame({"op": ["a", "b"], "step ms": [12.345, None], "count": [3, None]})
    shown = dashed(frame, {"step ms": "{:.1f}", "count": "{:,.0f}"})
    assert list(shown["step ms"]) == ["12.3", "—"] and list(shown["count"]) == ["3", "—"]
    assert list(shown["op"]) == ["a", "b"] and frame["step ms"].dtype == float  # a copy


def test_significant_keeps_numbers_numeric_and_small_values_visible():
    column = significant([62.41, 0.03123, None, 1234.5, 0.0, "n/a", float("nan"), 7])
    assert column.dtype == "float64"  # sorts as numbers, not as text
    assert column[:2].tolist() == [62.4, 0.0312] and column[3:5].tolist() == [1234.0, 0.0]
    assert column.isna().tolist() == [False, False, True, False, False, True, True, False]
    assert column[7] == 7.0 and significant([]).empty
