"""Build DDP-like multi-rank Kineto traces whose timing is simulated here, so the right answers
(who is late, why, and how much shorter the steps would be without the fault) are known.

Each step on each rank: the host loads a batch (a ``DataLoader`` range; the GPU idles), then
launches forward kernels, backward kernels in ``BUCKETS`` buckets, one all-reduce per bucket on a
communication stream (it starts when the bucket's gradients are ready and the previous
all-reduce is done, and ends ``TRANSFER`` after the last rank arrives), the optimizer after the
last all-reduce, and blocks in ``cudaStreamSynchronize`` (``loss.item()``) until the GPU is
done; the next step starts right after. Realistic proportions: about 95 ms of GPU work per step
with the all-reduces under backward, GPU 90-95 % busy. Times in integer ns.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.kineto_builder import KinetoTrace, linked_sync

US, MS = 1_000, 1_000_000
FWD_KERNELS, FWD_NS = 6, 5 * MS
BUCKETS, BWD_PER_BUCKET, BWD_NS = 10, 2, 3 * MS
OPT_KERNELS, OPT_NS = 4, 1_250 * US
TRANSFER, LOAD = 2 * MS, 500 * US
LAUNCH_NS, LATENCY = 10 * US, 5 * US
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


@dataclass(frozen=True)
class Plan:
    """A rank's fault: ``stall_ns`` more data loading per step; ``syncs`` rounds of rank-only
    metric logging before the forward (a small kernel, ``.item()`` blocking until it is done,
    1 ms of Python); compute ``scale``d (with the
    launch grid ``grid_scale``d: a larger batch; same grid: a slower GPU), or its first captured
    step starting ``first_delay_ns`` late (a delay before the capture)."""

    stall_ns: int = 0
    syncs: int = 0
    scale: float = 1.0
    grid_scale: float = 1.0
    first_delay_ns: int = 0


def meta(ranks: int, seq: int) -> dict:
    return {
        "Collective name": "allreduce",
        "In msg nelems": 6_250_000,
        "Out msg nelems": 6_250_000,
        "Group size": ranks,
        "dtype": "Float",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": str(list(range(ranks))),
        "Seq": seq,
    }


def ddp_job(plans: list[Plan], steps: int = 3) -> tuple[list[KinetoTrace], list[int]]:
    """Traces of ``len(plans)`` ranks and each step's end (the last optimizer kernel, any rank)."""
    n = len(plans)
    traces = [KinetoTrace(rank=r, world_size=n) for r in range(n)]
    host = [10 * MS + p.first_delay_ns for p in plans]
    step_ends = []
    for k in range(steps):
        ready, work = [], []
        for r, (t, p) in enumerate(zip(traces, plans, strict=True)):
            start = host[r]
            data_end = start + LOAD + p.stall_ns
            t.cpu_op(LOADER, start, data_end - start)
            w = _Rank(t, r, data_end, p)
            for _ in range(p.syncs):
                w.log_metric()
            for _ in range(FWD_KERNELS):
                w.compute("fwd_gemm", FWD_NS)
            bucket_ready = []
            for _ in range(BUCKETS):
                for _ in range(BWD_PER_BUCKET):
                    w.compute("bwd_gemm", BWD_NS)
                bucket_ready.append(w.gpu)
            ready.append(bucket_ready)
            work.append(w)
        comm_end = 0
        for j in range(BUCKETS):  # all-reduces: start when ready, end TRANSFER after the last
            arrive = [max(ready[r][j], comm_end) for r in range(n)]
            comm_end = max(arrive) + TRANSFER
            for r, w in enumerate(work):
                w.allreduce(arrive[r], comm_end, seq=k * BUCKETS + j)
        ends = []
        for r, w in enumerate(work):
            w.gpu = max(w.gpu, comm_end)
            for _ in range(OPT_KERNELS):
                w.compute("optimizer_step", OPT_NS, scaled=False)
            sync_end = w.gpu + 10 * US
            linked_sync(
                w.t, "cudaStreamSynchronize", "stream_sync", w.host, sync_end - w.host,
                w.host, sync_end - w.host, device=r,
            )  # fmt: skip
            w.t.step(k, host[r], sync_end + 20 * US - host[r])
            host[r] = sync_end + 50 * US
            ends.append(w.gpu)
        step_ends.append(max(ends))
    return traces, step_ends


class _Rank:
    """One rank's host and GPU clocks while a step is laid out."""

    def __init__(self, t: KinetoTrace, rank: int, host: int, plan: Plan):
        self.t, self.rank, self.host, self.gpu, self.plan = t, rank, host, host, plan

    def _launch(self) -> tuple[int, int]:
        corr = self.t.next_corr()
        self.t.runtime("cudaLaunchKernel", self.host, LAUNCH_NS - 2 * US, corr=corr)
        at = self.host
        self.host += LAUNCH_NS
        return corr, at

    def compute(self, name: str, dur: int, scaled: bool = True) -> None:
        corr, at = self._launch()
        if scaled:
            dur = int(dur * self.plan.scale)
        grid = int(128 * (self.plan.grid_scale if scaled else 1))
        start = max(self.gpu, at + LATENCY)
        self.t.kernel(name, start, dur, device=self.rank, corr=corr, grid=(grid, 1, 1))
        self.gpu = start + dur

    def log_metric(self) -> None:
        """A small kernel, then the host blocks in ``.item()`` until it is done, then Python."""
        self.compute("metric_reduce", 50 * US, scaled=False)
        linked_sync(
            self.t, "cudaStreamSynchronize", "stream_sync", self.host, self.gpu + 5 * US - self.host,
            self.host, self.gpu + 5 * US - self.host, device=self.rank,
        )  # fmt: skip
        self.host = self.gpu + 5 * US
        self.t.cpu_op("log_metrics", self.host, 1 * MS)
        self.host += 1 * MS

    def allreduce(self, start: int, end: int, seq: int) -> None:
        corr, _ = self._launch()
        n = self.t.world_size or 1
        self.t.kernel(
            ALLREDUCE, start, end - start, device=self.rank, stream=20, corr=corr,
            extra=meta(n, seq),
        )  # fmt: skip
