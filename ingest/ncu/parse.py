"""Nsight Compute results -> one :class:`ParsedTrace` (source ``"ncu"``) per file.

Input: a CSV page exported with ``ncu --import R.ncu-rep --csv --page raw``
or ``--page details`` (see :mod:`stallscope.ingest.ncu.csv_pages`), or a binary
``.ncu-rep`` report, which is exported through ``ncu`` when it is on PATH
(else a one-line error gives the export commands).

Output: the ``kernel_metrics`` table (every metric of every profiled kernel,
with its unit, long format), ``names`` (kernel names), ``devices`` (from the
raw page's ``device__attribute_*`` metrics, or the ``CC`` column) and empty
timeline tables. ncu profiles kernels one at a time with serialized replay,
so its trace has no timeline: the job ingester pairs it with the timeline
trace of the same rank and matches kernels (:mod:`stallscope.ingest.ncu.match`).
The rank comes from the file name (``rank3``...) or, later, from that pairing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pyarrow as pa

from stallscope.errors import InputError
from stallscope.ingest.canonical import CanonicalTrace, devices_table
from stallscope.ingest.formats import ParseContext, ParsedTrace, rank_in_name
from stallscope.ingest.ncu import REPORT_MAGIC
from stallscope.ingest.ncu.csv_pages import NcuCsv, read_ncu_csv
from stallscope.ingest.reader import Source
from stallscope.schema import arrow_schema

_EXPORT_TIMEOUT_S = 600
# device__attribute_* metric -> Kineto deviceProperties key (canonical.DEVICE_KEYS)
_DEVICE_ATTRIBUTES = {
    "display_name": "name", "compute_capability_major": "computeMajor",
    "compute_capability_minor": "computeMinor", "multiprocessor_count": "numSms",
    "max_registers_per_multiprocessor": "regsPerMultiprocessor",
    "max_registers_per_block": "regsPerBlock",
    "max_shared_memory_per_multiprocessor": "sharedMemPerMultiprocessor",
    "max_shared_memory_per_block": "sharedMemPerBlock",
    "max_shared_memory_per_block_optin": "sharedMemPerBlockOptin",
    "max_threads_per_multiprocessor": "maxThreadsPerMultiprocessor",
    "max_threads_per_block": "maxThreadsPerBlock",
    "max_blocks_per_multiprocessor": "maxBlocksPerMultiprocessor",
    "warp_size": "warpSize", "total_memory": "totalGlobalMem",
}  # fmt: skip
# Empty timeline tables: an ncu result has no timeline.


def parse_ncu(source: Source, data: bytes, ctx: ParseContext) -> list[ParsedTrace]:
    name = source.name
    if data.startswith(REPORT_MAGIC) or name.lower().endswith(".ncu-rep"):
        pages = [read_ncu_csv(f"{name} (--page {p})", csv) for p, csv in _export(name, data)]
        label = "Nsight Compute report"
    else:
        pages = [read_ncu_csv(name, data)]
        label = f"ncu {pages[0].page} page"
    trace_id = ctx.trace_id("")
    canonical = _canonical(trace_id, pages)
    return [
        ParsedTrace(
            key="",
            canonical=canonical,
            source="ncu",
            source_version=None,
            rank=rank_in_name(name),
            label=label,
            warnings=_warnings(pages),
        )
    ]


def _canonical(trace_id: str, pages: list[NcuCsv]) -> CanonicalTrace:
    kernels = {}
    for page in pages:
        for index, kernel in page.kernels.items():
            kernels.setdefault(index, kernel)
    names = sorted({k.name for k in kernels.values()})
    name_ids = {n: i for i, n in enumerate(names)}
    columns: dict[str, list] = {f.name: [] for f in arrow_schema("kernel_metrics")}
    for page in pages:
        count = len(page.metric)
        columns["kernel_index"] += page.kernel
        for col in ("section", "metric", "value", "value_text", "unit"):
            columns[col] += getattr(page, col)
        for index in page.kernel:
            k = kernels[index]
            columns["name_id"].append(name_ids[k.name])
            columns["pid"].append(k.pid)
            columns["device"].append(k.device)
            columns["stream"].append(k.stream)
            for kind, dims in (("grid", k.grid), ("block", k.block)):
                for axis, value in zip("xyz", dims or (None, None, None), strict=True):
                    columns[f"{kind}_{axis}"].append(value)
        columns["trace_id"] += [trace_id] * count
    for col in ("timeline_trace_id", "timeline_name_id", "timeline_correlation",
                "timeline_start_ns", "timeline_end_ns"):  # fmt: skip
        columns[col] = [None] * len(columns["trace_id"])
    metrics = pa.Table.from_pydict(columns, schema=arrow_schema("kernel_metrics"))
    return CanonicalTrace(
        names=pa.table(
            {
                "trace_id": [trace_id] * len(names),
                "name_id": pa.array(range(len(names)), pa.int32()),
                "name": names,
            }  # fmt: skip
        ),
        devices=devices_table(trace_id, _device_properties(pages, kernels)),
        kernel_metrics=metrics,
        event_count=len(kernels),
    )


def _device_properties(pages: list[NcuCsv], kernels) -> list[dict]:
    """Kineto-style deviceProperties per device: raw-page attributes, else the CC column."""
    props: dict[int, dict] = {}
    for kernel in kernels.values():
        device = kernel.device if kernel.device is not None else 0
        entry = props.setdefault(device, {"id": device})
        if kernel.cc and "." in kernel.cc and "computeMajor" not in entry:
            major, minor = kernel.cc.split(".", 1)
            if major.isdigit() and minor.isdigit():
                entry.update(computeMajor=int(major), computeMinor=int(minor))
    prefix = "device__attribute_"
    for page in pages:
        for index, section, metric, value, text in zip(
            page.kernel, page.section, page.metric, page.value, page.value_text, strict=True
        ):
            key = (
                _DEVICE_ATTRIBUTES.get(metric[len(prefix) :]) if metric.startswith(prefix) else None
            )
            if section == "Launch Statistics" and metric == "# SMs":  # details page
                key = "numSms"
            if key:
                device = kernels[index].device if kernels[index].device is not None else 0
                props[device][key] = text if key == "name" else value
    return [props[d] for d in sorted(props)]


def _warnings(pages: list[NcuCsv]) -> list[str]:
    """Kernels whose duration has no number (ncu writes ``nan``/``n/a`` when replay failed)."""
    timed, measured = False, set()
    for page in pages:
        for k, metric, v in zip(page.kernel, page.metric, page.value, strict=True):
            if metric in ("gpu__time_duration.sum", "Duration"):
                timed = True
                if v is not None:
                    measured.add(k)
    failed = sorted({k for page in pages for k in page.kernels} - measured)
    if not timed or not failed:
        return []
    shown = ", ".join(str(k) for k in failed[:10]) + (" ..." if len(failed) > 10 else "")
    return [
        f"{len(failed)} profiled kernel(s) have no measured values (profiling failed?): ID {shown}"
    ]


def _export(name: str, data: bytes) -> list[tuple[str, bytes]]:
    """The raw and details pages of a binary report, through ``ncu --import``."""
    path = name if os.path.isfile(name) else os.path.basename(name.rsplit(":", 1)[-1])
    stem = re.sub(r"\.ncu-rep$", "", path, flags=re.IGNORECASE)
    exe = shutil.which("ncu")
    if exe is None:
        commands = " and ".join(
            f"ncu --import {shlex.quote(path)} --csv --page {p} > {shlex.quote(f'{stem}.{p}.csv')}"
            for p in ("raw", "details")
        )
        raise InputError(
            name,
            f"Nsight Compute report and no ncu on PATH: export it with {commands}, "
            "then ingest the CSV files",
        )
    pages = []
    with tempfile.TemporaryDirectory(prefix="stallscope-ncu-") as tmp:
        report = os.path.join(tmp, "report.ncu-rep")
        with open(report, "wb") as fh:
            fh.write(data)
        for page in ("raw", "details"):
            try:
                done = subprocess.run(
                    [exe, "--import", report, "--csv", "--page", page],
                    capture_output=True,
                    timeout=_EXPORT_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise InputError(name, f"ncu could not export the report ({exc})") from None
            if done.returncode != 0:
                reason = (done.stderr or done.stdout).decode(errors="replace").strip()
                reason = reason.splitlines()[0] if reason else f"exit status {done.returncode}"
                raise InputError(name, f"ncu could not read the report: {reason}")
            pages.append((page, done.stdout))
    return pages
