"""Nsight Compute measurements per kernel, in base units, keyed like timeline kernels.

ncu profiles a few launches of each kernel; the timeline says how much GPU
time each kernel really took. :func:`profiles` reads a job's
``kernel_metrics`` and returns one :class:`Profile` per kernel **signature**
``(name, grid, block)``: for ncu results matched to a timeline trace, the
name is the **timeline's** (so the key equals the timeline kernel's and the
profile can be weighted by its GPU time); for unmatched ncu traces it is
ncu's own. Values of the several profiled launches are averaged.

Each quantity is read from the raw page metric when present, else from the
details page label (rounded there to 2 decimals). Times are ns, sizes
bytes, rates per second, percentages 0-100. A quantity that no result holds
is absent: callers must say "not measured", never assume it is fine.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stallscope.ingest.ncu.csv_pages import to_base
from stallscope.jobdata import JobData

# name: (raw page metric, details section, details label)
FIELDS: dict[str, tuple[str, str | None, str | None]] = {
    "theoretical_pct": ("sm__maximum_warps_per_active_cycle_pct", "Occupancy", "Theoretical Occupancy"),
    "achieved_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "Occupancy", "Achieved Occupancy"),
    "limit_registers": ("launch__occupancy_limit_registers", "Occupancy", "Block Limit Registers"),
    "limit_shared_memory": ("launch__occupancy_limit_shared_mem", "Occupancy", "Block Limit Shared Mem"),
    "limit_warps": ("launch__occupancy_limit_warps", "Occupancy", "Block Limit Warps"),
    "limit_blocks": ("launch__occupancy_limit_blocks", "Occupancy", "Block Limit SM"),
    "limit_barriers": ("launch__occupancy_limit_barriers", "Occupancy", "Block Limit Barriers"),
    "compute_sol_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
                        "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    "memory_sol_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                       "GPU Speed Of Light Throughput", "Memory Throughput"),
    "duration_ns": ("gpu__time_duration.sum", "GPU Speed Of Light Throughput", "Duration"),
    "warp_cycles_per_issue": ("smsp__average_warp_latency_per_inst_issued.ratio",
                              "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    "registers_per_thread": ("launch__registers_per_thread", "Launch Statistics", "Registers Per Thread"),
    "static_smem_bytes": ("launch__shared_mem_per_block_static", "Launch Statistics",
                          "Static Shared Memory Per Block"),
    "dynamic_smem_bytes": ("launch__shared_mem_per_block_dynamic", "Launch Statistics",
                           "Dynamic Shared Memory Per Block"),
    "waves_per_sm": ("launch__waves_per_multiprocessor", "Launch Statistics", "Waves Per SM"),
    "dram_bytes_per_s": ("dram__bytes.sum.per_second", None, None),
    "smsp_cycles_per_s": ("smsp__cycles_elapsed.avg.per_second", None, None),
}  # fmt: skip
_FP_OPS = {f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed": 2 if op.endswith("fma") else 1
           for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hadd", "hmul", "hfma")}  # fmt: skip
_STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
_TENSOR = ("sm__ops_path_tensor_src_", ".sum.per_second")
_INTEGER_TENSOR = ("int1", "int4", "int8")
HOW_TO_MEASURE = {
    "occupancy": "not measured (collect the Occupancy section: ncu --section Occupancy)",
    "sol": "not measured (collect the SpeedOfLight section: ncu --section SpeedOfLight)",
    "stalls": "not measured (collect with ncu --set full, or --section WarpStateStats)",
    "roofline": "not measured (collect with ncu --set full, or --section SpeedOfLight_RooflineChart)",
}

Key = tuple[str, tuple | None, tuple | None]
BOTH_BOUND_PTS = 5.0  # compute and memory throughput this close (both near peak): bound by both


@dataclass
class Profile:
    """Averaged ncu measurements of one kernel signature."""

    results: int = 0
    values: dict[str, float] = field(default_factory=dict)
    stalls: dict[str, float] = field(
        default_factory=dict
    )  # reason -> cycles per issued instruction
    fp_ops_per_cycle: float | None = None  # FP32/FP64/FP16 FLOP per cycle (FMA = 2)
    tensor_flops_per_s: float | None = None

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def limiters(self) -> list[str] | None:
        limits = {k[6:]: v for k, v in self.values.items() if k.startswith("limit_")}
        if not limits:
            return None
        low = min(limits.values())
        return [k for k, v in limits.items() if v == low]

    def bound(self, near_sol_pct: float) -> str | None:
        """``compute``/``memory`` (at or above ``near_sol_pct`` of peak), else ``latency``.

        When both are at or above ``near_sol_pct`` and within BOTH_BOUND_PTS of
        each other, ``compute and memory``: neither alone says what limits it.
        None without both measurements.
        """
        sm, mem = self.get("compute_sol_pct"), self.get("memory_sol_pct")
        if sm is None or mem is None:
            return None
        if max(sm, mem) < near_sol_pct:
            return "latency"
        if min(sm, mem) >= near_sol_pct and abs(sm - mem) < BOTH_BOUND_PTS:
            return "compute and memory"
        return "compute" if sm >= mem else "memory"

    def top_stalls(self, n: int = 3) -> list[dict[str, Any]] | None:
        total = self.get("warp_cycles_per_issue")
        if not self.stalls:
            return None
        ranked = sorted(self.stalls.items(), key=lambda kv: -kv[1])[:n]
        return [
            {
                "reason": reason,
                "cycles_per_issue": round(value, 3),
                "share_pct": round(100 * value / total, 1) if total else None,
            }  # fmt: skip
            for reason, value in ranked
        ]

    def roofline(self) -> dict[str, float] | None:
        hz, dram = self.get("smsp_cycles_per_s"), self.get("dram_bytes_per_s")
        if (
            hz is None
            or dram is None
            or (self.fp_ops_per_cycle is None and self.tensor_flops_per_s is None)
        ):
            return None
        flops = (self.fp_ops_per_cycle or 0.0) * hz + (self.tensor_flops_per_s or 0.0)
        return {
            "flop_per_s": flops,
            "dram_bytes_per_s": dram,
            "flop_per_dram_byte": flops / dram if dram else None,
        }


def profiles(
    job: JobData, *, timeline: str | None = None, ncu_traces: list[str] | None = None
) -> dict[Key, Profile]:
    """Profiles of the ncu kernels matched to trace ``timeline``, or of the ``ncu_traces``.

    Empty (no query) when the job holds no Nsight Compute results."""
    if not job.may_hold("kernel_metrics"):
        return {}
    if timeline is not None:
        where, params = "k.timeline_trace_id = ?", [timeline]
    else:
        marks = ", ".join("?" for _ in ncu_traces or [])
        if not marks:
            return {}
        where, params = f"k.trace_id IN ({marks})", list(ncu_traces or [])
    raw = [f[0] for f in FIELDS.values()] + list(_FP_OPS)
    labels = [f[2] for f in FIELDS.values() if f[2]]
    rows = job.sql(
        f"""
        SELECT coalesce(tn.name, n.name) AS kernel, k.trace_id, k.kernel_index,
               k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y, k.block_z,
               k.section, k.metric, k.value, k.unit
        FROM kernel_metrics k
        JOIN names n ON n.trace_id = k.trace_id AND n.name_id = k.name_id
        LEFT JOIN names tn ON tn.trace_id = k.timeline_trace_id AND tn.name_id = k.timeline_name_id
        WHERE {where} AND k.value IS NOT NULL
          AND ((k.section IS NULL AND (k.metric IN ({", ".join("?" for _ in raw)})
                OR (starts_with(k.metric, ?) AND ends_with(k.metric, ?))
                OR (starts_with(k.metric, ?) AND ends_with(k.metric, ?))))
               OR (k.section IS NOT NULL AND k.metric IN ({", ".join("?" for _ in labels)})))
        """,
        params + raw + [*_STALL, *_TENSOR] + labels,
    ).fetchall()
    return _aggregate(rows)


def _aggregate(rows: list[tuple]) -> dict[Key, Profile]:
    raw_to_field = {f[0]: name for name, f in FIELDS.items()}
    label_to_field = {(f[1], f[2]): name for name, f in FIELDS.items() if f[2]}
    # per key: field -> [values] for raw and for details; per result: fp ops and tensor
    raw_vals: dict[Key, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    det_vals: dict[Key, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    stalls: dict[Key, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    fp: dict[Key, dict[tuple, float]] = defaultdict(dict)
    tensor: dict[Key, dict[tuple, float]] = defaultdict(dict)
    results: dict[Key, set] = defaultdict(set)
    for kernel, trace, index, gx, gy, gz, bx, by, bz, section, metric, value, unit in rows:
        key: Key = (kernel, _dims(gx, gy, gz), _dims(bx, by, bz))
        result = (trace, index)
        results[key].add(result)
        value = to_base(value, unit)
        if section is not None:
            if (section, metric) in label_to_field:
                det_vals[key][label_to_field[(section, metric)]].append(value)
        elif metric in raw_to_field:
            raw_vals[key][raw_to_field[metric]].append(value)
        elif metric in _FP_OPS:
            fp[key][result] = fp[key].get(result, 0.0) + value * _FP_OPS[metric]
        elif metric.startswith(_STALL[0]):
            reason = metric[len(_STALL[0]) : -len(_STALL[1])]
            if reason != "selected":  # issuing, not stalled
                stalls[key][reason].append(value)
        elif metric.startswith(_TENSOR[0]) and not any(i in metric for i in _INTEGER_TENSOR):
            tensor[key][result] = tensor[key].get(result, 0.0) + value
    out = {}
    for key, res in results.items():
        values = {f: _mean(v) for f, v in det_vals[key].items()}
        values.update({f: _mean(v) for f, v in raw_vals[key].items()})
        out[key] = Profile(
            results=len({i for _, i in res}),
            values=values,
            stalls={r: _mean(v) for r, v in stalls[key].items()},
            fp_ops_per_cycle=_mean(list(fp[key].values())) if fp[key] else None,
            tensor_flops_per_s=_mean(list(tensor[key].values())) if tensor[key] else None,
        )
    return out


def _dims(x, y, z) -> tuple | None:
    return None if x is None or not (x and y and z) else (int(x), int(y), int(z))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
