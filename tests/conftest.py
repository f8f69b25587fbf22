"""Shared fixtures: a fresh store per test, paths to the corpus and samples; the corpus rule.

The corpus (``../shared/corpus``, or ``$STALLSCOPE_CORPUS``) is declared in
tests/corpus_manifest.json (path, size, sha256 of every file the tests read).
Tests that read it are marked ``corpus``. Without the folder they skip, all with
one reason. With ``STALLSCOPE_REQUIRE_CORPUS=1`` (.ci/run sets it when CI has
the folder) a missing folder, or a file missing or changed, stops the run
before any test (exit status 4): the corpus tests cannot vanish silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("STALLSCOPE_CORPUS", REPO.parent / "shared" / "corpus"))
SAMPLES = REPO / "sample_traces"
CORPUS_MANIFEST = Path(__file__).resolve().parent / "corpus_manifest.json"
REQUIRE_CORPUS = os.environ.get("STALLSCOPE_REQUIRE_CORPUS") == "1"
NO_CORPUS = f"trace corpus not found at {CORPUS} (tests/corpus_manifest.json lists it)"


def corpus_problems(root: Path = CORPUS, manifest: Path = CORPUS_MANIFEST) -> list[str]:
    """What differs between ``root`` and the manifest: missing or changed files ([] = none)."""
    if not root.is_dir():
        return [NO_CORPUS]
    problems = []
    for entry in json.loads(manifest.read_text())["files"]:
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"missing: {entry['path']}")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"changed size: {entry['path']}")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"changed content: {entry['path']}")
    return problems


def pytest_sessionstart(session):
    if REQUIRE_CORPUS and (problems := corpus_problems()):
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise pytest.UsageError(
            f"STALLSCOPE_REQUIRE_CORPUS=1 but the corpus does not match: {shown}"
        )


def pytest_collection_modifyitems(config, items):
    if CORPUS.is_dir():
        return
    skip = pytest.mark.skip(reason=NO_CORPUS)
    for item in items:
        if item.get_closest_marker("corpus"):
            item.add_marker(skip)


_MAIN = sys.modules.get("__main__")


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Restore ``sys.modules["__main__"]`` after each test: Streamlit's AppTest runs a page
    as ``__main__`` from a temporary file and leaves it there, and a spawned process pool
    (stallscope.report.process_pool) re-runs ``__main__``'s file in every child, which then
    fails (``NameError: __args``) and breaks the pool of a later test."""
    yield
    if _MAIN is not None and sys.modules.get("__main__") is not _MAIN:
        sys.modules["__main__"] = _MAIN


@pytest.fixture
def store(tmp_path):
    from stallscope.store import Store

    return Store(tmp_path / "store").ensure()


@pytest.fixture
def cli(tmp_path):
    """Run the real console command in a subprocess; returns CompletedProcess."""
    import subprocess

    store_dir = tmp_path / "store"

    def run(*args: str, store: Path | None = None, env: dict | None = None, **kw):
        full_env = dict(os.environ, STALLSCOPE_STORE=str(store or store_dir), **(env or {}))
        return subprocess.run(
            [sys.executable, "-m", "stallscope.cli", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=kw.pop("timeout", 300),
            **kw,
        )

    run.store_dir = store_dir
    return run
