"""Golden (snapshot) tests of every report format on a trace built in code.

Refresh after an intended change with ``STALLSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``
and review the diff of tests/golden/. Outputs are stable: ids are content hashes, no
timestamps or absolute paths appear in reports, and the inlined plotly.js bundle of the
HTML page is replaced by a placeholder (it changes with the plotly version, not with us).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from stallscope.ingest import ingest_paths
from stallscope.render import FORMATS, render
from stallscope.report import build_report
from tests.ddp_builder import Plan, ddp_job
from tests.kineto_builder import KinetoTrace

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = bool(os.environ.get("STALLSCOPE_UPDATE_GOLDEN"))
SUFFIX = {"text": "txt", "json": "json", "markdown": "md", "html": "html"}
MS = 1_000_000


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from stallscope.store import Store

    tmp = tmp_path_factory.mktemp("golden")
    t = KinetoTrace(rank=0, world_size=1)
    for step in range(4):
        s = step * 20 * MS
        t.step(step + 1, s, 20 * MS)
        t.cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, 8 * MS)
        corr = t.kernel("ampere_sgemm_128x64_tn", s + 8 * MS + 10_000, 10 * MS)
        t.runtime("cudaLaunchKernel", s + 8 * MS, 5_000, corr=corr)
        corr = t.kernel("vectorized_elementwise_kernel", s + 18 * MS + 20_000, 1 * MS)
        t.runtime("cudaLaunchKernel", s + 18 * MS, 5_000, corr=corr)
    path = t.write(tmp / "golden.pt.trace.json")
    store = Store(tmp / "store").ensure()
    (res,) = ingest_paths(store, [str(path)])
    return build_report(store, [store.traces(res.job_id)])


def stable(text: str, fmt: str) -> str:
    if fmt == "html":
        text = re.sub(
            r"<script>/\*\*.*?</script>",
            "<script>/* plotly.js inlined here */</script>",
            text,
            count=1,
            flags=re.S,
        )
    return text


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden(report, fmt):
    text = stable(render(report, fmt), fmt)
    assert "/tmp" not in text and "pytest" not in text
    path = GOLDEN / f"report.{SUFFIX[fmt]}"
    if UPDATE or not path.exists():
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"{path.name} was missing and has been written: review and commit it")
    assert text == path.read_text(), (
        f"{fmt} output changed; if intended: STALLSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py"
    )


def test_html_keeps_plotly_inline(report):
    page = render(report, "html")
    assert len(page) > 1_000_000 and "Plotly" in page  # the bundle itself is in the page
    assert re.search(r"<script[^>]*\bsrc\s*=", page) is None


@pytest.fixture(scope="module")
def ranks_report(tmp_path_factory):
    """A 10-rank DDP job built in code (tests/ddp_builder.py): rank 4 loads data 20 ms longer
    each step, the others wait for it. More than 8 GPUs: metrics as distributions."""
    from stallscope.store import Store

    tmp = tmp_path_factory.mktemp("golden_ranks")
    plans = [Plan(stall_ns=20 * MS if r == 4 else 0) for r in range(10)]
    traces, _ = ddp_job(plans, steps=2)
    paths = [str(t.write(tmp / f"rank{r}.pt.trace.json")) for r, t in enumerate(traces)]
    store = Store(tmp / "store").ensure()
    (res,) = ingest_paths(store, paths)
    return build_report(store, [store.traces(res.job_id)])


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_golden_ranks(ranks_report, fmt):
    """Findings grouped across ranks, metrics as distributions (docs/reports.md)."""
    text = render(ranks_report, fmt)
    assert "/tmp" not in text and "pytest" not in text
    path = GOLDEN / f"report_ranks.{SUFFIX[fmt]}"
    if UPDATE or not path.exists():
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"{path.name} was missing and has been written: review and commit it")
    assert text == path.read_text(), (
        f"{fmt} output changed; if intended: STALLSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py"
    )
