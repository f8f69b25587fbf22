#!/usr/bin/env python3
"""Two-GPU data-parallel workloads with planted, known faults.

Launch one process per GPU (NCCL backend):

    NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --standalone \
        --nproc_per_node 2 tools/capture/ddp_scenarios.py \
        --variant ddp_overlap --out /tmp/cap/kineto/ddp_overlap

Variants (same fp32 MLP, 10 x Linear(3072, 3072), ~94.4M parameters, batch
4096 per rank, TF32 matmuls, SGD momentum, loss.item() every step):

  ddp_overlap     DistributedDataParallel (default 25 MB buckets): gradient
                  all-reduces overlap the backward pass.
  ddp_no_overlap  no DDP wrapper: after loss.backward(), every gradient is
                  all-reduced with dist.all_reduce, one after another, so no
                  communication overlaps compute.
  ddp_straggler   as ddp_overlap, but rank 1 sleeps 50 ms before every
                  forward: rank 0 waits inside its first all-reduce.

Each rank writes rank{R}.pt.trace.json.gz (Kineto) when --profiler kineto;
rank 0 writes <variant>.truth.json with what was planted and measured on both
ranks.  With --profiler none --nvtx the loop emits NVTX 'step N' ranges (for
nsys).
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
import sys
import time
import traceback

HID, DEPTH, BATCH = 3072, 10, 4096
STRAGGLER_RANK = 1
STRAGGLER_SLEEP_S = 0.050

VARIANTS = {
    "ddp_overlap": {
        "description": "DDP (bucket_cap_mb=25 default) on a 10x Linear(3072,3072) "
        "fp32 MLP; all-reduce of gradient buckets overlaps backward.",
        "planted": [],
        "expected_findings": [
            {
                "analyzer": "overlap",
                "notes": "Most all-reduce time hidden under backward compute; "
                "communication is mostly overlapped. No straggler. The "
                "last bucket(s) cannot overlap (they finish after the last "
                "backward kernel): a small exposed tail is expected.",
            }
        ],
        "expected_absent": ["nccl_wait straggler"],
        "severity_notes": "Healthy baseline for multi-GPU analyzers.",
    },
    "ddp_no_overlap": {
        "description": "Same model without DDP; after loss.backward() each of the "
        "20 gradient tensors is all-reduced with dist.all_reduce "
        "(sum, then divide by world size) sequentially on the "
        "default stream, so no communication overlaps compute.",
        "planted": [
            {
                "kind": "serialized_allreduce",
                "count_per_step": 2 * DEPTH,
                "bytes_per_step": None,
                "amount_ns_per_step": "see measured.allreduce_flat_ns",
            }
        ],
        "expected_findings": [
            {
                "analyzer": "overlap",
                "notes": "~0% of all-reduce time overlapped with compute; all NCCL "
                "kernels run after the last backward kernel and before "
                "the optimizer kernels.",
            }
        ],
        "severity_notes": "Exposed communication = whole all-reduce time per step.",
    },
    "ddp_straggler": {
        "description": "As ddp_overlap, but rank 1 calls time.sleep(0.05) before every forward.",
        "planted": [
            {
                "kind": "straggler_sleep",
                "rank": STRAGGLER_RANK,
                "amount_ns_per_step": int(STRAGGLER_SLEEP_S * 1e9),
                "count_per_step": 1,
                "where": "host, before forward",
            }
        ],
        "expected_findings": [
            {
                "analyzer": "nccl_wait",
                "straggler_rank": STRAGGLER_RANK,
                "waiting_rank": 0,
                "approx_wait_ns_per_step": int(STRAGGLER_SLEEP_S * 1e9),
                "notes": "Rank 0's first NCCL all-reduce kernel of each step lasts "
                "~50 ms longer than rank 1's; rank 1's GPU is idle ~50 ms "
                "per step before its forward.",
            }
        ],
        "severity_notes": "High: ~50 ms of a ~60 ms step is waiting on rank 0.",
    },
}


def utc_now():
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ns(s):
    return int(round(s * 1e9))


def summarize(v):
    if not v:
        return None
    return {
        "n": len(v),
        "median_ns": ns(statistics.median(v)),
        "mean_ns": ns(statistics.fmean(v)),
        "min_ns": ns(min(v)),
        "max_ns": ns(max(v)),
    }


class ListDataset:
    def __init__(self, batches, length=10**6):
        self.batches = batches
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.batches[i % len(self.batches)]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--profiler", choices=["kineto", "none"], default="kineto")
    ap.add_argument("--nvtx", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--measure", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5, help="--profiler none steps")
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--pwarmup", type=int, default=2)
    ap.add_argument("--active", type=int, default=4)
    ap.add_argument("--trace-format", default=None)
    ap.add_argument("--external-command", default=None)
    args = ap.parse_args(argv)
    if args.measure is None:
        args.measure = 8 if args.profiler == "kineto" else 0

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    for k, v in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        if os.environ.get(k) != v:
            raise SystemExit(f"refusing to run: set {k}={v}")

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    v = args.variant

    torch.manual_seed(0)  # identical init on every rank
    layers = []
    for i in range(DEPTH):
        layers += [torch.nn.Linear(HID, HID)]
        if i < DEPTH - 1:
            layers += [torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    if v in ("ddp_overlap", "ddp_straggler"):
        net = DDP(model, device_ids=[local_rank])
    else:
        net = model
        for p in params:
            dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(1234 + rank)
    batches = [
        (
            torch.randn(BATCH, HID, device=dev, generator=g),
            torch.randn(BATCH, HID, device=dev, generator=g),
        )
        for _ in range(2)
    ]
    loader = DataLoader(ListDataset(batches), batch_size=None, num_workers=0)
    it = iter(loader)
    sleeps = []

    def nvtx_push(name):
        if args.nvtx:
            torch.cuda.nvtx.range_push(name)

    def nvtx_pop():
        if args.nvtx:
            torch.cuda.nvtx.range_pop()

    def step():
        x, y = next(it)
        if v == "ddp_straggler" and rank == STRAGGLER_RANK:
            nvtx_push("straggler_sleep")
            t0 = time.perf_counter()
            time.sleep(STRAGGLER_SLEEP_S)  # PLANTED straggler
            sleeps.append(time.perf_counter() - t0)
            nvtx_pop()
        out = net(x)
        loss = (out - y).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if v == "ddp_no_overlap":
            for p in params:  # PLANTED: serialized, non-overlapped all-reduce
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()
        return loss.item()

    def phase(n, label, sync_each=False, prof=None):
        times = []
        for i in range(n):
            if sync_each:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            nvtx_push(f"{'step' if label == 'profiled' else label} {i}")
            step()
            nvtx_pop()
            if sync_each:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if prof is not None:
                prof.step()
        return times

    phase(args.warmup, "warmup", sync_each=True)
    dist.barrier()
    m_times = phase(args.measure, "measure", sync_each=True)
    sleep_mark = len(sleeps)
    dist.barrier()
    trace_name = None
    if args.profiler == "kineto":
        from torch.profiler import ProfilerActivity, profile, schedule

        total = args.wait + args.pwarmup + args.active
        raw = os.path.join(args.out, f"rank{rank}.pt.trace.json")
        done = []

        def ready(p):
            p.export_chrome_trace(raw)
            done.append(1)

        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(wait=args.wait, warmup=args.pwarmup, active=args.active, repeat=1),
            on_trace_ready=ready,
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        ) as prof:
            p_times = phase(total, "profiled", prof=prof)
        torch.cuda.synchronize()
        trace_name = raw + ".gz"
        with open(raw, "rb") as fi, gzip.open(trace_name, "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(raw)
        first = args.wait + args.pwarmup
        active_slice = slice(first, total)
        profiled_steps = [f"ProfilerStep#{i}" for i in range(first, total)]
    else:
        p_times = phase(args.steps, "profiled")
        torch.cuda.synchronize()
        active_slice = slice(0, args.steps)
        profiled_steps = [f"step {i}" for i in range(args.steps)]

    # Unprofiled reference: one all-reduce of a flat buffer the size of all grads.
    dist.barrier()
    flat = torch.zeros(n_params, device=dev)
    ar = []
    for i in range(6):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        dist.barrier()
        a.record()
        dist.all_reduce(flat)
        b.record()
        b.synchronize()
        if i >= 2:
            ar.append(a.elapsed_time(b) / 1e3)

    mine = {
        "rank": rank,
        "gpu": torch.cuda.get_device_name(dev),
        "step_wall_ns_measure_phase_synced": summarize(m_times),
        "step_wall_ns_profiled_phase_cpu": summarize(p_times[active_slice]),
        "profiled_phase_step_wall_ns_list": [ns(t) for t in p_times[active_slice]],
        "allreduce_flat_ns": summarize(ar),
        # one sleep per step; keep the profiled (active) steps only
        "planted_sleep_ns_measured": summarize(sleeps[sleep_mark:][active_slice])
        if sleeps
        else None,
        "trace_file": os.path.basename(trace_name) if trace_name else None,
        "trace_bytes_gz": os.path.getsize(trace_name) if trace_name else None,
    }
    allm = [None] * world
    dist.all_gather_object(allm, mine)
    if rank == 0:
        truth = {
            "schema": "stallscope-sample-truth/1",
            "scenario": v,
            "description": VARIANTS[v]["description"],
            "planted": VARIANTS[v]["planted"],
            "expected_findings": VARIANTS[v]["expected_findings"],
            "expected_absent": VARIANTS[v].get("expected_absent", []),
            "severity_notes": VARIANTS[v]["severity_notes"],
            "capture": {
                "profiler": args.profiler,
                "nvtx": args.nvtx,
                "format": args.trace_format
                or ("kineto-json-gz" if args.profiler == "kineto" else None),
                "external_profiler_command": args.external_command,
                "ranks": world,
                "backend": "nccl",
                "launcher": "python3 -m torch.distributed.run --standalone --nproc_per_node 2",
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                "warmup_steps": args.warmup,
                "measure_steps": args.measure,
                "schedule": (
                    {"wait": args.wait, "warmup": args.pwarmup, "active": args.active}
                    if args.profiler == "kineto"
                    else None
                ),
                "profiled_steps": profiled_steps,
                "record_shapes": False,
                "with_stack": False,
                "profile_memory": False,
            },
            "model": {
                "layers": f"{DEPTH} x Linear({HID},{HID}) fp32, ReLU between",
                "params": n_params,
                "grad_bytes": 4 * n_params,
                "batch_per_rank": BATCH,
                "tf32": True,
                "ddp_bucket_cap_mb": 25 if v != "ddp_no_overlap" else None,
                "allreduce_calls_per_step_no_overlap": len(params),
            },
            "measured_per_rank": allm,
            "environment": {
                "date_utc": utc_now(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "cuda_runtime": torch.version.cuda,
                "nccl": ".".join(str(x) for x in torch.cuda.nccl.version()),
                "gpu_count": torch.cuda.device_count(),
                "gpu_name": torch.cuda.get_device_name(dev),
                "nsys_version": os.environ.get("STALLSCOPE_NSYS_VERSION"),
                "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
                "kernel": platform.release(),
            },
        }
        if v == "ddp_no_overlap":
            truth["planted"][0]["bytes_per_step"] = 4 * n_params
        if v == "ddp_straggler":
            try:
                r0 = allm[0]["step_wall_ns_measure_phase_synced"]["median_ns"]
                truth["measured_expected_wait_ns_per_step_rank0"] = allm[STRAGGLER_RANK][
                    "planted_sleep_ns_measured"
                ]["median_ns"]
                truth["measured_step_ns_rank0"] = r0
            except Exception:  # noqa: BLE001
                pass
        tag = "" if args.profiler == "kineto" else ".nsys"
        with open(os.path.join(args.out, f"{v}{tag}.truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        print(
            f"[{v}] wrote truth; rank0 measure step median "
            f"{(allm[0]['step_wall_ns_measure_phase_synced'] or {}).get('median_ns')} ns; "
            f"allreduce flat {(allm[0]['allreduce_flat_ns'] or {}).get('median_ns')} ns"
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
