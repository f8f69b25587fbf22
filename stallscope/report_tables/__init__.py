"""Report tables declared outside ``stallscope/report_types.py``: one module per analyzer
that adds tables, found here.

Each module of this package declares ``ORDER`` (its tables' place after the core tables of
:class:`~stallscope.report_types.CoreTables` and those of lower ORDER; unique) and
``TABLES``, a tuple of :class:`ReportTable` (name, row type, description); its row types
derive from :class:`Row`. :data:`stallscope.report_types.Tables` gains a field per declared
table, so a new analyzer's tables are one new module here and no edit to the report's types.
A module without both, or two of one ORDER or table name, is an error (tests/test_discovery.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["ReportTable", "Row", "declared_tables", "table_modules"]


class Row(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where a table row is of: the trace (id), its rank, and the device (null: the trace
    as a whole, or Nsight Compute kernels without a device)."""

    trace: Annotated[str, Meta(description="trace id")]
    rank: int
    device: int | None


@dataclass(frozen=True)
class ReportTable:
    """One typed table of the report: its key in ``tables``, its row type, what it holds."""

    name: str
    row: type[Row]
    description: str


def table_modules() -> list[str]:
    """The modules of this package, by name (sorted; no import)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def declared_tables() -> list[ReportTable]:
    """Every module's ``TABLES``, the modules in ``ORDER``. Raises RuntimeError for a module
    without an int ``ORDER`` and a tuple of ReportTable ``TABLES``, and for a repeated ORDER or
    table name."""
    modules = [importlib.import_module(f"{__name__}.{name}") for name in table_modules()]
    for module in modules:
        tables = getattr(module, "TABLES", None)
        if not isinstance(getattr(module, "ORDER", None), int) or not (
            isinstance(tables, tuple) and all(isinstance(t, ReportTable) for t in tables)
        ):
            raise RuntimeError(
                f"{module.__name__}: declare ORDER (int) and TABLES (ReportTable, ...)"
            )
    orders = [m.ORDER for m in modules]
    if len(set(orders)) != len(orders):
        raise RuntimeError(f"report table modules share an ORDER: {orders}")
    found = [t for m in sorted(modules, key=lambda m: m.ORDER) for t in m.TABLES]
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"report tables declared twice: {names}")
    return found
