"""Analyzers, pages, input formats and report tables are found in their folders, each declaring
its own place (docs/extending.md): the discovered sets are the expected ones, the declared orders
unique, a broken or ill-declared module an error (never skipped), and no other code file names a
discovered module (there is no central list to forget)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from stallscope import analyzers
from stallscope.analyzers.base import AnalyzerSpec
from stallscope.ingest import registry
from stallscope.ingest.formats import Format
from stallscope.report_tables import declared_tables, table_modules
from stallscope.report_types import CoreTables, Tables

REPO = Path(__file__).resolve().parents[1]

ANALYZERS = [
    "utilization", "gpu_idle", "launch_overhead", "step_breakdown", "inference", "overlap",
    "nccl_wait", "host_sync", "memcpy", "hotspots", "occupancy", "memory",
]  # fmt: skip
PER_RANK = set(ANALYZERS) - {"overlap", "nccl_wait"}
FORMATS = ["nsys-rep", "nsys", "ncu", "memory-snapshot", "kineto"]  # in the order tried
PAGES = ["library", "overview", "timeline", "kernels", "distributed", "inference", "occupancy",
         "memory", "compare", "sql"]  # fmt: skip
EXTRA_TABLES = ["memory_devices", "memory_live_at_peak", "memory_live_at_snapshot"]


def test_analyzers_are_found_in_report_order():
    specs = analyzers.all_specs()
    assert [s.id for s in specs] == ANALYZERS
    assert analyzers.module_names() == sorted(ANALYZERS)
    assert analyzers.per_rank_ids() == PER_RANK
    orders = [s.order for s in specs]
    assert orders == sorted(set(orders)) and min(orders) >= 0


def _fake_module(monkeypatch, package: str, name: str, **attrs) -> None:
    module = types.ModuleType(f"{package}.{name}")
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, f"{package}.{name}", module)


def test_an_ill_declared_analyzer_is_an_error(monkeypatch):
    real = analyzers.module_names()
    monkeypatch.setattr(analyzers, "module_names", lambda: [*real, "broken"])
    _fake_module(monkeypatch, "stallscope.analyzers", "broken")  # no SPEC
    with pytest.raises(RuntimeError, match="broken.py declares no SPEC"):
        analyzers.registry.__wrapped__()
    spec = AnalyzerSpec("broken", "t", "d", run=lambda job, params: None, order=10)
    _fake_module(monkeypatch, "stallscope.analyzers", "broken", SPEC=spec)  # order taken
    with pytest.raises(RuntimeError, match="both declare order 10"):
        analyzers.registry.__wrapped__()
    unset = AnalyzerSpec("broken", "t", "d", run=lambda job, params: None)
    _fake_module(monkeypatch, "stallscope.analyzers", "broken", SPEC=unset)
    with pytest.raises(RuntimeError, match="SPEC.order set"):
        analyzers.registry.__wrapped__()


def test_formats_are_found_in_the_order_they_are_tried():
    assert [f.name for f in registry.FORMATS] == FORMATS
    folders = sorted(p.parent.name for p in (REPO / "ingest").glob("*/__init__.py"))
    assert registry.format_packages() == folders
    priorities = [f.priority for f in registry.FORMATS]
    assert priorities == sorted(set(priorities))
    assert registry.FORMATS[-1].name == "kineto"  # claims any JSON: tried last


def test_an_ill_declared_format_is_an_error(monkeypatch):
    _fake_module(monkeypatch, "stallscope.ingest", "broken")
    with pytest.raises(RuntimeError, match="broken/__init__.py declares no FORMAT"):
        registry._declared("broken")
    twin = Format("twin", "Twin", lambda n, h: False, lambda s, p, c: [], frozenset(), priority=30)
    _fake_module(monkeypatch, "stallscope.ingest", "broken", FORMAT=twin)
    with pytest.raises(RuntimeError, match="share priority 30"):
        registry._discover({**registry.BY_PACKAGE, "broken": registry._declared("broken")})


def test_pages_are_found_in_navigation_order():
    from stallscope.pages import spec

    found = spec.pages()
    assert list(found) == PAGES
    assert spec.page_modules() == sorted(PAGES)
    orders = [s.order for s, _ in found.values()]
    assert orders == sorted(set(orders))
    assert [name for name, (s, _) in found.items() if not s.url_path] == ["library"]


def test_an_ill_declared_page_is_an_error(monkeypatch):
    from stallscope.pages import spec

    real = spec.page_modules()
    monkeypatch.setattr(spec, "page_modules", lambda: [*real, "broken"])
    _fake_module(monkeypatch, "stallscope.pages", "broken", PAGE={"title": "x"}, render=print)
    with pytest.raises(RuntimeError, match="broken.py: PAGE must be a PageSpec"):
        spec.pages.__wrapped__()
    twin = spec.PageSpec("Twin", "twin", order=20)  # the Overview's
    _fake_module(monkeypatch, "stallscope.pages", "broken", PAGE=twin, render=print)
    with pytest.raises(RuntimeError, match="share order 20"):
        spec.pages.__wrapped__()


def test_report_tables_are_the_core_ones_then_the_declared_ones():
    assert [t.name for t in declared_tables()] == EXTRA_TABLES
    assert table_modules() == ["memory"]
    assert Tables.__struct_fields__ == CoreTables.__struct_fields__ + tuple(EXTRA_TABLES)


# Code that may import a discovered module by name besides its own files (benchmarks study
# one module at a time and are not scanned): ncu_metrics reads the ncu format's CSV columns.
KNOWN = {("stallscope/ncu_metrics.py", "stallscope.ingest.ncu")}
CODE = ("analyzers", "pages", "ingest", "stallscope", "tools")


def _own(module: str, rel: str) -> bool:
    """A discovered module's own files: its module (a format: its folder), the analyzer of its
    name and its helpers named after it in stallscope/ (``<name>_*.py``, ``report_tables/``)."""
    kind, leaf = module.split(".")[1], module.rsplit(".", 1)[-1]
    home = {"analyzers": "analyzers/", "pages": "pages/", "ingest": "ingest/"}.get(kind, "")
    return (
        rel in (f"{home}{leaf}.py", f"stallscope/report_tables/{leaf}.py", f"analyzers/{leaf}.py")
        or rel.startswith(f"{home}{leaf}/")
        or (rel.startswith(f"stallscope/{leaf}_") and rel.count("/") == 1)
    )


def _plugin_modules() -> list[str]:
    """The dotted name of each discovered module."""
    from stallscope.pages import spec

    return (
        [f"stallscope.analyzers.{n}" for n in analyzers.module_names()]
        + [f"stallscope.pages.{n}" for n in spec.page_modules()]
        + [f"stallscope.ingest.{n}" for n in registry.format_packages()]
        + [f"stallscope.report_tables.{n}" for n in table_modules()]
    )


def test_no_code_file_imports_a_discovered_module_by_name():
    """Analyzers, pages, formats and report-table modules are reached through discovery only: no
    other code file imports one by name, so adding one edits no list (an analyzer's own
    helpers aside: its report tables, its charts)."""
    files = [p for top in CODE for p in (REPO / top).rglob("*.py")]
    offenders = []
    for module in _plugin_modules():
        package, _, leaf = module.rpartition(".")
        direct = re.compile(rf"^\s*(from|import) {re.escape(module)}\b", re.M)
        names = re.compile(rf"^\s*from {re.escape(package)} import (\([^)]*\)|[^\n]*)", re.M)

        def imports(text: str, leaf: str = leaf, direct=direct, names=names) -> bool:
            found = (re.search(rf"\b{leaf}\b", m.group(1)) for m in names.finditer(text))
            return bool(direct.search(text)) or any(found)

        for path in files:
            rel = path.relative_to(REPO).as_posix()
            if _own(module, rel) or (rel, module) in KNOWN:
                continue
            if imports(path.read_text(encoding="utf-8")):
                offenders.append(f"{rel} imports {module}")
    assert offenders == []
