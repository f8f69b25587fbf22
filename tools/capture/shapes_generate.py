#!/usr/bin/env python3
"""Unannotated inference captures with input shapes (issue 17): find iterations from shapes.

A plain-PyTorch GPT-like decoder (bf16, random weights, static KV cache) run
eagerly with **no** ``record_function`` and no NVTX ranges, profiled with
``record_shapes=True``, so the only way to find its model forwards is the
input shapes of the ops (the token embedding's ``[batch, seq]`` input:
sequence length 1 is a decode, longer a prefill):

    python3 shapes_generate.py --out OUT/kineto            # both scenarios
    python3 shapes_generate.py --out DIR --dry-run         # tiny config on the CPU

Scenarios (one trace and one truth file each):
  shapes_decode          decode only: every iteration feeds one new token per
                         sequence ([batch, 1]) over a static KV cache already
                         holding ``decode_start`` positions; ``iters_per_step``
                         iterations per profiler step, a sync at the step's end
  shapes_generate        a generate-style loop, one call per profiler step: a
                         prefill of [batch, prompt] tokens (K/V written into the
                         cache), then ``new_tokens`` decode iterations, then the
                         generated tokens are read back with one .cpu()

Truth (unprofiled, same process, after warm-up): a CUDA event is recorded on
the stream after every model forward, so the time per output token is the
elapsed time between the events of two consecutive decode forwards (the GPU
completion of one decode iteration to the next, which is what the
``inference`` analyzer measures); the prefill's GPU time comes from events
before and after it, recorded after a sync. Then the scenario is profiled
(Kineto, ``record_shapes=True``) and the trace is gzipped, trimmed to fewer
profiled steps if over ``--max-gz``; ``expected_iterations`` counts the
forwards of the steps kept in the file.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import realistic_1gpu as r1  # noqa: E402  (standard library only at import)

# 6 layers, d_model 2048, 16 heads, MLP 8192, vocab 32768, 8192 learned positions:
# 453M parameters. Few wide layers (fewer launches per token than realistic_1gpu's 16)
# and a long static cache (each decode reads 51.6 GB of K/V, about 15 ms): a profiled
# eager decode then stays GPU-bound, since the profiler makes each launch slow.
CFG = dict(vocab=32768, d=2048, layers=6, heads=16, max_pos=8192)
CFG_DRY = dict(vocab=256, d=64, layers=2, heads=2, max_pos=128)
RUN = dict(
    batch=128, ctx=8192, decode_start=6144, iters_per_step=8, prompt=512, new_tokens=16,
    timed_decodes=64, timed_generates=4, warmup_decodes=16, warmup_generates=3,
)  # fmt: skip
RUN_DRY = dict(
    batch=2, ctx=128, decode_start=96, iters_per_step=8, prompt=32, new_tokens=16,
    timed_decodes=16, timed_generates=2, warmup_decodes=2, warmup_generates=1,
)  # fmt: skip
SCHEDULES = {
    "shapes_decode": {"wait": 1, "warmup": 1, "active": 4},
    "shapes_generate": {"wait": 1, "warmup": 1, "active": 3},
}
DESCRIPTIONS = {
    "shapes_decode": (
        "Eager decode of a GPT-like decoder (6 layers, d_model 2048, 16 heads, MLP 8192, vocab "
        "32768, learned positions, bf16, 453M parameters) with a static KV cache of 8192 slots "
        "per layer: batch 128, one new token per sequence per iteration ([128, 1] into the token "
        "embedding), attention over the whole cache with a position mask, greedy next token kept "
        "on the GPU. No record_function or NVTX: the iterations are visible only through the "
        "ops' input shapes. 8 iterations per profiler step, a sync at the end of each step."
    ),
    "shapes_generate": (
        "A generate-style loop on the same decoder: prefill of a [128, 512] prompt (causal SDPA, "
        "K/V written into the static cache), greedy first token, then 16 decode iterations "
        "([128, 1] each), then one .cpu() of the generated tokens. One generate call per "
        "profiler step. No record_function or NVTX."
    ),
}


class Runner:
    """The model, its static KV cache and the token/position state (torch imported lazily)."""

    def __init__(self, torch, env, cfg: dict, run: dict):
        self.torch, self.env, self.cfg, self.run = torch, env, cfg, run
        GPT = r1.build_model_classes(torch)
        self.model, self.n_params = r1.make_model(torch, env, GPT, cfg)
        self.model.eval()
        L, d, H = cfg["layers"], cfg["d"], cfg["heads"]
        B, ctx, dh = run["batch"], run["ctx"], d // H
        dev, dt = env.dev, env.dtype
        g = torch.Generator(device=dev).manual_seed(3)
        self.kc = [torch.randn(B, H, ctx, dh, device=dev, dtype=dt, generator=g) for _ in range(L)]
        self.vc = [torch.randn(B, H, ctx, dh, device=dev, dtype=dt, generator=g) for _ in range(L)]
        self.prompt = torch.randint(0, cfg["vocab"], (B, run["prompt"]), device=dev, generator=g)
        self.tok = torch.randint(0, cfg["vocab"], (B, 1), device=dev, generator=g)
        self.pos = torch.full((1,), run["decode_start"], dtype=torch.long, device=dev)
        self.start = torch.full((1,), run["decode_start"], dtype=torch.long, device=dev)
        self.slots = torch.arange(ctx, device=dev)
        self.marks = None  # a list: a CUDA event (kind, event) after every forward

    def _mark(self, kind: str):
        if self.marks is not None and self.env.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((kind, event))

    def decode(self):
        """One decode forward: one token per sequence at ``pos``; next token into ``tok``."""
        t, m = self.torch, self.model
        with t.no_grad():
            pos = self.pos
            mask = (self.slots <= pos).view(1, 1, 1, -1)
            x = m.wte(self.tok) + m.wpe(pos).view(1, 1, -1)
            for i, block in enumerate(m.blocks):
                x = block.decode(x, pos, mask, self.kc[i], self.vc[i])
            logits = m.lm_head(m.ln_f(x))[:, -1, :]
            self.tok.copy_(logits.argmax(dim=-1, keepdim=True))
            nxt = pos + 1
            self.pos.copy_(t.where(nxt >= self.run["ctx"], self.start, nxt))
        self._mark("decode")

    def prefill(self):
        """The prompt's forward: K/V of its positions into the cache, first token into ``tok``."""
        t, m, P = self.torch, self.model, self.run["prompt"]
        self._mark("before_prefill")
        with t.no_grad():
            kv = [(k[:, :, :P], v[:, :, :P]) for k, v in zip(self.kc, self.vc, strict=True)]
            h = m.hidden(self.prompt, kv_out=kv)
            self.tok.copy_(m.lm_head(h[:, -1:, :]).argmax(dim=-1))
            self.pos.fill_(P)
        self._mark("prefill")

    def decode_step(self):
        """``shapes_decode``'s profiler step: ``iters_per_step`` decodes, then a sync."""
        for _ in range(self.run["iters_per_step"]):
            self.decode()
        self.env.sync()

    def generate(self):
        """``shapes_generate``'s profiler step: prefill, ``new_tokens`` decodes, one read-back."""
        self.env.sync()
        self.prefill()
        out = [self.tok.clone()]
        for _ in range(self.run["new_tokens"]):
            self.decode()
            out.append(self.tok.clone())
        return self.torch.cat(out, dim=1).cpu()


def periods_ns(marks) -> dict:
    """Time per output token and prefill GPU time (ns) from the events after each forward."""
    tpot, prefill = [], []
    for (kind_a, a), (kind_b, b) in zip(marks, marks[1:], strict=False):
        if kind_a == "decode" and kind_b == "decode":
            tpot.append(a.elapsed_time(b) / 1e3)
        if kind_a == "before_prefill" and kind_b == "prefill":
            prefill.append(a.elapsed_time(b) / 1e3)
    return {"tpot": r1.stats_ns(tpot), "prefill_gpu": r1.stats_ns(prefill)}


def measure(runner: Runner, name: str) -> dict:
    """Warm up, then time the scenario unprofiled (events after every forward, perf_counter)."""
    env, run = runner.env, runner.run
    if name == "shapes_decode":
        for _ in range(run["warmup_decodes"]):
            runner.decode()
        env.sync()
        runner.marks = []
        t0 = time.perf_counter()
        for _ in range(run["timed_decodes"]):
            runner.decode()
        env.sync()
        wall = [(time.perf_counter() - t0) / run["timed_decodes"]]
    else:
        for _ in range(run["warmup_generates"]):
            runner.generate()
        runner.marks, wall = [], []
        for _ in range(run["timed_generates"]):
            t0 = time.perf_counter()
            runner.generate()
            wall.append(time.perf_counter() - t0)
    marks, runner.marks = runner.marks, None
    env.sync()
    out = periods_ns(marks) if env.cuda else {"tpot": None, "prefill_gpu": None}
    out["wall_ns"] = r1.stats_ns(wall)
    out["wall_what"] = (
        "perf_counter over the timed decodes / their count"
        if name == "shapes_decode"
        else "perf_counter around each synchronized generate call"
    )
    tpot = out["tpot"]
    out["tokens_per_s"] = (
        round(run["batch"] / (tpot["median_ns"] / 1e9), 1) if tpot and tpot["median_ns"] else None
    )
    return out


def expected_iterations(name: str, run: dict, steps: int) -> dict:
    """Forwards in the trace's kept profiled steps, and what their shapes say."""
    per_step = (
        {"decode": run["iters_per_step"], "prefill": 0}
        if name == "shapes_decode"
        else {"decode": run["new_tokens"], "prefill": 1}
    )
    return {
        "profiled_steps": steps,
        "decode": per_step["decode"] * steps,
        "prefill": per_step["prefill"] * steps,
        "per_profiled_step": per_step,
        "batch": run["batch"],
        "decode_tokens_per_iteration": run["batch"],
        "prefill_tokens_per_iteration": run["batch"] * run["prompt"]
        if per_step["prefill"]
        else None,
        "token_embedding_input_dims": {
            "decode": [run["batch"], 1],
            "prefill": [run["batch"], run["prompt"]] if per_step["prefill"] else None,
        },
    }


def capture(torch, env, runner: Runner, name: str, args) -> None:
    out_dir = os.path.join(args.out, name)
    measured = measure(runner, name)
    tpot = measured["tpot"]
    if tpot:
        print(f"  {name}: TPOT median {tpot['median_ns'] / 1e6:.3f} ms", flush=True)
    r1.SCHEDULE.clear()
    r1.SCHEDULE.update(SCHEDULES[name])
    step = runner.decode_step if name == "shapes_decode" else runner.generate
    gz, cap, profiled_wall = r1.profile_variant(torch, env, name, step, out_dir, args.max_gz)
    cap["annotations"] = "none (no record_function, no NVTX ranges)"
    cap["command"] = args.external_command or " ".join(sys.argv)
    steps = len(cap["profiled_steps"])
    measured["profiled_step_wall_ns"] = profiled_wall
    truth = {
        "schema": "stallscope.sample-truth/1",
        "scenario": name,
        "family": "shapes",
        "description": DESCRIPTIONS[name],
        "model": {
            "config": dict(runner.cfg),
            "parameters": runner.n_params,
            "dtype": "bfloat16",
            "run": dict(runner.run),
            "weights": "random (torch.manual_seed(0)); no downloads",
        },
        "expected_iterations": expected_iterations(name, runner.run, steps),
        "capture": cap,
        "measured": measured,
        "trace_readback": r1.trace_readback(gz),
        "environment": r1.env_facts(torch),
    }
    r1.write_truth(os.path.join(out_dir, f"{name}.truth.json"), truth)
    busy = truth["trace_readback"]["gpu_busy_pct_over_steps"]
    print(f"  {name}: {os.path.getsize(gz)} B gz, GPU busy {busy} % in the trace", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenario", choices=sorted(SCHEDULES), action="append")
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU")
    ap.add_argument("--max-gz", type=int, default=900_000)
    ap.add_argument("--external-command", default=None)
    args = ap.parse_args(argv)
    import torch

    env = r1.Env(torch, args.dry_run)
    runner = Runner(torch, env, CFG_DRY if args.dry_run else CFG, RUN_DRY if args.dry_run else RUN)
    print(f"model {runner.n_params:,} parameters", flush=True)
    t0 = time.perf_counter()
    for name in args.scenario or sorted(SCHEDULES):
        try:
            capture(torch, env, runner, name, args)
        except Exception:  # noqa: BLE001 (one scenario's failure must not lose the other)
            traceback.print_exc()
    print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
