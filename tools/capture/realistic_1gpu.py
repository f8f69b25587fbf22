#!/usr/bin/env python3
"""Realistic one-GPU captures with paired ground truth: a GPT-like decoder.

Two families, each run in one process so the clean and faulty variants share
one model, one GPU state and interleaved timing rounds:

    python3 realistic_1gpu.py --family train  --out OUT/kineto
    python3 realistic_1gpu.py --family decode --out OUT/kineto
    nsys profile -t cuda,nvtx,osrt ... python3 realistic_1gpu.py \
        --nsys train_pageable_d2h --out OUT/nsys

Family ``train`` (a ~270M-parameter decoder, bf16, fused AdamW):
  train_baseline       forward + backward + AdamW, loss.item() per step
  train_pageable_d2h   the same plus ``h[:4].detach().cpu()`` of a 32 MiB MLP
                       activation in the middle of the forward (PLANTED)
  train_cuda_graph     the baseline step captured whole as one CUDA graph
  train_small_eager    a small, launch-bound config of the same model
  train_small_graph    that small config as one CUDA graph

Family ``decode`` (the same ~270M model, static KV cache, batch 16, context
960..1023, one token per iteration, 8 iterations per profiler step):
  decode_eager                 the decode step launched op by op
  decode_graph                 the decode step replayed as one CUDA graph
  decode_graph_item_python     decode_graph plus, per iteration, 16 ``.item()``
                               reads of the sampled tokens and ~2 ms of Python
                               work in ``sample_and_schedule`` (PLANTED)
  decode_prefill_interference  decode_graph plus, every 16 iterations, a new
                               request's prefill (8 x 1024 tokens) (PLANTED)

Truth: every variant's step is timed unprofiled (perf_counter around each
step, torch.cuda.synchronize() before and after), in interleaved rounds after
warm-up; the expected saving of a planted fault is the difference of the
step-time medians of the faulty variant and its clean reference. Then each
variant is profiled with Kineto (schedule wait=1, warmup=2, active=5,
record_shapes=True), the trace is gzipped (trimmed to fewer profiled steps if
it is over --max-gz bytes) and read back: profiled step durations and GPU busy
share per ProfilerStep window. One ``<variant>.truth.json`` per variant.

``--dry-run`` runs everything on the CPU with a tiny config (CUDA graphs and
synchronizes replaced by plain calls) to check the script before a device run.
Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MiB = 1024 * 1024
SCHEDULE = {"wait": 1, "warmup": 2, "active": 5}

# model / workload sizes: (real, dry-run)
BIG = dict(vocab=32768, d=1024, layers=16, heads=16, max_pos=1024)
BIG_DRY = dict(vocab=256, d=64, layers=2, heads=2, max_pos=64)
SMALL = dict(vocab=8192, d=512, layers=8, heads=8, max_pos=256)
SMALL_DRY = dict(vocab=128, d=32, layers=2, heads=2, max_pos=32)
TRAIN = dict(batch=12, seq=1024, probe_layer=8, probe_rows=4)
TRAIN_DRY = dict(batch=4, seq=64, probe_layer=1, probe_rows=2)
SMALL_TRAIN = dict(batch=4, seq=256)
SMALL_TRAIN_DRY = dict(batch=2, seq=32)
DECODE = dict(
    batch=16,
    ctx=1024,
    start=960,
    iters_per_step=8,
    prefill_every=16,
    prefill_batch=8,
    prefill_len=1024,
    host_work_ms=2.0,
)
DECODE_DRY = dict(
    batch=2,
    ctx=64,
    start=48,
    iters_per_step=8,
    prefill_every=16,
    prefill_batch=2,
    prefill_len=64,
    host_work_ms=2.0,
)

DESCRIPTIONS = {
    "train_baseline": (
        "GPT-like decoder (16 layers, d_model 1024, 16 heads, MLP 4096, vocab 32768, "
        "learned positions, bf16 parameters, about 270M parameters) training step on batch 12 x "
        "1024 tokens already on the GPU: forward with causal SDPA, float32 cross-entropy, "
        "backward, fused AdamW (capturable=True), loss.item() for logging. Clean reference."
    ),
    "train_pageable_d2h": (
        "train_baseline plus, in the forward of block 8, `self.probe = h[:4].detach().cpu()` "
        "of the GELU output of the MLP (4 x 1024 x 4096 bf16 = 32 MiB) into new, unpinned "
        "(pageable) host memory: a blocking device-to-host copy in the middle of the forward "
        "that drains the GPU queue and stalls the host."
    ),
    "train_cuda_graph": (
        "The train_baseline step (same model, same optimizer object) captured whole as one "
        "CUDA graph (forward, loss, backward, fused AdamW capturable) and replayed; the "
        "batch is copied into static input buffers before each replay; loss.item() after."
    ),
    "train_small_eager": (
        "A small, launch-bound config of the same decoder (8 layers, d_model 512, "
        "8 heads, vocab 8192, about 34M parameters, batch 4 x 256): forward, backward, fused "
        "AdamW (capturable), loss.item(), launched op by op. Clean eager reference for "
        "train_small_graph."
    ),
    "train_small_graph": (
        "train_small_eager's step captured whole as one CUDA graph and replayed."
    ),
    "decode_eager": (
        "Static-KV-cache decode of the ~270M decoder: batch 16, context 960..1023 of a "
        "1024-slot cache (attention over the whole cache with a position mask), one token per "
        "iteration (greedy argmax written back into the input-token buffer, position advanced "
        "on the GPU), each iteration inside record_function('decode_step'); 8 iterations per "
        "profiler step, torch.cuda.synchronize() at the end of each step. Launched op by op."
    ),
    "decode_graph": (
        "decode_eager's step captured once as a CUDA graph (the token and position updates "
        "are inside the graph) and replayed once per iteration inside "
        "record_function('decode_step'). Clean reference for the decode faults."
    ),
    "decode_graph_item_python": (
        "decode_graph plus, per iteration inside record_function('sample_and_schedule') "
        "(nested in 'decode_step'): the host reads each of the 16 sampled tokens with "
        "`.item()` (16 blocking D2H reads, the first waits for the replay) and then runs "
        "about 2 ms of pure-Python scheduler work (a busy loop, not a sleep) before it "
        "launches the next replay, so the GPU idles during the Python work."
    ),
    "decode_prefill_interference": (
        "decode_graph plus, before every 16th decode iteration (iteration index % 16 == 0), "
        "a new request's prefill: 8 x 1024 tokens through the same model (causal SDPA, K/V "
        "written to the new request's cache, logits of the last position) inside "
        "record_function('prefill'), launched eagerly. The decode iteration after the "
        "prefill waits for it: those iterations stall for about the prefill's length."
    ),
}


# --------------------------------------------------------------------------
# small helpers (no torch)
# --------------------------------------------------------------------------
def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def p90(values):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def stats_ns(values_s) -> dict | None:
    """n, median, p90, mean, min, max (integer ns) and the list, of seconds."""
    if not values_s:
        return None
    return {
        "n": len(values_s),
        "median_ns": ns(statistics.median(values_s)),
        "p90_ns": ns(p90(values_s)),
        "mean_ns": ns(statistics.fmean(values_s)),
        "min_ns": ns(min(values_s)),
        "max_ns": ns(max(values_s)),
        "values_ns": [ns(v) for v in values_s],
    }


def union_ns(iv) -> float:
    iv = sorted(iv)
    if not iv:
        return 0.0
    tot, (cs, ce) = 0.0, iv[0]
    for s, e in iv[1:]:
        if s > ce:
            tot += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return tot + ce - cs


# --------------------------------------------------------------------------
# trace read-back and trimming (plain json)
# --------------------------------------------------------------------------
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load_trace(path: str) -> dict:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return json.load(f)


def step_windows(events) -> list[tuple[str, float, float]]:
    """ProfilerStep#N CPU ranges as (name, start_us, end_us), by N."""
    out = [
        (e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"  # Kineto mirrors the ranges on the GPU row
    ]
    return sorted(out, key=lambda w: int(w[0].split("#")[1]))


def trace_readback(path: str) -> dict:
    """Per profiled step: window length and GPU busy share (union of kernels, memcpys,
    memsets clipped to the CPU ProfilerStep window), plus counts of what the trace holds."""
    tr = load_trace(path)
    evs = tr.get("traceEvents", [])
    gpu = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in evs
        if e.get("cat") in GPU_CATS and e.get("ph") == "X"
    ]
    steps = []
    for name, lo, hi in step_windows(evs):
        busy = union_ns([(max(s, lo), min(e, hi)) for s, e in gpu if e > lo and s < hi])
        steps.append(
            {
                "step": name,
                "dur_ns": int(round((hi - lo) * 1e3)),
                "gpu_busy_ns": int(round(busy * 1e3)),
                "gpu_busy_pct": round(100.0 * busy / (hi - lo), 2) if hi > lo else None,
            }
        )
    cats: dict[str, int] = {}
    names: dict[str, int] = {}
    memcpy: dict[str, dict] = {}
    for e in evs:
        c = e.get("cat")
        cats[c] = cats.get(c, 0) + 1
        n = str(e.get("name", ""))
        if c == "user_annotation" or n in ("aten::item", "aten::_local_scalar_dense"):
            key = "ProfilerStep#*" if n.startswith("ProfilerStep#") else n
            names[key] = names.get(key, 0) + 1
        if c in ("cuda_runtime", "cuda_driver") and (
            "ynchronize" in n or "GraphLaunch" in n or n.startswith("cudaMemcpy")
        ):
            names[n] = names.get(n, 0) + 1
        if c == "gpu_memcpy":
            m = memcpy.setdefault(n, {"count": 0, "bytes": 0})
            m["count"] += 1
            m["bytes"] += int(e.get("args", {}).get("bytes", 0))
    tot_dur = sum(s["dur_ns"] for s in steps)
    tot_busy = sum(s["gpu_busy_ns"] for s in steps)
    durs = [s["dur_ns"] for s in steps]
    return {
        "profiled_steps": steps,
        "step_dur_ns_median": int(statistics.median(durs)) if durs else None,
        "step_dur_ns_sum": tot_dur,
        "gpu_busy_pct_over_steps": round(100.0 * tot_busy / tot_dur, 2) if tot_dur else None,
        "events": len(evs),
        "events_by_cat": cats,
        "kernels": cats.get("kernel", 0),
        "named_counts": dict(sorted(names.items())),
        "memcpy": memcpy,
        "note": "read back from the trace by tools/capture/realistic_1gpu.py (plain JSON "
        "scan): windows are the CPU ProfilerStep#N ranges; not independent of the trace",
    }


def trim_trace(raw_path: str, keep_steps: int) -> dict:
    """Keep only the first ``keep_steps`` ProfilerStep windows of a raw Kineto JSON.

    CPU-side events (ops, annotations, runtime calls) that start after the last kept
    window are dropped; GPU events and flow arrows are dropped when their correlation id
    belongs to a dropped runtime call (GPU work lags its launch). Metadata is kept."""
    tr = load_trace(raw_path)
    evs = tr["traceEvents"]
    wins = step_windows(evs)
    cut = wins[keep_steps - 1][2]
    dropped_corr = set()
    for e in evs:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and float(e.get("ts", 0)) > cut:
            c = e.get("args", {}).get("correlation")
            if c is not None:
                dropped_corr.add(c)

    def keep(e) -> bool:
        if e.get("ph") in ("M", None) or "ts" not in e:
            return True
        cat = e.get("cat")
        if cat in GPU_CATS or cat == "gpu_user_annotation":
            c = e.get("args", {}).get("correlation")
            if c is not None:
                return c not in dropped_corr
            return float(e["ts"]) <= cut
        if e.get("ph") in ("s", "f") and cat == "ac2g":
            return e.get("id") not in dropped_corr
        return float(e["ts"]) <= cut

    before = len(evs)
    tr["traceEvents"] = [e for e in evs if keep(e)]
    with open(raw_path, "w") as f:
        json.dump(tr, f)
    return {
        "kept_profiled_steps": [w[0] for w in wins[:keep_steps]],
        "dropped_profiled_steps": [w[0] for w in wins[keep_steps:]],
        "events_before": before,
        "events_after": len(tr["traceEvents"]),
    }


def gzip_file(raw: str) -> str:
    out = raw + ".gz"
    with open(raw, "rb") as fi, gzip.open(out, "wb", compresslevel=9) as fo:
        shutil.copyfileobj(fi, fo)
    return out


def gz_size_of(raw: str) -> int:
    with open(raw, "rb") as f:
        return len(gzip.compress(f.read(), compresslevel=6))


# --------------------------------------------------------------------------
# the model (torch imported lazily)
# --------------------------------------------------------------------------
def build_model_classes(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.h, self.dh = heads, d // heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)
            self.probe_rows = 0  # > 0: PLANTED pageable D2H copy of the MLP activation
            self.probe = None
            self.probe_events = None  # (start, end) CUDA events around the copy, or None
            self.probe_host_s = []

        def _heads(self, t, B, T):
            return t.view(B, T, self.h, self.dh).transpose(1, 2)

        def _mlp(self, x):
            h = F.gelu(self.fc1(self.ln2(x)), approximate="tanh")
            if self.probe_rows:
                self._copy_probe(h)
            return self.fc2(h)

        def _copy_probe(self, h):
            t0 = time.perf_counter()
            if self.probe_events is not None:
                self.probe_events[0].record()
            self.probe = h[: self.probe_rows].detach().cpu()  # PLANTED: pageable D2H
            if self.probe_events is not None:
                self.probe_events[1].record()
            self.probe_host_s.append(time.perf_counter() - t0)

        def forward(self, x, kv_out=None):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = self._heads(q, B, T), self._heads(k, B, T), self._heads(v, B, T)
            if kv_out is not None:
                kv_out[0].copy_(k)
                kv_out[1].copy_(v)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self._mlp(x)

        def decode(self, x, pos, mask, kc, vc):
            B, T, C = x.shape  # T == 1
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = self._heads(q, B, T), self._heads(k, B, T), self._heads(v, B, T)
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self._mlp(x)

    class GPT(nn.Module):
        def __init__(self, vocab, d, layers, heads, max_pos):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(max_pos, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.vocab = vocab

        def hidden(self, idx, kv_out=None):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for i, b in enumerate(self.blocks):
                x = b(x, None if kv_out is None else kv_out[i])
            return self.ln_f(x)

        def loss(self, idx, targets):
            logits = self.lm_head(self.hidden(idx))
            return F.cross_entropy(logits.float().view(-1, self.vocab), targets.view(-1))

    return GPT


class Env:
    """CUDA or the CPU dry run: device, dtype, sync and events in one place."""

    def __init__(self, torch, dry: bool):
        self.torch = torch
        self.dry = dry
        self.cuda = (not dry) and torch.cuda.is_available()
        if not dry and not self.cuda:
            raise SystemExit("no CUDA device (use --dry-run on a machine without one)")
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.dtype = torch.bfloat16

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def event_pair(self):
        if not self.cuda:
            return None
        E = self.torch.cuda.Event
        return (E(enable_timing=True), E(enable_timing=True))

    def graph(self, fn, warmup=3, before_capture=None):
        """Capture fn() as a CUDA graph after side-stream warm-up; returns replay().
        ``before_capture`` runs between the warm-up and the capture (e.g. to drop
        gradients so that the captured backward allocates them in the graph's pool).
        In the dry run, replay() just calls fn()."""
        t = self.torch
        if not self.cuda:
            return fn
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(warmup):
                fn()
        t.cuda.current_stream().wait_stream(s)
        self.sync()
        if before_capture is not None:
            before_capture()
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            fn()
        self.sync()
        return g.replay


def make_model(torch, env, GPT, cfg):
    torch.manual_seed(0)
    with torch.device(env.dev):
        m = GPT(**cfg)
    m = m.to(dtype=env.dtype)
    return m, sum(p.numel() for p in m.parameters())


# --------------------------------------------------------------------------
# train family
# --------------------------------------------------------------------------
class TrainSetup:
    """One model + optimizer; an eager step and a CUDA-graph step on it."""

    def __init__(self, torch, env, GPT, cfg, tcfg):
        self.torch, self.env = torch, env
        self.cfg, self.tcfg = cfg, tcfg
        self.model, self.n_params = make_model(torch, env, GPT, cfg)
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=1e-5,
            fused=True,
            capturable=env.cuda,
        )
        g = torch.Generator(device=env.dev).manual_seed(1)
        B, T, V = tcfg["batch"], tcfg["seq"], cfg["vocab"]
        self.batches = [
            (
                torch.randint(0, V, (B, T), device=env.dev, generator=g),
                torch.randint(0, V, (B, T), device=env.dev, generator=g),
            )
            for _ in range(4)
        ]
        self.static_x = self.batches[0][0].clone()
        self.static_y = self.batches[0][1].clone()
        self.replay = None
        self.static_loss = None
        self.i = 0

    def next_batch(self):
        self.i += 1
        return self.batches[self.i % len(self.batches)]

    def eager_step(self):
        x, y = self.next_batch()
        self.opt.zero_grad(set_to_none=True)
        loss = self.model.loss(x, y)
        loss.backward()
        self.opt.step()
        return loss.item()  # logging: one host sync per step

    def _graph_body(self):
        self.static_loss = self.model.loss(self.static_x, self.static_y)
        self.static_loss.backward()
        self.opt.step()

    def capture(self):
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.replay = self.env.graph(self._graph_body, before_capture=self._before_capture)
        return time.perf_counter() - t0

    def _before_capture(self):
        """Gradients allocated inside the graph; no warm-up autograd graph kept alive."""
        self.static_loss = None
        self.opt.zero_grad(set_to_none=True)

    def graph_step(self):
        x, y = self.next_batch()
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        if self.env.cuda:
            self.replay()
        else:  # dry run: eager with the same body
            self.opt.zero_grad(set_to_none=True)
            self._graph_body()
        return self.static_loss.item()

    def flops_per_step(self):
        B, T = self.tcfg["batch"], self.tcfg["seq"]
        d, L = self.cfg["d"], self.cfg["layers"]
        dense = 6 * self.n_params * B * T
        attn = 3 * L * 2 * B * T * T * d  # causal QK^T + PV, fwd+bwd, roughly
        return dense + attn


# --------------------------------------------------------------------------
# decode family
# --------------------------------------------------------------------------
class DecodeSetup:
    def __init__(self, torch, env, GPT, cfg, dcfg):
        self.torch, self.env, self.cfg, self.dcfg = torch, env, cfg, dcfg
        self.model, self.n_params = make_model(torch, env, GPT, cfg)
        self.model.eval()
        L, d, H = cfg["layers"], cfg["d"], cfg["heads"]
        B, ctx = dcfg["batch"], dcfg["ctx"]
        dh = d // H
        dev, dt = env.dev, env.dtype
        g = torch.Generator(device=dev).manual_seed(2)
        # the KV cache of the running batch: random "already prefilled" context
        self.kc = [torch.randn(B, H, ctx, dh, device=dev, dtype=dt, generator=g) for _ in range(L)]
        self.vc = [torch.randn(B, H, ctx, dh, device=dev, dtype=dt, generator=g) for _ in range(L)]
        PB, PT = dcfg["prefill_batch"], dcfg["prefill_len"]
        self.pk = [torch.empty(PB, H, PT, dh, device=dev, dtype=dt) for _ in range(L)]
        self.pv = [torch.empty(PB, H, PT, dh, device=dev, dtype=dt) for _ in range(L)]
        self.prompt = torch.randint(0, cfg["vocab"], (PB, PT), device=dev, generator=g)
        self.tok = torch.randint(0, cfg["vocab"], (B, 1), device=dev, generator=g)
        self.pos = torch.full((1,), dcfg["start"], dtype=torch.long, device=dev)
        self.start = torch.full((1,), dcfg["start"], dtype=torch.long, device=dev)
        self.slots = torch.arange(ctx, device=dev)
        self.replay = None
        self.iter_index = 0
        self.host_ids = [0] * B
        self.work_s = dcfg["host_work_ms"] / 1e3
        self.work_units = []
        self.prefill_step_flags = []  # per measured decode_prefill_interference step
        self.host_work_s = []
        self.item_s = []
        self.scheduler_state = {}

    def decode_body(self):
        """One token for every sequence: writes K/V at pos, greedy next token into
        self.tok, advances pos (wrapping back to start at the end of the cache)."""
        t, m = self.torch, self.model
        with t.no_grad():
            pos = self.pos
            mask = (self.slots <= pos).view(1, 1, 1, -1)
            x = m.wte(self.tok) + m.wpe(pos).view(1, 1, -1)
            for i, b in enumerate(m.blocks):
                x = b.decode(x, pos, mask, self.kc[i], self.vc[i])
            logits = m.lm_head(m.ln_f(x))[:, -1, :]
            self.tok.copy_(logits.argmax(dim=-1, keepdim=True))
            nxt = pos + 1
            self.pos.copy_(t.where(nxt >= self.dcfg["ctx"], self.start, nxt))

    def prefill_body(self):
        t, m = self.torch, self.model
        with t.no_grad():
            h = m.hidden(self.prompt, kv_out=list(zip(self.pk, self.pv, strict=True)))
            logits = m.lm_head(h[:, -1, :])
            return logits.argmax(dim=-1)

    def capture(self):
        t0 = time.perf_counter()
        saved = (self.tok.clone(), self.pos.clone())
        self.replay = self.env.graph(self.decode_body)
        self.tok.copy_(saved[0])
        self.pos.copy_(saved[1])
        self.env.sync()
        return time.perf_counter() - t0

    # -- host work of the item_python variant --------------------------------
    def _python_work(self, seconds: float) -> int:
        """A scheduler-like pure-Python busy loop (no sleep): update per-request
        bookkeeping until ``seconds`` have passed; returns the units of work done."""
        st = self.scheduler_state
        ids = self.host_ids
        acc, k = 0, 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(16):
                r = ids[k % len(ids)]
                key = (k * 2654435761 + r) & 1023
                acc = (acc + st.get(key, k) * 31 + r) % 1000003
                st[key] = acc & 0xFFFF
                k += 1
        return k

    def sample_and_schedule(self):
        t = self.torch
        with t.profiler.record_function("sample_and_schedule"):
            t0 = time.perf_counter()
            for b in range(self.dcfg["batch"]):
                self.host_ids[b] = self.tok[b, 0].item()  # PLANTED: 16 blocking reads
            t1 = time.perf_counter()
            self.work_units.append(self._python_work(self.work_s))  # PLANTED: ~2 ms Python
            t2 = time.perf_counter()
        if self.record_host:
            self.item_s.append(t1 - t0)
            self.host_work_s.append(t2 - t1)

    record_host = False

    def launch_decode(self, graph: bool):
        if graph and self.env.cuda:
            self.replay()
        else:
            self.decode_body()

    def iteration(self, variant: str, sync_each: bool = False):
        """One decode iteration of a variant (the prefill, where due, comes first)."""
        t = self.torch
        i = self.iter_index
        self.iter_index += 1
        prefill = variant == "decode_prefill_interference" and i % self.dcfg["prefill_every"] == 0
        if prefill:
            with t.profiler.record_function("prefill"):
                self.prefill_body()
        with t.profiler.record_function("decode_step"):
            self.launch_decode(graph=variant != "decode_eager")
            if variant == "decode_graph_item_python":
                self.sample_and_schedule()
        if sync_each:
            self.env.sync()
        return prefill

    def step(self, variant: str):
        had_prefill = False
        for _ in range(self.dcfg["iters_per_step"]):
            had_prefill |= self.iteration(variant)
        self.env.sync()
        if self.record_host and variant == "decode_prefill_interference":
            self.prefill_step_flags.append(had_prefill)


# --------------------------------------------------------------------------
# timing and profiling
# --------------------------------------------------------------------------
def timed_steps(env, step_fn, n: int) -> list[float]:
    """perf_counter around each step, synchronized before and after."""
    out = []
    for _ in range(n):
        env.sync()
        t0 = time.perf_counter()
        step_fn()
        env.sync()
        out.append(time.perf_counter() - t0)
    return out


def interleaved_timing(
    env, fns: dict, rounds: int, per_round: int, warmup: int, on_measure_start=None
) -> dict:
    """Warm every variant, then `rounds` rounds of `per_round` steps of each, in turn.
    The host side of eager loops keeps speeding up for a few dozen steps on a fresh
    machine (seen on the first device run), hence a long warm-up."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    env.sync()
    if on_measure_start is not None:
        on_measure_start()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k] += timed_steps(env, fn, per_round)
    return times


def round_medians(values_s: list[float], per_round: int) -> list[int]:
    """Median of each interleaved round (drift check), integer ns."""
    return [
        ns(statistics.median(values_s[i : i + per_round]))
        for i in range(0, len(values_s), per_round)
    ]


def profile_variant(torch, env, name: str, step_fn, out_dir: str, max_gz: int):
    """Kineto capture of one variant: wait/warmup/active with prof.step() after each step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    os.makedirs(out_dir, exist_ok=True)
    raw = os.path.join(out_dir, f"{name}.pt.trace.json")
    done = []

    def on_ready(p):
        p.export_chrome_trace(raw)
        done.append(raw)

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.cuda else [])
    total = SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]
    times = []
    env.sync()
    with profile(
        activities=acts,
        schedule=schedule(repeat=1, **SCHEDULE),
        on_trace_ready=on_ready,
        record_shapes=True,
        with_stack=False,
        profile_memory=False,
    ) as prof:
        for _ in range(total):
            t0 = time.perf_counter()
            step_fn()
            env.sync()
            times.append(time.perf_counter() - t0)
            prof.step()
    env.sync()
    if not done:
        raise RuntimeError(f"{name}: profiler exported no trace")
    raw_bytes = os.path.getsize(raw)
    first = SCHEDULE["wait"] + SCHEDULE["warmup"]
    trim = None
    gz_est = gz_size_of(raw)
    if gz_est > max_gz:
        keep = max(1, int(SCHEDULE["active"] * max_gz / gz_est))
        keep = min(keep, SCHEDULE["active"] - 1)
        trim = trim_trace(raw, keep)
        trim["reason"] = f"gzip of the full trace was {gz_est} B > {max_gz} B"
        trim["gz_bytes_before"] = gz_est
    gz = gzip_file(raw)
    os.remove(raw)
    cap = {
        "profiler": "kineto (torch.profiler)",
        "schedule": dict(SCHEDULE),
        "profiled_steps": (
            trim["kept_profiled_steps"]
            if trim
            else [f"ProfilerStep#{i}" for i in range(first, total)]
        ),
        "record_shapes": True,
        "with_stack": False,
        "profile_memory": False,
        "sync_each_step": True,
        "trace_file": os.path.basename(gz),
        "trace_bytes_gz": os.path.getsize(gz),
        "trace_bytes_raw": raw_bytes,
        "trimmed": trim,
    }
    profiled_wall = stats_ns(times[first:])
    return gz, cap, profiled_wall


def env_facts(torch) -> dict:
    try:
        import scenarios

        d = scenarios.env_info(torch)
    except Exception as e:  # noqa: BLE001
        d = {"env_info_error": repr(e), "torch": torch.__version__}
    import platform

    d["python"] = platform.python_version()
    d["sdpa_flash_enabled"] = torch.backends.cuda.flash_sdp_enabled()
    return d


def diff_block(faulty: dict, clean: dict, steps: int, clean_name: str) -> dict:
    """Expected saving = median(faulty step) - median(clean step), per step and over
    the profiled steps."""
    per = faulty["median_ns"] - clean["median_ns"]
    return {
        "clean_reference": clean_name,
        "saving_ns_per_step": per,
        "saving_ns_per_step_p90_diff": faulty["p90_ns"] - clean["p90_ns"],
        "profiled_steps": steps,
        "saving_ns_over_profiled_steps": per * steps,
        "saving_pct_of_faulty_step": round(100.0 * per / faulty["median_ns"], 2),
        "how": "difference of the medians of the unprofiled, synchronized step times "
        "measured in interleaved rounds in the same process (measured.step_wall_ns)",
    }


def write_truth(path: str, truth: dict):
    with open(path, "w") as f:
        json.dump(truth, f, indent=1)
    print(f"wrote {path}")


# --------------------------------------------------------------------------
# family runners
# --------------------------------------------------------------------------
def run_train(torch, env, args):
    GPT = build_model_classes(torch)
    dry = args.dry_run
    big_cfg, tcfg = (BIG_DRY, TRAIN_DRY) if dry else (BIG, TRAIN)
    small_cfg, stcfg = (SMALL_DRY, SMALL_TRAIN_DRY) if dry else (SMALL, SMALL_TRAIN)
    big = TrainSetup(torch, env, GPT, big_cfg, tcfg)
    small = TrainSetup(torch, env, GPT, small_cfg, stcfg)
    probe_block = big.model.blocks[tcfg["probe_layer"]]
    probe_bytes = tcfg["probe_rows"] * tcfg["seq"] * 4 * big_cfg["d"] * 2
    print(f"big model {big.n_params:,} params; small {small.n_params:,}", flush=True)

    def baseline():
        probe_block.probe_rows = 0
        return big.eager_step()

    def pageable():
        probe_block.probe_rows = tcfg["probe_rows"]
        try:
            return big.eager_step()
        finally:
            probe_block.probe_rows = 0

    # warm eager first (optimizer state exists before capture), then capture graphs
    for _ in range(3):
        baseline()
        small.eager_step()
    cap_big = big.capture()
    cap_small = small.capture()
    print(f"captured graphs in {cap_big:.2f} s and {cap_small:.2f} s", flush=True)
    variants = {
        "train_baseline": baseline,
        "train_pageable_d2h": pageable,
        "train_cuda_graph": big.graph_step,
        "train_small_eager": small.eager_step,
        "train_small_graph": small.graph_step,
    }
    t0 = time.perf_counter()
    times = interleaved_timing(
        env, variants, rounds=args.rounds, per_round=args.per_round, warmup=args.warmup_steps
    )
    print(f"timing rounds took {time.perf_counter() - t0:.1f} s", flush=True)
    st = {k: stats_ns(v) for k, v in times.items()}
    for k, v in st.items():
        print(
            f"  {k}: median {v['median_ns'] / 1e6:.3f} ms p90 {v['p90_ns'] / 1e6:.3f} ms",
            flush=True,
        )

    # the planted copy, timed with CUDA events on its own (unprofiled)
    copy_gpu_s = []
    probe_block.probe_host_s = []
    for _ in range(10):
        probe_block.probe_events = env.event_pair()
        pageable()
        env.sync()
        if probe_block.probe_events is not None:
            a, b = probe_block.probe_events
            copy_gpu_s.append(a.elapsed_time(b) / 1e3)
    copy_host_s = list(probe_block.probe_host_s)
    probe_block.probe_events = None
    env.sync()

    env_d = env_facts(torch)
    ref_of = {
        "train_pageable_d2h": "train_baseline",
        "train_cuda_graph": "train_baseline",
        "train_small_graph": "train_small_eager",
    }
    for name, fn in variants.items():
        out_dir = os.path.join(args.out, name)
        tp = time.perf_counter()
        gz, cap, prof_wall = profile_variant(torch, env, name, fn, out_dir, args.max_gz)
        steps = len(cap["profiled_steps"])  # fewer than active if the trace was trimmed
        rb = trace_readback(gz)
        print(
            f"[{name}] trace {cap['trace_bytes_gz']} B gz, {rb['events']} events, "
            f"steps {rb['step_dur_ns_median']} ns median, busy "
            f"{rb['gpu_busy_pct_over_steps']} % ({time.perf_counter() - tp:.1f} s)",
            flush=True,
        )
        small_cfg_used = name.startswith("train_small")
        setup = small if small_cfg_used else big
        truth = {
            "schema": "stallscope-sample-truth/1",
            "scenario": name,
            "family": "train",
            "description": DESCRIPTIONS[name],
            "model": {
                "kind": "GPT-like decoder (pre-LN, learned positions, GELU MLP 4x, untied "
                "lm_head), random weights, no downloads",
                "config": setup.cfg,
                "parameters": setup.n_params,
                "dtype": "bfloat16 parameters and activations; float32 cross-entropy",
                "optimizer": "torch.optim.AdamW(fused=True, capturable=True), lr 1e-5",
                "train": setup.tcfg,
                "approx_flops_per_step": setup.flops_per_step(),
            },
            "planted": [],
            "capture": {
                **cap,
                "command": " ".join(["python3"] + sys.argv),
                "capture_s": {"big_graph": cap_big, "small_graph": cap_small},
            },
            "measured": {
                "step_wall_ns": st[name],
                "step_wall_ns_round_medians": round_medians(times[name], args.per_round),
                "step_wall_ns_how": (
                    f"unprofiled, torch.cuda.synchronize() before and after each step, "
                    f"perf_counter; {args.rounds} interleaved rounds x {args.per_round} steps "
                    f"of every train variant after {args.warmup_steps} warm-up steps each"
                ),
                "clean_reference": ref_of.get(name),
                "clean_reference_step_wall_ns": (
                    {k: v for k, v in st[ref_of[name]].items() if k != "values_ns"}
                    if name in ref_of
                    else None
                ),
                "profiled_phase_step_wall_ns": prof_wall,
            },
            "trace_readback": rb,
            "environment": env_d,
        }
        if name in ref_of:
            truth["expected_saving"] = diff_block(st[name], st[ref_of[name]], steps, ref_of[name])
        if name == "train_pageable_d2h":
            truth["planted"] = [
                {
                    "kind": "pageable_d2h_memcpy",
                    "where": f"blocks[{tcfg['probe_layer']}] MLP, h[:{tcfg['probe_rows']}]"
                    ".detach().cpu() (aten::to -> aten::_to_copy -> aten::copy_ -> "
                    "cudaMemcpyAsync DtoH into pageable memory + stream sync)",
                    "bytes_per_step": probe_bytes,
                    "count_per_step": 1,
                    "direction": "DtoH",
                    "dst_memory": "Pageable",
                    "copy_gpu_ns": stats_ns(copy_gpu_s),
                    "copy_call_host_ns": stats_ns(copy_host_s),
                    "amount_ns_per_step": truth["expected_saving"]["saving_ns_per_step"],
                    "amount_note": "step-time cost = faulty median - baseline median; the "
                    "copy's own GPU time (CUDA events around the call) and the host time of "
                    "the .cpu() call (which first waits for the queued forward) are above",
                }
            ]
            truth["expected_findings"] = [
                {
                    "analyzer": "memcpy",
                    "kind": "pageable",
                    "direction": "DtoH",
                    "bytes_per_step": probe_bytes,
                },
                {
                    "analyzer": "host_sync",
                    "notes": "one blocking D2H (.cpu()) per step "
                    "mid-forward, besides the loss.item() that ends every step",
                },
            ]
        elif name == "train_cuda_graph":
            truth["planted"] = [
                {
                    "kind": "fix_cuda_graph",
                    "note": "not a fault: the "
                    "baseline step as one graph; saving is negative when the "
                    "graph is faster",
                }
            ]
        elif name == "train_small_graph":
            truth["planted"] = [
                {"kind": "fix_cuda_graph", "note": "the launch-bound small config as one graph"}
            ]
            truth["eager_reference_saving_if_graphed"] = {
                "scenario": "train_small_eager",
                "saving_ns_per_step": st["train_small_eager"]["median_ns"]
                - st["train_small_graph"]["median_ns"],
                "saving_ns_over_profiled_steps": (
                    st["train_small_eager"]["median_ns"] - st["train_small_graph"]["median_ns"]
                )
                * steps,
            }
        if name in ("train_baseline", "train_small_eager"):
            graph_name = "train_cuda_graph" if name == "train_baseline" else "train_small_graph"
            d = st[name]["median_ns"] - st[graph_name]["median_ns"]
            truth["saving_if_cuda_graphed"] = {
                "graph_variant": graph_name,
                "saving_ns_per_step": d,
                "saving_ns_over_profiled_steps": d * steps,
                "how": "median eager step - median graph-replay step (unprofiled)",
            }
        write_truth(os.path.join(out_dir, f"{name}.truth.json"), truth)


def run_decode(torch, env, args):
    GPT = build_model_classes(torch)
    dry = args.dry_run
    cfg, dcfg = (BIG_DRY, DECODE_DRY) if dry else (BIG, DECODE)
    ds = DecodeSetup(torch, env, GPT, cfg, dcfg)
    print(f"decode model {ds.n_params:,} params", flush=True)
    for _ in range(3):
        ds.decode_body()
        ds.prefill_body()
    env.sync()
    cap_s = ds.capture()
    print(f"decode graph captured in {cap_s:.2f} s", flush=True)
    names = [
        "decode_eager",
        "decode_graph",
        "decode_graph_item_python",
        "decode_prefill_interference",
    ]
    fns = {n: (lambda n=n: ds.step(n)) for n in names}
    t0 = time.perf_counter()

    def start_recording():
        ds.record_host = True

    times = interleaved_timing(
        env,
        fns,
        rounds=args.rounds,
        per_round=args.per_round,
        warmup=args.warmup_steps,
        on_measure_start=start_recording,
    )
    ds.record_host = False
    prefill_flags = list(ds.prefill_step_flags)
    print(f"timing rounds took {time.perf_counter() - t0:.1f} s", flush=True)
    st = {k: stats_ns(v) for k, v in times.items()}
    for k, v in st.items():
        print(
            f"  {k}: median {v['median_ns'] / 1e6:.3f} ms p90 {v['p90_ns'] / 1e6:.3f} ms",
            flush=True,
        )
    host_work = stats_ns(ds.host_work_s)
    item_read = stats_ns(ds.item_s)

    # per-iteration times, synchronized after every iteration
    per_iter = {}
    for n in names:
        ds.iter_index = 0
        its, flags = [], []
        for _ in range(args.iter_steps * dcfg["iters_per_step"]):
            env.sync()
            t1 = time.perf_counter()
            flags.append(ds.iteration(n, sync_each=True))
            its.append(time.perf_counter() - t1)
        per_iter[n] = (its, flags)
    # the prefill alone, unprofiled
    prefill_s = timed_steps(env, ds.prefill_body, 10)
    graph_replay_s = timed_steps(env, lambda: ds.launch_decode(True), 20)

    env_d = env_facts(torch)
    ips = dcfg["iters_per_step"]
    first = SCHEDULE["wait"] + SCHEDULE["warmup"]
    ref_of = {
        "decode_eager": "decode_graph",
        "decode_graph_item_python": "decode_graph",
        "decode_prefill_interference": "decode_graph",
    }
    for name in names:
        out_dir = os.path.join(args.out, name)
        ds.iter_index = 0  # ProfilerStep#k holds iterations k*ips .. k*ips+ips-1
        tp = time.perf_counter()
        gz, cap, prof_wall = profile_variant(torch, env, name, fns[name], out_dir, args.max_gz)
        steps = len(cap["profiled_steps"])  # fewer than active if the trace was trimmed
        rb = trace_readback(gz)
        print(
            f"[{name}] trace {cap['trace_bytes_gz']} B gz, {rb['events']} events, "
            f"steps {rb['step_dur_ns_median']} ns median, busy "
            f"{rb['gpu_busy_pct_over_steps']} % ({time.perf_counter() - tp:.1f} s)",
            flush=True,
        )
        its, flags = per_iter[name]
        iter_stats = stats_ns(its)
        truth = {
            "schema": "stallscope-sample-truth/1",
            "scenario": name,
            "family": "decode",
            "description": DESCRIPTIONS[name],
            "model": {
                "kind": "GPT-like decoder (pre-LN, learned positions, GELU MLP 4x, untied "
                "lm_head), random weights, no downloads",
                "config": cfg,
                "parameters": ds.n_params,
                "dtype": "bfloat16",
                "decode": dcfg,
                "kv_cache_bytes": 2 * cfg["layers"] * dcfg["batch"] * dcfg["ctx"] * cfg["d"] * 2,
            },
            "planted": [],
            "capture": {
                **cap,
                "command": " ".join(["python3"] + sys.argv),
                "iterations_per_profiler_step": ips,
                "iteration_range_per_profiler_step": {
                    f"ProfilerStep#{k}": [k * ips, k * ips + ips - 1]
                    for k in range(first, first + steps)
                },
                "graph_capture_s": cap_s,
            },
            "measured": {
                "step_wall_ns": st[name],
                "step_wall_ns_round_medians": round_medians(times[name], args.per_round),
                "step_wall_ns_how": (
                    f"one step = {ips} decode iterations; unprofiled, torch.cuda.synchronize() "
                    f"before and after each step, perf_counter; {args.rounds} interleaved rounds "
                    f"x {args.per_round} steps of every decode variant after "
                    f"{args.warmup_steps} warm-up steps each"
                ),
                "iteration_wall_ns_synced_each": {
                    **iter_stats,
                    "how": "a separate pass: torch.cuda.synchronize() after every iteration "
                    "(so no run-ahead); index 0 is the first iteration of the pass",
                },
                "decode_graph_replay_ns_synced": stats_ns(graph_replay_s),
                "clean_reference": ref_of.get(name),
                "clean_reference_step_wall_ns": (
                    {k: v for k, v in st[ref_of[name]].items() if k != "values_ns"}
                    if name in ref_of
                    else None
                ),
                "profiled_phase_step_wall_ns": prof_wall,
            },
            "trace_readback": rb,
            "environment": env_d,
        }
        if name in ref_of:
            truth["expected_saving"] = diff_block(st[name], st[ref_of[name]], steps, ref_of[name])
            truth["expected_saving"]["saving_ns_per_iteration"] = (
                truth["expected_saving"]["saving_ns_per_step"] // ips
            )
        if name == "decode_eager":
            truth["planted"] = [
                {
                    "kind": "eager_decode_launches",
                    "note": "every op of the "
                    "decode step launched from Python each iteration; the fix is "
                    "decode_graph",
                    "amount_ns_per_step": truth["expected_saving"]["saving_ns_per_step"],
                }
            ]
            truth["expected_findings"] = [{"analyzer": "launch_overhead"}]
        elif name == "decode_graph":
            truth["expected_findings"] = []
            truth["saving_vs_eager_ns_per_step"] = (
                st["decode_eager"]["median_ns"] - st["decode_graph"]["median_ns"]
            )
        elif name == "decode_graph_item_python":
            truth["planted"] = [
                {
                    "kind": "host_sync_item",
                    "count_per_step": dcfg["batch"] * ips,
                    "count_per_iteration": dcfg["batch"],
                    "api": "tok[b, 0].item() -> aten::item -> aten::_local_scalar_dense -> "
                    "cudaMemcpyAsync(DtoH) + cudaStreamSynchronize",
                    "item_reads_ns_per_iteration": item_read,
                },
                {
                    "kind": "host_python_work",
                    "where": "record_function('sample_and_schedule'), after the reads",
                    "target_ns_per_iteration": int(dcfg["host_work_ms"] * 1e6),
                    "measured_ns_per_iteration": host_work,
                    "work_units_per_iteration_median": (
                        int(statistics.median(ds.work_units)) if ds.work_units else None
                    ),
                    "how": "a busy loop of dict/arithmetic bookkeeping that runs until "
                    "host_work_ms has passed (perf_counter deadline), no sleep",
                    "amount_ns_per_step": truth["expected_saving"]["saving_ns_per_step"],
                },
            ]
            truth["expected_findings"] = [
                {"analyzer": "host_sync", "syncs_per_step": dcfg["batch"] * ips},
                {
                    "analyzer": "gpu_idle",
                    "cause": "host (Python between the sync and the next "
                    "launch, inside sample_and_schedule)",
                },
            ]
        elif name == "decode_prefill_interference":
            stalled = [i for i, f in enumerate(flags) if f]
            normal = [v for v, f in zip(its, flags, strict=True) if not f]
            stalled_t = [v for v, f in zip(its, flags, strict=True) if f]
            truth["planted"] = [
                {
                    "kind": "prefill_interference",
                    "every_iterations": dcfg["prefill_every"],
                    "prefill_tokens": [dcfg["prefill_batch"], dcfg["prefill_len"]],
                    "prefill_ns": stats_ns(prefill_s),
                    "amount_ns_per_prefill": ns(statistics.median(prefill_s)),
                    "profiled_steps_with_prefill": [
                        f"ProfilerStep#{k}"
                        for k in range(first, first + steps)
                        if any((k * ips + j) % dcfg["prefill_every"] == 0 for j in range(ips))
                    ],
                    "profiled_iterations_with_prefill": [
                        i
                        for i in range(first * ips, (first + steps) * ips)
                        if i % dcfg["prefill_every"] == 0
                    ],
                    "profiled_iterations_note": "global iteration index i (ProfilerStep#k "
                    f"holds i = {ips}k .. {ips}k+{ips - 1}); the prefill runs just before the "
                    "decode_step of iteration i",
                }
            ]
            truth["per_iteration_truth"] = {
                "iteration_wall_ns": [ns(v) for v in its],
                "stalled_iterations": stalled,
                "decode_iteration_ns_median": ns(statistics.median(normal)) if normal else None,
                "stalled_iteration_ns_median": ns(statistics.median(stalled_t))
                if stalled_t
                else None,
                "how": "synchronized after every iteration; a stalled iteration includes the "
                "prefill that ran before it",
            }
            pf_vals = times[name]
            with_p = [v for v, f in zip(pf_vals, prefill_flags, strict=False) if f]
            without_p = [v for v, f in zip(pf_vals, prefill_flags, strict=False) if not f]
            clean_med = st["decode_graph"]["median_ns"]
            n_pf = len(truth["planted"][0]["profiled_steps_with_prefill"])
            if with_p and without_p and len(prefill_flags) == len(pf_vals):
                add_p = ns(statistics.median(with_p)) - clean_med
                add_n = ns(statistics.median(without_p)) - clean_med
                over = n_pf * add_p + (steps - n_pf) * add_n
                truth["expected_saving"].update(
                    {
                        "median_diff_ns_per_step_misleading": truth["expected_saving"][
                            "saving_ns_per_step"
                        ],
                        "saving_ns_per_step": over // steps,
                        "saving_ns_per_iteration": over // (steps * ips),
                        "saving_pct_of_faulty_step": round(
                            100.0
                            * over
                            / (
                                n_pf * statistics.median(with_p) * 1e9
                                + (steps - n_pf) * statistics.median(without_p) * 1e9
                            ),
                            2,
                        ),
                        "saving_ns_over_profiled_steps": over,
                        "saving_ns_per_prefill_step": add_p,
                        "saving_ns_per_step_without_prefill": add_n,
                        "step_wall_ns_with_prefill": stats_ns(with_p),
                        "step_wall_ns_without_prefill": stats_ns(without_p),
                        "how": "steps are bimodal (a prefill every 16 iterations = every "
                        "other 8-iteration step), so the median difference is misleading: "
                        "over the profiled steps = (steps with a prefill) x (their median - "
                        "decode_graph median) + (the others) x (their median - decode_graph "
                        "median); per step = that / profiled steps. Whether a prefill can "
                        "be 'saved' is a scheduling question (chunked prefill, a separate "
                        "stream): this is the time it adds to the decode loop",
                    }
                )
            truth["expected_findings"] = [
                {
                    "analyzer": "step_breakdown",
                    "notes": "step-time jitter: profiled steps "
                    "with a prefill last about one prefill longer than the others",
                },
            ]
        write_truth(os.path.join(out_dir, f"{name}.truth.json"), truth)


def run_nsys(torch, env, args):
    """Unprofiled-by-Kineto run of train_pageable_d2h with NVTX step ranges for nsys."""
    GPT = build_model_classes(torch)
    dry = args.dry_run
    big_cfg, tcfg = (BIG_DRY, TRAIN_DRY) if dry else (BIG, TRAIN)
    big = TrainSetup(torch, env, GPT, big_cfg, tcfg)
    blk = big.model.blocks[tcfg["probe_layer"]]
    nv = torch.cuda.nvtx if env.cuda else None
    name = args.nsys
    assert name == "train_pageable_d2h", name

    def step():
        blk.probe_rows = tcfg["probe_rows"]
        big.eager_step()

    times = []
    for phase, n in (("warmup", args.warmup), ("step", args.steps)):
        for i in range(n):
            env.sync()
            t0 = time.perf_counter()
            if nv:
                nv.range_push(f"{phase} {i}")
            step()
            if nv:
                nv.range_pop()
            env.sync()
            if phase == "step":
                times.append(time.perf_counter() - t0)
    truth = {
        "schema": "stallscope-sample-truth/1",
        "scenario": name,
        "family": "train",
        "description": DESCRIPTIONS[name],
        "model": {"config": big_cfg, "parameters": big.n_params, "train": tcfg},
        "planted": [
            {
                "kind": "pageable_d2h_memcpy",
                "bytes_per_step": tcfg["probe_rows"] * tcfg["seq"] * 4 * big_cfg["d"] * 2,
                "count_per_step": 1,
                "direction": "DtoH",
                "dst_memory": "Pageable",
                "amount_ns_per_step": "see kineto/train_pageable_d2h truth "
                "(expected_saving.saving_ns_per_step), measured without nsys",
            }
        ],
        "capture": {
            "profiler": "nsys",
            "format": "nsys-sqlite",
            "profiled_steps": [f"step {i}" for i in range(args.steps)],
            "nvtx": "NVTX 'warmup <i>' then 'step <i>' around each step",
            "command": " ".join(["python3"] + sys.argv),
            "external_profiler_command": args.external_command,
            "trace_files": [f"{name}.sqlite.gz"],
        },
        "measured": {
            "step_wall_ns_under_nsys": stats_ns(times),
            "how": "perf_counter with torch.cuda.synchronize() before and after each step, "
            "under nsys (not an unprofiled truth: compare the kineto truth)",
        },
        "environment": env_facts(torch),
    }
    os.makedirs(args.out, exist_ok=True)
    write_truth(os.path.join(args.out, f"{name}.truth.json"), truth)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--family", choices=["train", "decode"])
    ap.add_argument(
        "--nsys",
        choices=["train_pageable_d2h"],
        help="run this variant with NVTX step ranges for an nsys capture",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument(
        "--warmup-steps", type=int, default=20, help="untimed steps of each variant first"
    )
    ap.add_argument(
        "--iter-steps", type=int, default=8, help="decode: steps of per-iteration-synced timing"
    )
    ap.add_argument("--max-gz", type=int, default=1_500_000)
    ap.add_argument("--warmup", type=int, default=3, help="--nsys: warm-up steps")
    ap.add_argument("--steps", type=int, default=6, help="--nsys: NVTX 'step i' steps")
    ap.add_argument("--external-command", default=None)
    args = ap.parse_args(argv)
    if not (args.family or args.nsys):
        ap.error("--family or --nsys is required")
    import torch

    env = Env(torch, args.dry_run)
    if env.cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.perf_counter()
    if args.nsys:
        run_nsys(torch, env, args)
    elif args.family == "train":
        run_train(torch, env, args)
    else:
        run_decode(torch, env, args)
    print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
