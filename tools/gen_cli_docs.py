"""Regenerate docs/cli.md from the CLI's own --help (CI checks it is current).

Usage: python tools/gen_cli_docs.py [--check]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

INTRO = """# Command-line reference

Generated from `stallscope --help` by `tools/gen_cli_docs.py`; do not edit by hand.

Exit codes (all commands): `0` success; `1` a finding at or above `--fail-on`
(`analyze`) or a regression (`compare`, see [compare.md](compare.md)); `2` usage error; `3` input error (unreadable, unsupported or
malformed trace, unknown id, an input past a limit such as `--timeout`; one line
on stderr, store unchanged); `4` environment error (read-only store, permission
denied, disk full, a damaged store file: the machine, not the input); `70`
internal error, a bug (one line; set `STALLSCOPE_DEBUG=1` for the traceback).

Environment: `STALLSCOPE_STORE` (store folder), `STALLSCOPE_USER` (uploader
name), `STALLSCOPE_MAX_TRACE_BYTES` (largest decompressed trace, default
16 GiB), `STALLSCOPE_DECOMPRESS_HEADROOM_MB` (a compressed file may expand to
100x its size plus this, default 32), `STALLSCOPE_INGEST_TIMEOUT` and
`STALLSCOPE_INGEST_MAX_MEMORY_MB` (defaults of `ingest --timeout` and
`--max-memory-mb`), `STALLSCOPE_MAX_RANKS` (ranks one job may hold, default
1024), `STALLSCOPE_SCHEDULER` (the Dask scheduler of `ingest`/`analyze --scheduler`, see
docs/dask.md), `STALLSCOPE_STAGING_STALE_S` (see docs/store.md), `STALLSCOPE_ANALYZE_TIMEOUT` (the
dashboard's limit on building a report that is not stored, default 600 s; see
docs/store.md#stored-reports), `STALLSCOPE_SAMPLES` (sample traces folder for `serve`),
`STALLSCOPE_MAX_UPLOAD_MB` and `STALLSCOPE_TOKEN` (dashboard upload limit and
shared access token, see docs/dashboard.md), `STALLSCOPE_UPLOAD_QUOTA_MB`,
`STALLSCOPE_UPLOAD_QUOTA_MINUTES`, `STALLSCOPE_UPLOAD_MAX_FILES`,
`STALLSCOPE_SESSION_DAYS` and `STALLSCOPE_COOKIE_SECURE` (dashboard upload
quotas and session cookie, see docs/security.md), `STALLSCOPE_NSYS` and
`STALLSCOPE_NSYS_CACHE` (the `nsys` that exports `.nsys-rep` reports and where
exports are cached, see docs/formats/nsys.md), `STALLSCOPE_DECODE_WORKERS`
(processes that decode a big Kineto trace or read a big Nsight Systems table;
default: one per CPU, at most 8, on Linux machines with 4 or more CPUs, for
Kineto traces of 128 MB or more and nsys tables of 400,000 rows or more; `1`
turns them off; see docs/benchmarks.md), `STALLSCOPE_THREADS` (threads one ingest's
SQL and Arrow work may use; default: the machine's CPUs, DuckDB's at most 8; an
ingest task on a Dask worker uses the worker's thread count), `STALLSCOPE_ITERATION_RANGE` (the
inference iteration ranges when `analyze --iteration-range` is not given, see
docs/analyzers/inference.md).
"""


def render() -> str:
    os.environ["COLUMNS"] = "100"
    from stallscope.cli import build_parser

    parser = build_parser()
    parts = [INTRO, "## stallscope\n", "```\n" + parser.format_help() + "```\n"]
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        parts.append(f"## stallscope {name}\n")
        parts.append("```\n" + command.format_help() + "```\n")
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/cli.md is out of date: run python tools/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
