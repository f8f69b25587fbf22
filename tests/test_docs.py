"""Docs stay true to the code: CLI reference, analyzer pages, metric definitions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from stallscope.analyzers import all_specs
from stallscope.ingest import ingest_paths
from stallscope.jobdata import JobData
from stallscope.report import analyze_job
from tests.test_utilization import hand_trace

REPO = Path(__file__).resolve().parents[1]


def test_cli_reference_is_generated_from_help():
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_cli_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def documented_defaults(page: str) -> dict[str, float]:
    """{threshold: default} from a page's threshold table: rows ``| `name` | <number> <unit> | ...``."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (-?[0-9]+(?:\.[0-9]+)?)(?: |\|)", page, re.M)
    return {name: float(value) for name, value in rows}


def test_every_analyzer_has_a_page_with_its_threshold_defaults():
    """Each threshold's documented default equals the code's (3 -> 5 fails), none undocumented."""
    for spec in all_specs():
        page = REPO / "docs" / "analyzers" / f"{spec.id}.md"
        assert page.is_file(), page
        documented = documented_defaults(page.read_text())
        for t in spec.thresholds:
            assert t.name in documented, (spec.id, t.name, "not in the page's threshold table")
            assert documented[t.name] == t.default, (spec.id, t.name, documented[t.name], t.default)


def test_documented_defaults_are_parsed_exactly():
    page = "| `share_pct_low` | 3 % | x |\n| `min_impact_ms` | 0.5 ms | y |\n| `n` | 10 | z |\n"
    assert documented_defaults(page) == {"share_pct_low": 3.0, "min_impact_ms": 0.5, "n": 10.0}
    assert documented_defaults(page.replace("| 3 %", "| 30 %"))["share_pct_low"] == 30.0


def test_every_emitted_metric_is_defined(store, tmp_path):
    (res,) = ingest_paths(store, [str(hand_trace().write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    names = {m.name for m in analyze_job(job).metrics}
    job.close()
    documented = set(
        re.findall(r"^\| `([a-z0-9_]+)` \|", (REPO / "docs" / "metrics.md").read_text(), re.M)
    )
    assert names <= documented, names - documented


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = (
        re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.+?)\n\s*```", readme, re.S)
        .group(1)
        .strip()
    )
    assert command in ci
