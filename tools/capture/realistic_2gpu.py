#!/usr/bin/env python3
"""Realistic two-GPU training captures with paired, measured ground truth.

One script, one process per GPU, launched by torchrun:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tools/capture/realistic_2gpu.py --scenario baseline --out DIR

CPU dry run (no GPU; gloo; a tiny model; the CPU profiler):

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tools/capture/realistic_2gpu.py --scenario loader_stall --out DIR --tiny

The model is GPT-like: token + position embeddings, --layers pre-LayerNorm
blocks (causal scaled-dot-product attention with --d-model/--heads, a 4x GELU
MLP), a final LayerNorm and a head tied to the token embedding.  The defaults
(d_model 1024, 16 layers, 16 heads, seq 1024, vocab 32768, batch 16 per rank)
give 236,144,640 parameters.  Compute is bf16 (torch.autocast; FSDP2 casts
parameters with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32));
master weights, gradients and their reduction are fp32; AdamW (fused on CUDA).
Every step ends with loss.item(), as a training loop that logs does.

Scenarios (--scenario), each with the configuration it is paired with:

  baseline           DDP, default buckets (25 MB). The clean control.
  loader_stall       as baseline, but rank 1's Dataset.__getitem__ sleeps so the
                     stall is --stall-frac (0.40) of the resulting step. The
                     sleep is calibrated in the run: stall = f/(1-f) x the clean
                     step median (max over ranks). Paired with: no sleep.
  compute_straggler  as baseline, but rank 1 trains on a 1.5x batch
                     (--straggler-batch-mult). Paired with: batch x1 on both.
  no_overlap         no DDP wrapper: after backward all gradients are
                     flattened into one buffer, all-reduced in ONE call,
                     averaged and copied back. Paired with: DDP default
                     buckets (a second copy of the model in the same process).
  fsdp_prefetch      FSDP2 fully_shard per block and at the root,
                     reshard_after_forward=True, explicit forward prefetch of
                     the next --prefetch-depth (2) blocks and backward prefetch
                     of the previous ones. The clean FSDP control.
  fsdp_no_prefetch   the same FSDP2 model with prefetching off: no forward
                     prefetch list and each module's backward prefetch set to
                     itself (a no-op that replaces FSDP2's default one-module
                     backward prefetch). FSDP2 still issues each all-gather
                     from the CPU on its own stream, so CPU run-ahead can hide
                     part of it; the measured difference says how much was
                     lost. Paired with: fsdp_prefetch (toggled in the run).

Ground truth (rank 0 writes <scenario>.truth.json, or <scenario>.nsys.truth.json
with --profiler none): the planted fault and its size per step; per-rank step
times of --measure (24) unprofiled steps of the scenario and of its paired
reference, interleaved in blocks of --block (4) steps, each step timed with
time.perf_counter between two torch.cuda.synchronize() calls; median/p90 per
rank and of the job (the slowest rank per step); the difference of the job
medians = the expected saving per step and over the profiled steps; the step
times of the profiled phase; model size; versions.  --baseline-truth adds the
median of a separate baseline run (cross-run check).  Per-rank GPU busy/idle is
read from the traces afterwards by tools/capture/trim_and_truth.py.

Run-time estimate on 2 x H200 (defaults; not yet measured, to be replaced by
the logged times): start-up (torchrun, import, NCCL, model, cuBLAS) ~20 s; a
clean step ~70-90 ms (about 13 TFLOP per rank at ~40-60 % of bf16 peak), so
warm-up + 2 x 24 measured + 8 profiled steps ~6 s (loader_stall and
compute_straggler ~8 s); Kineto export + gzip of 5 steps (~20k events per
rank) ~5-10 s.  Kineto run: ~30-40 s per scenario, ~3.5 min for all six.  nsys
run (--profiler none --measure 0, 2 warm-up + 5 steps): ~25 s, plus report
generation and SQLite export ~15-30 s: ~40-55 s per scenario, ~4.5 min for
six.  capture_2gpu.sh runs Kineto first, then nsys by priority, under a
global DEADLINE (default 540 s) that skips what would not fit.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time

SCHEMA = "stallscope-sample-truth/1"
STRAGGLER_RANK = 1
NVLS_ENV = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
)
FULL_SIZE = {"d_model": 1024, "layers": 16, "heads": 16, "seq": 1024, "vocab": 32768, "batch": 16}
TINY_SIZE = {"d_model": 64, "layers": 2, "heads": 4, "seq": 32, "vocab": 256, "batch": 2}

SCENARIOS: dict[str, dict] = {
    "baseline": {
        "wrapper": "ddp",
        "reference": None,
        "description": "DDP (default 25 MB buckets) on a GPT-like bf16 model; gradient "
        "all-reduces overlap backward. The clean control for the DDP faults.",
        "expected_findings": [],
        "expected_absent": ["nccl_wait straggler", "gpu_idle dataloader", "overlap (exposed)"],
        "severity_notes": "Healthy: both GPUs busy >= 70 % of each step.",
    },
    "loader_stall": {
        "wrapper": "ddp",
        "reference": "baseline",
        "description": "As baseline, but rank 1's Dataset.__getitem__ sleeps in its data "
        "loading phase (DataLoader, num_workers=0) for --stall-frac of a step; rank 0 "
        "waits for it in its first gradient all-reduce.",
        "expected_findings": [
            {
                "analyzer": "nccl_wait",
                "straggler_rank": STRAGGLER_RANK,
                "waiting_rank": 0,
                "notes": "Rank 0 waits ~the stall per step inside NCCL; rank 1 is the straggler.",
            },
            {
                "analyzer": "gpu_idle",
                "rank": STRAGGLER_RANK,
                "cause": "dataloader",
                "notes": "Rank 1's GPU idles during its DataLoader __next__.",
            },
        ],
        "expected_absent": [],
        "severity_notes": "High: ~40 % of every step.",
    },
    "compute_straggler": {
        "wrapper": "ddp",
        "reference": "baseline",
        "description": "As baseline, but rank 1 trains on a 1.5x batch, so its forward "
        "and backward take ~1.5x as long; rank 0 waits in its all-reduces.",
        "expected_findings": [
            {
                "analyzer": "nccl_wait",
                "straggler_rank": STRAGGLER_RANK,
                "waiting_rank": 0,
                "notes": "Rank 1 is busy computing (not idle) while rank 0 waits in NCCL.",
            }
        ],
        "expected_absent": ["gpu_idle dataloader"],
        "severity_notes": "Medium to high: about a third of rank 0's step is waiting.",
    },
    "no_overlap": {
        "wrapper": "flat_allreduce",
        "reference": "baseline",
        "description": "No DDP wrapper: after loss.backward() every gradient is copied "
        "into one flat fp32 buffer, all-reduced in one dist.all_reduce call, divided "
        "by the world size and copied back, so no communication overlaps compute.",
        "expected_findings": [
            {
                "analyzer": "overlap",
                "notes": "~0 % of all-reduce time overlapped; the one NCCL kernel per step "
                "runs after the last backward kernel and before the optimizer.",
            }
        ],
        "expected_absent": ["nccl_wait straggler"],
        "severity_notes": "Exposed communication = the whole all-reduce per step.",
    },
    "fsdp_prefetch": {
        "wrapper": "fsdp",
        "reference": None,
        "description": "FSDP2 fully_shard on every block and the root, "
        "reshard_after_forward=True, explicit forward and backward prefetch of "
        "--prefetch-depth blocks. The clean FSDP control.",
        "expected_findings": [],
        "expected_absent": ["overlap (exposed)", "nccl_wait straggler"],
        "severity_notes": "Healthy: all-gathers and reduce-scatters mostly hidden.",
    },
    "fsdp_no_prefetch": {
        "wrapper": "fsdp",
        "reference": "fsdp_prefetch",
        "description": "The fsdp_prefetch model with prefetching off: no forward "
        "prefetch and each module's backward prefetch set to itself (a no-op that "
        "replaces FSDP2's default one-module backward prefetch).",
        "expected_findings": [
            {
                "analyzer": "overlap",
                "notes": "More exposed all-gather time than fsdp_prefetch; the measured "
                "step difference is how much of it prefetching hides.",
            }
        ],
        "expected_absent": ["nccl_wait straggler"],
        "severity_notes": "Depends on how far the CPU runs ahead; see the measured pair.",
    },
}


# ---------------------------------------------------------------- pure helpers


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def param_count(d_model: int, layers: int, vocab: int, seq: int) -> int:
    """Parameters of the GPT-like model (head tied to the token embedding).

    Per block: qkv (3d^2+3d), proj (d^2+d), fc (4d^2+4d), out (4d^2+d) and two
    LayerNorms (4d) = 12 d^2 + 13 d; plus embeddings (vocab+seq) d and the
    final LayerNorm 2d.
    """
    d = d_model
    return vocab * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    v = sorted(values)
    if not v:
        raise ValueError("percentile of an empty list")
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize_ns(values_ns: list[int]) -> dict | None:
    """n, median, p90, mean, min, max of step times (integer ns)."""
    if not values_ns:
        return None
    return {
        "n": len(values_ns),
        "median_ns": int(round(statistics.median(values_ns))),
        "p90_ns": int(round(percentile(values_ns, 90))),
        "mean_ns": int(round(statistics.fmean(values_ns))),
        "min_ns": min(values_ns),
        "max_ns": max(values_ns),
    }


def job_steps_ns(per_rank: list[list[int]]) -> list[int]:
    """The job's step time at each step index: the slowest rank's (ns)."""
    n = min(len(r) for r in per_rank) if per_rank else 0
    return [max(r[i] for r in per_rank) for i in range(n)]


def stall_seconds(clean_step_s: float, frac: float) -> float:
    """Sleep that makes up `frac` of the resulting step: s / (t + s) = frac."""
    if not 0.0 < frac < 1.0:
        raise ValueError("stall fraction must be in (0, 1)")
    return clean_step_s * frac / (1.0 - frac)


def interleave_order(names: list[str], per_name: int, block: int) -> list[str]:
    """Configuration per measured step: blocks of `block` steps, round robin,
    until each name has `per_name` steps (drift then hits both alike)."""
    order: list[str] = []
    left = {n: per_name for n in names}
    while any(left.values()):
        for n in names:
            k = min(block, left[n])
            order += [n] * k
            left[n] -= k
    return order


def pair_summary(
    scenario_job_ns: list[int], reference_job_ns: list[int] | None, profiled_steps: int
) -> dict | None:
    """Expected saving = job median(scenario) - job median(reference), per step
    and over the profiled steps (the unit of Finding.saving_ns)."""
    if not reference_job_ns or not scenario_job_ns:
        return None
    s = int(round(statistics.median(scenario_job_ns)))
    r = int(round(statistics.median(reference_job_ns)))
    return {
        "scenario_median_ns": s,
        "reference_median_ns": r,
        "expected_saving_ns_per_step": s - r,
        "expected_saving_frac_of_step": round((s - r) / s, 4) if s else None,
        "profiled_steps": profiled_steps,
        "expected_saving_ns_over_profiled_steps": (s - r) * profiled_steps,
    }


def build_truth(
    scenario: str,
    args: argparse.Namespace,
    model_info: dict,
    per_rank: list[dict],
    planted: list[dict],
    environment: dict,
    baseline_truth: dict | None = None,
) -> dict:
    """The truth file's content.  per_rank[r] holds at least
    measure_step_ns {config: [ns...]} and profiled_step_ns [ns...]."""
    spec = SCENARIOS[scenario]
    n_prof = args.active if args.profiler == "kineto" else args.steps
    configs = sorted({c for r in per_rank for c in r["measure_step_ns"]})
    job = {c: job_steps_ns([r["measure_step_ns"].get(c, []) for r in per_rank]) for c in configs}
    ref_name = "reference" if "reference" in job else None
    pair = pair_summary(job.get("scenario", []), job.get(ref_name) if ref_name else None, n_prof)
    if pair is not None:
        pair["reference"] = spec["reference"]
        pair["method"] = (
            f"same process, {args.measure} unprofiled steps per configuration, "
            f"interleaved in blocks of {args.block}; job step = slowest rank per step; "
            + (
                "time.perf_counter between torch.cuda.synchronize() calls"
                if args.device == "cuda"
                else "time.perf_counter (CPU dry run: the numbers mean nothing)"
            )
        )
    cross = None
    if baseline_truth is not None:
        try:
            b = baseline_truth["measured"]["job_step_ns"]["scenario"]["median_ns"]
            s = pair["scenario_median_ns"] if pair else summarize_ns(job["scenario"])["median_ns"]
            cross = {
                "baseline_run_scenario": baseline_truth.get("scenario"),
                "baseline_run_median_ns": b,
                "difference_ns_per_step": s - b,
                "note": "separate launch: includes run-to-run variation; the in-run pair is primary",
            }
        except (KeyError, TypeError):
            cross = {"error": "baseline truth has no measured.job_step_ns.scenario.median_ns"}
    if args.profiler == "kineto":
        first = args.wait + args.pwarmup
        profiled = [f"ProfilerStep#{i}" for i in range(first, first + args.active)]
        schedule = {"wait": args.wait, "warmup": args.pwarmup, "active": args.active}
    else:
        profiled = [f"step {i}" for i in range(args.steps)]
        schedule = None
    return {
        "schema": SCHEMA,
        "scenario": scenario,
        "description": spec["description"],
        "planted": planted,
        "expected_findings": spec["expected_findings"],
        "expected_absent": spec["expected_absent"],
        "severity_notes": spec["severity_notes"],
        "pair": pair,
        "cross_run_baseline": cross,
        "capture": {
            "profiler": args.profiler,
            "nvtx": args.nvtx,
            "format": args.trace_format
            or ("kineto-json-gz" if args.profiler == "kineto" else None),
            "external_profiler_command": args.external_command,
            "ranks": len(per_rank),
            "backend": args.backend,
            "device": args.device,
            "launcher": "python3 -m torch.distributed.run --standalone --nproc-per-node 2",
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "warmup_steps": args.warmup,
            "measure_steps_per_config": args.measure,
            "measure_block": args.block,
            "schedule": schedule,
            "profiled_steps": profiled,
            "record_shapes": False,
            "with_stack": False,
            "profile_memory": False,
        },
        "model": model_info,
        "measured": {
            "configs": {
                "scenario": scenario,
                "reference": spec["reference"] if "reference" in job else None,
            },
            "job_step_ns": {c: summarize_ns(v) for c, v in job.items()},
            "per_rank": [
                {
                    "rank": r["rank"],
                    "step_ns": {c: summarize_ns(v) for c, v in r["measure_step_ns"].items()},
                    "step_ns_list": r["measure_step_ns"],
                    "loader_ns": {c: summarize_ns(v) for c, v in r.get("loader_ns", {}).items()},
                    "profiled_phase_step_ns": summarize_ns(r["profiled_step_ns"]),
                    "profiled_phase_step_ns_list": r["profiled_step_ns"],
                    **{k: v for k, v in r.items() if k.startswith("extra_")},
                }
                for r in per_rank
            ],
        },
        "gpu_busy": {
            "note": "filled from the traces by tools/capture/trim_and_truth.py process",
            "per_rank": None,
        },
        "environment": environment,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="realistic_2gpu.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="what to run (required)")
    ap.add_argument("--list", action="store_true", help="describe the scenarios and exit")
    ap.add_argument("--out", help="output folder (traces and truth)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="nccl on cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model and few steps (dry run)")
    for k in ("d_model", "layers", "heads", "seq", "vocab", "batch"):
        ap.add_argument(
            f"--{k.replace('_', '-')}", type=int, default=None, help=f"default {FULL_SIZE[k]}"
        )
    ap.add_argument("--profiler", choices=["kineto", "none"], default="kineto")
    ap.add_argument("--nvtx", action="store_true", help="NVTX step/data_loading ranges (nsys)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per config (3)")
    ap.add_argument("--measure", type=int, default=None, help="unprofiled steps per config (24)")
    ap.add_argument("--block", type=int, default=4, help="interleave block of measured steps")
    ap.add_argument("--steps", type=int, default=5, help="NVTX steps with --profiler none")
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--pwarmup", type=int, default=2)
    ap.add_argument("--active", type=int, default=5)
    ap.add_argument("--stall-frac", type=float, default=0.40)
    ap.add_argument(
        "--stall-ms", type=float, default=None, help="fixed stall instead of calibrating"
    )
    ap.add_argument("--calib", type=int, default=6, help="clean steps to calibrate the stall")
    ap.add_argument("--straggler-batch-mult", type=float, default=1.5)
    ap.add_argument("--prefetch-depth", type=int, default=2)
    ap.add_argument("--reshard-after-forward", choices=["true", "false"], default="true")
    ap.add_argument("--baseline-truth", default=None, help="truth of a separate baseline run")
    ap.add_argument("--trace-format", default=None)
    ap.add_argument("--external-command", default=None)
    return ap


def resolve_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and fill size/step defaults (--tiny picks the small ones)."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.list:
        return a
    if not a.scenario or not a.out:
        ap.error("--scenario and --out are required")
    size = TINY_SIZE if a.tiny else FULL_SIZE
    for k, v in size.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.d_model % a.heads:
        ap.error("--d-model must be a multiple of --heads")
    if a.backend is None:
        a.backend = "nccl" if a.device == "cuda" else "gloo"
    if a.device == "cpu" and a.backend == "nccl":
        ap.error("--device cpu needs --backend gloo")
    if a.warmup is None:
        a.warmup = 1 if a.tiny else 3
    if a.measure is None:
        a.measure = 0 if a.profiler == "none" else (4 if a.tiny else 24)
    if a.block < 1:
        ap.error("--block must be >= 1")
    if not 0.0 < a.stall_frac < 1.0:
        ap.error("--stall-frac must be in (0, 1)")
    return a


# ---------------------------------------------------------------- torch part


def import_torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise SystemExit(
            f"realistic_2gpu.py needs PyTorch with torch.distributed ({e}); "
            "install torch, or use --list / --help without it"
        ) from None
    return torch, dist


def import_fsdp2(torch):
    """fully_shard and MixedPrecisionPolicy, or a clear exit."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        try:  # torch 2.4-2.5 kept FSDP2 here
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            raise SystemExit(
                f"FSDP2 (torch.distributed.fsdp.fully_shard) is not in torch "
                f"{torch.__version__}: the fsdp_* scenarios need torch >= 2.6 "
                "(2.4-2.5 under torch.distributed._composable.fsdp); the DDP scenarios still run"
            ) from None
    return fully_shard, MixedPrecisionPolicy


def check_fsdp_prefetch_api(module) -> None:
    for name in ("set_modules_to_forward_prefetch", "set_modules_to_backward_prefetch"):
        if not hasattr(module, name):
            raise SystemExit(
                f"this torch's FSDP2 modules lack {name}(): the prefetch on/off "
                "scenarios need torch >= 2.6"
            )


def build_gpt(torch, a):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(a.vocab, a.d_model)
            self.pos = nn.Embedding(a.seq, a.d_model)
            self.blocks = nn.ModuleList(Block(a.d_model, a.heads) for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.d_model)
            self.head = nn.Linear(a.d_model, a.vocab, bias=False)
            self.head.weight = self.tok.weight  # tied

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return GPT()


def run(a: argparse.Namespace) -> int:  # noqa: C901 (one linear capture script)
    torch, dist = import_torch()
    from torch.utils.data import DataLoader, Dataset

    cuda = a.device == "cuda"
    if cuda:
        for k, v in NVLS_ENV:
            if os.environ.get(k) != v:
                raise SystemExit(f"refusing to run: set {k}={v} (NVLink multicast must stay off)")
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but torch sees no GPU (use --device cpu --tiny)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group(a.backend, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = SCENARIOS[a.scenario]
    os.makedirs(a.out, exist_ok=True)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True

    def nvtx_push(name):
        if a.nvtx and cuda:
            torch.cuda.nvtx.range_push(name)

    def nvtx_pop():
        if a.nvtx and cuda:
            torch.cuda.nvtx.range_pop()

    # ---- data: pre-made token batches behind a real DataLoader
    class TokenBatches(Dataset):
        def __init__(self):
            self.sets: dict[str, list] = {}
            self.use = "x1"
            self.stall_s = 0.0
            self.sleeps: list[float] = []

        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            if self.stall_s > 0:
                nvtx_push("planted_stall")
                t0 = time.perf_counter()
                time.sleep(self.stall_s)  # PLANTED data-loading stall
                self.sleeps.append(time.perf_counter() - t0)
                nvtx_pop()
            b = self.sets[self.use]
            return b[i % len(b)]

    gen = torch.Generator().manual_seed(1000 + rank)

    def make_batches(n_rows):
        out = []
        for _ in range(2):
            t = torch.randint(0, a.vocab, (n_rows, a.seq + 1), generator=gen)
            x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
            if cuda:
                x, y = x.pin_memory(), y.pin_memory()
            out.append((x, y))
        return out

    ds = TokenBatches()
    ds.sets["x1"] = make_batches(a.batch)
    big = max(a.batch + 1, int(round(a.batch * a.straggler_batch_mult)))
    if a.scenario == "compute_straggler" and rank == STRAGGLER_RANK:
        ds.sets["big"] = make_batches(big)
    it = iter(DataLoader(ds, batch_size=None, num_workers=0))

    # ---- model(s)
    def fresh_model():
        torch.manual_seed(0)  # identical init on every rank
        return build_gpt(torch, a).to(dev)

    def make_opt(params):
        # fused AdamW for plain tensors; FSDP2's DTensor parameters keep the
        # default (foreach) implementation
        kw = {"fused": True} if cuda and spec["wrapper"] != "fsdp" else {}
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, **kw)

    configs: dict[str, dict] = {}
    model_info_extra: dict = {}
    set_prefetch = None
    if spec["wrapper"] in ("ddp", "flat_allreduce"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        def ddp_config():
            m = fresh_model()
            net = DDP(m, device_ids=[local] if cuda else None)  # default buckets (25 MB)
            return {"net": net, "opt": make_opt(net.parameters()), "params": list(m.parameters())}

        if spec["wrapper"] == "ddp":
            base = ddp_config()
            configs["scenario"] = dict(base)
            if spec["reference"]:
                configs["reference"] = dict(base)
        else:
            m = fresh_model()
            for p in m.parameters():
                dist.broadcast(p.data, src=0)
            plain = {"net": m, "opt": make_opt(m.parameters()), "params": list(m.parameters())}
            configs["scenario"] = dict(plain, flat_allreduce=True)
            configs["reference"] = ddp_config()
        model_info_extra = {"wrapper": spec["wrapper"], "ddp_bucket_cap_mb": 25}
    else:
        fully_shard, MixedPrecisionPolicy = import_fsdp2(torch)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(a.device, (world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        raf = a.reshard_after_forward == "true"
        m = fresh_model()
        blocks = list(m.blocks)
        for blk in blocks:
            fully_shard(blk, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
        fully_shard(m, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
        check_fsdp_prefetch_api(m)
        d = a.prefetch_depth

        def set_prefetch(on: bool) -> None:
            """Explicit prefetch of `d` blocks, or none (backward: self = no-op)."""
            m.set_modules_to_forward_prefetch(blocks[:d] if on else [])
            m.set_modules_to_backward_prefetch([blocks[-1]] if on else [m])
            for i, blk in enumerate(blocks):
                if on:
                    blk.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + d])
                    prev = list(reversed(blocks[max(0, i - d) : i]))
                    blk.set_modules_to_backward_prefetch(prev or [blk])
                else:
                    blk.set_modules_to_forward_prefetch([])
                    blk.set_modules_to_backward_prefetch([blk])

        fs = {"net": m, "opt": make_opt(m.parameters()), "params": list(m.parameters())}
        on = a.scenario == "fsdp_prefetch"
        configs["scenario"] = dict(fs, prefetch=on)
        if spec["reference"]:
            configs["reference"] = dict(fs, prefetch=True)
        model_info_extra = {
            "wrapper": "fsdp2",
            "fully_shard": "each block, then the root",
            "reshard_after_forward": raf,
            "prefetch_depth": d,
            "mixed_precision": "param bf16, reduce fp32",
        }

    # per-config data settings (the planted faults)
    if a.scenario == "compute_straggler" and rank == STRAGGLER_RANK:
        configs["scenario"]["batch_set"] = "big"

    n_params = sum(p.numel() for p in configs["scenario"]["params"])
    F = torch.nn.functional
    amp_dtype = torch.bfloat16
    loader_times: dict[str, list[float]] = {}

    def flat_allreduce(params):
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # PLANTED: one un-overlapped all-reduce of all gradients
        flat.div_(world)
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()

    def apply(cfg_name):
        c = configs[cfg_name]
        ds.use = c.get("batch_set", "x1")
        ds.stall_s = c.get("stall_s", 0.0)
        if set_prefetch is not None:
            set_prefetch(c.get("prefetch", True))
        return c

    def train_step(cfg_name):
        c = apply(cfg_name)
        nvtx_push("data_loading")
        t0 = time.perf_counter()
        x, y = next(it)
        loader_times.setdefault(cfg_name, []).append(time.perf_counter() - t0)
        nvtx_pop()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(
            device_type=a.device, dtype=amp_dtype, enabled=spec["wrapper"] != "fsdp"
        ):
            logits = c["net"](x)
            loss = F.cross_entropy(logits.reshape(-1, a.vocab).float(), y.reshape(-1))
        c["opt"].zero_grad(set_to_none=True)
        loss.backward()
        if c.get("flat_allreduce"):
            flat_allreduce(c["params"])
        c["opt"].step()
        return loss.item()

    def timed(cfg_name, label, prof=None, sync_each=True):
        """Wall time of one step.  Unprofiled phases synchronize around the
        step; profiled steps do not (loss.item() already waits for the GPU),
        so the traces hold no extra synchronize calls."""
        if sync_each:
            sync()
        t0 = time.perf_counter()
        nvtx_push(label)
        train_step(cfg_name)
        nvtx_pop()
        if sync_each:
            sync()
        dt = time.perf_counter() - t0
        if prof is not None:
            prof.step()
        return dt

    names = ["scenario"] + (["reference"] if "reference" in configs else [])
    for n in names:
        for i in range(a.warmup):
            timed(n, f"warmup {n} {i}")

    # ---- calibrate the loader stall on clean steps (max over ranks)
    stall_s = 0.0
    clean_median_s = None
    if a.scenario == "loader_stall":
        if a.stall_ms is not None:
            stall_s = a.stall_ms / 1e3
        else:
            clean = [timed("reference", f"calib {i}") for i in range(a.calib)]
            t = torch.tensor([statistics.median(clean)], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            clean_median_s = float(t.item())
            stall_s = stall_seconds(clean_median_s, a.stall_frac)
        if rank == STRAGGLER_RANK:
            configs["scenario"]["stall_s"] = stall_s
        for _ in range(max(1, a.warmup)):  # every rank: the collectives must match
            timed("scenario", "warmup stalled")
    dist.barrier()

    # ---- unprofiled, interleaved measurement
    measure: dict[str, list[int]] = {n: [] for n in names}
    loader_times.clear()
    sleep_mark = len(ds.sleeps)
    for n in interleave_order(names, a.measure, a.block):
        measure[n].append(to_ns(timed(n, f"measure {n}")))
    measured_sleeps = ds.sleeps[sleep_mark:]
    loader_ns = {n: [to_ns(t) for t in v] for n, v in loader_times.items()}
    dist.barrier()

    # ---- profiled phase (the scenario configuration only)
    prof_times: list[float] = []
    trace_path = None
    if a.profiler == "kineto":
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        total = a.wait + a.pwarmup + a.active
        raw = os.path.join(a.out, f"rank{rank}.pt.trace.json")

        def ready(p):
            p.export_chrome_trace(raw)

        with profile(
            activities=acts,
            schedule=schedule(wait=a.wait, warmup=a.pwarmup, active=a.active, repeat=1),
            on_trace_ready=ready,
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        ) as prof:
            for i in range(total):
                prof_times.append(timed("scenario", f"profiled {i}", prof=prof, sync_each=False))
        sync()
        prof_times = prof_times[a.wait + a.pwarmup :]
        import gzip

        trace_path = raw + ".gz"
        with open(raw, "rb") as fi, gzip.open(trace_path, "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(raw)
    else:
        for i in range(a.steps):
            prof_times.append(timed("scenario", f"step {i}", sync_each=False))

    mine = {
        "rank": rank,
        "measure_step_ns": measure,
        "loader_ns": loader_ns,
        "profiled_step_ns": [to_ns(t) for t in prof_times],
        "extra_batch_rows": a.batch if configs["scenario"].get("batch_set", "x1") == "x1" else big,
        "extra_planted_sleep_ns": summarize_ns([to_ns(t) for t in measured_sleeps]),
        "extra_trace_file": os.path.basename(trace_path) if trace_path else None,
        "extra_trace_bytes_gz": os.path.getsize(trace_path) if trace_path else None,
        "extra_device_name": torch.cuda.get_device_name(dev) if cuda else platform.processor(),
    }
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        planted = planted_facts(a, gathered, stall_s, clean_median_s, big, n_params)
        model_info = {
            "kind": "GPT-like decoder, pre-LayerNorm, causal SDPA, GELU MLP, tied head",
            "params": n_params,
            "params_formula": param_count(a.d_model, a.layers, a.vocab, a.seq),
            "d_model": a.d_model,
            "layers": a.layers,
            "heads": a.heads,
            "seq": a.seq,
            "vocab": a.vocab,
            "batch_per_rank": a.batch,
            "tokens_per_rank_per_step": a.batch * a.seq,
            "compute_dtype": "bf16",
            "master_dtype": "fp32",
            "optimizer": "AdamW" + (" (fused)" if cuda and spec["wrapper"] != "fsdp" else ""),
            **model_info_extra,
        }
        baseline = None
        if a.baseline_truth and os.path.exists(a.baseline_truth):
            with open(a.baseline_truth) as f:
                baseline = json.load(f)
        truth = build_truth(
            a.scenario, a, model_info, gathered, planted, environment(torch, cuda, dev), baseline
        )
        tag = "" if a.profiler == "kineto" else ".nsys"
        path = os.path.join(a.out, f"{a.scenario}{tag}.truth.json")
        with open(path, "w") as f:
            json.dump(truth, f, indent=1)
        pair = truth["pair"] or {}
        job = truth["measured"]["job_step_ns"]["scenario"] or {}
        print(
            f"[{a.scenario}] params {n_params:,}; job step median {job.get('median_ns')} ns; "
            f"reference {pair.get('reference_median_ns')} ns; "
            f"saving/step {pair.get('expected_saving_ns_per_step')} ns -> {path}"
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def planted_facts(a, gathered, stall_s, clean_median_s, big_rows, n_params) -> list[dict]:
    """What was planted, with its size per step (from the run where measured)."""
    if a.scenario == "loader_stall":
        meas = gathered[STRAGGLER_RANK].get("extra_planted_sleep_ns")
        return [
            {
                "kind": "dataloader_stall",
                "rank": STRAGGLER_RANK,
                "where": "Dataset.__getitem__ (DataLoader, num_workers=0), before forward",
                "amount_ns_per_step": to_ns(stall_s),
                "count_per_step": 1,
                "stall_frac_of_step_target": a.stall_frac,
                "calibrated_from_clean_step_ns": to_ns(clean_median_s) if clean_median_s else None,
                "measured_sleep_ns": meas,
            }
        ]
    if a.scenario == "compute_straggler":
        return [
            {
                "kind": "compute_straggler",
                "rank": STRAGGLER_RANK,
                "batch_rows": big_rows,
                "other_ranks_batch_rows": a.batch,
                "batch_mult": round(big_rows / a.batch, 4),
                "amount_ns_per_step": "see pair.expected_saving_ns_per_step",
            }
        ]
    if a.scenario == "no_overlap":
        return [
            {
                "kind": "serialized_allreduce",
                "count_per_step": 1,
                "bytes_per_step": 4 * n_params,  # fp32 gradients, one flat buffer
                "amount_ns_per_step": "see pair.expected_saving_ns_per_step",
            }
        ]
    if a.scenario == "fsdp_no_prefetch":
        return [
            {
                "kind": "fsdp_prefetch_off",
                "forward_prefetch": "none",
                "backward_prefetch": "self (no-op)",
                "amount_ns_per_step": "see pair.expected_saving_ns_per_step",
            }
        ]
    return []


def environment(torch, cuda: bool, dev) -> dict:
    env = {
        "date_utc": utc_now(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "kernel": platform.release(),
        "nsys_version": os.environ.get("STALLSCOPE_NSYS_VERSION"),
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
    }
    if cuda:
        env["gpu_name"] = torch.cuda.get_device_name(dev)
        env["gpu_count"] = torch.cuda.device_count()
        try:
            env["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - informative only
            env["nccl"] = None
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def list_scenarios() -> None:
    for name, s in SCENARIOS.items():
        ref = s["reference"] or "-"
        print(f"{name:18s} wrapper={s['wrapper']:15s} paired with {ref}\n    {s['description']}")


def main(argv: list[str] | None = None) -> int:
    a = resolve_args(argv)
    if a.list:
        list_scenarios()
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
