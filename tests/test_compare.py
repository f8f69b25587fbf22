"""stallscope compare: step-time verdict with noise, time by cause, kernel deltas, exit codes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stallscope.compare import decide, step_statistics
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace

MS = 1_000_000


def steps_trace(path, step_ms: list[float], *, slow_kernel_ms: float = 1.0):
    """One step per entry; in each a 'main' kernel filling the step but for 1 ms and a 'slow' kernel."""
    t = KinetoTrace(rank=0, world_size=1)
    start = 0
    for i, ms in enumerate(step_ms):
        dur = int(ms * MS)
        t.step(i + 1, start, dur)
        main = dur - MS - int(slow_kernel_ms * MS)
        t.kernel("main", start, main)
        t.kernel("slow", start + main, int(slow_kernel_ms * MS))
        start += dur
    return t.write(path)


def run_json(cli, *args):
    out = cli("compare", *map(str, args), "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


BASE = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.2, 9.8, 10.1, 9.9]


def test_regression_with_known_numbers(cli, tmp_path):
    base = steps_trace(tmp_path / "base.json", BASE)
    new = steps_trace(tmp_path / "new.json", [x + 1.0 for x in BASE], slow_kernel_ms=2.0)
    rc, result = run_json(cli, base, new)
    assert rc == 1 and result["verdict"] == "regression"
    s = result["step_time"]
    assert (s["base_median_ms"], s["new_median_ms"], s["delta_ms"]) == (10.0, 11.0, 1.0)
    assert s["delta_pct"] == 10.0 and s["base_steps"] == s["new_steps"] == 10
    sd = float(np.std(np.array(BASE), ddof=1))
    assert s["pooled_std_ms"] == pytest.approx(sd, abs=1e-6)
    assert s["noise_ms"] == pytest.approx(2 * sd * math.sqrt(2 / 10), abs=1e-6)
    (top, *_) = result["kernels"]  # the slow kernel doubled: +1 ms per step
    assert (top["kernel"], top["base_ms"], top["new_ms"], top["delta_ms"]) == (
        "slow",
        1.0,
        2.0,
        1.0,
    )
    compute = next(r for r in result["causes"] if r["cause"] == "compute")
    assert compute["delta_ms"] == pytest.approx(1.0, abs=1e-3)
    # a looser gate passes the same change, and says why
    assert cli("compare", str(base), str(new), "--max-regression", "15%").returncode == 0


def test_noise_hides_a_change_beyond_the_percentage(cli, tmp_path):
    noisy = [8.0, 12.0, 7.0, 13.0, 10.0, 6.0, 14.0, 10.0]
    base = steps_trace(tmp_path / "base.json", noisy)
    new = steps_trace(tmp_path / "new.json", [x + 0.8 for x in noisy])  # +8 % but sd ~2.8 ms
    rc, result = run_json(cli, base, new)
    assert rc == 0 and result["verdict"] == "no significant change"
    assert "within the noise" in result["reason"]
    # with k = 0 only the percentage counts
    out = cli("compare", str(base), str(new), "--noise-k", "0")
    assert out.returncode == 1 and "REGRESSION" in out.stdout


def test_improvement_and_unchanged(cli, tmp_path):
    base = steps_trace(tmp_path / "base.json", BASE)
    faster = steps_trace(tmp_path / "fast.json", [x - 2.0 for x in BASE], slow_kernel_ms=0.5)
    rc, result = run_json(cli, base, faster)
    assert (rc, result["verdict"]) == (0, "improvement")
    rc, result = run_json(cli, base, base)
    assert (rc, result["verdict"], result["kernels"]) == (0, "no significant change", [])


def test_without_steps_the_gpu_span_is_the_sample(cli, tmp_path):
    a, b = KinetoTrace(), KinetoTrace()
    a.kernel("k", 0, 10 * MS)
    b.kernel("k", 0, 12 * MS)
    rc, result = run_json(cli, a.write(tmp_path / "a.json"), b.write(tmp_path / "b.json"))
    assert rc == 1 and result["base"]["step_source"] == "gpu_span"
    assert result["step_time"]["pooled_std_ms"] is None and result["step_time"]["noise_ms"] == 0
    assert "no noise estimate" in result["reason"]
    assert [w.split(":")[0] for w in result["warnings"]] == [
        "base has no step markers",
        "new has no step markers",
    ]
    text = cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")).stdout
    assert "Warning: base has no step markers" in text


def test_store_ids_and_text_markdown(cli, tmp_path):
    base = steps_trace(tmp_path / "base.json", BASE)
    new = steps_trace(tmp_path / "new.json", [x + 1.0 for x in BASE])
    ids = [json.loads(cli("ingest", str(p), "--json").stdout)[0]["job_id"] for p in (base, new)]
    text = cli("compare", *ids)
    assert text.returncode == 1 and text.stdout.startswith("stallscope compare: REGRESSION")
    md = cli("compare", *ids, "--format", "markdown")
    assert md.stdout.startswith("## stallscope compare: REGRESSION") and "| `main` |" in md.stdout
    assert "### Step time" in md.stdout


def test_usage_and_input_errors(cli, tmp_path):
    base = steps_trace(tmp_path / "base.json", BASE)
    assert cli("compare", str(base)).returncode == 2
    assert cli("compare", str(base), str(base), "--max-regression", "lots").returncode == 2
    assert cli("compare", str(base), "deadbeef0000").returncode == 3


def test_samples_healthy_vs_dataloader_stall(cli):
    k = SAMPLES / "kineto"
    healthy = k / "healthy" / "healthy.pt.trace.json.gz"
    stall = k / "dataloader_stall" / "dataloader_stall.pt.trace.json.gz"
    rc, result = run_json(cli, healthy, stall)
    assert rc == 1 and result["verdict"] == "regression"
    # the planted 30 ms sleep per batch shows up as data-loader idle per step
    loader = next(r for r in result["causes"] if r["cause"] == "dataloader")
    assert 20 < loader["delta_ms"] < 35
    assert ["gpu_idle", "critical"] in result["findings"]["new_only"]
    rc, back = run_json(cli, stall, healthy)
    assert (rc, back["verdict"]) == (0, "improvement")


def test_decide_unit():
    s = step_statistics(np.array([10 * MS] * 3), np.array([10 * MS] * 3), 2.0)
    assert decide(s, 0.05)[0] == "no significant change"
    s = step_statistics(np.array([10 * MS, 10 * MS]), np.array([10.6 * MS, 10.6 * MS]), 2.0)
    assert decide(s, 0.05)[0] == "regression"  # zero variance: any change past 5 % counts


def test_table_percentages_read_well():
    from stallscope.compare import pct_text as _pct

    assert [_pct(v) for v in (None, 5.0, -12.34, 999.0, 193417.3)] == [
        "new", "+5.0%", "-12.3%", "+999.0%", ">+999%"
    ]  # fmt: skip
