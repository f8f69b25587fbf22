"""Architecture rules: import-linter contracts (pyproject.toml) hold and can fail; the wheel
installs no generic module names."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest

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


def _lint_tools():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import lint_imports
    finally:
        sys.path.pop(0)
    return lint_imports


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["name"]: c for c in config["contracts"]}


def test_import_contracts_are_kept():
    """lint-imports (pyproject's [tool.importlinter]) over the installed layout: every contract kept."""
    tools = _lint_tools()
    with tempfile.TemporaryDirectory() as tmp:
        tools.lay_out(Path(tmp))
        out = tools.run_on(Path(tmp), capture=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_import_contracts_fail_on_a_violation(tmp_path):
    """The contracts can fail: a `from streamlit import` in an analyzer, an analyzer importing
    another, and a page reaching into the idle attribution each break one."""
    tools = _lint_tools()
    tools.lay_out(tmp_path)
    analyzers = tmp_path / "stallscope" / "analyzers"
    with open(analyzers / "utilization.py", "a") as fh:
        fh.write("\nfrom streamlit import cache_data  # noqa\n")
    with open(analyzers / "hotspots.py", "a") as fh:
        fh.write("\nfrom stallscope.analyzers.host_sync import blocking_calls  # noqa\n")
    with open(tmp_path / "stallscope" / "pages" / "kernels.py", "a") as fh:
        fh.write("\nfrom stallscope.idle import attribute_idle  # noqa\n")
    out = tools.run_on(tmp_path, capture=True)
    assert out.returncode != 0
    assert "3 broken" in out.stdout, out.stdout
    assert "stallscope.analyzers.utilization" in out.stdout and "streamlit" in out.stdout
    assert "stallscope.analyzers.hotspots -> stallscope.analyzers.host_sync" in out.stdout
    assert "stallscope.pages.kernels -> stallscope.idle" in out.stdout


def test_contracts_cover_every_module():
    """A new core module, page or analyzer is under the rules without anyone listing it: the
    contracts name them by wildcard (``stallscope.*``, ``stallscope.analyzers.*``)."""
    contracts = _contracts()
    streamlit = contracts["Only the dashboard (stallscope.pages) imports streamlit"]
    assert streamlit["source_modules"] == ["stallscope.*"]
    assert streamlit["ignore_imports"] == ["stallscope.pages.** -> streamlit"]
    pages = contracts["Nothing else imports the dashboard's modules (stallscope.pages.*)"]
    assert pages["source_modules"] == ["stallscope.*"]
    independent = contracts["Analyzers never import each other (shared code lives in stallscope.*)"]
    assert independent["modules"] == ["stallscope.analyzers.*"]
    public = contracts["Pages reach the core only through its public modules"]
    assert "stallscope.analyzers.*" in public["forbidden_modules"]


def test_a_core_module_reaching_streamlit_through_a_page_breaks_a_contract(tmp_path):
    """The pages' own streamlit imports are allowed by an ignore: a core module that imports a
    page (and so streamlit) breaks the contract that keeps the rest of stallscope off the pages."""
    tools = _lint_tools()
    tools.lay_out(tmp_path)
    with open(tmp_path / "stallscope" / "humanize.py", "a") as fh:
        fh.write("\nfrom stallscope.pages.text import literal  # noqa\n")
    out = tools.run_on(tmp_path, capture=True)
    assert out.returncode != 0
    assert "stallscope.humanize -> stallscope.pages.text" in out.stdout, out.stdout


def test_every_format_folder_is_packaged_registered_and_independent():
    """ingest/<format>/ folders: installed (pyproject ``packages``), registered (their FORMAT
    in the registry) and under the formats' independence contract."""
    from stallscope.ingest.registry import FORMATS

    folders = {p.parent.name for p in (REPO / "ingest").glob("*/__init__.py")}
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(config["tool"]["setuptools"]["packages"])
    assert {f"stallscope.ingest.{f}" for f in folders} <= packages
    independent = _contracts()["Input formats never import each other"]["modules"]
    assert set(independent) == {f"stallscope.ingest.{f}" for f in folders}
    registered = {f.parse.__module__.rsplit(".", 1)[-1] for f in FORMATS}
    assert registered == folders


@pytest.mark.slow
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
        "stallscope/ingest/kineto/decode.py",
        "stallscope/ingest/nsys/db.py",
        "stallscope/ingest/ncu/parse.py",
        "stallscope/schema.py",
        "stallscope/analyzers/utilization.py",
        "stallscope/pages/main.py",
    ):
        assert module in names
    from stallscope.ingest.registry import format_packages

    for package in format_packages():  # every format folder, whole
        files = {
            p.relative_to(REPO / "ingest").as_posix()
            for p in (REPO / "ingest" / package).glob("*.py")
        }
        assert {f"stallscope/ingest/{f}" for f in files} <= set(names), package
