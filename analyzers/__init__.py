"""Analyzers: one module each, found in this folder.

Every module here except ``base`` is an analyzer and exposes ``SPEC``
(:class:`~stallscope.analyzers.base.AnalyzerSpec`), which declares its id (the
module's name), its place in the report (``order``) and whether it reads one
rank at a time (``per_rank``). Adding an analyzer is adding its module: there
is no list to edit. A module without a valid ``SPEC`` or with an order another
analyzer has is an error at discovery, not skipped (tests/test_discovery.py).

The modules are imported on the first :func:`all_specs` call, not with this
package, so that ``stallscope.analyzers.base`` (severities, thresholds) stays
cheap to import for commands that run no analyzer (``stallscope ingest``).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from stallscope.analyzers.base import AnalyzerSpec

# Modules of this folder that are not analyzers.
NOT_ANALYZERS = frozenset({"base"})


def module_names() -> list[str]:
    """The analyzer modules of this folder, by name (sorted; no import)."""
    found = (m.name for m in pkgutil.iter_modules(__path__))
    return sorted(n for n in found if n not in NOT_ANALYZERS and not n.startswith("_"))


@functools.cache
def registry() -> dict[str, AnalyzerSpec]:
    """Analyzer id -> spec, in report order (``SPEC.order``; imports every analyzer module once).

    Raises RuntimeError for a module without an ``AnalyzerSpec`` named ``SPEC``, a spec whose
    id is not its module's name or whose order is unset, and two specs of the same order.
    """
    specs = [_spec_of(name) for name in module_names()]
    orders: dict[int, str] = {}
    for spec in specs:
        if spec.order in orders:
            raise RuntimeError(
                f"analyzers {orders[spec.order]} and {spec.id} both declare order {spec.order}"
            )
        orders[spec.order] = spec.id
    return {spec.id: spec for spec in sorted(specs, key=lambda s: s.order)}


def _spec_of(name: str) -> AnalyzerSpec:
    spec = getattr(importlib.import_module(f"{__name__}.{name}"), "SPEC", None)
    if not isinstance(spec, AnalyzerSpec):
        raise RuntimeError(f"analyzers/{name}.py declares no SPEC = AnalyzerSpec(...)")
    if spec.id != name or spec.order < 0:
        raise RuntimeError(
            f"analyzers/{name}.py: SPEC.id must be {name!r} and SPEC.order set "
            f"(got id={spec.id!r}, order={spec.order})"
        )
    return spec


def all_specs() -> list[AnalyzerSpec]:
    return list(registry().values())


def per_rank_ids() -> frozenset[str]:
    """The ids of the analyzers that read one rank at a time (``SPEC.per_rank``)."""
    return frozenset(spec.id for spec in all_specs() if spec.per_rank)
