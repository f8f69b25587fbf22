"""See README.md, "nsys memory events"."""

import os
import subprocess as sp
import sys
import time

import realistic_1gpu as r1

KEYS = "segment.all.allocated segment.all.freed reserved_bytes.all.current"


def stats(c):
    return {k: c.memory_stats()[k] for k in KEYS.split()}


def run(s, out):
    import torch

    c, env = torch.cuda, r1.Env(torch, False)
    m = r1.TrainSetup(torch, env, r1.build_model_classes(torch), r1.BIG, r1.TRAIN)
    t = {"parameters": m.n_params, "steps": []}
    for ph, n in (("warmup", 3), ("step", 5)):
        for i in range(n):
            env.sync()
            c.reset_peak_memory_stats()
            b, t0 = stats(c), time.perf_counter()
            c.nvtx.range_push(f"{ph} {i}")
            m.eager_step()
            if s == "churn":
                c.empty_cache()  # PLANTED
            c.nvtx.range_pop()
            env.sync()
            a = stats(c)
            w = r1.ns(time.perf_counter() - t0)
            t["steps"].append([ph, i, w, b, a, c.max_memory_allocated(), c.max_memory_reserved()])
    t["env"] = r1.env_facts(torch)
    r1.write_truth(f"{out}/nsys_mem_{s}.truth.json", t)


def capture(out):
    f = "-t cuda,nvtx -s none --cpuctxsw=none --cuda-memory-usage=true -f true -o"
    for s in ("churn", "train"):
        p, x = f"{out}/nsys_mem_{s}", os.environ["NSYS"]
        sp.run([x, "profile", *f.split(), p, sys.executable, __file__, s, out], timeout=140)
        sp.run([x, "export", "--type", "sqlite", "-o", p + ".sqlite", p + ".nsys-rep"])
        sp.run(["gzip", "-9", p + ".sqlite"])


if __name__ == "__main__":
    capture(sys.argv[2]) if sys.argv[1] == "-c" else run(*sys.argv[1:])
