#!/usr/bin/env python3
"""Single-GPU workloads with planted, known faults for stallscope sample traces.

Each scenario runs a short training-like loop on one CUDA GPU and writes, into
--out, the trace (Kineto JSON, gzipped, when --profiler kineto) plus a
``<scenario>.truth.json`` with what was planted, what an analyzer should find,
and what was measured in the same run.

    python3 scenarios.py --scenario healthy --out /tmp/cap/kineto/healthy
    nsys profile -t cuda,nvtx,osrt -o x python3 scenarios.py \
        --scenario healthy --profiler none --nvtx --out /tmp/cap/nsys
    ncu --clock-control none --set full ... python3 scenarios.py \
        --scenario occupancy --profiler none --warmup 0 --measure 0 --steps 2 ...

Phases (kineto mode): ``warmup`` steps (not recorded), ``measure`` steps timed
with torch.cuda.synchronize() around each step and no profiler attached, then
the profiled loop: schedule(wait, warmup, active) with prof.step() after every
iteration, so the exported trace holds ProfilerStep#<wait+warmup> ..
ProfilerStep#<wait+warmup+active-1>.

Phases (--profiler none): ``warmup`` steps wrapped in NVTX "warmup <i>", then
``steps`` steps wrapped in NVTX "step <i>" (with --nvtx), timed with
perf_counter and no extra synchronization.

Only the standard library is imported at module level, so the file compiles
and ``--list`` works on machines without torch.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback

MiB = 1024 * 1024

# --------------------------------------------------------------------------
# Static description of every scenario: what is planted, what should be found.
# Amounts are per profiled step.  "measured" facts are added at run time.
# --------------------------------------------------------------------------
SCENARIOS = {
    "healthy": {
        "description": (
            "bf16 MLP (1024 -> 8192 x3 -> 1024, batch 8192) training step: "
            "forward, MSE loss, backward, SGD(momentum) step, loss.item() for "
            "logging. Batches come from a torch DataLoader (num_workers=0, "
            "batch_size=None) over tensors that already live on the GPU, so "
            "data loading costs microseconds."
        ),
        "planted": [],
        "expected_findings": [],
        "expected_absent": [
            "gpu_idle",
            "launch_overhead",
            "memcpy",
            "host_sync",
            "occupancy",
            "dataloader",
        ],
        "severity_notes": (
            "Baseline. GPU should be busy >97% of each step. One loss.item() "
            "per step blocks the CPU for most of the step (it waits for the "
            "GPU) but leaves the GPU idle only for the few tens of us it takes "
            "the CPU to launch the next step: an analyzer should not flag it."
        ),
    },
    "dataloader_stall": {
        "description": (
            "Same model and loop as 'healthy'. Batches (bf16 8192x1024 = 16 "
            "MiB) come from a DataLoader with num_workers=0, batch_size=None, "
            "pin_memory=True whose Dataset.__getitem__ sleeps 30 ms; the "
            "pinned batch is copied H2D with non_blocking=True. Because "
            "loss.item() ends each step, the GPU sits idle during the whole "
            "data-loading time of the next step."
        ),
        "planted": [
            {
                "kind": "dataloader_sleep",
                "where": "Dataset.__getitem__ (time.sleep), inside "
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "amount_ns_per_step": 30_000_000,
                "count_per_step": 1,
            }
        ],
        "expected_findings": [
            {
                "analyzer": "gpu_idle",
                "cause": "dataloader",
                "approx_idle_ns_per_step": "sleep (30 ms) + pin_memory copy; see "
                "measured.expected_gpu_idle_ns_per_step",
            }
        ],
        "severity_notes": ("High: ~30+ ms idle out of a ~45-50 ms step (~60-70% of the step)."),
    },
    "tiny_kernels": {
        "description": (
            "Per step, 1000 iterations of x.mul_(1.0001); x.add_(0.0001) on a "
            "256-element fp32 GPU tensor = 2000 tiny elementwise kernels, then "
            "torch.cuda.synchronize() to close the step. Launch-bound: each "
            "kernel runs ~1-2 us, the CPU needs several us to launch it."
        ),
        "planted": [
            {
                "kind": "tiny_kernel_launches",
                "count_per_step": 2000,
                "elements_per_kernel": 256,
                "amount_ns_per_step": None,
            }
        ],
        "expected_findings": [
            {
                "analyzer": "launch_overhead",
                "kernels_per_step": 2000,
                "notes": "GPU busy fraction far below 50%; median kernel duration "
                "a few us; gaps between kernels dominated by CPU launch "
                "time. measured.graph_replay_ns_per_step is the GPU time "
                "of the same work launched as one CUDA graph.",
            }
        ],
        "severity_notes": "High: GPU mostly idle inside the step.",
    },
    "pageable_sync": {
        "description": (
            "Per step: DataLoader (num_workers=0, batch_size=None, "
            "pin_memory=False) returns a 64 MiB pageable fp32 CPU tensor "
            "(16,777,216 elements); x = batch.to('cuda') (blocking, pageable "
            "H2D); then three segments of bf16 4096^3 matmuls, each followed "
            "by a .item() (4 .item() calls in all), and a final "
            "torch.cuda.synchronize()."
        ),
        "planted": [
            {
                "kind": "pageable_h2d_memcpy",
                "bytes_per_step": 64 * MiB,
                "count_per_step": 1,
                "direction": "HtoD",
                "src_memory": "Pageable",
                "amount_ns_per_step": "see measured.h2d_ns_median",
            },
            {
                "kind": "host_sync_item",
                "count_per_step": 4,
                "api": "aten::item -> aten::_local_scalar_dense -> "
                "cudaMemcpyAsync(DtoH) + cudaStreamSynchronize",
            },
            {
                "kind": "host_sync_device_synchronize",
                "count_per_step": 1,
                "api": "torch.cuda.synchronize -> cudaDeviceSynchronize",
            },
        ],
        "expected_findings": [
            {
                "analyzer": "memcpy",
                "kind": "pageable",
                "direction": "HtoD",
                "bytes_per_step": 64 * MiB,
            },
            {
                "analyzer": "host_sync",
                "syncs_per_step": 5,
                "notes": "4 .item() + 1 cudaDeviceSynchronize per step; the "
                "blocking pageable copy also synchronizes the stream "
                "(at::cuda::memcpy_and_sync), so a count of "
                "cudaStreamSynchronize may read 5 per step",
            },
        ],
        "severity_notes": (
            "Medium-high: the pageable copy (~5-10 ms at ~7-13 GB/s) leaves "
            "the SMs idle for a large part of the step; each sync adds a small "
            "GPU gap while the CPU launches the next segment."
        ),
    },
    "cuda_graph": {
        "description": (
            "The tiny_kernels body (2000 tiny elementwise kernels) captured "
            "once into a torch.cuda.CUDAGraph and replayed once per step, "
            "then torch.cuda.synchronize()."
        ),
        "planted": [],
        "expected_findings": [],
        "expected_absent": ["launch_overhead"],
        "severity_notes": (
            "Healthy with respect to launch overhead: one cudaGraphLaunch per "
            "step; the 2000 kernels run back to back on the GPU (gaps ~1 us). "
            "The kernels are still tiny, so the GPU's SMs are mostly empty "
            "(low utilization per kernel), but this is not a launch problem. "
            "PROFILER ARTIFACT: under Kineto/CUPTI, cudaGraphLaunch of this "
            "2000-node graph takes ~2.3 ms of host time (unprofiled, the whole "
            "synced step takes ~2.1 ms), and the GPU starts the graph only "
            "near the end of that call, so with the per-step synchronize the "
            "trace shows ~50% GPU idle per step, all of it inside "
            "cudaGraphLaunch. An analyzer may report that idle time (cause: "
            "host / cudaGraphLaunch), but must not call it per-kernel launch "
            "overhead. See cuda_graph_runahead for the same graph without "
            "the per-step sync."
        ),
    },
    "cuda_graph_runahead": {
        "description": (
            "Same CUDA graph as 'cuda_graph' (2000 tiny elementwise kernels "
            "replayed once per step), but with no synchronize at the end of "
            "each profiled step: the CPU enqueues the next replay while the "
            "GPU runs the previous one."
        ),
        "planted": [],
        "expected_findings": [],
        "expected_absent": ["launch_overhead", "host_sync"],
        "severity_notes": (
            "Healthy. Host time per cudaGraphLaunch (~2.3 ms under CUPTI) is "
            "about equal to the graph's GPU time (~2.1-2.4 ms), so the GPU "
            "should be busy for most of the profiled window; small gaps "
            "between replays can remain. CPU ProfilerStep ranges and GPU "
            "work are offset (GPU lags the CPU)."
        ),
    },
    "occupancy": {
        "description": (
            "Three kernels per step: (a) low_occupancy_smem_kernel (CuPy "
            "RawKernel): 32 threads/block, 204800 B dynamic shared memory "
            "(cudaFuncAttributeMaxDynamicSharedMemorySize raised), so at most "
            "1 block = 1 warp per SM; (b) well_occupied_axpy_kernel (CuPy "
            "RawKernel): y = a*x + y over 64M fp32, 256 threads/block, no "
            "shared memory; (c) torch.matmul bf16 4096x4096x4096 (cuBLAS)."
        ),
        "planted": [
            {
                "kind": "low_occupancy",
                "kernel": "low_occupancy_smem_kernel",
                "limiter": "shared_memory",
                "count_per_step": 1,
            }
        ],
        "expected_findings": [
            {
                "analyzer": "occupancy",
                "kernel": "low_occupancy_smem_kernel",
                "limiter": "shared_memory",
                "theoretical_occupancy_pct": 1.5625,
                "notes": "1 block of 1 warp per SM out of 64 warps per SM. "
                "well_occupied_axpy_kernel and the GEMM should not be "
                "flagged for occupancy (the GEMM is low occupancy by "
                "design, limited by registers/shared memory, but it is "
                "compute-bound; an analyzer may mention it at low "
                "severity).",
            }
        ],
        "severity_notes": "High for kernel (a); none for (b).",
    },
}

SCHEDULE_DEFAULT = {"wait": 1, "warmup": 2, "active": 5}
SCHEDULE_PER_SCENARIO = {
    # 2000 kernels per step: keep the Kineto trace small.
    "tiny_kernels": {"wait": 1, "warmup": 2, "active": 3},
    "cuda_graph": {"wait": 1, "warmup": 2, "active": 3},
    "cuda_graph_runahead": {"wait": 1, "warmup": 2, "active": 3},
    "occupancy": {"wait": 1, "warmup": 1, "active": 3},
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def summarize(values_s):
    """Median/mean/min/max of a list of seconds, as integer ns."""
    if not values_s:
        return None
    return {
        "n": len(values_s),
        "median_ns": ns(statistics.median(values_s)),
        "mean_ns": ns(statistics.fmean(values_s)),
        "min_ns": ns(min(values_s)),
        "max_ns": ns(max(values_s)),
    }


def nvidia_smi_facts() -> dict:
    out = {}
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        out["nvidia_smi"] = q.stdout.strip()
    except Exception as e:  # noqa: BLE001
        out["nvidia_smi_error"] = repr(e)
    return out


def env_info(torch) -> dict:
    d = {
        "date_utc": utc_now(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nsys_version": os.environ.get("STALLSCOPE_NSYS_VERSION"),
        "ncu_version": os.environ.get("STALLSCOPE_NCU_VERSION"),
        "kernel": platform.release(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(
            {
                "gpu_name": p.name,
                "gpu_count_visible": torch.cuda.device_count(),
                "sm_count": p.multi_processor_count,
                "compute_capability": f"{p.major}.{p.minor}",
                "gpu_memory_bytes": p.total_memory,
            }
        )
    try:
        d["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        pass
    try:
        import cupy  # noqa: F401

        d["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001
        pass
    d.update(nvidia_smi_facts())
    return d


class Nvtx:
    def __init__(self, torch, enabled: bool):
        self.torch = torch
        self.on = enabled

    def push(self, name: str):
        if self.on:
            self.torch.cuda.nvtx.range_push(name)

    def pop(self):
        if self.on:
            self.torch.cuda.nvtx.range_pop()


# --------------------------------------------------------------------------
# Datasets (module level so they are importable/picklable)
# --------------------------------------------------------------------------
class ListDataset:
    """Returns pre-made batches (GPU or CPU tensors) in turn; batch_size=None."""

    def __init__(self, batches, length=10**6, sleep_s=0.0):
        self.batches = batches
        self.length = length
        self.sleep_s = sleep_s
        self.sleep_log = []  # measured sleep durations (s); num_workers=0 only

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if self.sleep_s > 0:
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)  # PLANTED data-loading stall
            self.sleep_log.append(time.perf_counter() - t0)
        return self.batches[i % len(self.batches)]


def make_loader(torch, dataset, pin_memory=False):
    from torch.utils.data import DataLoader

    # torch.utils.data.Dataset subclassing is not required for map-style use
    return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0, pin_memory=pin_memory)


# --------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------
class Workload:
    name = ""
    uses_loader = False

    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.dev = torch.device("cuda", 0)
        self.loader = None
        self.extra = {}
        # (phase, start_event, end_event) for GPU-side timing of the compute part
        self.gpu_events = []
        self.phase = "warmup"

    def setup(self):
        pass

    def step(self, batch):
        raise NotImplementedError

    def after_run(self):
        """Extra measurements after all phases (not profiled)."""

    def gpu_event_pair(self):
        t = self.torch
        a = t.cuda.Event(enable_timing=True)
        b = t.cuda.Event(enable_timing=True)
        self.gpu_events.append((self.phase, a, b))
        return a, b

    def gpu_times_by_phase(self):
        self.torch.cuda.synchronize()
        out = {}
        for phase, a, b in self.gpu_events:
            out.setdefault(phase, []).append(a.elapsed_time(b) / 1e3)
        return out


class MLPTrain(Workload):
    """Shared by healthy and dataloader_stall."""

    B, IN, HID, DEPTH, OUT = 8192, 1024, 8192, 3, 1024
    sleep_s = 0.0
    on_gpu_data = True

    def setup(self):
        t = self.torch
        nn = t.nn
        t.manual_seed(0)
        layers = [nn.Linear(self.IN, self.HID), nn.ReLU()]
        for _ in range(self.DEPTH):
            layers += [nn.Linear(self.HID, self.HID), nn.ReLU()]
        layers += [nn.Linear(self.HID, self.OUT)]
        self.model = nn.Sequential(*layers).to(self.dev, dtype=t.bfloat16)
        self.opt = t.optim.SGD(self.model.parameters(), lr=1e-5, momentum=0.9)
        self.target = t.randn(self.B, self.OUT, device=self.dev) * 0.1
        if self.on_gpu_data:
            batches = [
                t.randn(self.B, self.IN, device=self.dev, dtype=t.bfloat16) for _ in range(4)
            ]
            pin = False
        else:
            batches = [t.randn(self.B, self.IN, dtype=t.bfloat16) for _ in range(4)]
            pin = True
        self.dataset = ListDataset(batches, sleep_s=self.sleep_s)
        self.loader = make_loader(t, self.dataset, pin_memory=pin)
        n_params = sum(p.numel() for p in self.model.parameters())
        flops = 0
        dims = [self.IN] + [self.HID] * (self.DEPTH + 1) + [self.OUT]
        for a, b in zip(dims[:-1], dims[1:], strict=False):
            flops += 2 * self.B * a * b
        self.extra.update(
            {
                "model_params": n_params,
                "batch_shape": [self.B, self.IN],
                "batch_bytes": self.B * self.IN * 2,
                "matmul_flops_per_step_fwd_bwd": 3 * flops,
            }
        )

    def step(self, batch):
        x = batch.to(self.dev, non_blocking=True)
        a, b = self.gpu_event_pair()
        a.record()
        out = self.model(x)
        loss = (out.float() - self.target).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        b.record()
        self.last_loss = loss.item()  # logging: one host sync per step


class Healthy(MLPTrain):
    name = "healthy"
    uses_loader = True


class DataloaderStall(MLPTrain):
    name = "dataloader_stall"
    uses_loader = True
    sleep_s = 0.030
    on_gpu_data = False


class TinyKernels(Workload):
    name = "tiny_kernels"
    N_ITERS = 1000  # 2 kernels each

    def setup(self):
        t = self.torch
        self.x = t.randn(256, device=self.dev)

    def body(self):
        x = self.x
        for _ in range(self.N_ITERS):
            x.mul_(1.0001)
            x.add_(0.0001)

    def step(self, batch):
        self.body()
        self.torch.cuda.synchronize()

    def graph_reference(self):
        """GPU time of the same 2000 kernels as one CUDA graph (not profiled)."""
        t = self.torch
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(2):
                self.body()
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            self.body()
        times = []
        for _ in range(10):
            a = t.cuda.Event(enable_timing=True)
            b = t.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return g, times

    def after_run(self):
        if self.name == "tiny_kernels":
            _, times = self.graph_reference()
            self.extra["graph_replay_ns_per_step"] = summarize(times[2:])


class CudaGraph(TinyKernels):
    name = "cuda_graph"

    def setup(self):
        super().setup()
        self.graph, times = self.graph_reference()
        self.extra["graph_replay_ns_per_step"] = summarize(times[2:])
        self.extra["graph_nodes_kernels"] = 2 * self.N_ITERS

    def step(self, batch):
        self.graph.replay()
        self.torch.cuda.synchronize()


class CudaGraphRunahead(CudaGraph):
    name = "cuda_graph_runahead"

    def step(self, batch):
        self.graph.replay()
        if self.phase != "profiled":
            self.torch.cuda.synchronize()


class PageableSync(Workload):
    name = "pageable_sync"
    uses_loader = True
    N = 16 * MiB  # 16,777,216 fp32 elements = 64 MiB
    MM_PER_SEGMENT = 6

    def setup(self):
        t = self.torch
        t.manual_seed(0)
        self.cpu_batch = t.randn(self.N)  # pageable (not pinned)
        assert not self.cpu_batch.is_pinned()
        self.dataset = ListDataset([self.cpu_batch])
        self.loader = make_loader(t, self.dataset, pin_memory=False)
        self.w = (t.randn(4096, 4096, device=self.dev) / 64).to(t.bfloat16)
        self.h2d_events = []
        self.extra.update(
            {
                "h2d_bytes_per_step": self.N * 4,
                "matmuls_per_step": 3 * self.MM_PER_SEGMENT,
                "matmul_shape": [4096, 4096, 4096],
            }
        )

    def seg(self, y):
        for _ in range(self.MM_PER_SEGMENT):
            y = (y @ self.w).relu_()
        return y

    def step(self, batch):
        t = self.torch
        a = t.cuda.Event(enable_timing=True)
        b = t.cuda.Event(enable_timing=True)
        a.record()
        x = batch.to(self.dev)  # PLANTED: 64 MiB pageable H2D, blocking
        b.record()
        self.h2d_events.append((self.phase, a, b))
        y = x.view(4096, 4096).to(t.bfloat16)
        y = self.seg(y)
        s1 = y.float().mean().item()  # PLANTED sync 1
        y = self.seg(y)
        s2 = y.abs().max().item()  # PLANTED sync 2
        y = self.seg(y)
        s3 = y.float().norm().item()  # PLANTED sync 3
        s4 = (~t.isfinite(y)).sum().item()  # PLANTED sync 4
        t.cuda.synchronize()  # PLANTED sync 5
        self.last = (s1, s2, s3, s4)

    def after_run(self):
        self.torch.cuda.synchronize()
        by = {}
        for phase, a, b in self.h2d_events:
            by.setdefault(phase, []).append(a.elapsed_time(b) / 1e3)
        for phase, v in by.items():
            self.extra[f"h2d_time_{phase}"] = summarize(v)
        m = by.get("measure") or by.get("profiled") or []
        if m:
            med = statistics.median(m)
            self.extra["h2d_ns_median"] = ns(med)
            self.extra["h2d_GBps_median"] = round(self.N * 4 / med / 1e9, 2)


def theoretical_occupancy_sm90(regs, block, smem_per_block):
    """Hand occupancy calculator with sm_90 limits (64 warps, 32 blocks,
    64K registers, 228 KiB shared memory per SM, 1 KiB reserved per block)."""
    warps_per_block = (block + 31) // 32
    lim = {"warps": 64 // warps_per_block, "blocks": 32}
    if regs:
        regs_per_warp = ((regs * 32 + 255) // 256) * 256
        lim["registers"] = 65536 // (regs_per_warp * warps_per_block)
    if smem_per_block:
        per_block = ((smem_per_block + 1024 + 127) // 128) * 128
        lim["shared_memory"] = (228 * 1024) // per_block
    limiter = min(lim, key=lambda k: lim[k])
    blocks = lim[limiter]
    return {
        "limits_blocks_per_sm": lim,
        "limiter": limiter,
        "max_active_blocks_per_sm": blocks,
        "active_warps_per_sm": blocks * warps_per_block,
        "theoretical_occupancy_pct": round(100.0 * blocks * warps_per_block / 64, 4),
    }


LOW_OCC_SRC = r"""
extern "C" __global__ void low_occupancy_smem_kernel(
        const float* __restrict__ in, float* __restrict__ out,
        int n_per_block, int reps) {
    extern __shared__ float buf[];
    const float* src = in + (size_t)blockIdx.x * n_per_block;
    for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) buf[i] = src[i];
    __syncthreads();
    float acc = 0.f;
    for (int r = 0; r < reps; ++r) {
        for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) {
            int j = i + r * 33;
            if (j >= n_per_block) j -= n_per_block;
            acc = fmaf(buf[j], 1.0001f, acc);
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}
"""

WELL_OCC_SRC = r"""
extern "C" __global__ void well_occupied_axpy_kernel(
        const float* __restrict__ x, float* __restrict__ y, float a,
        long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaf(a, x[i], y[i]);
}
"""


class Occupancy(Workload):
    name = "occupancy"
    SMEM = 200 * 1024  # 204800 B dynamic shared memory per block
    LOW_BLOCK = 32
    LOW_REPS = 2
    NB = 64 * MiB  # 67,108,864 fp32 elements for the axpy
    WELL_BLOCK = 256
    GEMM_N = 4096

    def setup(self):
        t = self.torch
        import cupy as cp
        import numpy as np

        self.cp, self.np = cp, np
        cp.cuda.Device(0).use()
        sms = t.cuda.get_device_properties(0).multi_processor_count
        self.low_grid = 4 * sms
        self.n_per_block = self.SMEM // 4
        self.low = cp.RawKernel(LOW_OCC_SRC, "low_occupancy_smem_kernel")
        self.well = cp.RawKernel(WELL_OCC_SRC, "well_occupied_axpy_kernel")
        for k in (self.low, self.well):
            try:
                k.compile()
            except Exception:  # noqa: BLE001  (older CuPy: compiled on first call)
                pass
        set_how = None
        try:
            self.low.max_dynamic_shared_size_bytes = self.SMEM
            set_how = "RawKernel.max_dynamic_shared_size_bytes"
        except Exception as e1:  # noqa: BLE001
            print("max_dynamic_shared_size_bytes setter failed:", repr(e1))
            drv = cp.cuda.driver
            drv.funcSetAttribute(
                self.low.kernel.ptr, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.SMEM
            )
            set_how = "cuFuncSetAttribute"
        self.low_in = cp.random.random(self.low_grid * self.n_per_block, dtype=cp.float32)
        self.low_out = cp.zeros(self.low_grid, dtype=cp.float32)
        self.wx = cp.random.random(self.NB, dtype=cp.float32)
        self.wy = cp.random.random(self.NB, dtype=cp.float32)
        self.well_grid = (self.NB + self.WELL_BLOCK - 1) // self.WELL_BLOCK
        self.A = t.randn(self.GEMM_N, self.GEMM_N, device=self.dev, dtype=t.bfloat16)
        self.Bm = t.randn(self.GEMM_N, self.GEMM_N, device=self.dev, dtype=t.bfloat16)
        cp.cuda.runtime.deviceSynchronize()
        t.cuda.synchronize()

        def attrs(k):
            d = {}
            for a in (
                "num_regs",
                "shared_size_bytes",
                "const_size_bytes",
                "local_size_bytes",
                "max_threads_per_block",
                "max_dynamic_shared_size_bytes",
                "binary_version",
                "ptx_version",
            ):
                try:
                    d[a] = int(getattr(k, a))
                except Exception:  # noqa: BLE001
                    pass
            return d

        occ = {}
        for nm, k, blk, sm in (
            ("low_occupancy_smem_kernel", self.low, self.LOW_BLOCK, self.SMEM),
            ("well_occupied_axpy_kernel", self.well, self.WELL_BLOCK, 0),
        ):
            occ[nm] = theoretical_occupancy_sm90(
                attrs(k).get("num_regs"), blk, sm + attrs(k).get("shared_size_bytes", 0)
            )
            try:
                nb = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, blk, sm)
                occ[nm]["driver_max_active_blocks_per_sm"] = int(nb)
            except Exception as e:  # noqa: BLE001
                occ[nm]["driver_occupancy_api"] = f"unavailable: {e!r}"[:200]
        self.extra["launch_configs"] = {
            "low_occupancy_smem_kernel": {
                "grid": [self.low_grid, 1, 1],
                "block": [self.LOW_BLOCK, 1, 1],
                "dynamic_smem_bytes": self.SMEM,
                "smem_attr_set_via": set_how,
                "n_per_block_floats": self.n_per_block,
                "reps": self.LOW_REPS,
                "bytes_read": self.low_grid * self.SMEM,
                **attrs(self.low),
                **occ["low_occupancy_smem_kernel"],
            },
            "well_occupied_axpy_kernel": {
                "grid": [self.well_grid, 1, 1],
                "block": [self.WELL_BLOCK, 1, 1],
                "dynamic_smem_bytes": 0,
                "n": self.NB,
                "bytes_moved": 3 * 4 * self.NB,
                **attrs(self.well),
                **occ["well_occupied_axpy_kernel"],
            },
            "gemm": {
                "op": "torch.matmul",
                "dtype": "bfloat16",
                "shape_mnk": [self.GEMM_N] * 3,
                "flops": 2 * self.GEMM_N**3,
                "note": "kernel name/grid/regs: see trace_facts",
            },
        }
        self.kern_times = {"low": [], "well": [], "gemm": []}

    def step(self, batch):
        t, np = self.torch, self.np
        prof_rf = t.profiler.record_function
        ev = [t.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record()
        with prof_rf("launch low_occupancy_smem_kernel"):
            self.low(
                (self.low_grid,),
                (self.LOW_BLOCK,),
                (self.low_in, self.low_out, np.int32(self.n_per_block), np.int32(self.LOW_REPS)),
                shared_mem=self.SMEM,
            )
        ev[1].record()
        with prof_rf("launch well_occupied_axpy_kernel"):
            self.well(
                (self.well_grid,),
                (self.WELL_BLOCK,),
                (self.wx, self.wy, np.float32(1.0001), np.int64(self.NB)),
            )
        ev[2].record()
        self.C = self.A @ self.Bm
        ev[3].record()
        t.cuda.synchronize()
        if self.phase == "measure":
            self.kern_times["low"].append(ev[0].elapsed_time(ev[1]) / 1e3)
            self.kern_times["well"].append(ev[1].elapsed_time(ev[2]) / 1e3)
            self.kern_times["gemm"].append(ev[2].elapsed_time(ev[3]) / 1e3)

    def after_run(self):
        self.extra["kernel_time_measure_phase"] = {
            k: summarize(v) for k, v in self.kern_times.items()
        }


WORKLOADS = {
    w.name: w
    for w in (
        Healthy,
        DataloaderStall,
        TinyKernels,
        PageableSync,
        CudaGraph,
        CudaGraphRunahead,
        Occupancy,
    )
}


# --------------------------------------------------------------------------
# Trace read-back (plain json; no torch needed)
# --------------------------------------------------------------------------
def kineto_facts(path: str) -> dict:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        tr = json.load(f)
    evs = tr.get("traceEvents", [])
    cats = {}
    steps = []
    dl = 0
    kernels = {}
    syncs = {}
    memcpy = {}
    for e in evs:
        c = e.get("cat")
        cats[c] = cats.get(c, 0) + 1
        n = e.get("name", "")
        if n.startswith("ProfilerStep#"):
            steps.append(n)
        if "DataLoader" in n:
            dl += 1
        if c == "kernel":
            a = e.get("args", {})
            k = kernels.setdefault(n, {"count": 0, "total_dur_us": 0.0})
            k["count"] += 1
            k["total_dur_us"] += float(e.get("dur", 0))
            for key in (
                "grid",
                "block",
                "registers per thread",
                "shared memory",
                "est. achieved occupancy %",
                "warps per SM",
                "blocks per SM",
            ):
                if key in a and key not in k:
                    k[key] = a[key]
        if c in ("cuda_runtime", "cuda_driver") and "ynchronize" in n:
            syncs[n] = syncs.get(n, 0) + 1
        if c == "gpu_memcpy":
            m = memcpy.setdefault(n, {"count": 0, "bytes": 0})
            m["count"] += 1
            m["bytes"] += int(e.get("args", {}).get("bytes", 0))
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["total_dur_us"])[:8]
    return {
        "n_events": len(evs),
        "events_by_cat": cats,
        "profiler_steps": sorted(set(steps), key=lambda s: int(s.split("#")[1])),
        "dataloader_events": dl,
        "n_kernels": sum(v["count"] for v in kernels.values()),
        "n_distinct_kernels": len(kernels),
        "top_kernels_by_time": [dict(name=k, **v) for k, v in top],
        "sync_api_calls": syncs,
        "memcpy": memcpy,
        "distributedInfo": tr.get("distributedInfo"),
        "deviceProperties_names": [d.get("name") for d in tr.get("deviceProperties", [])],
    }


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def run_phase(torch, wl, it, n, nvtx, label, sync_each=False, prof=None, first_index=0):
    wl.phase = label
    times = []
    loads = []
    for i in range(n):
        if sync_each:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        nvtx.push(f"{'step' if label == 'profiled' else label} {first_index + i}")
        batch = None
        if it is not None:
            nvtx.push("data_loading")
            tl = time.perf_counter()
            batch = next(it)
            loads.append(time.perf_counter() - tl)
            nvtx.pop()
        wl.step(batch)
        nvtx.pop()
        if sync_each:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return times, loads


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--profiler", choices=["kineto", "none"], default="kineto")
    ap.add_argument(
        "--nvtx", action="store_true", help="emit NVTX ranges per step and around data loading"
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--measure",
        type=int,
        default=None,
        help="synchronized, unprofiled timing steps (default 10 with "
        "kineto, 0 with --profiler none)",
    )
    ap.add_argument(
        "--steps", type=int, default=6, help="--profiler none: number of NVTX 'step N' steps"
    )
    ap.add_argument("--active", type=int, default=None, help="override schedule active steps")
    ap.add_argument("--tag", default="", help="suffix for the truth file name")
    ap.add_argument(
        "--trace-format",
        default=None,
        help="annotation for the truth file when an external profiler "
        "(nsys, ncu) wraps this run, e.g. nsys-sqlite, ncu-csv",
    )
    ap.add_argument(
        "--trace-file",
        action="append",
        default=[],
        help="annotation: file name(s) the external profiler writes",
    )
    ap.add_argument(
        "--external-command", default=None, help="annotation: the external profiler command line"
    )
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for k, v in SCENARIOS.items():
            print(f"{k}: {v['description']}")
        return 0
    if not args.scenario or not args.out:
        ap.error("--scenario and --out are required")
    if args.measure is None:
        args.measure = 10 if args.profiler == "kineto" else 0

    import torch

    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    wl = WORKLOADS[args.scenario](torch, args)
    wl.setup()
    nvtx = Nvtx(torch, args.nvtx)
    it = iter(wl.loader) if wl.loader is not None else None

    t_start = time.perf_counter()
    run_phase(torch, wl, it, args.warmup, nvtx, "warmup", sync_each=True)
    torch.cuda.synchronize()
    m_times, m_loads = run_phase(torch, wl, it, args.measure, nvtx, "measure", sync_each=True)
    sleep_mark = len(getattr(wl, "dataset", None).sleep_log) if getattr(wl, "dataset", None) else 0

    truth = {
        "schema": "stallscope-sample-truth/1",
        "scenario": args.scenario,
        "description": SCENARIOS[args.scenario]["description"],
        "planted": SCENARIOS[args.scenario]["planted"],
        "expected_findings": SCENARIOS[args.scenario]["expected_findings"],
        "expected_absent": SCENARIOS[args.scenario].get("expected_absent", []),
        "severity_notes": SCENARIOS[args.scenario]["severity_notes"],
        "capture": {
            "profiler": args.profiler,
            "nvtx": args.nvtx,
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "warmup_steps": args.warmup,
            "measure_steps": args.measure,
            "format": args.trace_format
            or ("kineto-json-gz" if args.profiler == "kineto" else None),
            "external_profiler_command": args.external_command,
            "trace_files": args.trace_file or None,
        },
    }
    trace_path = None
    if args.profiler == "kineto":
        sched = dict(SCHEDULE_PER_SCENARIO.get(args.scenario, SCHEDULE_DEFAULT))
        if args.active:
            sched["active"] = args.active
        total = sched["wait"] + sched["warmup"] + sched["active"]
        raw_path = os.path.join(args.out, f"{args.scenario}.pt.trace.json")
        exported = []

        def on_ready(p):
            p.export_chrome_trace(raw_path)
            exported.append(raw_path)

        from torch.profiler import ProfilerActivity, profile, schedule

        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(
                wait=sched["wait"], warmup=sched["warmup"], active=sched["active"], repeat=1
            ),
            on_trace_ready=on_ready,
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        ) as prof:
            p_times, p_loads = run_phase(torch, wl, it, total, nvtx, "profiled", prof=prof)
        torch.cuda.synchronize()
        if not exported:
            raise RuntimeError("profiler did not export a trace")
        trace_path = raw_path + ".gz"
        with open(raw_path, "rb") as fi, gzip.open(trace_path, "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        raw_size = os.path.getsize(raw_path)
        os.remove(raw_path)
        first = sched["wait"] + sched["warmup"]
        truth["capture"].update(
            {
                "schedule": sched,
                "profiled_steps": [f"ProfilerStep#{i}" for i in range(first, total)],
                "trace_file": os.path.basename(trace_path),
                "trace_bytes_gz": os.path.getsize(trace_path),
                "trace_bytes_raw": raw_size,
                "record_shapes": False,
                "with_stack": False,
                "profile_memory": False,
            }
        )
        active_slice = slice(first, total)
    else:
        p_times, p_loads = run_phase(torch, wl, it, args.steps, nvtx, "profiled", first_index=0)
        torch.cuda.synchronize()
        truth["capture"].update(
            {
                "profiled_steps": [f"step {i}" for i in range(args.steps)],
                "nvtx_step_ranges": "NVTX 'step <i>' per profiled step, nested "
                "'data_loading' around next(DataLoader); "
                "'warmup <i>' for warmup steps"
                if args.nvtx
                else None,
            }
        )
        active_slice = slice(0, args.steps)
    wall_total = time.perf_counter() - t_start

    wl.after_run()
    measured = {
        "step_wall_ns_measure_phase_synced": summarize(m_times),
        "step_wall_ns_profiled_phase_cpu": summarize(p_times[active_slice]),
        "profiled_phase_step_wall_ns_list": [ns(v) for v in p_times[active_slice]],
        "data_loading_ns_measure_phase": summarize(m_loads),
        "data_loading_ns_profiled_phase": summarize(p_loads[active_slice]) if p_loads else None,
        "run_wall_s": round(wall_total, 3),
    }
    gpu = wl.gpu_times_by_phase()
    for phase, v in gpu.items():
        measured[f"gpu_compute_ns_{phase}"] = summarize(
            v[active_slice] if phase == "profiled" else v
        )
    ds = getattr(wl, "dataset", None)
    if ds is not None and ds.sleep_log:
        # one sleep per step; keep the profiled (active) steps only
        measured["planted_sleep_ns_measured"] = summarize(ds.sleep_log[sleep_mark:][active_slice])
    if m_times and "measure" in gpu:
        idle = statistics.median(m_times) - statistics.median(gpu["measure"])
        measured["expected_gpu_idle_ns_per_step"] = ns(idle)
        measured["expected_gpu_busy_fraction"] = round(
            statistics.median(gpu["measure"]) / statistics.median(m_times), 4
        )
    measured.update(wl.extra)
    gr = (wl.extra.get("graph_replay_ns_per_step") or {}).get("median_ns")
    if gr and m_times:
        # GPU work of the step (as one graph) over the eager step's wall time
        measured["expected_gpu_busy_fraction"] = round(gr / ns(statistics.median(m_times)), 4)
    truth["measured"] = measured
    truth["environment"] = env_info(torch)
    if trace_path:
        try:
            truth["trace_facts"] = kineto_facts(trace_path)
            truth["trace_facts_note"] = (
                "read back from the exported trace by a "
                "plain JSON scan (tools/capture); not "
                "independent of the trace"
            )
        except Exception as e:  # noqa: BLE001
            truth["trace_facts_error"] = repr(e)
    tp = os.path.join(args.out, f"{args.scenario}{args.tag}.truth.json")
    with open(tp, "w") as f:
        json.dump(truth, f, indent=1, sort_keys=False)
    print(
        f"[{args.scenario}] wrote {tp}"
        + (f" and {trace_path} ({os.path.getsize(trace_path)} B)" if trace_path else "")
    )
    print(
        f"[{args.scenario}] measure-phase step median: "
        f"{(measured['step_wall_ns_measure_phase_synced'] or {}).get('median_ns')} ns; "
        f"profiled-phase step median: "
        f"{(measured['step_wall_ns_profiled_phase_cpu'] or {}).get('median_ns')} ns"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
