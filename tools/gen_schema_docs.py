"""Write the column tables of docs/schema.md from the declared schema (stallscope/schema.py).

Usage: python tools/gen_schema_docs.py [--check]

Each canonical table's section in docs/schema.md holds its column table
between ``<!-- columns: NAME -->`` and ``<!-- /columns -->``, and the catalog
section its field table between ``<!-- catalog -->`` and ``<!-- /catalog -->``
(``stallscope.schema.CATALOG``); this tool rewrites what is between them (the
prose around them is kept), and adds nothing else. No catalog block is an error. A table of the schema without such a block or without its
section (``## NAME — TITLE``), or a block naming no table, is an error. ``--check`` (tests/test_schema.py) exits 1 when
the file is not what it would write.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "schema.md"
BLOCK = re.compile(r"(<!-- columns: (\w+) -->\n)(.*?)(<!-- /columns -->)", re.DOTALL)
CATALOG_BLOCK = re.compile(r"(<!-- catalog -->\n)(.*?)(<!-- /catalog -->)", re.DOTALL)


def render(text: str) -> str:
    """``text`` (docs/schema.md) with every column block regenerated."""
    from stallscope.schema import TABLE_NAMES, TABLES, markdown_catalog, markdown_columns

    found = [m.group(2) for m in BLOCK.finditer(text)]
    unknown = sorted(set(found) - set(TABLE_NAMES))
    missing = [name for name in TABLE_NAMES if name not in found]
    if unknown or missing:
        raise SystemExit(
            f"docs/schema.md: column blocks for unknown tables {unknown}, none for {missing}"
        )
    headings = [
        f"## {t.name} — {t.title}\n" for t in TABLES if f"## {t.name} — {t.title}\n" not in text
    ]
    if headings:
        raise SystemExit(f"docs/schema.md: no section headed {headings} (the schema's titles)")
    if len(CATALOG_BLOCK.findall(text)) != 1:
        raise SystemExit("docs/schema.md: needs exactly one <!-- catalog --> block")
    text = CATALOG_BLOCK.sub(lambda m: m.group(1) + markdown_catalog() + m.group(3), text)
    return BLOCK.sub(lambda m: m.group(1) + markdown_columns(m.group(2)) + m.group(4), text)


def main(argv: list[str]) -> int:
    current = DOC.read_text(encoding="utf-8")
    wanted = render(current)
    if "--check" in argv:
        if wanted != current:
            print("docs/schema.md is stale: run python tools/gen_schema_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
