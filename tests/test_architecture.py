"""Architecture rules: the core never imports streamlit; installs no generic module names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = [
    "stallscope.store", "stallscope.report", "stallscope.render", "stallscope.cli", "stallscope.jobdata",
    "stallscope.ingest", "stallscope.analyzers", "stallscope.commands.analyze", "stallscope.commands.ingest",
    "stallscope.commands.serve",
]  # fmt: skip


def test_core_never_imports_streamlit():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in CORE)
        + "print('streamlit' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_core_file_mentions_streamlit():
    for folder in ("stallscope", "ingest", "analyzers"):
        for path in (REPO / folder).rglob("*.py"):
            assert "import streamlit" not in path.read_text(), path


def test_wheel_installs_only_the_stallscope_namespace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("stallscope-*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"stallscope"}
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "stallscope/ingest/job.py",
        "stallscope/analyzers/utilization.py",
        "stallscope/pages/main.py",
    ):
        assert module in names
