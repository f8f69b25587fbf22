"""GPU limits and the theoretical-occupancy calculator.

:func:`device_limits` merges what a trace says about a device (the canonical
``devices`` row: Kineto ``deviceProperties``, nsys ``TARGET_INFO_GPU``, ncu
``device__attribute_*``) with a built-in table by architecture (what traces
never carry: blocks per SM on Kineto, allocation granularities, the 1 KiB of
shared memory the driver reserves per block on sm_80+) and by product (SM or
CU count of V100, A100, H100, H200, B200, MI250, MI300...).

:func:`occupancy` follows the CUDA occupancy calculator (``cuda_occupancy.h``,
which Nsight Compute's "Theoretical Occupancy" matches):

* warps per block = ceil(threads / warp size);
* **registers**: per warp ceil(regs x 32 / 256) x 256, allocated per SM
  sub-partition (4): blocks = floor(floor(regs per SM / 4 / regs per warp) x 4
  / warps per block); the launch fails if regs per warp x (warps per block
  rounded up to 4) exceeds the per-block register limit;
* **shared memory**: (static + dynamic + reserved) rounded up to the
  allocation unit (128 B on sm_80+, 256 B before); blocks = floor(shared
  memory per SM at the largest carveout / that);
* **warps**: floor(max warps per SM / warps per block); **blocks**: max
  blocks per SM;
* theoretical occupancy = min(limits) x warps per block / max warps per SM.

AMD CDNA (MI250 gfx90a, MI300 gfx942) uses the same shape: a CU has 4 SIMDs
of 8 waves and 512 VGPRs (granularity 8) each, 64 KiB of LDS (granularity
512 B) and at most 16 multi-wave workgroups; traces rarely give AMD register
counts, so the register limit is then unknown, not assumed. Units: bytes,
registers, warps (wavefronts), blocks (workgroups) per SM (CU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

LIMITERS = ("registers", "shared_memory", "warps", "blocks")


@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM limits of one GPU; ``source`` says where they came from."""

    name: str
    arch: str
    sm_count: int | None
    warp_size: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    max_regs_per_block: int
    reg_alloc_unit: int  # registers per warp (NVIDIA 256; AMD 8 VGPRs x 64 lanes)
    subpartitions: int  # SM sub-partitions (SMSPs) / SIMDs per CU
    smem_per_sm: int  # bytes, largest carveout
    max_smem_per_block: int  # bytes, opt-in maximum (reserved part excluded)
    smem_alloc_unit: int  # bytes
    reserved_smem_per_block: int  # bytes the driver adds to every block
    max_threads_per_block: int = 1024
    single_wave_blocks_free: bool = False  # AMD: 1-wave workgroups skip the workgroup limit
    source: str = "built-in table"


def _nv(arch, warps, blocks, smem, optin, unit, reserved) -> DeviceLimits:
    return DeviceLimits("", arch, None, 32, warps, blocks, 65536, 65536, 256, 4, smem, optin,
                        unit, reserved)  # fmt: skip


def _cdna(arch: str) -> DeviceLimits:
    return DeviceLimits("", arch, None, 64, 32, 16, 4 * 512 * 64, 4 * 512 * 64, 8 * 64, 4,
                        65536, 65536, 512, 0, single_wave_blocks_free=True)  # fmt: skip


# Per architecture (CUDA C Programming Guide, compute capabilities table; LLVM AMDGPU).
ARCHES: dict[str, DeviceLimits] = {
    "sm_70": _nv("sm_70", 64, 32, 98304, 98304, 256, 0),
    "sm_75": _nv("sm_75", 32, 16, 65536, 65536, 256, 0),
    "sm_80": _nv("sm_80", 64, 32, 167936, 166912, 128, 1024),
    "sm_86": _nv("sm_86", 48, 16, 102400, 101376, 128, 1024),
    "sm_87": _nv("sm_87", 48, 16, 167936, 166912, 128, 1024),
    "sm_89": _nv("sm_89", 48, 24, 102400, 101376, 128, 1024),
    "sm_90": _nv("sm_90", 64, 32, 233472, 232448, 128, 1024),
    "sm_100": _nv("sm_100", 64, 32, 233472, 232448, 128, 1024),
    "sm_103": _nv("sm_103", 64, 32, 233472, 232448, 128, 1024),
    "gfx90a": _cdna("gfx90a"),
    "gfx942": _cdna("gfx942"),
}
# Products: (name pattern, arch, SMs or CUs). Most specific first.
PRODUCTS: tuple[tuple[str, str, int], ...] = (
    ("V100", "sm_70", 80), ("A100", "sm_80", 108), ("H100 PCIe", "sm_90", 114),
    ("GH200", "sm_90", 132), ("H100", "sm_90", 132), ("H200", "sm_90", 132), ("H800", "sm_90", 132),
    ("GB200", "sm_100", 152), ("B200", "sm_100", 148),
    ("MI250X", "gfx90a", 110), ("MI250", "gfx90a", 104), ("MI210", "gfx90a", 104),
    ("MI300X", "gfx942", 304), ("MI325X", "gfx942", 304), ("MI300A", "gfx942", 228),
)  # fmt: skip


def device_limits(row: dict[str, Any] | None) -> DeviceLimits | None:
    """Limits for one canonical ``devices`` row; None when neither it nor the tables say enough."""
    row = row or {}
    name = row.get("name") or ""
    product = next((p for p in PRODUCTS if p[0].lower() in name.lower()), None)
    base = _arch_for(row, product)
    if base is None:
        return None
    from_trace = {
        "sm_count": row.get("sm_count"),
        "warp_size": row.get("warp_size"),
        "regs_per_sm": row.get("regs_per_sm"),
        "max_regs_per_block": row.get("regs_per_block"),
        "smem_per_sm": row.get("smem_per_sm"),
        "max_smem_per_block": row.get("smem_per_block_optin"),
        "max_blocks_per_sm": row.get("max_blocks_per_sm"),
        "max_threads_per_block": row.get("max_threads_per_block"),
    }
    threads = row.get("max_threads_per_sm")
    warp = from_trace["warp_size"] or base.warp_size
    if threads:
        from_trace["max_warps_per_sm"] = threads // warp
    known = {k: int(v) for k, v in from_trace.items() if v}
    if not known.get("sm_count") and product:
        known["sm_count"] = product[2]
    source = "trace + built-in table" if known.keys() - {"sm_count"} else "built-in table"
    return replace(base, name=name or base.arch, source=source, **known)


def _arch_for(row: dict[str, Any], product) -> DeviceLimits | None:
    major, minor = row.get("compute_major"), row.get("compute_minor")
    amd = (row.get("warp_size") == 64) or any(
        s in (row.get("name") or "") for s in ("AMD", "Instinct", "Radeon")
    )
    if product:
        return ARCHES[product[1]]
    if amd:  # Kineto reports CDNA GPUs as "AMD Radeon Graphics", compute 9.0: tell by CU count
        return ARCHES["gfx942" if (row.get("sm_count") or 0) >= 228 else "gfx90a"]
    if major is None:
        return None
    key = f"sm_{major}{minor or 0}"
    if key in ARCHES:
        return ARCHES[key]
    same_major = sorted(k for k in ARCHES if k.startswith(f"sm_{major}"))
    return ARCHES[same_major[0]] if same_major else None


@dataclass
class Occupancy:
    """Theoretical occupancy of one launch configuration on one device."""

    occupancy_pct: float
    blocks_per_sm: int
    warps_per_sm: int
    warps_per_block: int
    limits: dict[str, int | None]  # blocks per SM each resource allows (None: unknown or unused)
    limiters: list[str] = field(default_factory=list)  # resources at the minimum
    regs_per_warp: int | None = None  # allocated
    smem_per_block: int | None = None  # allocated, reserved part included


def occupancy(
    dev: DeviceLimits, threads: int, regs: int | None, smem: int | None
) -> Occupancy | None:
    """Theoretical occupancy for ``threads`` per block, ``regs`` per thread and ``smem`` bytes
    (static + dynamic) per block; None when the block size is unknown."""
    if not threads or threads <= 0:
        return None
    wpb = math.ceil(threads / dev.warp_size)
    limits: dict[str, int | None] = {
        "warps": dev.max_warps_per_sm // wpb if threads <= dev.max_threads_per_block else 0,
        "blocks": dev.max_warps_per_sm if dev.single_wave_blocks_free and wpb == 1
        else dev.max_blocks_per_sm,
        "registers": None,
        "shared_memory": None,
    }  # fmt: skip
    regs_per_warp = None
    if regs is not None and regs > 0:
        regs_per_warp = _round_up(regs * dev.warp_size, dev.reg_alloc_unit)
        assumed = regs_per_warp * _round_up(wpb, dev.subpartitions)
        if assumed > dev.max_regs_per_block or regs_per_warp * wpb > dev.max_regs_per_block:
            limits["registers"] = 0
        else:
            per_partition = dev.regs_per_sm // dev.subpartitions // regs_per_warp
            limits["registers"] = per_partition * dev.subpartitions // wpb
    smem_alloc = None
    if smem is not None:
        smem_alloc = _round_up(smem + dev.reserved_smem_per_block, dev.smem_alloc_unit)
        if smem > dev.max_smem_per_block:
            limits["shared_memory"] = 0
        elif smem_alloc:
            limits["shared_memory"] = dev.smem_per_sm // smem_alloc
    blocks = min(v for v in limits.values() if v is not None)
    limiters = [k for k in LIMITERS if limits[k] is not None and limits[k] == blocks]
    warps = blocks * wpb
    return Occupancy(
        occupancy_pct=100.0 * warps / dev.max_warps_per_sm,
        blocks_per_sm=blocks,
        warps_per_sm=warps,
        warps_per_block=wpb,
        limits=limits,
        limiters=limiters,
        regs_per_warp=regs_per_warp,
        smem_per_block=smem_alloc,
    )


def regs_for_blocks(dev: DeviceLimits, threads: int, blocks: int) -> int:
    """Most registers per thread that still let ``blocks`` blocks of ``threads`` share an SM."""
    wpb = math.ceil(threads / dev.warp_size)
    per_partition = math.ceil(blocks * wpb / dev.subpartitions)
    per_warp = dev.regs_per_sm // dev.subpartitions // max(per_partition, 1)
    per_warp -= per_warp % dev.reg_alloc_unit
    return per_warp // dev.warp_size


def smem_for_blocks(dev: DeviceLimits, blocks: int) -> int:
    """Most bytes of static + dynamic shared memory per block that still fit ``blocks`` per SM."""
    per_block = dev.smem_per_sm // max(blocks, 1)
    per_block -= per_block % dev.smem_alloc_unit
    return max(per_block - dev.reserved_smem_per_block, 0)


def waves(dev: DeviceLimits, grid_blocks: int, blocks_per_sm: int) -> float | None:
    """Grid blocks / (blocks per SM x SMs): how many full rounds of the GPU the grid needs."""
    if not dev.sm_count or not blocks_per_sm or not grid_blocks:
        return None
    return grid_blocks / (blocks_per_sm * dev.sm_count)


def tail_idle_pct(wave_count: float | None) -> float | None:
    """Share of SM block slots idle over the run, from the partial last wave (or a short grid)."""
    if wave_count is None or wave_count <= 0:
        return None
    rounds = math.ceil(wave_count - 1e-9)
    return 100.0 * (rounds - wave_count) / rounds


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit
