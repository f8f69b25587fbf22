"""Run import-linter (``lint-imports``) on the installed ``stallscope`` namespace layout.

The checkout keeps ``ingest/``, ``analyzers/`` and ``pages/`` at the top and
installs them as ``stallscope.ingest`` etc. (pyproject's ``package-dir``); an
editable install maps them with an import hook that import-linter's graph
builder does not follow. So the sources are laid out as installed in a
temporary folder first, and ``lint-imports`` reads the contracts of
pyproject.toml (``[tool.importlinter]``) there. Exit status: lint-imports'.

Usage: python tools/lint_imports.py [lint-imports options]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lay_out(target: Path, repo: Path = REPO) -> None:
    """Copy each package of pyproject's ``package-dir`` to where it installs, under ``target``."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        dest = target.joinpath(*package.split("."))
        shutil.copytree(repo / folder, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip


def lint_imports_command() -> str | None:
    """The lint-imports executable of this interpreter's environment, else on PATH."""
    here = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    return here or shutil.which("lint-imports")


def run_on(tree: Path, argv: list[str] = (), capture: bool = False) -> subprocess.CompletedProcess:
    """lint-imports with pyproject's contracts over a laid-out ``tree`` (see :func:`lay_out`)."""
    lint = lint_imports_command()
    if lint is None:
        raise FileNotFoundError("lint-imports not found: pip install -e '.[test]'")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    )
    command = [lint, str(REPO / "pyproject.toml"), "--no-cache", *argv]
    return subprocess.run(command, cwd=tree, env=env, capture_output=capture, text=True)


def main(argv: list[str]) -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="stallscope-imports-") as tmp:
            lay_out(Path(tmp))
            return run_on(Path(tmp), argv).returncode
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
