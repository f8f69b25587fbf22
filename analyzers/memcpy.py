"""``memcpy``: copies that are slower, or more blocking, than they need to be.

Per trace and device (docs/analyzers/memcpy.md):

* **pageable host-to-device copies** (``src_kind = 'pageable'``): the driver
  stages them through a pinned bounce buffer, so they run at a fraction of
  the link's bandwidth and block the host. GPU time lost per copy
  = max(0, duration − (bytes / pinned bandwidth + 1 µs)), the time a pinned
  copy would have saved; the pinned bandwidth is measured from the trace's
  own pinned H2D copies of at least 1 MiB when it has some, else assumed
  from the GPU generation (threshold ``pinned_gbps`` overrides both);
* **device-to-host copies inside a ProfilerStep** (``.item()``, ``.cpu()``,
  ``.tolist()``): count, bytes and call sites when there are at least
  ``d2h_per_step`` per step (``info``: the GPU time they cost through the
  syncs they force is ``host_sync``'s impact, not counted twice);
* **synchronous copy calls** (``cudaMemcpy``, ``hipMemcpyWithStream``…, not
  ``*Async``; host-to-device copies of at most 64 KiB excepted, as nsys does):
  count, bytes and call sites (``info``, same reason).

* **copy-bound GPUs**: pinned host-to-device, device-to-host and peer copies
  (pageable ones are the first finding's; device-to-device copies are GPU
  memory work, like kernels) with no kernel running beside them, when that *exposed* copy
  time reaches ``copy_exposed_pct_low/medium/high`` % of the span: the GPU
  waits on transfers, not compute. ``impact_ns`` is the exposed copy time.

Metrics: ``pageable_memcpy_bytes`` and ``pageable_memcpy_count`` per device
(copies whose host memory is pageable, either direction).
"""

from __future__ import annotations

import msgspec
import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
    graded_severity,
    graded_thresholds,
)
from stallscope.host_ops import call_sites
from stallscope.idle import device_busy
from stallscope.jobdata import JobData
from stallscope.sync_calls import API_SQL, COPY_API_REGEX, SMALL_H2D_BYTES

THRESHOLDS = (
    *graded_thresholds(
        "GPU time lost to pageable host-to-device copies, % of the span",
        "GPU time lost to pageable copies below which they are not reported",
    ),
    Threshold(
        "pinned_gbps",
        0.0,
        "GB/s",
        "pinned host-to-device bandwidth for the lost-time estimate; 0 = measured from the trace, "
        "else by GPU generation",
    ),
    *(
        Threshold(
            f"copy_exposed_pct_{level}",
            default,
            "%",
            f"pinned/device copy time with no kernel beside it, % of the span, for a {level}-severity "
            "copy-bound finding",
            maximum=100,
        )
        for level, default in (("low", 10.0), ("medium", 25.0), ("high", 50.0))
    ),
    Threshold(
        "d2h_per_step",
        2.0,
        "copies",
        "device-to-host copies per step that make an (info) finding",
        minimum=1,
    ),
)
MAX_WINDOWS = 20
TOP_CALL_SITES = 10
PINNED_LATENCY_NS = 1_000  # fixed cost of a small pinned copy on the GPU timeline
MEASURE_MIN_BYTES = 1 << 20  # pinned copies at least this big measure the link
# Assumed pinned H2D bandwidth (GB/s) by NVIDIA compute capability major, a little
# below the practical peak of the PCIe generation those GPUs ship with.
GENERATION_GBPS = ((9, 40.0), (8, 20.0), (0, 10.0))
UNKNOWN_GBPS = 10.0

_COPIES_SQL = f"""
WITH launch AS (
  SELECT h.correlation, any_value(h.pid) AS pid, any_value(h.tid) AS tid,
         min(h.start_ns) AS host_start, max(h.end_ns) AS host_end, any_value({API_SQL}) AS api
  FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
  WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver')
    AND h.correlation IN (SELECT correlation FROM gpu WHERE trace_id = $trace AND kind = 'memcpy')
  GROUP BY h.correlation
)
SELECT g.device, g.start_ns, g.end_ns, coalesce(g.bytes, 0) AS bytes,
       coalesce(g.copy_kind, '') AS copy_kind, coalesce(g.src_kind, '') AS src_kind,
       coalesce(g.dst_kind, '') AS dst_kind,
       coalesce(l.pid, -1) AS pid, coalesce(l.tid, -1) AS tid,
       coalesce(l.host_start, g.start_ns) AS host_start, coalesce(l.host_end, g.end_ns) AS host_end,
       coalesce(l.api, '') AS api,
       l.api IS NOT NULL AND regexp_matches(l.api, '{COPY_API_REGEX}') AND NOT contains(l.api, 'Async') AS sync_api
FROM gpu g LEFT JOIN launch l ON l.correlation = g.correlation
WHERE g.trace_id = $trace AND g.kind = 'memcpy'
ORDER BY g.start_ns
"""


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        _trace(job, result, ref.trace_id, rank, params)
    return result


def _trace(job: JobData, result: AnalyzerResult, trace: str, rank: int, params: dict) -> None:
    """Each device's metrics, then its findings in report order, each spoken from its
    measurement (None: nothing of that kind on the device)."""
    for c in device_copies(job, Where(trace, rank)):
        result.metrics.extend(metrics(c))
        if not c.dev["start_ns"].size:
            continue
        measured = (
            (measure_pageable_h2d(job, c, params), speak_pageable_h2d),
            (measure_pageable_d2h(job, c, params), speak_pageable_d2h),
            (measure_copy_bound(job, c), speak_copy_bound),
            (measure_d2h_in_step(c), speak_d2h_in_step),
            (measure_sync_copies(c), speak_sync_copies),
        )
        for m, speak in measured:
            finding = None if m is None else speak(m, params)
            if finding:
                result.findings.append(finding)


def metrics(c: DeviceCopies) -> list[Metric]:
    """``pageable_memcpy_bytes`` and ``pageable_memcpy_count`` of the device: its copies whose
    host memory is pageable, either direction (0 without copies)."""
    dev, w = c.dev, c.where
    host_pageable = (dev["src_kind"] == "pageable") | (dev["dst_kind"] == "pageable")
    return [
        Metric(w.trace, w.rank, w.device, "pageable_memcpy_bytes",
               int(dev["bytes"][host_pageable].sum()), "bytes"),
        Metric(w.trace, w.rank, w.device, "pageable_memcpy_count", int(host_pageable.sum()), "count"),
    ]  # fmt: skip


def device_copies(job: JobData, where: Where) -> list[DeviceCopies]:
    """The copies of each device of trace ``where.trace`` with GPU work, by device
    (a device without copies gets empty columns)."""
    trace = where.trace
    copies = {
        k: np.asarray(v)
        for k, v in job.con.execute(_COPIES_SQL, {"trace": trace}).fetchnumpy().items()
    }
    devices = np.asarray(job.devices(trace, ("kernel", "memcpy", "memset")), dtype=np.int64)
    steps = job.steps(trace)
    n_steps = int(steps["start_ns"].size)
    window = (int(steps["start_ns"].min()), int(steps["end_ns"].max())) if n_steps else None
    in_step = intervals.covers(
        intervals.union(steps["start_ns"], steps["end_ns"]), copies["host_start"]
    )
    if not n_steps:
        in_step[:] = True
    sites = (
        call_sites(
            job,
            trace,
            copies["pid"],
            copies["tid"],
            copies["host_start"],
            copies["host_end"],
            np.where(copies["api"] == "", "(no launch record)", copies["api"]).astype(object),
        )
        if copies["start_ns"].size
        else np.zeros(0, dtype=object)
    )
    out = []
    for device in devices.tolist():
        mask = copies["device"] == device
        out.append(
            DeviceCopies(
                where=Where(trace, where.rank, int(device)),
                dev={k: v[mask] for k, v in copies.items()},
                in_step=in_step[mask],
                sites=sites[mask],
                steps=n_steps,
                window=window,
            )
        )
    return out


class DeviceCopies(msgspec.Struct, kw_only=True):
    """One device's copies (the columns of ``_COPIES_SQL``) and where they sit."""

    where: Where
    dev: dict[str, np.ndarray]  # one entry per copy
    in_step: np.ndarray  # per copy: its launch is inside a step (all True without steps)
    sites: np.ndarray  # per copy: its call site
    steps: int  # ProfilerStep ranges of the trace
    window: tuple[int, int] | None  # first step start, last step end; None without steps


def pinned_bandwidth(
    job: JobData, trace: str, device: int, dev: dict, params: dict
) -> tuple[float, str]:
    """GB/s assumed for a pinned host-to-device copy, and where the number comes from."""
    if params["pinned_gbps"] > 0:
        return params["pinned_gbps"], "threshold pinned_gbps"
    big = (
        (dev["copy_kind"] == "HtoD")
        & (dev["src_kind"] == "pinned")
        & (dev["bytes"] >= MEASURE_MIN_BYTES)
        & (dev["end_ns"] > dev["start_ns"])
    )
    if big.any():
        gbps = float(np.median(dev["bytes"][big] / (dev["end_ns"][big] - dev["start_ns"][big])))
        return gbps, f"median of {int(big.sum())} pinned HtoD copies ≥ 1 MiB in this trace"
    rows = job.sql(
        "SELECT compute_major, name FROM devices WHERE trace_id = ? AND device = ?", [trace, device]
    ).fetchall()
    row = rows[0] if rows else None
    if row and row[0] is not None and "nvidia" in str(row[1] or "nvidia").lower():
        for major, gbps in GENERATION_GBPS:
            if row[0] >= major:
                return gbps, f"assumed for compute capability {row[0]}.x"
    return UNKNOWN_GBPS, "assumed (GPU generation unknown)"


class PageableH2D(msgspec.Struct, kw_only=True):
    """Pageable host-to-device copies of one device (inside the steps when there are
    any), measured against pinned copies of the same bytes: :func:`measure_pageable_h2d`.

    ``lost_ns`` = Σ max(0, duration − (bytes / ``gbps`` + 1 µs)) per copy;
    ``saving_ns`` the same over each copy's exposed time (no kernel beside it).
    """

    where: Where
    count: int
    outside_steps: int  # pageable copies outside the steps, not counted (0 without steps)
    steps: int
    nbytes: int
    largest_bytes: int
    gpu_ns: int
    exposed_ns: int
    lost_ns: int
    saving_ns: int
    span_ns: int
    gbps: float  # assumed pinned bandwidth
    gbps_source: str  # where gbps comes from
    call_sites: list[dict]
    windows: list[list[int]]  # the copies that lost the most

    @property
    def achieved_gbps(self) -> float:
        return self.nbytes / self.gpu_ns if self.gpu_ns else 0.0

    @property
    def share_pct(self) -> float:
        return 100.0 * self.lost_ns / self.span_ns if self.span_ns else 0.0


def measure_pageable_h2d(job: JobData, c: DeviceCopies, params: dict) -> PageableH2D | None:
    """The device's pageable host-to-device copies, or None when it has none."""
    dev, in_step, trace, device = c.dev, c.in_step, c.where.trace, c.where.device
    pageable = (dev["copy_kind"] == "HtoD") & (dev["src_kind"] == "pageable")
    if not pageable.any():
        return None
    counted = pageable & in_step
    bw, source = pinned_bandwidth(job, trace, device, dev, params)
    dur = dev["end_ns"] - dev["start_ns"]
    pinned_ns = dev["bytes"] / bw + PINNED_LATENCY_NS  # bytes / (GB/s) = ns
    lost_each = np.where(counted, np.maximum(dur - pinned_ns, 0), 0).astype(np.int64)
    exposed = exposed_each(dev, kernel_union(job, trace, device))
    order = np.argsort(-lost_each, kind="stable")[:MAX_WINDOWS]
    order = order[lost_each[order] > 0]
    return PageableH2D(
        where=c.where,
        count=int(counted.sum()),
        outside_steps=int((pageable & ~in_step).sum()) if c.steps else 0,
        steps=c.steps,
        nbytes=int(dev["bytes"][counted].sum()),
        largest_bytes=int(dev["bytes"][counted].max()) if counted.any() else 0,
        gpu_ns=int(dur[counted].sum()),
        exposed_ns=int(exposed[counted].sum()),
        lost_ns=int(lost_each.sum()),
        saving_ns=int(np.where(counted, np.maximum(exposed - pinned_ns, 0), 0).sum()),
        span_ns=_span(job, trace, device, c.window),
        gbps=bw,
        gbps_source=source,
        call_sites=_by_site(c.sites[counted], dev["bytes"][counted], dur[counted]),
        windows=[[int(dev["start_ns"][i]), int(dev["end_ns"][i])] for i in order],
    )


def speak_pageable_h2d(m: PageableH2D, params: dict) -> Finding | None:
    """The pageable host-to-device finding, graded by the lost share of the span
    (``info`` below the ladder); None under ``min_impact_ms``."""
    lost, share, achieved, nbytes = m.lost_ns, m.share_pct, m.achieved_gbps, m.nbytes
    if lost < params["min_impact_ms"] * 1e6:
        return None
    severity = "info"
    for level in ("critical", "high", "medium", "low"):
        if share >= params[f"share_pct_{level}"]:
            severity = level
            break
    device, n_steps = m.where.device, m.steps
    scope = "inside the steps" if n_steps else "in the trace"
    per_step = f" ({_mib(nbytes // n_steps)} per step)" if n_steps else ""
    return Finding(
        analyzer="memcpy",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity=severity,
        title=(
            f"GPU {device}: {m.count} pageable host-to-device copies, "
            f"{_mib(nbytes)}{per_step}, at {achieved:.1f} GB/s"
        ),
        detail=(
            f"{m.count} copies from pageable host memory {scope} moved {nbytes:,} bytes in "
            f"{m.gpu_ns / 1e6:.2f} ms of GPU time ({achieved:.1f} GB/s). From pinned memory at {m.gbps:.1f} GB/s "
            f"({m.gbps_source}) they would take about {(nbytes / m.gbps + PINNED_LATENCY_NS * m.count) / 1e6:.2f} ms: "
            f"at least {lost / 1e6:.2f} ms lost ({share:.1f}% of the span). Pageable copies also block the "
            f"host while the driver stages them."
            + (
                f" {m.outside_steps} more outside the steps are not counted."
                if n_steps and m.outside_steps
                else ""
            )
        ),
        recommendation=(
            "Copy from pinned memory: DataLoader(pin_memory=True), tensor.pin_memory(), or a reusable "
            "torch.empty(..., pin_memory=True) staging buffer, then .to(device, non_blocking=True) so the "
            "copy overlaps compute; prefetch the next batch to the GPU on a side stream."
        ),
        impact_ns=lost,
        saving_ns=m.saving_ns,
        evidence={
            "key": "pageable_h2d",
            "exposed_ns": m.exposed_ns,
            "count": m.count,
            "bytes": nbytes,
            "gpu_ns": m.gpu_ns,
            "achieved_gbps": round(float(achieved), 2),
            "pinned_gbps": round(float(m.gbps), 2),
            "pinned_gbps_source": m.gbps_source,
            "share_of_span_pct": round(float(share), 3),
            "span_ns": m.span_ns,
            "steps": n_steps,
            "outside_steps": m.outside_steps,
            "largest_bytes": m.largest_bytes,
            "call_sites": m.call_sites,
        },
        windows=m.windows,
    )


def kernel_union(job: JobData, trace: str, device: int) -> tuple[np.ndarray, np.ndarray]:
    """Union of the device's kernels (cached per job)."""
    key = ("memcpy.kernels", trace, device)
    if key not in job.cache:
        k = job.numpy(
            "SELECT start_ns, end_ns FROM gpu WHERE trace_id = ? AND device = ? AND kind = 'kernel'",
            [trace, device],
        )
        job.cache[key] = intervals.union(k["start_ns"], k["end_ns"])
    return job.cache[key]


def exposed_each(dev: dict, kernels: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per copy: ns of its duration with no kernel running (int64)."""
    starts, ends = dev["start_ns"], dev["end_ns"]
    if not starts.size:
        return np.zeros(0, dtype=np.int64)
    k_s, k_e = kernels
    cum = np.concatenate([[0], np.cumsum(k_e - k_s)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(k_s, t, side="right") - 1
        j = np.maximum(i, 0)
        if not k_s.size:
            return np.zeros(t.size, dtype=np.int64)
        return np.where(i >= 0, cum[j] + np.minimum(t, k_e[j]) - k_s[j], 0)

    return ((ends - starts) - (covered_before(ends) - covered_before(starts))).astype(np.int64)


def refill_after(
    ends: np.ndarray, kernels: tuple[np.ndarray, np.ndarray], cap: np.ndarray
) -> np.ndarray:
    """Per copy end: ns until the next kernel starts (0 if one runs at the end), at most ``cap``."""
    k_s, k_e = kernels
    if not k_s.size or not ends.size:
        return np.zeros(ends.size, dtype=np.int64)
    i = np.searchsorted(k_s, ends, side="left")
    running = (i > 0) & (k_e[np.maximum(i - 1, 0)] > ends)
    nxt = np.where(i < k_s.size, k_s[np.minimum(i, k_s.size - 1)], ends)
    gap = np.where(running, 0, np.maximum(nxt - ends, 0))
    return np.minimum(gap, cap).astype(np.int64)


class PageableD2H(msgspec.Struct, kw_only=True):
    """Pageable device-to-host copies of one device inside the steps, measured:
    :func:`measure_pageable_d2h`.

    ``exposed_ns``: copy time with no kernel beside it (the critical path: the
    host waits for the copy, and the GPU has nothing else queued while the
    host is blocked); ``pinned_ns``: what pinned copies of the same bytes
    would take at ``gbps``; ``refill_ns``: the GPU idle right after each copy, until the
    next kernel (the copy drained the queue: the host was blocked and launched nothing), at
    most the copy's own exposed time (a longer gap has another cause); ``saving_ns`` =
    Σ max(0, exposed − pinned) + refill per copy.
    """

    where: Where
    count: int
    nbytes: int
    gpu_ns: int
    exposed_ns: int
    pinned_ns: int
    saving_ns: int
    refill_ns: int
    gbps: float  # assumed pinned bandwidth
    gbps_source: str  # where gbps comes from
    span_ns: int
    steps: int
    call_sites: list[dict]
    windows: list[list[int]]  # the longest copies

    @property
    def achieved_gbps(self) -> float:
        return self.nbytes / self.gpu_ns if self.gpu_ns else 0.0

    @property
    def share_pct(self) -> float:
        """The exposed copy time as a share of the span (unrounded)."""
        return 100.0 * self.exposed_ns / self.span_ns if self.span_ns else 0.0


def measure_pageable_d2h(job: JobData, c: DeviceCopies, params: dict) -> PageableD2H | None:
    """The device's pageable device-to-host copies inside the steps, or None when it has none."""
    trace, device, dev, window = c.where.trace, c.where.device, c.dev, c.window
    mask = (dev["copy_kind"] == "DtoH") & (dev["dst_kind"] == "pageable") & c.in_step
    if not mask.any():
        return None
    gbps, source = pinned_bandwidth(job, trace, device, dev, params)
    dur_all = dev["end_ns"] - dev["start_ns"]
    dur = dur_all[mask]
    kernels = kernel_union(job, trace, device)
    exposed = exposed_each(dev, kernels)[mask]
    refill = refill_after(dev["end_ns"][mask], kernels, cap=exposed)
    pinned = dev["bytes"][mask] / gbps + PINNED_LATENCY_NS
    count = int(mask.sum())
    longest = np.argsort(-(dur_all * mask), kind="stable")[: min(MAX_WINDOWS, count)]
    return PageableD2H(
        where=c.where,
        count=count,
        nbytes=int(dev["bytes"][mask].sum()),
        gpu_ns=int(dur.sum()),
        exposed_ns=int(exposed.sum()),
        pinned_ns=int(pinned.sum()),
        saving_ns=int((np.maximum(exposed - pinned, 0) + refill).sum()),
        refill_ns=int(refill.sum()),
        gbps=gbps,
        gbps_source=source,
        span_ns=_span(job, trace, device, window),
        steps=c.steps,
        call_sites=_by_site(c.sites[mask], dev["bytes"][mask], dur),
        windows=[[int(dev["start_ns"][i]), int(dev["end_ns"][i])] for i in longest],
    )


def speak_pageable_d2h(m: PageableD2H, params: dict) -> Finding | None:
    """The pageable device-to-host finding, graded by the exposed share of the span; None
    below the ladder or under ``min_impact_ms``."""
    severity = graded_severity(m.share_pct, m.exposed_ns, params)
    if severity is None:
        return None
    device, n_steps, share, achieved = m.where.device, m.steps, m.share_pct, m.achieved_gbps
    per_step = f" ({_mib(m.nbytes // n_steps)} per step)" if n_steps else ""
    return Finding(
        analyzer="memcpy",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity=severity,
        title=(
            f"GPU {device}: {m.count} pageable device-to-host copies, {_mib(m.nbytes)}{per_step}, at "
            f"{achieved:.1f} GB/s take {share:.1f}% of the time"
        ),
        detail=(
            f"{m.count} copies into pageable host memory moved {m.nbytes:,} bytes in {m.gpu_ns / 1e6:.2f} ms "
            f"({achieved:.1f} GB/s), {m.exposed_ns / 1e6:.2f} ms of it with no kernel running "
            f"({share:.1f}% of the {m.span_ns / 1e6:.2f} ms span). A copy into pageable memory returns only "
            f"when it is done, so the host waits for it and the GPU gets no new work meanwhile. Into pinned "
            f"memory at {m.gbps:.1f} GB/s ({m.gbps_source}) it would take about {m.pinned_ns / 1e6:.2f} ms, and "
            f"with non_blocking=True it can overlap compute; the GPU also idled {m.refill_ns / 1e6:.2f} ms "
            f"after the copies until the host launched again (the blocked host had queued nothing): about "
            f"{m.saving_ns / 1e6:.2f} ms saved in all."
        ),
        recommendation=(
            "Copy into a reusable pinned buffer: buf = torch.empty(shape, dtype, pin_memory=True) once, then "
            "buf.copy_(t, non_blocking=True) and wait on a CUDA event (or the next step) before reading it; "
            "better, read back less (only what the host needs, every N steps)."
        ),
        impact_ns=m.exposed_ns,
        saving_ns=m.saving_ns,
        evidence={
            "key": "pageable_d2h",
            "count": m.count,
            "bytes": m.nbytes,
            "gpu_ns": m.gpu_ns,
            "exposed_ns": m.exposed_ns,
            "pinned_estimate_ns": m.pinned_ns,
            "refill_ns": m.refill_ns,
            "achieved_gbps": round(float(achieved), 2),
            "pinned_gbps": round(float(m.gbps), 2),
            "pinned_gbps_source": m.gbps_source,
            "share_of_span_pct": round(float(share), 3),
            "span_ns": m.span_ns,
            "steps": n_steps,
            "call_sites": m.call_sites,
        },
        windows=m.windows,
    )


class D2HInStep(msgspec.Struct, kw_only=True):
    """Device-to-host copies of one device launched inside the steps: :func:`measure_d2h_in_step`."""

    where: Where
    count: int
    nbytes: int
    pageable: int  # of them, into pageable memory
    sync_api: int  # of them, through a synchronous copy call
    steps: int
    call_sites: list[dict]
    windows: list[list[int]]  # launch to copy end of the longest copies

    @property
    def per_step(self) -> float:
        return self.count / self.steps


def measure_d2h_in_step(c: DeviceCopies) -> D2HInStep | None:
    """The device's device-to-host copies inside the steps, or None without steps or such copies."""
    dev, n_steps = c.dev, c.steps
    if not n_steps:
        return None
    d2h = (dev["copy_kind"] == "DtoH") & c.in_step
    if not d2h.any():
        return None
    dur = dev["end_ns"] - dev["start_ns"]
    count = int(d2h.sum())
    longest = np.argsort(-(dur * d2h), kind="stable")[: min(MAX_WINDOWS, count)]
    return D2HInStep(
        where=c.where,
        count=count,
        nbytes=int(dev["bytes"][d2h].sum()),
        pageable=int((d2h & (dev["dst_kind"] == "pageable")).sum()),
        sync_api=int((d2h & dev["sync_api"]).sum()),
        steps=n_steps,
        call_sites=_by_site(c.sites[d2h], dev["bytes"][d2h], dur[d2h]),
        windows=[[int(dev["host_start"][i]), int(dev["end_ns"][i])] for i in longest],
    )


def speak_d2h_in_step(m: D2HInStep, params: dict) -> Finding | None:
    """The ``info`` finding when there are at least ``d2h_per_step`` copies per step."""
    if m.per_step < params["d2h_per_step"]:
        return None
    device = m.where.device
    top = ", ".join(f"{s['call_site']} ×{s['count']}" for s in m.call_sites[:3])
    return Finding(
        analyzer="memcpy",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity="info",
        title=f"GPU {device}: {m.per_step:.1f} device-to-host copies per step inside the training step",
        detail=(
            f"{m.count} device-to-host copies ({m.nbytes:,} bytes) were issued inside {m.steps} "
            f"steps; {m.pageable} into pageable memory and {m.sync_api} through a "
            f"synchronous copy call (both block the host by themselves). "
            f"Top call sites: {top}. Each copy whose result the host reads forces a sync; the GPU idle "
            f"time that costs is reported by host_sync"
            + (
                ", and the copy time of the pageable ones by the pageable device-to-host finding."
                if m.pageable
                else "."
            )
        ),
        recommendation=(
            "Keep values on the GPU inside the step: accumulate losses and metrics as tensors and read "
            "them (.item(), .cpu(), .tolist()) every N steps in one copy; when the host needs a result "
            "now, copy it into a pinned buffer with non_blocking=True and wait on a CUDA event."
        ),
        impact_ns=0,
        evidence={
            "key": "d2h_in_step",
            "count": m.count,
            "per_step": round(float(m.per_step), 2),
            "bytes": m.nbytes,
            "pageable": m.pageable,
            "sync_api": m.sync_api,
            "steps": m.steps,
            "call_sites": m.call_sites,
        },
        windows=m.windows,
    )


class SyncCopies(msgspec.Struct, kw_only=True):
    """Copies of one device issued through synchronous copy calls (host-to-device copies of
    at most SMALL_H2D_BYTES excepted, as nsys does): :func:`measure_sync_copies`."""

    where: Where
    count: int
    by_direction: dict[str, int]  # copy kind -> count
    apis: list[str]  # the synchronous calls used, sorted
    nbytes: int
    host_ns: int  # time in the calls
    gpu_ns: int
    in_steps: int  # of them, launched inside the steps (all without steps)
    call_sites: list[dict]
    windows: list[list[int]]  # the longest calls


def measure_sync_copies(c: DeviceCopies) -> SyncCopies | None:
    """The device's synchronous copy calls, or None when it has none."""
    dev = c.dev
    sync = dev["sync_api"] & ~((dev["copy_kind"] == "HtoD") & (dev["bytes"] <= SMALL_H2D_BYTES))
    if not sync.any():
        return None
    kinds, counts = np.unique(dev["copy_kind"][sync].astype(str), return_counts=True)
    dur = dev["end_ns"] - dev["start_ns"]
    host = dev["host_end"] - dev["host_start"]
    count = int(sync.sum())
    longest = np.argsort(-(host * sync), kind="stable")[: min(MAX_WINDOWS, count)]
    return SyncCopies(
        where=c.where,
        count=count,
        by_direction={str(k) or "unknown": int(n) for k, n in zip(kinds, counts, strict=True)},
        apis=np.unique(dev["api"][sync].astype(str)).tolist(),
        nbytes=int(dev["bytes"][sync].sum()),
        host_ns=int(host[sync].sum()),
        gpu_ns=int(dur[sync].sum()),
        in_steps=int((sync & c.in_step).sum()),
        call_sites=_by_site(c.sites[sync], dev["bytes"][sync], dur[sync]),
        windows=[[int(dev["host_start"][i]), int(dev["host_end"][i])] for i in longest],
    )


def speak_sync_copies(m: SyncCopies, params: dict) -> Finding:
    """The ``info`` finding on the device's synchronous copy calls (no threshold)."""
    device = m.where.device
    return Finding(
        analyzer="memcpy",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity="info",
        title=f"GPU {device}: {m.count} synchronous copy calls ({', '.join(m.apis)})",
        detail=(
            f"{m.count} copies ({', '.join(f'{k} ×{n}' for k, n in m.by_direction.items())}, "
            f"{m.nbytes:,} bytes) went through synchronous copy APIs, which block the "
            f"host until the copy is done ({m.host_ns / 1e6:.2f} ms in the calls); "
            f"{m.in_steps} of them inside the steps. The GPU idle time they cause is "
            f"reported by host_sync."
        ),
        recommendation=(
            "Use the asynchronous copy (cudaMemcpyAsync / hipMemcpyAsync; in PyTorch "
            ".to(device, non_blocking=True) or .copy_(src, non_blocking=True)) from pinned memory, "
            "and synchronize on an event only where the data is needed."
        ),
        impact_ns=0,
        evidence={
            "key": "sync_copy",
            "count": m.count,
            "by_direction": m.by_direction,
            "apis": m.apis,
            "bytes": m.nbytes,
            "host_ns": m.host_ns,
            "gpu_ns": m.gpu_ns,
            "in_steps": m.in_steps,
            "call_sites": m.call_sites,
        },
        windows=m.windows,
    )


class CopyBound(msgspec.Struct, kw_only=True):
    """Pinned host/device and peer copies of one device (device-to-device copies are GPU
    memory work, like kernels) against its kernels: :func:`measure_copy_bound`."""

    where: Where
    copy_ns: int  # union of the copies
    exposed_ns: int  # of it, with no kernel running
    span_ns: int
    by_direction: dict[str, dict]  # copy kind -> {count, bytes, gbps}
    windows: list[list[int]]  # the longest copies

    @property
    def share_pct(self) -> float:
        return 100.0 * self.exposed_ns / self.span_ns


def measure_copy_bound(job: JobData, c: DeviceCopies) -> CopyBound | None:
    """The device's exposed copy time (in the steps when there are any), or None when it
    has no such copy or no span."""
    trace, device, dev, window = c.where.trace, c.where.device, c.dev, c.window
    pageable = (dev["src_kind"] == "pageable") | (dev["dst_kind"] == "pageable")
    # host <-> device and peer transfers; device-to-device copies are GPU memory work, like kernels
    mine = ~pageable & np.isin(dev["copy_kind"], ["HtoD", "DtoH", "PtoP"])
    if window is not None:
        mine &= (dev["start_ns"] >= window[0]) & (dev["start_ns"] < window[1])
    span = _span(job, trace, device, window)
    if not mine.any() or span <= 0:
        return None
    kernels = job.numpy(
        "SELECT start_ns, end_ns FROM gpu WHERE trace_id = ? AND device = ? AND kind = 'kernel'",
        [trace, device],
    )
    starts, ends = dev["start_ns"][mine], dev["end_ns"][mine]
    kernel_ns = intervals.total(kernels["start_ns"], kernels["end_ns"])
    both = intervals.total(
        np.concatenate([starts, kernels["start_ns"]]), np.concatenate([ends, kernels["end_ns"]])
    )
    kinds = dev["copy_kind"][mine].astype(str)
    nbytes, dur = dev["bytes"][mine], ends - starts
    by_kind = {}
    for kind in np.unique(kinds).tolist():
        k = kinds == kind
        seconds = float(dur[k].sum()) / 1e9
        by_kind[kind or "unknown"] = {
            "count": int(k.sum()),
            "bytes": int(nbytes[k].sum()),
            "gbps": round(float(nbytes[k].sum()) / seconds / 1e9, 2) if seconds else None,
        }
    longest = np.argsort(-dur, kind="stable")[:MAX_WINDOWS]
    return CopyBound(
        where=c.where,
        copy_ns=intervals.total(starts, ends),
        exposed_ns=both - kernel_ns,
        span_ns=span,
        by_direction=by_kind,
        windows=[[int(starts[i]), int(ends[i])] for i in longest],
    )


def speak_copy_bound(m: CopyBound, params: dict) -> Finding | None:
    """The copy-bound finding, graded by the exposed share (``copy_exposed_pct_*``)."""
    exposed, share, span, device = m.exposed_ns, m.share_pct, m.span_ns, m.where.device
    severity = graded_severity(share, exposed, params, prefix="copy_exposed_pct")
    if severity is None:
        return None
    moved = ", ".join(
        f"{kind} {_mib(v['bytes'])} in {v['count']} copies"
        + (f" at {v['gbps']:.1f} GB/s" if v["gbps"] else "")
        for kind, v in sorted(m.by_direction.items(), key=lambda kv: -kv[1]["bytes"])
    )
    return Finding(
        analyzer="memcpy",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity=severity,
        title=f"GPU {device} copy-bound: copies with no compute beside them fill {share:.1f}% of the time",
        detail=(
            f"Pinned host/device and peer copies ran {m.copy_ns / 1e6:.2f} ms, {exposed / 1e6:.2f} ms of it with no kernel "
            f"running ({share:.1f}% of the {span / 1e6:.2f} ms span): {moved}."
        ),
        recommendation=(
            "The GPU waits on transfers, not compute. Overlap them: copy the next batch from pinned memory on a "
            "side stream with non_blocking=True while the current one computes (a prefetcher around "
            "DataLoader(pin_memory=True)), and synchronize on an event only where the data is used. Move fewer "
            "bytes: keep tensors on the GPU across steps, send uint8/bf16 and convert on the GPU, read back only "
            "what the host needs. If the bandwidth is well below the link's (PCIe 4 x16 about 25 GB/s, PCIe 5 "
            "about 50 GB/s per direction), check the link width and generation (nvidia-smi -q) and the NUMA "
            "placement of the process."
        ),
        impact_ns=int(exposed),
        evidence={
            "key": "copy_bound",
            "copy_ns": int(m.copy_ns),
            "exposed_ns": int(exposed),
            "share_of_span_pct": round(share, 3),
            "span_ns": int(span),
            "by_direction": m.by_direction,
        },
        windows=m.windows,
    )


def _by_site(sites: np.ndarray, nbytes: np.ndarray, dur: np.ndarray) -> list[dict]:
    if sites.size == 0:
        return []
    labels, inverse = np.unique(sites.astype(str), return_inverse=True)
    counts = np.bincount(inverse, minlength=labels.size)
    total_bytes = np.bincount(inverse, weights=nbytes, minlength=labels.size)
    gpu_ns = np.bincount(inverse, weights=dur, minlength=labels.size)
    order = np.lexsort((-counts, -gpu_ns))[:TOP_CALL_SITES]
    return [
        {
            "call_site": str(labels[i]),
            "count": int(counts[i]),
            "bytes": int(total_bytes[i]),
            "gpu_ns": int(gpu_ns[i]),
        }
        for i in order
    ]


def _span(job: JobData, trace: str, device: int, window: tuple[int, int] | None) -> int:
    """The device's span; with steps, only its part inside [first step start, last step end]
    (setup traffic before the steps, such as model.to(device), does not dilute the share)."""
    busy = device_busy(job, trace, device)
    if busy["start_ns"].size == 0:
        return 0
    start, end = int(busy["start_ns"].min()), int(busy["end_ns"].max())
    if window and min(end, window[1]) > max(start, window[0]):
        start, end = max(start, window[0]), min(end, window[1])
    return end - start


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


SPEC = AnalyzerSpec(
    id="memcpy",
    order=90,
    per_rank=True,
    title="Memory copies",
    description=(
        "Pageable host-to-device copies (bytes, time, GPU time lost against pinned memory), "
        "device-to-host copies inside the step, synchronous copy calls."
    ),
    run=run,
    thresholds=THRESHOLDS,
)
