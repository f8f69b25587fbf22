"""Memory captures for stallscope's memory analyzer (run on one GPU; writes to $OUT).

Made sample_traces/kineto/memory_gpt, memory_gpt_ckpt and memory_fragment on an
H200 (torch 2.11.0+cu130): ``OUT=dir python3 tools/capture/memory_capture.py``;
the snapshot pickle was gzipped by hand and is kept in sample_traces/memory_snapshot/
(its own job there; given with memory_fragment's trace, of this same process, it pairs). The profiler runs without a schedule,
so these traces have no ProfilerStep ranges. Lint-only edits since that run.
"""

import gzip
import json
import os
import shutil
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

OUT = os.environ["OUT"]
dev = torch.device("cuda")
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False, is_causal=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=8192, d=1024, h=16, layers=4, ckpt=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.head = nn.Linear(d, vocab)
        self.ckpt = ckpt

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return self.head(x)


def save(name, prof, truth):
    path = f"{OUT}/{name}.pt.trace.json"
    prof.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(path)
    with open(f"{OUT}/{name}.truth.json", "w") as f:
        json.dump(truth, f, indent=1)
    print(name, os.path.getsize(path + ".gz"), truth, flush=True)


def train(name, ckpt, steps=3):
    torch.cuda.empty_cache()
    model = GPT(ckpt=ckpt).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 8192, (8, 512), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True
    ) as prof:
        for _ in range(steps):
            step()
            prof.step()
        torch.cuda.synchronize()
    truth = {
        "scenario": name,
        "activation_checkpointing": ckpt,
        "profiled_steps": steps,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
    }
    save(name, prof, truth)


def fragment(steps=3):
    """Each step: 40 blocks of 6..60 MiB, every other one freed, then 12 blocks of 80 MiB that fit
    no hole (the reservation grows), all freed, then empty_cache(): churn every step."""
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=20000, stacks="python")
    g = torch.Generator().manual_seed(1)
    MiB = 1 << 20

    def step():
        keep = [
            torch.empty(
                int(torch.randint(6, 60, (1,), generator=g)) * MiB, dtype=torch.uint8, device=dev
            )
            for _ in range(40)
        ]
        keep = keep[::2]
        big = [torch.empty(80 * MiB, dtype=torch.uint8, device=dev) for _ in range(12)]
        torch.cuda.synchronize()
        del keep, big
        torch.cuda.empty_cache()

    step()
    torch.cuda.reset_peak_memory_stats()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True
    ) as prof:
        for _ in range(steps):
            step()
            prof.step()
    truth = {
        "scenario": "fragment",
        "profiled_steps": steps,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
    }
    save("memory_fragment", prof, truth)
    keep = [
        torch.empty(
            int(torch.randint(6, 60, (1,), generator=g)) * MiB, dtype=torch.uint8, device=dev
        )
        for _ in range(40)
    ]
    keep = keep[::2]
    big = [torch.empty(80 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
    torch.cuda.synchronize()
    assert keep and big  # live when the snapshot is taken
    torch.cuda.memory._dump_snapshot(f"{OUT}/memory_fragment.snapshot.pickle")
    snap_truth = {
        "allocated_at_snapshot": torch.cuda.memory_allocated(),
        "reserved_at_snapshot": torch.cuda.memory_reserved(),
        "max_memory_allocated_since_reset": torch.cuda.max_memory_allocated(),
        "max_memory_reserved_since_reset": torch.cuda.max_memory_reserved(),
    }
    with open(f"{OUT}/memory_fragment.snapshot.truth.json", "w") as f:
        json.dump(snap_truth, f, indent=1)
    print("snapshot", os.path.getsize(f"{OUT}/memory_fragment.snapshot.pickle"), snap_truth)
    torch.cuda.memory._record_memory_history(enabled=None)


t0 = time.time()
train("memory_gpt", ckpt=False)
train("memory_gpt_ckpt", ckpt=True)
fragment()
print("done in", round(time.time() - t0, 1), "s")
