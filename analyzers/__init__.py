"""Analyzers: one module each, listed here in report order.

Each module exposes ``SPEC`` (:class:`~stallscope.analyzers.base.AnalyzerSpec`).
The modules are imported on the first :func:`all_specs` call, not with this
package, so that ``stallscope.analyzers.base`` (severities, thresholds) stays
cheap to import for commands that run no analyzer (``stallscope ingest``).
"""

from __future__ import annotations

import functools
import importlib

from stallscope.analyzers.base import AnalyzerSpec

REPORT_ORDER = (
    "utilization",
    "gpu_idle",
    "launch_overhead",
    "step_breakdown",
    "inference",
    "overlap",
    "nccl_wait",
    "host_sync",
    "memcpy",
    "hotspots",
    "occupancy",
    "memory",
)


@functools.cache
def registry() -> dict[str, AnalyzerSpec]:
    """Analyzer id -> spec, in report order (imports every analyzer module once)."""
    specs = (importlib.import_module(f"{__name__}.{module}").SPEC for module in REPORT_ORDER)
    return {spec.id: spec for spec in specs}


def all_specs() -> list[AnalyzerSpec]:
    return list(registry().values())
