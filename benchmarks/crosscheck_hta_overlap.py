"""Cross-check ``comm_overlap_pct`` against HTA's ``get_comm_comp_overlap()``.

    python benchmarks/crosscheck_hta_overlap.py [--hta-python /tmp/htavenv2/bin/python] [--markdown]

HTA 0.5.0 lives in its own virtual environment (it pins pandas/plotly versions
of its own), so this script, run with stallscope's Python, calls it in a
subprocess. For every set of traces (one job: the ranks of a capture, or one
rank of a corpus job) it prints, per rank:

* ``ours``      — stallscope's ``comm_overlap_pct`` over the whole trace;
* ``hta_all``   — HTA with ``include_last_profiler_step=True`` (same window);
* ``hta``       — HTA with its defaults, which drop the last ``ProfilerStep``
  and every GPU operation whose launch is not in the kept steps;
* the communication kernels each side recognised (``comm``), since HTA finds
  them by name only (``^nccl``, ``ncclKernel``, and any ``^hip`` kernel).

Sets whose files are missing are skipped. The results are recorded in
docs/analyzers/overlap.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPUS = REPO.parent / "shared" / "corpus"
SAMPLES = REPO / "sample_traces" / "kineto"
SETS = {
    "ddp_overlap (2 ranks)": [SAMPLES / "ddp_overlap" / f"rank{r}.pt.trace.json.gz" for r in (0, 1)],
    "ddp_no_overlap (2 ranks)": [SAMPLES / "ddp_no_overlap" / f"rank{r}.pt.trace.json.gz" for r in (0, 1)],
    "ddp_straggler (2 ranks)": [SAMPLES / "ddp_straggler" / f"rank{r}.pt.trace.json.gz" for r in (0, 1)],
    "param/dlrm_kineto (8 ranks)": sorted((CORPUS / "param" / "dlrm_kineto").glob("*.json.gz")),
    "hta/nccl_parser_config": [CORPUS / "hta/nccl_parser_config/nccl_data.json.gz"],
    "hta/df_index_resolver": [CORPUS / "hta/df_index_resolver/df_index_resolver.json.gz"],
    "hta/negative_queue_length": [CORPUS / "hta/negative_queue_length_values_check/rank0.json.gz"],
    "hta/trace_diff/control": [CORPUS / "hta/trace_diff/control/control.json.gz"],
    "hta/trace_diff/test": [CORPUS / "hta/trace_diff/test/test.json.gz"],
    "hta/trace_filter (2 of 128)": sorted((CORPUS / "hta/trace_filter").glob("sampled_rank-*.json.gz")),
    "tracelens/b200 eager": [CORPUS / "tracelens/traces/b200/eager_trace.json.gz"],
    "tracelens/mi300 resnet": [CORPUS / "tracelens/traces/mi300/resnet_act_checkpoint.json.gz"],
}  # fmt: skip

HTA_SNIPPET = r"""
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
from hta.utils.utils import get_kernel_type
out = {}
for last in (True, False):
    a = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=last)
    df = a.get_comm_comp_overlap(visualize=False)
    out["all" if last else "default"] = {int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}
    if last:
        sym = a.t.symbol_table.get_sym_table()
        out["comm"] = {
            int(r): int(sum(get_kernel_type(sym[n]) == "COMMUNICATION" for n in t.loc[t["stream"].ne(-1), "name"]))
            for r, t in a.t.traces.items()
        }
print("HTA_JSON" + json.dumps(out))
"""


def ours(files: list[Path]) -> dict[int, tuple[float | None, int]]:
    """rank -> (comm_overlap_pct, communication kernels) from stallscope."""
    from stallscope.analyzers import overlap
    from stallscope.ingest import ingest_paths
    from stallscope.jobdata import JobData
    from stallscope.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store").ensure()
        (res,) = ingest_paths(store, [str(f) for f in files])
        job = JobData(store, store.traces(res.job_id))
        result = overlap.run(job, overlap.SPEC.params())
        counts = dict(
            job.sql(
                "SELECT c.rank, count(*) FROM gpu g JOIN catalog c USING (trace_id) "
                "WHERE g.is_comm GROUP BY 1"
            ).fetchall()
        )
        job.close()
    pct = {m.rank: m.value for m in result.metrics if m.name == "comm_overlap_pct"}
    return {int(r): (pct.get(r), int(counts.get(r, 0))) for r in set(pct) | set(counts)}


def hta(files: list[Path], python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copy(f, Path(tmp) / f.name)
        run = subprocess.run(
            [python, "-c", HTA_SNIPPET, tmp], capture_output=True, text=True, timeout=900
        )
    line = next((x for x in run.stdout.splitlines() if x.startswith("HTA_JSON")), None)
    if line is None:
        return {"error": (run.stderr.strip().splitlines() or ["no output"])[-1][:120]}
    return json.loads(line[len("HTA_JSON") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hta-python", default="/tmp/htavenv2/bin/python")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    header = (
        "set",
        "rank",
        "ours %",
        "HTA all steps %",
        "diff pp",
        "HTA default %",
        "comm ours/HTA",
    )
    rows = []
    for name, files in SETS.items():
        if not files or not all(f.is_file() for f in files):
            print(f"skip {name}: files not found", file=sys.stderr)
            continue
        mine, theirs = ours(files), hta(files, args.hta_python)
        for rank in sorted(mine):
            pct, comm = mine[rank]
            if "error" in theirs:
                rows.append((name, rank, _f(pct), f"error: {theirs['error']}", "", "", f"{comm}/-"))
                continue
            h_all = theirs["all"].get(str(rank), theirs["all"].get(rank))
            h_def = theirs["default"].get(str(rank), theirs["default"].get(rank))
            h_comm = theirs["comm"].get(str(rank), theirs["comm"].get(rank))
            diff = "" if pct is None or h_all is None or h_all != h_all else f"{pct - h_all:+.2f}"
            rows.append((name, rank, _f(pct), _f(h_all), diff, _f(h_def), f"{comm}/{h_comm}"))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        for row in [header, *rows]:
            print("  ".join(f"{x!s:>16}" for x in row))


def _f(value) -> str:
    if value is None:
        return "-"
    return "nan" if value != value else f"{value:.2f}"


if __name__ == "__main__":
    main()
