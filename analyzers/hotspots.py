"""``hotspots``: where each GPU's time goes — top kernels, top operators, categories, precision.

Per trace and device (docs/analyzers/hotspots.md), over the device's kernels,
memcpys and memsets (durations summed, not unioned: this is a profile, not a
timeline):

* top kernels by total GPU time: name, category, count, total, share of
  kernel time, mean and median duration;
* top CPU operators by the GPU time they launched: every GPU operation is
  joined to its launch call (correlation id) and charged to the innermost
  ``cpu_op`` enclosing that call on the same thread (what the ``External id``
  join gives on current Kineto, and still right on old schemas where the
  runtime's ``External id`` is its correlation id);
* kernel categories by name rules (:data:`CATEGORY_RULES`, first match wins;
  communication is ``gpu.is_comm``, copies and memsets are ``memory``);
* precision and Tensor Core use of matrix kernels (GEMM, attention,
  convolution) read from kernel names (:func:`precision_of`, :func:`tensor_cores_of`).

One ``info`` finding per device with the tables in ``evidence``; metrics
``gpu_time_pct_<category>`` and ``tensor_core_pct``; the same tables as the
report's ``kernels``, ``kernel_categories`` and ``operators`` (typed rows).
"""

from __future__ import annotations

import re
from functools import lru_cache

import msgspec
import numpy as np

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
)
from stallscope.host_ops import enclosing_ops, name_lookup, op_stack
from stallscope.jobdata import JobData
from stallscope.report_types import KernelCategoryRow, KernelRow, OperatorRow, Tables
from stallscope.scope import scope_sql

THRESHOLDS = (
    Threshold("top_n", 10, "rows", "rows in the top-kernel and top-operator tables", minimum=1),
    Threshold(
        "fp32_matmul_pct",
        20.0,
        "%",
        "share of matrix-kernel time in FP32 without Tensor Cores that triggers the TF32/bf16 advice",
        maximum=100,
    ),
    Threshold(
        "memory_bound_pct",
        40.0,
        "%",
        "share of GPU time in elementwise, normalization, reduction and memory kernels (not "
        "memcpy/memset copies) that triggers the fusion advice",
        maximum=100,
    ),
)
MAX_WINDOWS = 20
NEAR_SOL_PCT = 60.0  # as occupancy's near_sol_pct: throughput at which a kernel is bound by it
MATRIX = ("gemm", "attention", "convolution")
FUSIBLE = ("elementwise", "normalization", "reduction", "memory")  # memory-bound kernel categories
CATEGORIES = (
    "communication",
    "memory",
    "attention",
    "convolution",
    "gemm",
    "normalization",
    "reduction",
    "elementwise",
    "other",
)
# Kernel-name rules, case-insensitive, tried in order (communication and
# memcpy/memset rows are decided before these, from is_comm and kind).
CATEGORY_RULES = (
    # torch.compile (Inductor) kernels say what they are in their prefix
    ("gemm", r"^triton_tem_"),
    ("reduction", r"^triton_(red|per)_"),
    ("elementwise", r"^triton_poi_"),
    (
        "attention",
        r"flash|fmha|attention|attn|sdpa|mha_|_mha|xformers|mem_eff|paged_?att",
    ),
    (
        "normalization",
        r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|bn_fw|bn_bw|welford"
        r"|gammabeta|rowwisemoments|computefusedparams|computeinternalgradients|computebackwardfused",
    ),
    (
        "convolution",
        r"conv(?!ert)|dgrad|wgrad|fprop|winograd|implicit_gemm|im2col|col2im|scudnn|hcudnn"
        r"|igemm_(fwd|bwd|wrw)|fft2d|fft1d_[rc]2[rc]|flip_filter|miopen|depthwise",
    ),
    (
        "gemm",
        r"(?<!fb)gemm|gemv|matmul|cublas|xmma|wgmma|nvjet|^cijk_|cutlass|splitkreduce|bmm"
        r"|dot_kernel|mfma",
    ),
    ("elementwise", r"rotary|rope_"),
    (
        "memory",
        r"copy|fill|memset|memcpy|transpose|nchwtonhwc|nhwctonchw|catarray|concat|_cat_|permute"
        r"|scatter|gather|index|embedding|kvcache|kv_cache",
    ),
    (
        "reduction",
        r"reduce|softmax|argmax|argmin|topk|cumsum|cumprod|scan|logsumexp|nll_loss|cross_entropy"
        r"|nllcriterion|pool|sort|radix|histogram|bincount|unique",
    ),
    (
        "elementwise",
        r"elementwise|vectorized|unrolled|pointwise|functor|multi_tensor_apply"
        r"|activation|relu|gelu|silu|swiglu|sigmoid|tanh|dropout|adam|sgd|clamp|threshold"
        r"|rotary|rope|tensorop|scale|quant",
    ),
)
_RULES = tuple((cat, re.compile(rx, re.I)) for cat, rx in CATEGORY_RULES)

# Precision from names, first match wins. Tensile (rocBLAS/hipBLASLt) names
# are read from their type token instead (Cijk_Ailk_Bljk_<type>...).
PRECISION_RULES = (
    ("fp4", r"fp4|nvf4|mxf4|e2m1"),
    ("fp8", r"fp8|e4m3|e5m2|f8f6f4|_f8_|qmma"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"fp16|(?<!b)f16|half|h16816|h1688|h884|hgemm|hmma"),
    ("tf32", r"tf32|s1688|xf32"),
    ("int8", r"int8|i8816|imma|_i8_|s8s8|u8s8"),
    ("fp64", r"dgemm|zgemm|fp64|f64|double"),
    ("fp32", r"sgemm|scudnn|cgemm|fp32|f32|float|ffma"),
)
_PRECISION = tuple((p, re.compile(rx, re.I)) for p, rx in PRECISION_RULES)
SIXTEEN_BIT = "16-bit (bf16 or fp16)"  # a name that says 16 bits but not which
# cuDNN's generated kernels say f16 for both: a bf16 model's SDPA runs
# cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_… (H200 capture).
_CUDNN_16 = re.compile(r"^cudnn_generated.*_f16_", re.I)
_TENSILE = re.compile(r"^cijk_a[a-z]+_b[a-z]+_([a-z0-9]+)", re.I)
_TENSILE_TYPES = {"b": "bf16", "h": "fp16", "s": "fp32", "d": "fp64", "i": "int8", "f": "fp8"}
_NO_TENSOR_CORES = re.compile(
    r"sgemm|scudnn|dgemm|cgemm|gemv|gemmsn|implicit_convolve|explicit_convolve|winograd"
    r"|wgrad_alg[01]|dgrad_engine|dgrad_alg|fft|im2col|naive",
    re.I,
)
_TENSOR_CORES = re.compile(
    r"tensorop|xmma|wgmma|hmma|imma|qmma|mma_|_mma|h16816|h1688|s1688|i8816|h884|16816|1688"
    r"|nvjet|flash|fmha|mfma|xdl|gtcx|_mi\d+x\d+|sm[89]0_|sm100_|ampere_.*(h|bf16)gemm|turing_.*h\d+gemm",
    re.I,
)


def kernel_head(name: str) -> str:
    """A kernel name without its parameter list (template arguments kept).

    The rules look at the kernel and its template arguments only: parameter
    types (``fbgemm_gpu::FixedDivisor``, ``float const*``) would mislead them.
    """
    text = name.replace("(anonymous namespace)", "anon")
    depth = 0
    for i, char in enumerate(text):
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif char == "(" and depth == 0 and i > 0:
            return text[:i]
    return text


@lru_cache(maxsize=1 << 16)  # a pure function of the name; ranks share kernels
def category_of(name: str, kind: str = "kernel", is_comm: bool = False) -> str:
    """The kernel's category by :data:`CATEGORY_RULES` (see docs/analyzers/hotspots.md)."""
    if is_comm:
        return "communication"
    if kind in ("memcpy", "memset"):
        return "memory"
    head = kernel_head(name)
    for category, pattern in _RULES:
        if pattern.search(head):
            return category
    return "other"


@lru_cache(maxsize=1 << 16)  # a pure function of the name; ranks share kernels
def precision_of(name: str) -> str:
    """Numeric precision the kernel name shows, or ``unknown``."""
    clean = re.sub(r"fp8kvcachedatatype", "", kernel_head(name), flags=re.I)
    tensile = _TENSILE.match(clean)
    if tensile:
        return _TENSILE_TYPES.get(tensile.group(1)[0].lower(), "unknown")
    if _CUDNN_16.search(clean):
        return SIXTEEN_BIT
    for precision, pattern in _PRECISION:
        if pattern.search(clean):
            return precision
    return "unknown"


@lru_cache(maxsize=1 << 16)  # a pure function of the name; ranks share kernels
def tensor_cores_of(name: str) -> str:
    """``yes``/``no``/``unknown``: whether the kernel name shows Tensor Core (MMA/MFMA) use."""
    head = kernel_head(name)
    if _NO_TENSOR_CORES.search(head):
        return "no"
    if _TENSOR_CORES.search(head):
        return "yes"
    return "unknown"


# Only GPU work inside the step scope when the trace has steps (stallscope.scope.scope_sql).
_KERNELS_SQL = """
SELECT g.device, g.name_id, g.kind, bool_or(coalesce(g.is_comm, false)) AS is_comm, count(*) AS count,
       sum(g.end_ns - g.start_ns) AS total_ns, median(g.end_ns - g.start_ns) AS median_ns
FROM gpu g WHERE g.trace_id = ? AND g.kind IN ('kernel', 'memcpy', 'memset') AND {scope}
GROUP BY g.device, g.name_id, g.kind
"""

_LAUNCHES_SQL = """
SELECT g.device, h.pid, h.tid, h.start_ns, h.end_ns,
       sum(g.end_ns - g.start_ns) AS gpu_ns, count(*) AS ops
FROM gpu g JOIN host h
  ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
WHERE g.trace_id = ? AND g.kind IN ('kernel', 'memcpy', 'memset') AND {scope}
GROUP BY g.device, h.pid, h.tid, h.start_ns, h.end_ns
"""


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        _trace(job, result, ref.trace_id, rank, params)
    return result


def _trace(job: JobData, result: AnalyzerResult, trace: str, rank: int, params: dict) -> None:
    for profile in measure_trace(job, Where(trace, rank), params):
        result.metrics.extend(metrics(profile))
        result.tables.extend(tables(profile))
        result.findings.append(speak(profile, params))


def measure_trace(job: JobData, where: Where, params: dict) -> list[DeviceProfile]:
    """The profile of each device of trace ``where.trace`` with GPU work, by device."""
    trace = where.trace
    kernels = {
        k: np.asarray(v)
        for k, v in job.numpy(
            _KERNELS_SQL.replace("{scope}", scope_sql(job, trace)), [trace]
        ).items()
    }
    if kernels["device"].size == 0:
        return []
    names = name_lookup(job, trace, kernels["name_id"])
    name = np.array([names.get(int(i), "?") for i in kernels["name_id"]], dtype=object)
    # classification runs once per distinct (name, kind), not per event
    category = np.array(
        [
            category_of(n, k, bool(c))
            for n, k, c in zip(name, kernels["kind"], kernels["is_comm"], strict=True)
        ],
        dtype=object,
    )
    precision = np.array([precision_of(n) for n in name], dtype=object)
    tensor = np.array([tensor_cores_of(n) for n in name], dtype=object)
    ops = _top_ops(job, trace)
    out = []
    for device in np.unique(kernels["device"]).tolist():
        m = kernels["device"] == device
        table = {
            "name": name[m],
            "name_id": kernels["name_id"][m],
            "kind": kernels["kind"][m],
            "count": kernels["count"][m].astype(np.int64),
            "total_ns": kernels["total_ns"][m].astype(np.int64),
            "median_ns": kernels["median_ns"][m].astype(np.float64),
            "category": category[m],
            "precision": precision[m],
            "tensor_cores": tensor[m],
        }
        on = Where(trace, where.rank, int(device))
        out.append(measure_device(job, on, table, ops.get(device, []), params))
    return out


def _top_ops(job: JobData, trace: str) -> dict[int, list[dict]]:
    """Per device: [{name, gpu_ns, kernels, calls}] for every operator that launched GPU work."""
    launches = {
        k: np.asarray(v)
        for k, v in job.numpy(
            _LAUNCHES_SQL.replace("{scope}", scope_sql(job, trace)), [trace]
        ).items()
    }
    if launches["device"].size == 0:
        return {}
    stack = op_stack(job, trace)
    inner, _ = enclosing_ops(
        stack, launches["pid"], launches["tid"], launches["start_ns"], launches["end_ns"]
    )
    op_name_id = np.full(inner.size, -1, dtype=np.int64)
    op_name_id[inner >= 0] = stack.name_id[inner[inner >= 0]]
    names = name_lookup(job, trace, op_name_id)
    out: dict[int, list[dict]] = {}
    for device in np.unique(launches["device"]).tolist():
        m = launches["device"] == device
        ids, inverse = np.unique(op_name_id[m], return_inverse=True)
        gpu_ns = np.bincount(inverse, weights=launches["gpu_ns"][m], minlength=ids.size)
        kernels = np.bincount(inverse, weights=launches["ops"][m], minlength=ids.size)
        # operator instances per name: each distinct enclosing operator counted once
        distinct_ops, first = np.unique(inner[m], return_index=True)
        calls = np.bincount(inverse[first[distinct_ops >= 0]], minlength=ids.size)
        rows = [
            {
                "name": names.get(int(i), "(no operator)") if i >= 0 else "(no operator)",
                "gpu_ns": int(gpu_ns[j]),
                "kernels": int(kernels[j]),
                "calls": int(calls[j]) if i >= 0 else None,
            }
            for j, i in enumerate(ids.tolist())
        ]
        rows.sort(key=lambda r: -r["gpu_ns"])
        out[int(device)] = rows
    return out


class DeviceProfile(msgspec.Struct, kw_only=True):
    """What one device's GPU time is made of: :func:`measure_device`'s numbers and tables.

    Durations are summed ns over the device's kernels, memcpys and memsets in
    the step scope; percentages are unrounded unless a table says otherwise.
    No prose: :func:`speak` writes the finding from it.
    """

    where: Where
    gpu_ns: int  # kernels, memcpys and memsets
    kernel_ns: int
    kernel_launches: int  # kernels run (sum of counts)
    kernel_names: int  # distinct kernel names
    category_ns: dict[str, int]  # every category of CATEGORIES, 0 when absent
    categories: list[dict]  # [{category, gpu_ns, pct}], most time first, absent ones left out
    matrix_ns: int  # GEMM, attention and convolution kernels
    precision: dict[str, dict]  # {precision: {ns, pct of matrix_ns}}
    precision_inferred: dict | None  # infer_matrix_precision
    tensor_cores: dict[str, dict]  # {yes|no|unknown: {ns, pct of matrix_ns}}
    top_kernels: list[dict]  # top_n rows, see docs/analyzers/hotspots.md
    top_ops: list[dict]  # top_n rows
    fp32_no_tensor_core_pct: float  # % of matrix_ns in FP32 kernels without Tensor Cores
    memory_bound_pct: float  # % of gpu_ns in FUSIBLE kernels
    lead: dict | None  # _lead: the row with the most GPU time
    multi_tensor: bool  # the optimizer already runs foreach/fused kernels
    windows: list[list[int]]  # the longest launches of the top kernel

    @property
    def tensor_core_pct(self) -> float:
        return self.tensor_cores.get("yes", {}).get("pct", 0.0)


def measure_device(
    job: JobData, where: Where, t: dict, ops: list[dict], params: dict
) -> DeviceProfile:
    """One device's profile from its per-name table ``t`` (see :func:`_trace`; its
    ``precision`` column gets the inferred 16-bit type) and its operators ``ops``
    (:func:`_top_ops`); ``params['top_n']`` rows per table."""
    top_n = int(params["top_n"])
    gpu_ns = int(t["total_ns"].sum())
    is_kernel = t["kind"] == "kernel"
    kernel_ns = int(t["total_ns"][is_kernel].sum())
    cat_ns = {c: int(t["total_ns"][t["category"] == c].sum()) for c in CATEGORIES}
    matrix = np.isin(t["category"], MATRIX)
    matrix_ns = int(t["total_ns"][matrix].sum())
    inferred = infer_matrix_precision(t, matrix)
    if inferred:
        t["precision"] = np.where(
            matrix & np.isin(t["precision"], ["unknown", SIXTEEN_BIT]),
            inferred["precision"],
            t["precision"],
        )
    order = np.lexsort((t["name"].astype(str), -t["total_ns"]))
    top = [i for i in order if is_kernel[i]][:top_n]
    bounds = ncu_bounds(job, where.trace, params)
    fp32_no_tc = matrix & (t["precision"] == "fp32") & (t["tensor_cores"] == "no")
    fusible = is_kernel & np.isin(t["category"], FUSIBLE)  # copies are not fusible kernels
    return DeviceProfile(
        where=where,
        gpu_ns=gpu_ns,
        kernel_ns=kernel_ns,
        kernel_launches=int(t["count"][is_kernel].sum()),
        kernel_names=int(is_kernel.sum()),
        category_ns=cat_ns,
        categories=[
            {"category": c, "gpu_ns": cat_ns[c], "pct": _pct(cat_ns[c], gpu_ns)}
            for c in sorted(CATEGORIES, key=lambda c: -cat_ns[c])
            if cat_ns[c]
        ],
        matrix_ns=matrix_ns,
        precision=_shares(t["precision"][matrix], t["total_ns"][matrix], matrix_ns),
        precision_inferred=inferred,
        tensor_cores=_shares(t["tensor_cores"][matrix], t["total_ns"][matrix], matrix_ns),
        top_kernels=[_kernel_row(t, i, kernel_ns, bounds) for i in top],
        top_ops=_op_rows(ops, gpu_ns, top_n),
        fp32_no_tensor_core_pct=100.0 * t["total_ns"][fp32_no_tc].sum() / matrix_ns
        if matrix_ns
        else 0.0,
        memory_bound_pct=100.0 * t["total_ns"][fusible].sum() / gpu_ns if gpu_ns else 0.0,
        lead=_lead(t, order, bounds),
        multi_tensor=multi_tensor_optimizer(t["name"][is_kernel]),
        windows=_windows(job, where.trace, where.device, t["name_id"][top[0]]) if top else [],
    )


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def _kernel_row(t: dict, i: int, kernel_ns: int, bounds: dict[str, str]) -> dict:
    """Row ``i`` of the per-name table as a top-kernel table row."""
    return {
        "name": str(t["name"][i]),
        "category": str(t["category"][i]),
        "precision": str(t["precision"][i]),
        "tensor_cores": str(t["tensor_cores"][i]),
        "count": int(t["count"][i]),
        "total_ns": int(t["total_ns"][i]),
        "share_pct": round(float(100.0 * t["total_ns"][i] / kernel_ns), 3) if kernel_ns else 0.0,
        "mean_ns": int(round(t["total_ns"][i] / t["count"][i])),
        "median_ns": int(round(t["median_ns"][i])),
        "bound": bounds.get(str(t["name"][i]), BOUND_UNKNOWN),
    }


def _op_rows(ops: list[dict], gpu_ns: int, top_n: int) -> list[dict]:
    """The top operators with their share of GPU time; GPU time no launch record
    explains is a row of its own (``(no launch record)``)."""
    unlaunched = gpu_ns - sum(row["gpu_ns"] for row in ops)
    if unlaunched > 0:
        ops = sorted(
            [
                *ops,
                {
                    "name": "(no launch record)",
                    "gpu_ns": unlaunched,
                    "kernels": None,
                    "calls": None,
                },
            ],
            key=lambda r: -r["gpu_ns"],
        )
    return [
        dict(row, share_pct=round(100.0 * row["gpu_ns"] / gpu_ns, 3) if gpu_ns else 0.0)
        for row in ops[:top_n]
    ]


def metrics(m: DeviceProfile) -> list[Metric]:
    """``gpu_time_pct_<category>`` for every category; ``tensor_core_pct`` when there
    are matrix kernels."""
    w = m.where
    out = [
        Metric(
            w.trace, w.rank, w.device, f"gpu_time_pct_{c}", _pct(m.category_ns[c], m.gpu_ns), "%"
        )
        for c in CATEGORIES
    ]
    if m.matrix_ns:
        out.append(Metric(w.trace, w.rank, w.device, "tensor_core_pct", m.tensor_core_pct, "%"))
    return out


def tables(m: DeviceProfile) -> Tables:
    """The device's rows of the report's ``kernels``, ``kernel_categories`` and ``operators``
    tables (the same rows as the finding's evidence)."""
    w = {"trace": m.where.trace, "rank": m.where.rank, "device": m.where.device}
    return Tables(
        kernels=[KernelRow(**w, **row) for row in m.top_kernels],
        kernel_categories=[KernelCategoryRow(**w, **row) for row in m.categories],
        operators=[OperatorRow(**w, **row) for row in m.top_ops],
    )


def speak(m: DeviceProfile, params: dict) -> Finding:
    """The device's ``info`` finding: title, detail and advice from its profile."""
    head = m.top_kernels[0] if m.top_kernels else None
    cats_text = ", ".join(f"{c['category']} {c['pct']:.0f}%" for c in m.categories[:4])
    title = f"GPU {m.where.device} time: {cats_text}" + (
        f"; top kernel {_short(head['name'])} {head['share_pct']:.0f}% of kernel time"
        if head
        else ""
    )
    detail = (
        f"{m.gpu_ns / 1e6:.2f} ms of GPU operations ({m.kernel_ns / 1e6:.2f} ms in "
        f"{m.kernel_launches} kernels of {m.kernel_names} distinct names)."
    )
    if m.matrix_ns:
        prec_text = ", ".join(f"{p} {v['pct']:.0f}%" for p, v in m.precision.items())
        detail += (
            f" Matrix kernels (GEMM, attention, convolution) take {m.matrix_ns / 1e6:.2f} ms: {prec_text}; "
            f"{m.tensor_core_pct:.0f}% recognisably on Tensor Cores."
        )
    if m.top_ops:
        detail += (
            f" Top operator: {m.top_ops[0]['name']} ({m.top_ops[0]['share_pct']:.0f}% of GPU time)."
        )
    return Finding(
        analyzer="hotspots",
        trace=m.where.trace,
        rank=m.where.rank,
        device=m.where.device,
        severity="info",
        title=title,
        detail=detail,
        recommendation=_recommendation(
            m.fp32_no_tensor_core_pct,
            m.memory_bound_pct,
            m.category_ns,
            m.gpu_ns,
            m.lead,
            params,
            m.multi_tensor,
        ),
        impact_ns=0,
        evidence={
            "gpu_ns": m.gpu_ns,
            "kernel_ns": m.kernel_ns,
            "top_kernels": m.top_kernels,
            "top_ops": m.top_ops,
            "categories": m.categories,
            "matrix_ns": m.matrix_ns,
            "precision": m.precision,
            "precision_inferred": m.precision_inferred,
            "tensor_cores": m.tensor_cores,
            "fp32_no_tensor_core_pct": round(float(m.fp32_no_tensor_core_pct), 3),
            "memory_bound_pct": round(float(m.memory_bound_pct), 3),
        },
        windows=m.windows,
    )


def _shares(labels: np.ndarray, ns: np.ndarray, whole: int) -> dict[str, dict]:
    if not whole:
        return {}
    keys, inverse = np.unique(labels.astype(str), return_inverse=True)
    sums = np.bincount(inverse, weights=ns, minlength=keys.size)
    order = np.argsort(-sums, kind="stable")
    return {
        str(keys[i]): {"ns": int(sums[i]), "pct": round(float(100.0 * sums[i] / whole), 3)}
        for i in order
    }


BOUND_UNKNOWN = "unknown (no Nsight Compute profile)"
_SIXTEEN_BIT = (("bf16", re.compile(r"bfloat16|bf16", re.I)), ("fp16", re.compile(r"(?<![a-z])half|c10::half|__half|fp16", re.I)))  # fmt: skip
MULTI_TENSOR = re.compile(r"multi_tensor_apply|_foreach_|fused_adam|fusedadam|fused_sgd|fusedsgd|fused_lamb", re.I)  # fmt: skip


def infer_matrix_precision(t: dict, matrix: np.ndarray) -> dict | None:
    """The 16-bit type of matrix kernels whose names do not say it (cuBLAS ``nvjet_*``,
    flash kernels without template types, cuDNN's ``_f16_`` that means either 16-bit
    type), from the device's other kernels.

    Under autocast the element-wise, reduction and optimizer kernels around the
    GEMMs name their element type (``c10::BFloat16``, ``c10::Half``). When they
    name exactly one 16-bit type, and no matrix kernel names a precision other
    than that one, the unnamed matrix kernels get it. Returns
    ``{precision, evidence_ns, source}`` or None (nothing to infer, or mixed).
    """
    unknown = matrix & np.isin(t["precision"], ["unknown", SIXTEEN_BIT])
    if not unknown.any():
        return None
    named = set(t["precision"][matrix & ~unknown].astype(str).tolist())
    seen: dict[str, int] = {}
    for label, pattern in _SIXTEEN_BIT:
        hit = ~matrix & np.array([bool(pattern.search(str(n))) for n in t["name"]], dtype=bool)
        if hit.any():
            seen[label] = int(t["total_ns"][hit].sum())
    if len(seen) != 1 or not named <= set(seen):
        return None
    ((label, ns),) = seen.items()
    return {
        "precision": label,
        "evidence_ns": ns,
        "source": f"the element type of the device's other kernels ({label}, {ns / 1e6:.2f} ms)",
    }


def multi_tensor_optimizer(names: np.ndarray) -> bool:
    """Whether the optimizer already runs multi-tensor (foreach) or fused kernels."""
    return any(MULTI_TENSOR.search(str(n)) for n in names)


def ncu_bounds(job: JobData, trace: str, params: dict) -> dict[str, str]:
    """Kernel name -> what bounds it per Nsight Compute (compute, memory, latency), for the
    kernels with an ncu profile matched to this trace; several signatures: the first."""
    from stallscope.ncu_metrics import profiles

    out: dict[str, str] = {}
    for (name, _grid, _block), profile in profiles(job, timeline=trace).items():
        bound = profile.bound(params.get("near_sol_pct", NEAR_SOL_PCT))
        if bound and name not in out:
            sm = profile.get("compute_sol_pct")
            mem = profile.get("memory_sol_pct")
            out[name] = f"{bound} (Nsight Compute: SM {sm:.0f}%, memory {mem:.0f}% of peak)"
    return out


def _lead(t: dict, order: np.ndarray, bounds: dict[str, str] | None = None) -> dict | None:
    """The row with the most GPU time (kernel, memcpy or memset): name, kind, category,
    total_ns, and ``bound`` (Nsight Compute's, or None)."""
    if not order.size:
        return None
    i = order[0]
    lead = {k: t[k][i] for k in ("name", "kind", "category", "total_ns")}
    lead["bound"] = (bounds or {}).get(str(t["name"][i]))
    return lead


def _recommendation(
    fp32_pct, memory_pct, cat_ns, gpu_ns, lead, params, multi_tensor: bool = False
) -> str:
    """Advice for what the GPU time is: the lead row's kind first, then precision and fusion.

    ``fp32_pct``: % of matrix time in FP32 without Tensor Cores; ``memory_pct``: %
    of GPU time in memory-bound kernels (:data:`FUSIBLE`, copies excluded);
    ``cat_ns``: ns per category; ``lead``: :func:`_lead`; ``multi_tensor``: the
    optimizer already runs foreach/fused kernels (then they are not suggested).
    """
    advice = []
    if fp32_pct >= params["fp32_matmul_pct"]:
        advice.append(
            f"{fp32_pct:.0f}% of matrix-kernel time runs in FP32 without Tensor Cores (e.g. *sgemm, "
            "scudnn): enable TF32 (torch.backends.cuda.matmul.allow_tf32 = True, "
            "torch.backends.cudnn.allow_tf32 = True, or torch.set_float32_matmul_precision('high')) "
            "or train under torch.autocast(dtype=torch.bfloat16)."
        )
    if memory_pct >= params["memory_bound_pct"]:
        optimizer = (
            "the optimizer already runs multi-tensor (foreach/fused) kernels; "
            if multi_tensor
            else "use fused optimizers (fused=True / foreach=True), "
        )
        advice.append(
            f"{memory_pct:.0f}% of GPU time is in elementwise, normalization, reduction and copy "
            f"kernels, which are memory-bound: fuse them with torch.compile; {optimizer}and use fused "
            "normalization / attention kernels."
        )
    lead_text = _lead_advice(lead, cat_ns, gpu_ns, bool(advice))
    if lead_text:
        advice.insert(0, lead_text)
    attention_share = 100.0 * cat_ns["attention"] / gpu_ns if gpu_ns else 0.0
    if attention_share >= 20 and not any("attention" in a for a in advice):
        advice.append(
            "Attention is a large share: use fused attention (F.scaled_dot_product_attention with "
            "the flash / memory-efficient backends)."
        )
    return " ".join(advice) or "No GPU activity to profile."


def _lead_advice(lead: dict | None, cat_ns: dict, gpu_ns: int, advised: bool) -> str | None:
    """Advice that fits the row with the most GPU time, or None.

    Copies -> the memcpy analyzer's advice; communication kernels -> overlap /
    nccl_wait; GEMM, convolution and attention kernels -> shapes and library
    choice; other kernels -> Nsight Compute. Kernel advice is left out when the
    precision or fusion advice (``advised``) already covers the work.
    """
    if lead is None or not gpu_ns:
        return None
    name, share = _short(str(lead["name"])), 100.0 * lead["total_ns"] / gpu_ns
    if lead["kind"] != "kernel":
        pageable = "Pageable" in str(lead["name"])
        return (
            f"Copies lead the GPU time ({str(lead['name']).strip()} alone {share:.0f}%): see the "
            "memcpy findings. "
            + (
                "Copy from pinned memory (pin_memory=True) with non_blocking=True; "
                if pageable
                else ""
            )
            + "overlap the copies with compute (the next batch on a side stream), move fewer bytes, "
            "and keep data on the GPU between steps."
        )
    if lead["category"] == "communication":
        comm = 100.0 * cat_ns["communication"] / gpu_ns
        return (
            f"Communication kernels take {comm:.0f}% of GPU time (top: {name}); their time includes "
            "waiting for the other ranks: see the overlap and nccl_wait findings (overlap with "
            "compute, bucket sizes, straggling ranks)."
        )
    if advised:
        return None
    if lead["category"] in MATRIX:
        return _matrix_lead_advice(name, share, lead.get("bound"))
    return (
        f"Optimize from the top: {name} alone is {share:.0f}% of GPU time; profile it with "
        "Nsight Compute (ncu -k regex:<name> --set full) for occupancy and memory throughput."
    )


def _matrix_lead_advice(name: str, share: float, bound: str | None) -> str:
    """Advice for a leading GEMM/attention/convolution kernel, by what bounds it."""
    head = f"Optimize from the top: {name} alone is {share:.0f}% of GPU time"
    if bound is None:
        return (
            f"{head}; whether it is compute- or memory-bound is not measured (profile it: ncu --set "
            f"full -k regex:{name}). If it is far from peak, check its shapes (multiples of 64/128) "
            "and library choice (cuBLAS/cuDNN heuristics, torch.backends.cudnn.benchmark = True for "
            "fixed-shape convolutions)."
        )
    if bound.startswith("compute"):
        return (
            f"{head} and is {bound}: it already runs near the hardware's peak, so shapes will not "
            "help; do less of it (lower precision such as FP8, fewer FLOPs: smaller or pruned "
            "layers, activation recomputation off)."
        )
    return (
        f"{head} and is {bound}: check its shapes (multiples of 64/128, larger batch for more "
        "data reuse) and library choice (cuBLAS/cuDNN heuristics, torch.compile mode='max-autotune')."
    )


def _windows(job: JobData, trace: str, device: int, name_id) -> list[list[int]]:
    rows = job.sql(
        "SELECT g.start_ns, g.end_ns FROM gpu g WHERE g.trace_id = ? AND g.device = ? "
        f"AND g.name_id = ? AND g.kind = 'kernel' AND {scope_sql(job, trace)} "
        "ORDER BY g.end_ns - g.start_ns DESC, g.start_ns LIMIT ?",
        [trace, device, int(name_id), MAX_WINDOWS],
    ).fetchall()
    return [[int(a), int(b)] for a, b in rows]


def _short(name: str, limit: int = 60) -> str:
    """A kernel name without ``void``, namespaces' template arguments and parameters."""
    text = re.sub(r"^void |\(anonymous namespace\)::", "", name)
    head = (re.split(r"[<(]", text, maxsplit=1)[0] or text).rsplit("::", 1)[-1]
    wrapper = re.match(r"^[\w:]*Kernel\d*<(\w+)", text)  # cutlass::Kernel<cutlass_80_...>
    text = wrapper.group(1) if wrapper else head
    return text if len(text) <= limit else text[: limit - 1] + "…"


SPEC = AnalyzerSpec(
    id="hotspots",
    order=100,
    per_rank=True,
    title="GPU hotspots",
    description=(
        "Top kernels and operators by GPU time, kernel categories (GEMM, attention, convolution, "
        "elementwise, reduction, normalization, communication, memory), precision and Tensor Core use."
    ),
    run=run,
    thresholds=THRESHOLDS,
)
