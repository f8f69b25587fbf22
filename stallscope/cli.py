"""The ``stallscope`` command line (a thin front end over the core).

Exit codes (documented API, see docs/cli.md):
  0 success; 1 a finding at or above ``--fail-on`` (analyze) or a regression
  (compare); 2 usage error;
  3 input error (unreadable or unsupported trace, unknown id, an input past a limit);
  4 environment error (read-only store, permission denied, disk full, a damaged
  store file); 70 internal error (a bug).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stallscope import __version__
from stallscope.errors import EnvironmentProblem, StallscopeError, UsageError, environment_problem

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3, 70
EXIT_ENVIRONMENT = 4


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command=next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return run_handler(args.handler, args)


def run_handler(handler, args: argparse.Namespace) -> int:
    """``handler(args)`` with every failure turned into one line on stderr and an exit code."""
    try:
        return handler(args)
    except UsageError as exc:
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentProblem as exc:
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except StallscopeError as exc:
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except MemoryError:
        print("stallscope: error: out of memory (the machine or --max-memory-mb)", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except OSError as exc:
        problem = environment_problem(exc)
        if problem is None:
            return _internal(exc)
        print(f"stallscope: error: {problem}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except Exception as exc:  # noqa: BLE001 (last-resort: one line, never a traceback)
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    """A bug: one line (the first of the message), exit 70; the traceback with STALLSCOPE_DEBUG."""
    if os.environ.get("STALLSCOPE_DEBUG"):
        raise exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    print(
        f"stallscope: internal error: {type(exc).__name__}: {text} (set STALLSCOPE_DEBUG=1 for the traceback)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``command`` names the sub-command about to run, if known.

    ``analyze``'s threshold options are built from every analyzer's spec, which
    imports every analyzer (~0.1 s); they are left out when another command is
    about to run. ``None`` (help, generated docs) builds everything.
    """
    from stallscope.commands import analyze, compare, export, ingest, listing, remove, serve

    parser = _Parser(
        prog="stallscope",
        description=(
            "Find where GPU training and inference jobs lose time, from PyTorch profiler (Kineto), "
            "Nsight Systems and Nsight Compute traces."
        ),
        epilog=(
            "Exit codes: 0 ok, 1 findings at or above --fail-on (analyze) or a regression (compare), "
            "2 usage error, 3 input error (incl. an input past --timeout or --max-memory-mb), "
            "4 environment error (read-only store, permission denied, disk full, a damaged "
            "store file), 70 internal error (a bug)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (ingest, listing, analyze, compare, export, serve, remove):
        if module is analyze:
            analyze.register(sub, thresholds=command in (None, "analyze"))
        else:
            module.register(sub)
    return parser


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2; the full usage stays in ``--help``.

    (argparse's default prints the whole usage first: ~60 lines for ``analyze``,
    with the error last.)
    """

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        metavar="DIR",
        default=None,
        help="store folder (default: $STALLSCOPE_STORE, else ~/.stallscope/store)",
    )


def add_scheduler_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="run on the Dask cluster of this scheduler (tcp://HOST:PORT; default: "
        "$STALLSCOPE_SCHEDULER, else this machine); the store and the files must be on a "
        "filesystem its workers share (pip install 'stallscope[dask]'; see docs/dask.md)",
    )


def open_store(args: argparse.Namespace):
    from stallscope.store import Store

    return Store(args.store).ensure()


def print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


def checkout_root() -> Path:
    """The source checkout this package runs from (editable installs)."""
    return Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    sys.exit(main())
