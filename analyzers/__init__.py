"""Analyzers: one module each, registered here in report order.

Each module exposes ``SPEC`` (:class:`~stallscope.analyzers.base.AnalyzerSpec`).
"""

from __future__ import annotations

from stallscope.analyzers import (
    gpu_idle,
    host_sync,
    hotspots,
    launch_overhead,
    memcpy,
    nccl_wait,
    occupancy,
    overlap,
    step_breakdown,
    utilization,
)
from stallscope.analyzers.base import AnalyzerSpec

REGISTRY: dict[str, AnalyzerSpec] = {
    spec.id: spec
    for spec in (
        utilization.SPEC,
        gpu_idle.SPEC,
        launch_overhead.SPEC,
        step_breakdown.SPEC,
        overlap.SPEC,
        nccl_wait.SPEC,
        host_sync.SPEC,
        memcpy.SPEC,
        hotspots.SPEC,
        occupancy.SPEC,
    )
}


def all_specs() -> list[AnalyzerSpec]:
    return list(REGISTRY.values())
