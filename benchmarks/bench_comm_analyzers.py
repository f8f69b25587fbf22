"""How long do ``overlap`` and ``nccl_wait`` take on an 8-rank job, after ingest?

    python benchmarks/bench_comm_analyzers.py [--steps 200] [--repeat 3]

Two jobs, each ingested once into a temporary store, then analysed ``repeat``
times on a fresh :class:`JobData` (cold: views opened, Parquet read, nothing
cached), printing the median wall and CPU time (all threads; the steadier
figure on a busy machine) of overlap + nccl_wait together:

* the 8-rank DLRM job of the corpus (``param/dlrm_kineto``), when present;
* a synthetic 8-rank job built in code: per rank and step, 100 compute
  kernels with their launch calls, 10 all-reduces on their own stream and one
  copy; rank 5 sleeps 5 ms on the host before every step (a straggler), so
  the other ranks wait 5 ms in the first all-reduce of each step.
  ``--steps 200`` gives about 22,000 GPU operations and 2,000 collectives per
  rank (about 45,000 events per rank).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stallscope.analyzers import nccl_wait, overlap  # noqa: E402
from stallscope.ingest import ingest_paths  # noqa: E402
from stallscope.jobdata import JobData  # noqa: E402
from stallscope.store import Store  # noqa: E402
from tests.kineto_builder import KinetoTrace  # noqa: E402

US = 1_000
DLRM = REPO.parent / "shared" / "corpus" / "param" / "dlrm_kineto"


def synthetic(folder: Path, steps: int, ranks: int = 8) -> list[str]:
    paths = []
    args = {"Collective name": "allreduce", "In msg nelems": 1 << 22, "Out msg nelems": 1 << 22,
            "Group size": ranks, "dtype": "Float", "Process Group Name": "0",
            "Process Group Ranks": str(list(range(ranks)))}  # fmt: skip
    for rank in range(ranks):
        t = KinetoTrace(rank=rank, world_size=ranks)
        late = 5_000 * US if rank == 5 else 0
        for s in range(steps):
            base = s * 20_000 * US
            t.step(s, base, 20_000 * US)
            if late:
                t.cpu_op("time.sleep", base, late)
            for k in range(100):
                start = base + late + k * 100 * US
                corr = t.next_corr()
                t.runtime("cudaLaunchKernel", start, 5 * US, corr=corr)
                t.kernel("sm90_gemm", start + 10 * US, 80 * US, device=rank, corr=corr)
            for c in range(10):  # all ranks finish together; early ranks wait in the first
                end = base + 10_600 * US + c * 1_000 * US
                start = base + 5_000 * US if c == 0 and not late else end - 600 * US
                corr = t.next_corr()
                t.runtime("cudaLaunchKernel", start - 50 * US, 5 * US, corr=corr)
                t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", start, end - start,
                         device=rank, stream=20, corr=corr, extra=args)  # fmt: skip
            t.memcpy("DtoH", "Device", "Pinned", base + 15_500 * US, 20 * US, 4, device=rank)
        paths.append(str(t.write(folder / f"rank{rank}.json")))
    return paths


def bench(store: Store, files: list[str], repeat: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    (res,) = ingest_paths(store, files)
    ingest_s = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(repeat):
        job = JobData(store, store.traces(res.job_id))
        t, c = time.perf_counter(), time.process_time()
        overlap.run(job, overlap.SPEC.params())
        nccl_wait.run(job, nccl_wait.SPEC.params())
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        ops = job.sql("SELECT count(*) FROM gpu").fetchone()[0]
        colls = job.sql("SELECT count(*) FROM collectives").fetchone()[0]
        job.close()
    print(f"  ingest {ingest_s:.2f} s; {ops:,} GPU operations, {colls:,} collective kernels")
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store").ensure()
        if DLRM.is_dir():
            print("DLRM, 8 ranks (corpus):")
            wall, cpu = bench(store, sorted(str(p) for p in DLRM.glob("*.json.gz")), args.repeat)
            print(
                f"  overlap + nccl_wait: {wall:.3f} s wall, {cpu:.3f} s CPU (median of {args.repeat})"
            )
        print(f"synthetic, 8 ranks, {args.steps} steps:")
        wall, cpu = bench(store, synthetic(Path(tmp), args.steps), args.repeat)
        print(
            f"  overlap + nccl_wait: {wall:.3f} s wall, {cpu:.3f} s CPU (median of {args.repeat})"
        )


if __name__ == "__main__":
    main()
