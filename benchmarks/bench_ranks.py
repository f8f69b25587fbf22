"""How does ``stallscope analyze`` scale with the number of ranks of a job?

    python benchmarks/bench_ranks.py [--ranks 8 16 32 64 128] [--stallscope CMD] [--keep DIR]

For each N, an N-rank job is built from the real 2-rank sample
``sample_traces/kineto/ddp_straggler`` (rank 1 sleeps 50 ms before every
forward, so the other rank waits in the first all-reduce of each step):
rank 1's trace becomes rank 1 of the job (the one straggler) and rank 0's
trace every other rank. Each copy gets its rank and the world size rewritten
(``distributedInfo.rank``/``world_size``, its process-group size and ranks,
and the same in the collectives' arguments) and its own Kineto ``trace_id``,
so its bytes (and so its store trace id) are its own. The job is ingested
into a fresh store (``stallscope ingest``), then analyzed once, as a user
runs it: ``stallscope analyze <job> --format json``, a whole process whose
CPU seconds (user + system, all threads; ``os.wait4``, the child's
``getrusage``) and peak RSS are measured. The fitted exponent is the slope of
log(analysis CPU-s) against log(N) (least squares over the N measured).

Every N also checks that the straggler is still named: every ``nccl_wait``
finding of a waiting rank must name rank 1 as the rank waited for.
``--stallscope`` picks the command (e.g. another checkout's
``.venv/bin/stallscope``), to measure before and after a change;
``--all-ranks`` passes that flag to ``analyze`` (the per-rank analyzers on
every rank, no triage; checkouts that have it). The report's length is
measured with the measured checkout's own renderer (its venv's python): lines
of the text and Markdown reports and the text report's finding entries.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "kineto" / "ddp_straggler"
STRAGGLER = 1


def load_sample() -> dict[int, dict]:
    """The sample's two rank traces, by rank."""
    return {
        rank: json.loads(gzip.decompress((SAMPLE / f"rank{rank}.pt.trace.json.gz").read_bytes()))
        for rank in (0, 1)
    }


def rank_trace(sample: dict[int, dict], rank: int, world: int) -> dict:
    """Rank ``rank`` of a ``world``-rank job: the straggler's trace for rank 1, else rank 0's."""
    trace = copy.deepcopy(sample[STRAGGLER if rank == STRAGGLER else 0])
    ranks = str(list(range(world)))
    info = trace["distributedInfo"]
    info["rank"], info["world_size"] = rank, world
    for pg in info.get("pg_config", []):
        pg["pg_size"], pg["ranks"] = world, list(range(world))
    trace["trace_id"] = f"{rank:08X}{world:08X}" + "0" * 16  # unique bytes per (rank, world)
    for event in trace["traceEvents"]:
        args = event.get("args")
        if args and "Process Group Ranks" in args:
            args["Process Group Ranks"] = ranks
            args["Group size"] = world
    return trace


def build_job(sample: dict[int, dict], world: int, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world):
        path = folder / f"rank{rank}.pt.trace.json.gz"
        data = json.dumps(rank_trace(sample, rank, world)).encode()
        path.write_bytes(gzip.compress(data, compresslevel=1))
        paths.append(path)
    return paths


def straggler_named(report: dict) -> tuple[int, bool]:
    """(nccl_wait findings of waiting ranks, whether every one names the straggler)."""
    waits = [
        f
        for f in report["findings"]
        if f["analyzer"] == "nccl_wait" and "straggler_rank" in f["evidence"]
    ]
    return len(waits), bool(waits) and all(
        f["evidence"]["straggler_rank"] == STRAGGLER for f in waits
    )


LENGTHS = """
import json, re, sys
from stallscope.render import render
report = json.load(open(sys.argv[1]))
text = render(report, "text")
entries = len(re.findall(r"^\\[[A-Z]+\\] ", text, re.M))
print(json.dumps([text.count("\\n"), render(report, "markdown").count("\\n"), entries]))
"""  # run by the measured checkout's python: its own renderer


def report_lengths(cmd: list[str], report_path: Path) -> tuple[int, int, int]:
    """(text lines, Markdown lines, text finding entries) of a JSON report, rendered by the
    checkout that ``cmd`` runs (``<venv>/bin/stallscope`` -> ``<venv>/bin/python``)."""
    python = Path(cmd[0]).parent / "python" if cmd[0].endswith("stallscope") else sys.executable
    out = subprocess.run(
        [str(python), "-c", LENGTHS, str(report_path)], capture_output=True, text=True, check=True
    ).stdout
    text, markdown, entries = json.loads(out)
    return text, markdown, entries


def measure(
    cmd: list[str], world: int, work: Path, sample: dict[int, dict], all_ranks: bool = False
) -> dict:
    folder = work / f"job{world}"
    store = work / f"store{world}"
    if not (store / "jobs").is_dir():  # --keep: a kept store is ingested once
        shutil.rmtree(store, ignore_errors=True)
        build_job(sample, world, folder)
        ingest_wall, ingest_cpu, _, _ = benchlib.run_child(
            [*cmd, "ingest", "--no-analyze", "--store", str(store), str(folder)]
        )
    else:
        ingest_wall = ingest_cpu = float("nan")
    (job_id,) = [p.name for p in (store / "jobs").iterdir() if p.is_dir()]
    out = work / f"report{world}.json"
    wall, cpu, rss, _ = benchlib.run_child(
        [
            *cmd,
            "analyze",
            "--recompute",
            "--store",
            str(store),
            job_id,
            "--format",
            "json",
            "-o",
            str(out),
        ]
        + (["--all-ranks"] if all_ranks else [])
    )
    report = json.loads(out.read_text())
    waits, named = straggler_named(report)
    text_lines, markdown_lines, entries = report_lengths(cmd, out)
    return {
        "ranks": world,
        "ingest_s": ingest_wall,
        "ingest_cpu_s": ingest_cpu,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_mb": rss,
        "findings": len(report["findings"]),
        "waiting_findings": waits,
        "straggler_named": named,
        "text_lines": text_lines,
        "markdown_lines": markdown_lines,
        "entries": entries,
        "detail_ranks": len(report.get("rank_selection", [{}])[0].get("analyzed", []))
        if report.get("rank_selection")
        else world,
    }


def fit_exponent(rows: list[dict]) -> float:
    """Least-squares slope of log(CPU-s) against log(N)."""
    return benchlib.loglog_slope([r["ranks"] for r in rows], [r["cpu_s"] for r in rows])


def print_table(rows: list[dict]) -> None:
    print(
        "| ranks | ingest s | analyze wall s | analyze CPU s | CPU s per rank | peak RSS MB "
        "| findings | text lines | markdown lines | text entries | ranks in detail | straggler named |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['ranks']} | {r['ingest_s']:.1f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
            f"| {r['cpu_s'] / r['ranks']:.3f} | {r['rss_mb']:.0f} | {r['findings']} "
            f"| {r['text_lines']} | {r['markdown_lines']} | {r['entries']} | {r['detail_ranks']} "
            f"| {'yes' if r['straggler_named'] else 'NO'} ({r['waiting_findings']} waiting ranks) |"
        )
    if len(rows) > 1:
        print(f"\nfitted exponent of analysis CPU-s vs ranks: {fit_exponent(rows):.2f}")


def _checkout_of(exe: Path) -> Path:
    """The checkout a venv's ``stallscope`` belongs to (``<checkout>/.venv/bin/stallscope``)."""
    parts = exe.resolve().parents
    return parts[2] if len(parts) > 2 and parts[1].name == ".venv" else REPO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--stallscope", help="command that runs stallscope (default: this venv's)")
    parser.add_argument(
        "--keep", metavar="DIR", help="build jobs and stores here and keep them (reused if there)"
    )
    parser.add_argument(
        "--all-ranks", action="store_true", help="pass --all-ranks to analyze (no triage)"
    )
    args = parser.parse_args()
    cmd = benchlib.stallscope_cmd(args.stallscope)
    checkout = _checkout_of(Path(cmd[0]))
    version = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()
    print(f"machine: {benchlib.machine()}\ncommand: {' '.join(cmd)}\ncheckout: {version}\n")
    sample = load_sample()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_ranks_"))
    rows = []
    try:
        for world in sorted(args.ranks):
            rows.append(measure(cmd, world, work, sample, args.all_ranks))
            r = rows[-1]
            print(
                f"N={world}: analyze {r['cpu_s']:.1f} CPU-s, {r['wall_s']:.1f} s, "
                f"{r['rss_mb']:.0f} MB",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows)
    return 0 if all(r["straggler_named"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
