"""Reports of many ranks stay short: findings grouped across ranks, metrics as distributions,
the per-rank analyzers on the ranks triage picks; the straggler is still named.

The jobs are the real 2-rank ``ddp_straggler`` sample grown to N ranks as
``benchmarks/bench_ranks.py`` grows it (rank 1, the straggler, sleeps before every forward;
every other rank is a copy of rank 0).
"""

from __future__ import annotations

import pytest

from stallscope.finding_groups import grouped_findings
from stallscope.ingest import ingest_paths
from stallscope.rank_triage import DETAIL_ALL_UP_TO
from stallscope.render import render
from stallscope.report import build_report
from tests.test_rank_parts import replicated

LARGE = 80  # above DETAIL_ALL_UP_TO: triaged


def report_of(store, world: int, folder) -> dict:
    (res,) = ingest_paths(store, replicated(world, folder))
    return build_report(store, [store.traces(res.job_id)])


@pytest.mark.slow
def test_text_report_length_does_not_grow_with_the_ranks(store, tmp_path):
    assert LARGE > DETAIL_ALL_UP_TO
    small, large = report_of(store, 8, tmp_path / "j8"), report_of(store, LARGE, tmp_path / "jl")
    small_text, large_text = render(small, "text"), render(large, "text")
    # per-rank lines would be 3 per finding and one table row per rank: hundreds here
    assert len(large["findings"]) > 2 * LARGE
    assert large_text.count("\n") <= small_text.count("\n") + 12 < 90
    lines = large_text.splitlines()
    assert lines[0].startswith(
        f"stallscope report ({LARGE} traces, {len(large['findings'])} findings in "
    )
    # the straggler: its own idle finding, and one entry for the ranks waiting for it
    (waiting,) = [line for line in lines if "in collectives waiting for rank 1" in line]
    assert waiting.startswith("[CRITICAL] Rank 0 sat")  # all ranks wait alike: the lowest leads
    spread = f"    Same finding on {LARGE - 1} ranks (0, 2-{LARGE - 1}): ms lost per rank min"
    assert any(line.startswith(spread) for line in lines)
    assert any(
        line.startswith("[CRITICAL] GPU 1 idle") and "rank 1 gpu 1" in line for line in lines
    )
    # metrics as distributions: one row per metric, the straggler at the low end of busy %
    busy = next(line for line in lines if line.startswith("busy %"))
    assert "rank 1" in busy
    # triage: rank 1 is out of line, analyzed in detail with two median ranks
    (selection,) = large["rank_selection"]
    reasons = {a["rank"]: a["why"] for a in selection["analyzed"]}
    assert reasons[1].startswith("out of line") and len(reasons) == 3
    assert any(line.startswith("  rank 1: out of line") for line in lines)
    assert render(large, "markdown").count("\n") <= render(small, "markdown").count("\n") + 12
    html = render(large, "html")  # lines: the inlined plotly.js has its own; count table rows
    entries = len(grouped_findings(large["findings"]))
    assert html.count('<td class="sev ') == entries == len(grouped_findings(small["findings"]))
    assert html.count("<tr>") <= entries + 10  # findings, their header, the metrics' 8 rows
    assert f"Same finding on {LARGE - 1} ranks (0, 2-{LARGE - 1})" in html
    assert html.rstrip().endswith("</html>") and "Ranks analyzed in detail" in html
    # JSON keeps every rank's findings
    waits = [f for f in large["findings"] if "straggler_rank" in f["evidence"]]
    assert sorted(f["rank"] for f in waits) == [0, *range(2, LARGE)]
