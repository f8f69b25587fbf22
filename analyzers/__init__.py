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

# Analyzers that read one rank at a time. ``report.analyze_job`` runs each over
# every rank's traces alone (JobData.rank_parts: a connection over that rank's
# Parquet files, so a query costs the same at 8 ranks as at 256) and joins the
# ranks' results with ``SPEC.combine_ranks`` (None: concatenated in rank order).
# Contract, checked by tests/test_rank_parts.py: the joined result equals ``run``
# over the whole job. The others (overlap, nccl_wait: they match collectives
# across ranks) get the whole job and read per-rank data through JobData.part_of.
# An analyzer missing here runs over the whole job: correct, but slower per rank.
PER_RANK = frozenset(
    {
        "utilization",
        "gpu_idle",
        "launch_overhead",
        "step_breakdown",
        "host_sync",
        "memcpy",
        "hotspots",
        "occupancy",
        "inference",
        "memory",
    }
)


@functools.cache
def registry() -> dict[str, AnalyzerSpec]:
    """Analyzer id -> spec, in report order (imports every analyzer module once)."""
    specs = (importlib.import_module(f"{__name__}.{module}").SPEC for module in REPORT_ORDER)
    return {spec.id: spec for spec in specs}


def all_specs() -> list[AnalyzerSpec]:
    return list(registry().values())
