"""Write docs/report-schema.json: the JSON Schema of ``stallscope.report/1``, from its types.

    python tools/gen_report_schema.py [--check]

The schema is generated from the msgspec Structs in stallscope/report_types.py
(``msgspec.json.schema``). Run after changing those types; ``--check`` exits 1
when the file is stale (tests/test_report_schema.py runs it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "report-schema.json"


def render() -> str:
    from stallscope.report_types import json_schema

    return json.dumps(json_schema(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python tools/gen_report_schema.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
