"""The CLI as users run it: report contract, formats, exit codes, help."""

from __future__ import annotations

import json
import re

import pytest

from stallscope.analyzers import all_specs
from tests.kineto_builder import KinetoTrace

TRACE_KEYS = {"id", "name", "source", "source_version", "job", "rank", "world_size", "devices", "span_ns",
              "event_count", "kernel_count", "warnings"}  # fmt: skip
METRIC_KEYS = {"trace", "rank", "device", "name", "value", "unit"}
FINDING_KEYS = {"id", "trace", "rank", "device", "analyzer", "severity", "title", "detail", "recommendation",
                "impact_ns", "saving_ns", "evidence", "windows"}  # fmt: skip


@pytest.fixture
def idle_trace(tmp_path):
    """GPU busy 30 of 100 ms, nothing recorded on the host: 70 % idle, cause unknown -> critical."""
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("a", 0, 10_000_000)
    t.kernel("b", 50_000_000, 10_000_000)
    t.kernel("c", 90_000_000, 10_000_000)
    t.step(1, 0, 100_000_000)
    return t.write(tmp_path / "idle.pt.trace.json")


def test_json_report_contract(cli, idle_trace):
    out = cli("analyze", str(idle_trace), "--format", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["schema"] == "stallscope.report/1"
    (trace,) = report["traces"]
    assert set(trace) == TRACE_KEYS and trace["warnings"] == []
    assert (trace["kernel_count"], trace["span_ns"], trace["rank"], trace["source"]) == (
        3,
        100_000_000,
        0,
        "kineto",
    )
    assert all(set(m) == METRIC_KEYS for m in report["metrics"])
    metrics = {(m["device"], m["name"]): m["value"] for m in report["metrics"]}
    assert metrics[(0, "gpu_busy_pct")] == 30.0 and metrics[(0, "gpu_idle_pct")] == 70.0
    assert metrics[(None, "step_time_ms_median")] == 100.0
    assert all(set(f) == FINDING_KEYS for f in report["findings"])
    worst = report["findings"][0]
    assert (worst["severity"], worst["analyzer"], worst["impact_ns"]) == (
        "critical",
        "gpu_idle",
        70_000_000,
    )
    assert worst["evidence"]["cause"] == "unknown"
    assert worst["windows"] == [[10_000_000, 50_000_000], [60_000_000, 90_000_000]]
    assert report["findings"][-1]["severity"] == "info"  # sorted worst first


def test_fail_on_exit_code(cli, idle_trace):
    out = cli("analyze", str(idle_trace), "--fail-on", "HIGH")  # any case
    assert out.returncode == 1
    # stderr says why, in one line, beside the report on stdout
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(
        "stallscope: 1 finding(s) at or above high; worst: [CRITICAL] GPU 0 idle"
    )
    assert line.endswith("(gpu_idle): exit code 1")
    assert cli("analyze", str(idle_trace), "--fail-on", "critical").returncode == 1
    # threshold flags generated from the analyzer's declaration lower the severity to medium
    relaxed = ("--gpu-idle-share-pct-critical", "90", "--gpu-idle-share-pct-high", "80")
    assert cli("analyze", str(idle_trace), "--fail-on", "high", *relaxed).returncode == 0
    assert cli("analyze", str(idle_trace), "--fail-on", "medium", *relaxed).returncode == 1


def test_text_and_markdown_and_output_file(cli, idle_trace, tmp_path):
    text = cli("analyze", str(idle_trace))
    assert "[CRITICAL] GPU 0 idle 70.0% of the time with no host activity" in text.stdout
    md_path = tmp_path / "r.md"
    md = cli("analyze", str(idle_trace), "--format", "markdown", "--output", str(md_path))
    assert md.returncode == 0 and md.stdout == ""
    assert md_path.read_text().startswith("## stallscope report")
    assert "| trace | name | rank | gpu |" in md_path.read_text()


def test_ingest_ls_analyze_by_id_and_rm(cli, idle_trace):
    ingest = cli("ingest", str(idle_trace), "--tag", "nightly", "--json")
    (result,) = json.loads(ingest.stdout)
    listing = json.loads(cli("ls", "--json").stdout)
    assert [m["trace_id"] for m in listing] == result["trace_ids"]
    by_prefix = json.loads(cli("analyze", result["trace_ids"][0][:6], "--format", "json").stdout)
    assert by_prefix["traces"][0]["id"] == result["trace_ids"][0]
    assert (
        json.loads(cli("analyze", result["job_id"], "--format", "json").stdout)["traces"][0]["job"]
        == result["job_id"]
    )
    assert cli("rm", result["job_id"]).returncode == 0
    assert json.loads(cli("ls", "--json").stdout) == []


def test_unknown_id_is_an_input_error(cli):
    out = cli("analyze", "deadbeef0000")
    assert out.returncode == 3
    assert out.stderr.strip().splitlines() == [
        "stallscope: error: no trace or job 'deadbeef0000' in store " + str(cli.store_dir)
    ]


def test_usage_errors_exit_2(cli):
    assert cli().returncode == 2
    assert cli("analyze").returncode == 2
    bad = cli("analyze", "x", "--format", "yaml")
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()  # one line, not the whole usage first
    assert line.startswith("stallscope analyze: error: argument --format: invalid choice: 'yaml'")
    assert line.endswith("(see 'stallscope analyze --help')")


@pytest.mark.parametrize(
    "command", ["", "ingest", "ls", "analyze", "compare", "export", "serve", "rm"]
)
def test_help_everywhere(cli, command):
    out = cli(*([command] if command else []), "--help")
    assert out.returncode == 0 and "usage: stallscope" in out.stdout


def test_every_threshold_has_a_flag(cli):
    help_text = cli("analyze", "--help").stdout
    for spec in all_specs():
        for t in spec.thresholds:
            assert f"--{spec.id}-{t.name}".replace("_", "-") in help_text


def test_progress_is_silent_when_not_a_terminal(cli, idle_trace):
    out = cli("ingest", str(idle_trace))
    assert out.stderr == ""


def test_analyze_a_cpu_only_trace(cli, tmp_path):
    t = KinetoTrace()
    t.cpu_op("aten::mm", 0, 1_000)
    out = cli("analyze", str(t.write(tmp_path / "cpu.json")), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["traces"][0]["kernel_count"] == 0


def _small_trace(path, busy_ms: int):
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("k", 0, busy_ms * 1_000_000)
    t.kernel("k", 90_000_000, 10_000_000)
    return t.write(path)


def test_parallel_analyze_matches_sequential_and_expands_quoted_globs(cli, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    for i in range(3):
        _small_trace(folder / f"r{i}.pt.trace.json", 10 + i)
    pattern = str(folder / "*.pt.trace.json")
    par = cli("analyze", pattern, "--each", "--format", "json", "--jobs", "3")
    assert par.returncode == 0, par.stderr
    seq = cli(
        "analyze", pattern, "--each", "--format", "json", "--jobs", "1", store=tmp_path / "s2"
    )
    assert par.stdout == seq.stdout
    assert len(json.loads(par.stdout)["traces"]) == 3
    assert par.stderr == ""  # no progress when stderr is not a terminal
    missing = cli("analyze", str(folder / "*.nothing"))
    assert missing.returncode == 3 and "no file matches" in missing.stderr


def test_html_report_is_self_contained(cli, idle_trace, tmp_path):
    out = tmp_path / "r.html"
    assert cli("analyze", str(idle_trace), "--format", "html", "-o", str(out)).returncode == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "stallscope-time-by-cause" in page
    assert re.search(r"<script[^>]*\bsrc\s*=", page) is None  # plotly.js is inline: opens offline
    assert re.search(r"<link[^>]*https?://", page) is None
    assert "GPU 0 idle 70.0% of the time with no host activity" in page


def test_sample_folder_with_truth_sidecar_is_one_job(cli):
    from tests.conftest import SAMPLES

    out = cli(
        "analyze",
        str(SAMPLES / "kineto" / "ddp_straggler"),
        "--format",
        "json",
        "--fail-on",
        "high",
    )
    assert out.returncode == 1, out.stderr  # the straggler is a critical finding
    report = json.loads(out.stdout)
    assert sorted(t["rank"] for t in report["traces"]) == [0, 1]
    assert any(f["evidence"].get("straggler_rank") == 1 for f in report["findings"])


def test_a_lone_nsight_compute_csv_analyzes(cli):
    from tests.conftest import SAMPLES

    out = cli("analyze", str(SAMPLES / "ncu" / "occupancy.raw.csv"), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["traces"][0]["source"] == "ncu"
    text = cli("analyze", str(SAMPLES / "ncu" / "occupancy.raw.csv")).stdout
    assert "No GPU timeline: Nsight Compute results only" in text
    assert "No GPU activity" not in text  # its occupancy finding follows: not a contradiction


def test_ingest_warnings_reach_the_report(cli, tmp_path):
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("k", 0, 1000)
    t.step(1, 0, 2000)
    path = tmp_path / "nan.json"
    path.write_text(
        t.render().replace('"est. achieved occupancy %": 25', '"est. achieved occupancy %": NaN')
    )
    report = json.loads(cli("analyze", str(path), "--format", "json").stdout)
    (warning,) = report["traces"][0]["warnings"]
    assert "NaN" in warning
    for fmt, prefix in (("text", "Warning: nan.json: "), ("markdown", "> Warning: nan.json: ")):
        assert prefix + warning in cli("analyze", str(path), "--format", fmt).stdout


def test_commands_other_than_analyze_import_no_analyzer():
    """Start-up: ``stallscope ingest`` must not pay for importing every analyzer."""
    import subprocess
    import sys

    probe = (
        "import sys; from stallscope.cli import build_parser; build_parser(command='ingest');"
        "print(sorted(m for m in sys.modules if m.startswith('stallscope.analyzers.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['stallscope.analyzers.base']"
    full = probe.replace("command='ingest'", "command='analyze'")
    out = subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, check=True)
    assert "'stallscope.analyzers.gpu_idle'" in out.stdout


def test_markdown_escapes_pipes_only_in_tables(cli):
    from tests.conftest import SAMPLES

    text = cli("analyze", str(SAMPLES / "kineto" / "healthy"), "--format", "markdown").stdout
    fixes = [line for line in text.splitlines() if line.startswith("  - Fix:")]
    assert any("regex:'" in line and "|" in line for line in fixes)  # ncu -k with alternatives
    assert not any("\\|" in line for line in text.splitlines() if not line.startswith("|"))


def test_reingest_reports_the_stored_warnings(cli, tmp_path):
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("k", 0, 1000)
    path = tmp_path / "nan.json"
    path.write_text(
        t.render().replace('"est. achieved occupancy %": 25', '"est. achieved occupancy %": NaN')
    )
    first, again = (json.loads(cli("ingest", str(path), "--json").stdout)[0] for _ in range(2))
    assert (first["existed"], again["existed"]) == (False, True)
    assert again["warnings"] == first["warnings"] and "NaN" in first["warnings"][0]
