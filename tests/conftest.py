"""Shared fixtures: a fresh store per test, paths to the corpus and samples."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("STALLSCOPE_CORPUS", REPO.parent / "shared" / "corpus"))
SAMPLES = REPO / "sample_traces"


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
