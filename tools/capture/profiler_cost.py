#!/usr/bin/env python3
"""Issue 18: what torch.profiler costs the host, by profiler setting, on the samples' loops.

Run from the repository root on a CUDA machine (it imports realistic_1gpu.py beside it);
$OUT names the folder for the results. For each loop it times 10 unprofiled steps, then
3 profiled steps (after 1 warm-up) under each setting, then 10 unprofiled steps again,
and counts the recorded host events of the exported trace by category:

* ``full``: CPU + CUDA activities, record_shapes=True (the samples' setting);
* ``noshapes``: CPU + CUDA, record_shapes=False;
* ``cpu``: CPU activity only (operators, no CUPTI);
* ``cuda``: CUDA activity only (runtime/driver calls and kernels, no operators).

Loops: ``view`` (2,000 x ``x.view(-1)``: operators, no kernel), ``add`` (2,000 x
``x.add_``: one operator and one launch each), ``linear`` (2,000 x ``F.linear`` at
M=16), then realistic_1gpu's ``decode_eager`` step and ``train_small_eager`` step, whose
``full`` and ``cpu`` traces are kept as ``$OUT/<loop>_<setting>.json.gz``.
Writes ``$OUT/pc.json``: per loop ``u0``/``u1`` (unprofiled step seconds, before and
after), per setting ``step_ns``, ``ev`` (events per step by category) and
``ovh_per_ev_ns`` ((median profiled - median unprofiled) / events).

It ran on the device as a compressed one-letter-name version of this file, gzipped and
base64-encoded inside the command (the device runs the lead's checkout, where this file
did not exist yet); this is the same code with names and the repository's formatting.
Only the standard library is imported at module level; torch is imported in main().
Results of 2026-12-01: sample_traces/logs/profiler_cost_2026-12-01.json.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOST_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
ACTIVE = 3  # profiled steps per setting (after one warm-up step)


def timed(env, step, n: int) -> list[float]:
    """Seconds of ``n`` unprofiled steps, synchronized before and after each."""
    out = []
    for _ in range(n):
        env.sync()
        t0 = time.perf_counter()
        step()
        env.sync()
        out.append(time.perf_counter() - t0)
    return out


def profiled(torch, env, out: str, name: str, step, setting: str, keep: bool) -> dict:
    """One setting: step times of the active steps and host events per step by category."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities, shapes = {
        "full": ([ProfilerActivity.CPU, ProfilerActivity.CUDA], True),
        "noshapes": ([ProfilerActivity.CPU, ProfilerActivity.CUDA], False),
        "cpu": ([ProfilerActivity.CPU], True),
        "cuda": ([ProfilerActivity.CUDA], True),
    }[setting]
    raw, times = "/tmp/t.json", []
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=ACTIVE, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(raw),
        record_shapes=shapes,
    ) as prof:
        for _ in range(1 + ACTIVE):
            times += timed(env, step, 1)
            prof.step()
    with open(raw) as f:
        events = json.load(f)["traceEvents"]
    counts = collections.Counter(
        e["cat"]
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in HOST_CATS
        and not str(e.get("name")).startswith("ProfilerStep")
    )
    if keep:
        with open(raw, "rb") as f, open(f"{out}/{name}_{setting}.json.gz", "wb") as g:
            g.write(gzip.compress(f.read(), 5))
    return {
        "step_ns": [int(x * 1e9) for x in times[1:]],
        "ev": {k: v / ACTIVE for k, v in counts.items()},
    }


def measure(torch, env, out: str, name: str, step, keep: bool) -> dict:
    """15 warm-up steps, 10 unprofiled, each setting, 10 unprofiled again."""
    for _ in range(15):
        step()
    r = {"u0": timed(env, step, 10)}
    settings = ("full", "noshapes", "cpu", "cuda")
    for s in settings:
        r[s] = profiled(torch, env, out, name, step, s, keep and s in ("full", "cpu"))
    r["u1"] = timed(env, step, 10)
    base = statistics.median(r["u0"] + r["u1"])
    r["unprof_ns"] = int(base * 1e9)
    for s in settings:
        med = statistics.median(r[s]["step_ns"])
        events = sum(r[s]["ev"].values())
        r[s]["ovh_per_ev_ns"] = int((med - base * 1e9) / max(events, 1))
    summary = {
        s: (statistics.median(r[s]["step_ns"]), r[s]["ovh_per_ev_ns"], r[s]["ev"]) for s in settings
    }
    print(name, r["unprof_ns"], summary, flush=True)
    return r


def main() -> None:
    sys.path.insert(0, HERE)
    import realistic_1gpu as R
    import torch

    out = os.environ["OUT"]
    env = R.Env(torch, False)
    x = torch.ones(256, device="cuda")
    w = torch.randn(1024, 1024, device="cuda", dtype=env.dtype)
    bias, rows = w[0].clone(), w[:16].clone()
    linear = torch.nn.functional.linear

    def views():
        for _ in range(2000):
            x.view(-1)

    def adds():
        for _ in range(2000):
            x.add_(1e-4)

    def linears():
        with torch.no_grad():
            for _ in range(2000):
                linear(rows, w, bias)

    res = {
        "v": measure(torch, env, out, "view", views, False),
        "a": measure(torch, env, out, "add", adds, False),
        "l": measure(torch, env, out, "linear", linears, False),
    }
    gpt = R.build_model_classes(torch)
    decode = R.DecodeSetup(torch, env, gpt, R.BIG, R.DECODE)
    res["decode_eager"] = measure(
        torch, env, out, "decode_eager", lambda: decode.step("decode_eager"), True
    )
    decode = None  # frees the KV cache before the training model
    train = R.TrainSetup(torch, env, gpt, R.SMALL, R.SMALL_TRAIN)
    res["train_small_eager"] = measure(torch, env, out, "train_small_eager", train.eager_step, True)
    with open(f"{out}/pc.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
