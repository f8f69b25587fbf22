"""Ingest Kineto traces with the code of another git ref and with this checkout; diff the tables.

    python tools/check_same_ingest.py                  # base: merge-base with main
    python tools/check_same_ingest.py --base HEAD~3 FILE...

The default inputs are every Kineto file of ``../shared/corpus`` (every
``.json``/``.json.gz`` there; files that are not Kineto fail the same way on
both sides), every ``sample_traces/kineto`` trace and the awkward hand-made
traces of ``benchmarks/snapshot_outputs.py edge`` (NaN, control characters,
bare arrays, malformed entries, string and overflowing numbers, ...).

The base ref's files are taken with ``git archive`` into a temporary folder
and imported from there (``PYTHONPATH``), so both sides run in this
checkout's virtual environment with the same libraries. Each side ingests
every file alone (``benchmarks/snapshot_outputs.py snap``); then ``compare
--strict-order`` checks that every Parquet table has the same schema and the
same rows with the same values *in the same order*, and that every
``meta.json`` (warnings, counts, ids) is the same. Exit 0 when all are, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
SNAPSHOT = ROOT / "benchmarks" / "snapshot_outputs.py"


def default_inputs(edge_dir: Path) -> list[str]:
    """Corpus Kineto candidates, the Kineto samples and the edge traces, sorted."""
    files: list[Path] = []
    if CORPUS.is_dir():
        files += [p for p in CORPUS.rglob("*") if p.name.endswith((".json", ".json.gz"))]
        files = [p for p in files if p.name != "manifest.json"]
    files += (ROOT / "sample_traces" / "kineto").rglob("*.pt.trace.json.gz")
    subprocess.run([sys.executable, str(SNAPSHOT), "edge", str(edge_dir)], check=True)
    files += edge_dir.iterdir()
    return sorted(str(p) for p in files)


def merge_base() -> str:
    """The commit this branch left main at: main moves on while a branch is worked on."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "main", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()[:12]


def base_tree(ref: str, into: Path) -> Path:
    """The ref's files, importable as ``stallscope`` from ``into`` (its package layout rebuilt)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref],
        check=True,
        capture_output=True,
    ).stdout
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive_path = into / "base.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(tree, filter="data")
    # pyproject maps stallscope.ingest -> ingest/, stallscope.analyzers -> analyzers/, ...
    package = into / "path" / "stallscope"
    package.mkdir(parents=True)
    for entry in (tree / "stallscope").iterdir():
        (package / entry.name).symlink_to(entry)
    for sub in ("ingest", "analyzers", "pages"):
        (package / sub).symlink_to(tree / sub)
    return into / "path"


def snap(out: Path, files: list[str], pythonpath: Path | None) -> None:
    env = dict(os.environ, STALLSCOPE_DECODE_WORKERS="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    check = "import stallscope, sys; print(stallscope.__file__, file=sys.stderr)"
    # Run from the output's folder: ``python -c`` puts the current folder first on
    # sys.path, and this checkout's own stallscope/ must not shadow the base's.
    cwd = out.parent
    subprocess.run([sys.executable, "-c", check], env=env, check=True, cwd=cwd)
    subprocess.run(
        [sys.executable, str(SNAPSHOT), "snap", str(out), *files],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=cwd,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base",
        default=None,
        help="git ref of the old code (default: where this branch left main, git merge-base)",
    )
    parser.add_argument(
        "--new", default=None, help="git ref of the new code (default: this working tree)"
    )
    parser.add_argument("files", nargs="*", help="traces (default: see the module docstring)")
    args = parser.parse_args()
    args.base = args.base or merge_base()
    with tempfile.TemporaryDirectory(prefix="same-ingest-") as tmp:
        work = Path(tmp)
        files = args.files or default_inputs(work / "edge")
        new = args.new or "this working tree"
        print(f"{len(files)} inputs; {args.base} against {new}", file=sys.stderr)
        snap(work / "old", files, base_tree(args.base, work / "base"))
        new_path = None if args.new is None else base_tree(args.new, work / "head")
        snap(work / "new", files, new_path)
        result = subprocess.run(
            [
                sys.executable,
                str(SNAPSHOT),
                "compare",
                "--strict-order",
                str(work / "old"),
                str(work / "new"),
            ]  # fmt: skip
        )
        return result.returncode


if __name__ == "__main__":
    sys.exit(main())
