"""What a dashboard page declares, and how the pages are found (no streamlit here).

Every module of ``pages/`` that assigns ``PAGE = PageSpec(...)`` at its top
level is a page; its ``render()`` draws it. ``pages/main.py`` builds the
navigation from :func:`pages` (in ``order``), ``tools/screenshots.py`` shoots
each page's ``shots`` and ``benchmarks/bench_pages.py`` times each page: a new
page is its module, with no list to edit. Modules without ``PAGE`` (state,
text, gate...) are helpers. Discovery reads the modules' source for the
assignment (so helpers such as ``entry`` are never imported) and imports only
the pages; a page whose ``PAGE`` is not a PageSpec, or two pages of one order
or url path, are an error (tests/test_discovery.py).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from stallscope.discovery import modules_declaring

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Shot:
    """One screenshot of a page (tools/screenshots.py): ``name`` (the file's), and for each URL
    parameter the sample job to open it on, as part of the job's name (the shortest sample job
    name holding it). ``files``: sample files (under sample_traces/) ingested together as one
    job, named ``job`` (the parameter ``job`` then opens it)."""

    name: str
    params: tuple[tuple[str, str], ...] = ()
    files: tuple[str, ...] = ()
    job: str = ""


@dataclass(frozen=True)
class PageSpec:
    """A dashboard page: ``title`` (navigation and tab), ``url_path`` (``""``: the default page,
    at the root), ``order`` (its place in the navigation; unique), ``needs`` (the URL parameters
    naming the data it is opened on, each a job id: ``job``; compare: ``base`` and ``new``; none
    for pages over the whole store) and ``shots`` (the screenshots to take of it; default: one,
    on the default sample job)."""

    title: str
    url_path: str
    order: int
    needs: tuple[str, ...] = ("job",)
    shots: tuple[Shot, ...] = ()


def page_modules() -> list[str]:
    """The modules of ``pages/`` that declare ``PAGE`` (sorted; read, not imported)."""
    return modules_declaring(HERE, "PAGE")


@functools.cache
def pages() -> dict[str, tuple[PageSpec, ModuleType]]:
    """Page name (its module's) -> (spec, module), in navigation order. Raises RuntimeError for a
    ``PAGE`` that is not a PageSpec and for two pages of one order or url path."""
    found: dict[str, tuple[PageSpec, ModuleType]] = {}
    for name in page_modules():
        module = importlib.import_module(f"{__package__}.{name}")
        spec = module.PAGE
        if not isinstance(spec, PageSpec) or not callable(getattr(module, "render", None)):
            raise RuntimeError(f"pages/{name}.py: PAGE must be a PageSpec, beside a render()")
        found[name] = (spec, module)
    for attr in ("order", "url_path"):
        seen: dict[object, str] = {}
        for name, (spec, _) in found.items():
            value = getattr(spec, attr)
            if value in seen:
                raise RuntimeError(f"pages {seen[value]} and {name} share {attr} {value!r}")
            seen[value] = name
    return dict(sorted(found.items(), key=lambda kv: kv[1][0].order))
