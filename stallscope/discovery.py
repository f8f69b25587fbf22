"""Which modules of a folder declare a name, read from their source (none is imported).

The dashboard's pages (``PAGE``) and the formats' further table readers
(``TABLE_READER`` in ``ingest/<format>/``) are found this way: deterministic
(modules in name order), cheap (a parse of a few small files) and without
importing the modules that declare nothing (a page's helper, a format's
optional native reader).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType


def modules_declaring(folder: Path, name: str) -> list[str]:
    """The modules of ``folder`` (by name, sorted) that assign ``name`` at their top level."""
    found = sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if not m.ispkg)
    return [m for m in found if _declares(folder / f"{m}.py", name)]


def _declares(path: Path, name: str) -> bool:
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    if not re.search(rf"^{re.escape(name)}\b", text, re.MULTILINE):
        return False  # a top-level assignment starts a line with the name: no parse needed
    tree = ast.parse(text, str(path))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def declared(package: str, folder: Path, name: str) -> list[tuple[str, object, ModuleType]]:
    """(module name, its ``name``, module) for each module of ``package`` (at ``folder``) that
    declares ``name``, in module-name order; imports only those."""
    out = []
    for module_name in modules_declaring(folder, name):
        module = importlib.import_module(f"{package}.{module_name}")
        out.append((module_name, getattr(module, name), module))
    return out
