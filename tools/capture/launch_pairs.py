#!/usr/bin/env python3
"""Issue 18: paired truths for the CUDA-graph saving of ``launch_overhead``.

Run from the repository root on a CUDA machine (it imports realistic_1gpu.py beside it);
$OUT names the folder for the results. For each launch-bound loop below it

1. warms every loop's eager step and its CUDA-graph replay, then times both
   unprofiled in interleaved rounds (perf_counter around each synchronized step),
   every loop before anything is profiled: once the profiler has traced CUDA activity
   in a process, launches stay slower there after it stops (the first run of this
   script, 2026-12-02: ``muladd_256`` 16.0 ms per eager step before any profiling and
   30.5 ms after; its graph replay 2.2 and 3.2 ms), so a later "unprofiled" timing in
   the same process is not a truth;
2. then profiles each eager step as users do (CPU + CUDA activities; once with
   ``record_shapes=True`` and once without, schedule wait 1, warm-up 1, active 3) and
   keeps the exported trace gzipped as ``<loop>_<shapes|noshapes>.pt.trace.json.gz``;
3. times ``muladd_256`` again after all the profiling (``after_profiling``: that
   residue, recorded as a fact, not a truth).

The measured saving of a trace is 3 x (median eager step - median graph step), both
unprofiled, over all rounds. Loops (each step ends with a synchronize):

* ``muladd_256``: the tiny_kernels sample's body, 1,000 x (``x.mul_``, ``x.add_``) on 256
  floats: one operator and one launch each, no operator with recorded children;
* ``add_1m``: 2,000 x ``x.add_`` on 1M floats (kernels of a few us);
* ``add_8m``: 1,000 x ``x.add_`` on 8M floats (kernels longer than a launch: GPU-bound);
* ``linear_16``: 2,000 x ``F.linear`` of 16 rows by a 1024x1024 bf16 weight
  (``aten::linear`` records ``aten::t`` and ``aten::addmm``);
* ``decode_big``: realistic_1gpu's decode step (16 layers, d 1024, 8 iterations);
* ``decode_small``: the same loop on the small model (8 layers, d 512, context 256);
* ``train_small``: realistic_1gpu's launch-bound small training step.

Writes ``$OUT/pairs.json`` (per loop: eager and graph step times in ns, per-round
medians, profiled step times per setting, environment) and ``$OUT/traces.tar`` with
the traces. Only the standard library is imported at module level.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import statistics
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP, ROUNDS, PER_ROUND, ACTIVE = 15, 4, 5, 3


def timed(env, step, n: int) -> list[int]:
    """Nanoseconds of ``n`` unprofiled steps, synchronized before and after each."""
    out = []
    for _ in range(n):
        env.sync()
        t0 = time.perf_counter()
        step()
        env.sync()
        out.append(int((time.perf_counter() - t0) * 1e9))
    return out


def rounds(env, eager, graph, times: dict) -> None:
    """ROUNDS interleaved rounds of PER_ROUND steps of each variant."""
    for _ in range(ROUNDS):
        for key, fn in (("eager", eager), ("graph", graph)):
            block = timed(env, fn, PER_ROUND)
            times[key] += block
            times[key + "_rounds"].append(int(statistics.median(block)))


def profiled(env, out: str, name: str, step, shapes: bool) -> list[int]:
    """Profile the eager step (CPU + CUDA); keep the trace; the active steps' times in ns."""
    from torch.profiler import ProfilerActivity, profile, schedule

    raw = f"/tmp/{name}.json"
    times = []
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(raw),
        record_shapes=shapes,
    ) as prof:
        for _ in range(2 + ACTIVE):
            times += timed(env, step, 1)
            prof.step()
    with open(raw, "rb") as f, gzip.open(f"{out}/{name}.pt.trace.json.gz", "wb", 6) as g:
        g.write(f.read())
    os.remove(raw)
    return times[2:]


def time_pair(env, eager, graph) -> dict:
    """Warm-up, then 2 x ROUNDS interleaved rounds of both variants (unprofiled)."""
    for _ in range(WARMUP):
        eager()
        graph()
    times = {"eager": [], "graph": [], "eager_rounds": [], "graph_rounds": []}
    rounds(env, eager, graph, times)
    rounds(env, eager, graph, times)
    e, g = statistics.median(times["eager"]), statistics.median(times["graph"])
    times.update(
        eager_ns=int(e),
        graph_ns=int(g),
        saving_per_step_ns=int(e - g),
        active_steps=ACTIVE,
        saving_ns=int(ACTIVE * (e - g)),
    )
    return times


def profile_pair(env, out: str, name: str, eager, times: dict) -> None:
    """Both profiled settings of one loop's eager step, into ``times['profiled_ns']``."""
    prof = {}
    for shapes in (True, False):
        tag = "shapes" if shapes else "noshapes"
        prof[tag] = profiled(env, out, f"{name}_{tag}", eager, shapes)
    times["profiled_ns"] = prof
    med = {k: int(statistics.median(v)) for k, v in prof.items()}
    print(name, times["eager_ns"], times["graph_ns"], med, flush=True)


def loop_pair(torch, env, body):
    """An eager step (body + sync) and its CUDA-graph replay (+ sync)."""
    replay = env.graph(body)

    def eager():
        body()
        env.sync()

    def graph():
        replay()
        env.sync()

    return eager, graph


def main() -> None:
    sys.path.insert(0, HERE)
    import realistic_1gpu as R
    import torch

    out = os.environ["OUT"]
    env = R.Env(torch, False)
    res = {
        "env": {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0),
            "cpu": platform.processor() or platform.machine(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
    }
    x256 = torch.randn(256, device="cuda")
    x1m = torch.randn(1 << 20, device="cuda")
    x8m = torch.randn(1 << 23, device="cuda")
    w = torch.randn(1024, 1024, device="cuda", dtype=env.dtype)
    bias, rows = w[0].clone(), w[:16].clone()
    linear = torch.nn.functional.linear

    def muladd():
        for _ in range(1000):
            x256.mul_(1.0001)
            x256.add_(0.0001)

    def add1m():
        for _ in range(2000):
            x1m.add_(1e-4)

    def add8m():
        for _ in range(1000):
            x8m.add_(1e-4)

    def linears():
        with torch.no_grad():
            for _ in range(2000):
                linear(rows, w, bias)

    loops = {
        name: loop_pair(torch, env, body)
        for name, body in (
            ("muladd_256", muladd),
            ("add_1m", add1m),
            ("add_8m", add8m),
            ("linear_16", linears),
        )
    }
    gpt = R.build_model_classes(torch)
    for name, cfg, dcfg in (
        ("decode_big", R.BIG, R.DECODE),
        ("decode_small", R.SMALL, dict(R.DECODE, ctx=256, start=192)),
    ):
        d = R.DecodeSetup(torch, env, gpt, cfg, dcfg)
        d.capture()
        loops[name] = (lambda d=d: d.step("decode_eager"), lambda d=d: d.step("decode_graph"))
    train = R.TrainSetup(torch, env, gpt, R.SMALL, R.SMALL_TRAIN)
    train.capture()
    loops["train_small"] = (train.eager_step, train.graph_step)
    for name, (eager, graph) in loops.items():  # every truth before any profiling
        res[name] = time_pair(env, eager, graph)
    for name, (eager, _graph) in loops.items():
        profile_pair(env, out, name, eager, res[name])
    after = {"eager": [], "graph": [], "eager_rounds": [], "graph_rounds": []}
    rounds(env, *loops["muladd_256"], after)
    res["muladd_256"]["after_profiling"] = after
    print("muladd_256 after profiling", after["eager_rounds"], after["graph_rounds"], flush=True)
    with open(f"{out}/pairs.json", "w") as f:
        json.dump(res, f)
    with tarfile.open(f"{out}/traces.tar", "w") as tar:
        for fn in sorted(os.listdir(out)):
            if fn.endswith(".pt.trace.json.gz"):
                tar.add(f"{out}/{fn}", arcname=fn)
                os.remove(f"{out}/{fn}")


if __name__ == "__main__":
    main()
