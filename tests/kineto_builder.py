"""Build small Kineto traces in code, where every right answer is known by hand.

Times are given in integer nanoseconds and written the way Kineto writes
them: microseconds with three decimals (``ts`` may be relative or epoch).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def us(ns: int) -> str:
    """Integer ns -> Kineto's µs text with exactly three decimals."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


@dataclass
class KinetoTrace:
    """A trace under construction; ``render()`` gives the JSON text."""

    rank: int | None = None
    world_size: int | None = None
    base_ns: int = 0
    device_props: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    _corr: int = 1000

    def _event(
        self,
        cat: str,
        name: str,
        pid: Any,
        tid: Any,
        start: int,
        dur: int,
        args: dict | None = None,
    ) -> None:
        parts = [
            '"ph": "X"',
            f'"cat": {json.dumps(cat)}',
            f'"name": {json.dumps(name)}',
            f'"pid": {json.dumps(pid)}',
            f'"tid": {json.dumps(tid)}',
            f'"ts": {us(self.base_ns + start)}',
            f'"dur": {us(dur)}',
        ]
        if args is not None:
            parts.append(f'"args": {json.dumps(args)}')
        self.events.append("{" + ", ".join(parts) + "}")

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def kernel(
        self,
        name: str,
        start: int,
        dur: int,
        *,
        device: int = 0,
        stream: int = 7,
        corr: int | None = None,
        grid=(1, 1, 1),
        block=(128, 1, 1),
        regs: int = 32,
        smem: int = 0,
        extra: dict | None = None,
    ) -> int:
        corr = corr if corr is not None else self.next_corr()
        args = {
            "External id": corr,
            "device": device,
            "stream": stream,
            "correlation": corr,
            "registers per thread": regs,
            "shared memory": smem,
            "grid": list(grid),
            "block": list(block),
            "blocks per SM": 0.5,
            "warps per SM": 2.0,
            "est. achieved occupancy %": 25,
        }
        args.update(extra or {})
        self._event("kernel", name, device, stream, start, dur, args)
        return corr

    def memcpy(
        self,
        kind: str,
        src: str,
        dst: str,
        start: int,
        dur: int,
        nbytes: int,
        *,
        device: int = 0,
        stream: int = 7,
        corr: int | None = None,
    ) -> int:
        corr = corr if corr is not None else self.next_corr()
        self._event(
            "gpu_memcpy",
            f"Memcpy {kind} ({src} -> {dst})",
            device,
            stream,
            start,
            dur,
            {"device": device, "stream": stream, "correlation": corr, "bytes": nbytes},
        )
        return corr

    def memset(
        self, start: int, dur: int, nbytes: int, *, device: int = 0, stream: int = 7
    ) -> None:
        self._event(
            "gpu_memset",
            "Memset (Device)",
            device,
            stream,
            start,
            dur,
            {"device": device, "stream": stream, "correlation": self.next_corr(), "bytes": nbytes},
        )

    def sync(self, kind: str, start: int, dur: int, *, device: int = 0, stream: int = 7) -> None:
        self._event(
            "cuda_sync",
            kind,
            device,
            stream,
            start,
            dur,
            {
                "cuda_sync_kind": kind,
                "device": device,
                "stream": stream,
                "correlation": self.next_corr(),
            },
        )

    def runtime(
        self,
        name: str,
        start: int,
        dur: int,
        *,
        corr: int | None = None,
        pid: int = 100,
        tid: int = 100,
        cat: str = "cuda_runtime",
        ext: int = 1,
    ) -> None:
        args = {"correlation": corr if corr is not None else self.next_corr(), "External id": ext}
        self._event(cat, name, pid, tid, start, dur, args)

    def cpu_op(
        self,
        name: str,
        start: int,
        dur: int,
        *,
        pid: int = 100,
        tid: int = 100,
        cat: str = "cpu_op",
        args: dict | None = None,
    ) -> None:
        self._event(
            cat, name, pid, tid, start, dur, args if args is not None else {"External id": 1}
        )

    def step(self, number: int, start: int, dur: int, *, pid: int = 100, tid: int = 100) -> None:
        self._event(
            "user_annotation", f"ProfilerStep#{number}", pid, tid, start, dur, {"External id": 1}
        )

    def render(self, *, bare_array: bool = False) -> str:
        body = "[\n" + ",\n".join(self.events) + "\n]"
        if bare_array:
            return body
        header: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": self.device_props}
        if self.rank is not None:
            header["distributedInfo"] = {
                "backend": "nccl",
                "rank": self.rank,
                "world_size": self.world_size or 1,
            }
        head = json.dumps(header)[:-1]
        return head + ', "traceEvents": ' + body + "}"

    def write(self, path: Path, *, gz: bool = False, bare_array: bool = False) -> Path:
        text = self.render(bare_array=bare_array).encode()
        path.write_bytes(gzip.compress(text) if gz else text)
        return path


H100 = {
    "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 233472, "numSms": 132, "sharedMemPerBlockOptin": 232448,
}  # fmt: skip


def linked_sync(
    trace: KinetoTrace,
    api: str,
    kind: str,
    host_start: int,
    host_dur: int,
    gpu_start: int,
    gpu_dur: int,
    *,
    device: int = 0,
    stream: int = 7,
    pid: int = 100,
    tid: int = 100,
    cat: str = "cuda_runtime",
) -> int:
    """A synchronize API call and the ``cuda_sync`` GPU event it produced (same correlation)."""
    trace.sync(kind, gpu_start, gpu_dur, device=device, stream=stream)
    corr = trace._corr  # the correlation sync() just used
    trace.runtime(api, host_start, host_dur, corr=corr, pid=pid, tid=tid, cat=cat)
    return corr


# One ``[memory]`` allocation instant event (``%`` its ts in µs and its allocated bytes).
MEMORY_EVENT = (
    '{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2,'
    ' "ts": %d.5, "args": {"Total Reserved": 4096, "Total Allocated": %d, "Bytes": 512,'
    ' "Addr": 77, "Device Id": 0, "Device Type": 1}}'
)


def many_ops_trace(events: int = 3000, memory_every: int = 0) -> KinetoTrace:
    """A one-step trace of ``events`` operators on three threads, a kernel every third
    operator and, with ``memory_every``, a ``[memory]`` event every that many operators:
    enough events to be cut into several pieces."""
    t = KinetoTrace(rank=0, world_size=1)
    for i in range(events):
        t.cpu_op(f"aten::op{i % 7}", i * 1000, 500, pid=100, tid=100 + i % 3)
        if i % 3 == 0:
            t.kernel(f"kernel_{i % 5}", i * 1000 + 100, 300, grid=(i % 9 + 1, 1, 1))
        if memory_every and i % memory_every == 0:
            t.events.append(MEMORY_EVENT % (i, 1000 + i))
    t.step(1, 0, events * 1000)
    return t
