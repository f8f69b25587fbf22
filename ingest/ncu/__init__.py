"""Nsight Compute results: CSV exports (``--page raw``/``--page details``) and ``.ncu-rep`` reports.

``parse.py`` reads a file into the ``kernel_metrics`` table (a report is
exported with ``ncu`` when it is on PATH), ``csv_pages.py`` reads ncu's CSV
pages, ``match.py`` pairs each profiled kernel with its launch in the timeline
trace of the same rank. An ncu trace is a companion: it describes a timeline's
kernels and is not a rank of its own (docs/schema.md, kernel_metrics).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stallscope.ingest.formats import Format, ParseContext, ParsedTrace, Payload
from stallscope.ingest.ncu.csv_pages import HEADER_START
from stallscope.ingest.reader import Source

REPORT_MAGIC = b"NVR\x00"
_REPORT_HEADERS = (REPORT_MAGIC, b"NVIDIA Nsight Compute")
_LEADING = re.compile(rb"[\xef\xbb\xbf \t\r\n]*")  # what a CSV page may start with


def looks_like_ncu(name: str, head: bytes) -> bool:
    """An Nsight Compute report (by header or ``.ncu-rep``), or a CSV page, maybe after
    ncu's ``==PROF==`` log lines."""
    if head.startswith(_REPORT_HEADERS) or name.lower().endswith(".ncu-rep"):
        return True
    start = _LEADING.match(head).end()  # (an offset: no stripped copy of a whole trace)
    marker = HEADER_START.encode()  # the first cells of every CSV page
    return head.startswith(marker, start) or (
        head.startswith(b"==PROF==", start) and head.find(b"\n" + marker, start) >= 0
    )


def _parse(source: Source, payload: Payload, ctx: ParseContext) -> list[ParsedTrace]:
    from stallscope.ingest.ncu.parse import parse_ncu

    return parse_ncu(source, payload.take(), ctx)


def _pair(metas: list[dict[str, Any]], staging: Path) -> None:
    from stallscope.ingest.ncu.match import pair_ncu_traces

    pair_ncu_traces(metas, staging)


FORMAT = Format(
    name="ncu",
    title="Nsight Compute results",
    detect=looks_like_ncu,
    parse=_parse,
    provides=frozenset(),
    priority=30,
    binary=True,  # tried early: a report's header is binary (CSV pages are told by their header too)
    companion=True,
    finish=_pair,
    extensions=("csv", "ncu-rep"),
)
