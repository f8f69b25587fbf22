"""stallscope compare: step-time verdict with noise, time by cause, kernel deltas, exit codes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stallscope.compare import decide, step_statistics
from tests.conftest import SAMPLES
from tests.kineto_builder import KinetoTrace
from tests.test_nccl_wait import ALLREDUCE, meta

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


# -- where the step time goes: the rows that explain a change ----------------------


def write_job(folder, traces: list[KinetoTrace]):
    folder.mkdir()
    for t in traces:
        t.write(folder / f"rank{t.rank}.pt.trace.json")
    return folder


def part(result, category: str) -> dict:
    return next(p for p in result["attribution"]["parts"] if p["category"] == category)


@pytest.mark.parametrize(
    "base, new",
    [
        (SAMPLES / "kineto" / "ddp_overlap", SAMPLES / "kineto" / "ddp_no_overlap"),
        (
            SAMPLES / "nsys" / "ddp_overlap.sqlite.gz",
            SAMPLES / "nsys" / "ddp_no_overlap.sqlite.gz",
        ),
    ],
    ids=["kineto", "nsys"],
)
def test_samples_lost_overlap_is_the_reason(cli, base, new):
    """One flat all-reduce after backward instead of DDP's overlapped buckets: the communication
    kernels get shorter (they no longer share the GPU), yet they now run with nothing beside them."""
    rc, result = run_json(cli, base, new)
    comm = result["communication"]
    assert comm["overlap_pct"]["base"] > 75 and comm["overlap_pct"]["new"] < 1
    assert comm["exposed"]["delta_ms"] > 1.5  # summed over the 2 GPUs, per step
    moved = sorted(result["attribution"]["parts"], key=lambda p: -abs(p["delta_ms"]))
    assert moved[0]["category"] == "exposed_comm" and 1.0 < moved[0]["delta_ms"] < 1.6
    why = result["explanation"]
    assert "exposed communication +1." in why and "(overlap 8" in why and "% -> 0%)" in why
    # the GPU step scope the parts split is the step time the verdict measures
    att = result["attribution"]
    assert sum(p["new_ms"] for p in att["parts"]) == pytest.approx(att["scope"]["new_ms"], abs=0.01)
    assert abs(att["outside_scope"]["new_ms"]) < 0.05
    assert "Why: " in cli("compare", str(base), str(new)).stdout


def test_nsys_sample_attribution_beyond_noise_within_threshold(cli):
    nsys = SAMPLES / "nsys"
    rc, result = run_json(cli, nsys / "ddp_overlap.sqlite.gz", nsys / "ddp_no_overlap.sqlite.gz")
    assert (rc, result["verdict"]) == (0, "no significant change")  # +2.6 %: under 5 %
    # beyond the noise, so the change is attributed: mostly exposed communication, partly
    # offset by faster compute (the GEMMs no longer share the GPU with NCCL)
    assert result["explanation"].startswith("slower: +0.29")
    assert "mostly exposed communication" in result["explanation"]
    assert "partly offset by compute -0." in result["explanation"]


def copy_job(pageable: bool) -> list[KinetoTrace]:
    """4 steps. Each: a 9 ms kernel, then a 1 MB host-to-device copy with nothing beside it,
    pinned (1 ms, 10 ms steps) or pageable (3 ms, 12 ms steps)."""
    t = KinetoTrace(rank=0, world_size=1)
    copy_ms = 3 if pageable else 1
    step = (9 + copy_ms) * MS
    for k in range(4):
        start = k * step
        t.step(k, start, step)
        t.kernel("gemm", start, 9 * MS)
        src = "Pageable" if pageable else "Pinned"
        t.memcpy("HtoD", src, "Device", start + 9 * MS, copy_ms * MS, 1 << 20)
    return [t]


def test_a_copy_that_grows_is_the_reason(cli, tmp_path):
    base = write_job(tmp_path / "base", copy_job(pageable=False))
    new = write_job(tmp_path / "new", copy_job(pageable=True))
    rc, result = run_json(cli, base, new)
    assert rc == 1 and result["step_time"]["delta_ms"] == 2.0
    assert part(result, "exposed_copies")["delta_ms"] == pytest.approx(2.0, abs=1e-6)
    assert part(result, "compute")["delta_ms"] == pytest.approx(0.0, abs=1e-6)
    copies = {(r["kind"], r["memory"]): r for r in result["copies"]}
    pageable, pinned = copies[("HtoD", "pageable")], copies[("HtoD", "pinned")]
    assert (pageable["base_ms"], pageable["new_ms"], pageable["new_count"]) == (0.0, 3.0, 4)
    assert (pinned["base_ms"], pinned["new_ms"], pinned["base_mb"]) == (1.0, 0.0, 1.048576)
    assert result["explanation"] == (
        "slower: +2.000 ms/step (+20.0%); per GPU, mostly exposed copies +2.000 ms/step "
        "(largest change: HtoD pageable +3.000 ms/step on all GPUs)"
    )


def straggler_pair(late_ms: int) -> list[KinetoTrace]:
    """4 ranks, 4 steps. Each rank: 8 ms compute, then an all-reduce that ends 2 ms after the
    last rank joins. Rank 3's host is ``late_ms`` late ('slow_host_work', its GPU idle), so
    ranks 0-2 wait ``late_ms`` in each all-reduce. Steps last 10 + late_ms ms on every rank."""
    ranks = [KinetoTrace(rank=r, world_size=4) for r in range(4)]
    step = (10 + late_ms) * MS
    for k in range(4):
        start = k * step
        for r, t in enumerate(ranks):
            t.step(k, start, step)
            late = late_ms * MS if r == 3 else 0
            if late:
                t.cpu_op("slow_host_work", start, late)
            t.kernel("gemm", start + late, 8 * MS, device=r)
            arrive = start + 8 * MS + late
            t.kernel(ALLREDUCE, arrive, start + step - arrive, device=r, stream=20,
                     extra=meta(ranks="[0, 1, 2, 3]", seq=k))  # fmt: skip
    return ranks


def test_waiting_for_a_straggler_is_the_reason(cli, tmp_path):
    base = write_job(tmp_path / "base", straggler_pair(0))
    new = write_job(tmp_path / "new", straggler_pair(2))
    rc, result = run_json(cli, base, new)
    assert rc == 1 and result["step_time"]["delta_ms"] == 2.0
    # per GPU and step: ranks 0-2 wait 2 ms each, rank 3 idles 2 ms -> 1.5 and 0.5 on average
    assert part(result, "rank_wait")["delta_ms"] == pytest.approx(1.5, abs=1e-6)
    assert part(result, "exposed_comm")["delta_ms"] == pytest.approx(0.0, abs=1e-6)
    idle = sum(
        p["delta_ms"] for p in result["attribution"]["parts"] if p["category"].startswith("idle_")
    )
    assert idle == pytest.approx(0.5, abs=1e-6)
    waiting = result["communication"]["waiting"]  # nccl_wait_ns, summed over the 4 GPUs
    assert (waiting["base_ms"], waiting["new_ms"]) == (0.0, 6.0)
    assert result["new"]["stragglers"] == [3]
    assert result["explanation"].startswith(
        "slower: +2.000 ms/step (+20.0%); per GPU, mostly waiting for other ranks +1.500 ms/step "
        "(last to arrive: rank 3), idle: "
    )


def unbalanced_job(ms: tuple[float, float]) -> list[KinetoTrace]:
    """2 ranks without collectives, 4 steps; rank r's steps last ``ms[r]``, a kernel filling each."""
    ranks = [KinetoTrace(rank=r, world_size=2) for r in (0, 1)]
    for r, t in enumerate(ranks):
        step = int(ms[r] * MS)
        for k in range(4):
            t.step(k, k * step, step)
            t.kernel("gemm", k * step, step, device=r)
    return ranks


def test_rows_shrink_while_the_step_grows(cli, tmp_path):
    """Rank 0's steps grow 10 -> 11.5 ms, rank 1's shrink 10 -> 8 ms: the step (the slowest
    rank's) is 15 % slower while every per-GPU row shrinks; the explanation says why."""
    base = write_job(tmp_path / "base", unbalanced_job((10, 10)))
    new = write_job(tmp_path / "new", unbalanced_job((11.5, 8)))
    rc, result = run_json(cli, base, new)
    assert rc == 1 and result["step_time"]["delta_ms"] == 1.5
    assert all(p["delta_ms"] <= 0 for p in result["attribution"]["parts"])
    assert all(r["delta_ms"] <= 0 for r in result["causes"])
    assert part(result, "compute")["delta_ms"] == pytest.approx(-0.25, abs=1e-6)
    why = result["explanation"]
    assert why.startswith("slower: +1.500 ms/step (+15.0%), but no per-GPU category grew")
    assert (
        "the step time is the slowest rank's" in why and "rank 0's steps changed +1.500 ms" in why
    )
    assert "the ranks' average -0.250 ms" in why


def test_html_and_markdown_carry_the_new_tables(cli, tmp_path):
    base = write_job(tmp_path / "base", copy_job(pageable=False))
    new = write_job(tmp_path / "new", copy_job(pageable=True))
    html = cli("compare", str(base), str(new), "--format", "html")
    assert html.returncode == 1 and html.stdout.startswith("<!DOCTYPE html>")
    for title in ("Where one GPU&#x27;s step goes", "Communication", "Copies by kind",
                  "Findings: estimated saving"):  # fmt: skip
        assert title in html.stdout
    assert "<script" not in html.stdout and "http" not in html.stdout  # opens offline
    from stallscope.commands.compare import FORMATS as CLI_FORMATS
    from stallscope.compare import FORMATS

    assert CLI_FORMATS == FORMATS
    assert "Why: slower: +2.000 ms/step" in html.stdout
    md = cli("compare", str(base), str(new), "--format", "markdown").stdout
    assert "| HtoD pageable | 0.000 | 3.000 | +3.000 | new |" in md
    assert "### Copies by kind (GPU ms per step, summed over GPUs)" in md


def test_finding_savings_per_step_and_dash_where_not_estimated():
    from stallscope.compare import _savings_table, finding_savings

    def finding(analyzer, severity, saving, rank=0, key=""):
        return {"analyzer": analyzer, "severity": severity, "saving_ns": saving, "rank": rank,
                "device": rank, "title": f"{analyzer} title", "evidence": {"key": key}}  # fmt: skip

    base = [finding("memcpy", "high", 8 * MS, key="pageable_h2d"), finding("overlap", "low", None)]
    new = [
        finding("memcpy", "low", 2 * MS, key="pageable_h2d"),
        finding("utilization", "info", None),
    ]
    rows = finding_savings(base, new, per_a=4, per_b=2, top=10)
    assert [(r["analyzer"], r["base_ms"], r["new_ms"], r["delta_ms"]) for r in rows] == [
        ("memcpy", 2.0, 1.0, -1.0),  # 8 ms over 4 steps -> 2 ms per step; 2 over 2 -> 1
        ("overlap", None, None, None),  # low but not estimated: shown with a dash
    ]  # the info finding without a saving is left out
    (_, _, cells) = _savings_table({"findings": {"savings": rows}}, 60)
    assert cells[0][2:] == ["high", "low", "2.000", "1.000", "-1.000"]
    assert cells[1][2:] == ["low", "-", "—", "—", "-"]


def test_outlier_steps_are_named_when_the_rows_shrink(cli, tmp_path):
    """Base: eight 10 ms steps and two 20 ms ones (median 10, mean 12); new: ten 11 ms steps.
    The median grows 1 ms while the per-step means (the rows) shrink 1 ms."""
    base = steps_trace(tmp_path / "base.json", [10.0] * 8 + [20.0, 20.0])
    new = steps_trace(tmp_path / "new.json", [11.0] * 10)
    out = cli("compare", str(base), str(new), "--noise-k", "0", "--format", "json")
    result = json.loads(out.stdout)
    assert out.returncode == 1 and result["step_time"]["delta_ms"] == 1.0
    assert result["attribution"]["step_mean"]["delta_ms"] == -1.0
    assert part(result, "compute")["delta_ms"] == pytest.approx(-1.0, abs=1e-4)  # compute_pct: 3 dp
    assert result["explanation"] == (
        "slower: +1.000 ms/step (+10.0%), but no per-GPU category grew (they add up to "
        "-1.000 ms/step): the median step changed +1.000 ms but the mean step -1.000 ms, and the "
        "rows are per-step means: a few outlier steps weigh in them"
    )


def _f(analyzer, severity, saving=None, rank=0, key=""):
    return {"analyzer": analyzer, "severity": severity, "saving_ns": saving, "rank": rank,
            "device": rank, "title": f"{analyzer} title", "evidence": {"key": key}}  # fmt: skip


def test_a_finding_on_both_sides_that_rose_is_worse_not_new_only():
    from stallscope.compare import finding_changes, finding_notes

    base = [_f("overlap", "low", rank=0), _f("overlap", "info", rank=1), _f("memcpy", "high")]
    new = [
        _f("overlap", "medium", rank=0),
        _f("overlap", "medium", rank=1),
        _f("memcpy", "low"),  # better: neither list
        _f("gpu_idle", "critical"),  # no match in base
        _f("memcpy", "medium", key="pinned"),  # another key: a finding of its own
    ]
    changes = finding_changes(base, new)
    assert changes["new_only"] == [["gpu_idle", "critical"], ["memcpy", "medium"]]
    assert changes["worse"] == [["overlap", "info", "medium"], ["overlap", "low", "medium"]]
    notes = finding_notes({"findings": {**changes, "savings": []}})
    assert notes == [
        "Findings only in new: gpu_idle (critical), memcpy (medium); "
        "worse in new: overlap (info → medium), overlap (low → medium)"
    ]
    assert finding_changes(new, new) == {"new_only": [], "worse": []}


def test_unprofiled_saving_is_labelled_with_the_profiler_note():
    from stallscope.compare import _savings_table, finding_notes, finding_savings

    base = [_f("launch_overhead", "critical", 4 * MS), _f("step_breakdown", "low", 2 * MS)]
    rows = finding_savings(base, [], per_a=2, per_b=2, top=10)
    result = {"findings": {"new_only": [], "worse": [], "savings": rows}}
    (_, header, cells) = _savings_table(result, 60)
    assert header[4:6] == ["base est. saving ms", "new est. saving ms"]
    by = {c[0].split(":")[0]: c for c in cells}
    assert by["launch_overhead"][4] == "2.000 (unprofiled)"  # 4 ms over 2 steps
    assert by["step_breakdown"][4] == "1.000"  # a profiled-time saving: no label
    (note,) = finding_notes(result)
    assert "(unprofiled)" in note and "include the profiler's own overhead" in note
    no_launch = {"findings": {"new_only": [], "worse": [], "savings": rows[1:]}}
    assert rows[1]["analyzer"] == "step_breakdown" and finding_notes(no_launch) == []


def test_worse_alone_reads_as_a_sentence():
    from stallscope.compare import finding_notes

    result = {"findings": {"new_only": [], "worse": [["overlap", "low", "medium"]], "savings": []}}
    assert finding_notes(result) == ["Findings worse in new: overlap (low → medium)"]
