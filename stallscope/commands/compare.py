"""``stallscope compare BASE NEW``: step time and where it goes, copies, kernels, findings, with a CI verdict."""

from __future__ import annotations

import argparse
import sys

from stallscope.cli import EXIT_FINDINGS, EXIT_OK, add_store_option, open_store

FORMATS = (
    "text",
    "json",
    "markdown",
    "html",
)  # stallscope.compare.FORMATS (not imported: fast --help)


def percentage(text: str) -> float:
    """'5%' or '5' -> 0.05."""
    value = text.strip().removesuffix("%").strip()
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (e.g. 5%)") from None
    if not 0 <= number < 1000:
        raise argparse.ArgumentTypeError(f"out of range: {text!r}")
    return number / 100


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare a baseline and a new job: step time and where it goes, copies, kernels; CI regression gate",
        description=(
            "Compare two jobs. BASE and NEW are each a trace file, a job directory or .zip (ingested "
            "first), or a stored trace or job id. Reports the median step time of each (a step's time is "
            "its slowest rank's; without ProfilerStep/NVTX steps, the GPU span); where one GPU's step "
            "goes (compute, exposed communication, waiting for other ranks, exposed copies, idle time by "
            "cause); GPU time per step by busy category and idle cause; communication (exposed, waiting, "
            "overlap %); copies by kind; the kernels whose GPU time per step changed most; and the "
            "findings' estimated savings. Verdict: 'regression' when the new median step time exceeds the "
            "base median by more than --max-regression AND the difference exceeds K x the pooled "
            "step-to-step standard deviation x sqrt(1/n_base + 1/n_new) (--noise-k, default 2); "
            "'improvement' symmetrically; else 'no significant change'. When the step time changed "
            "beyond the noise, the categories that changed most explain it (or the output says what "
            "the rows cannot show)."
        ),
        epilog="Exit codes: 0 no regression, 1 regression, 2 usage error, 3 input error, 4 environment error, 70 internal error.",
    )
    p.add_argument(
        "base", metavar="BASE", help="baseline: trace file, job directory, zip or store id"
    )
    p.add_argument(
        "new", metavar="NEW", help="candidate: trace file, job directory, zip or store id"
    )
    p.add_argument(
        "--max-regression",
        type=percentage,
        default=0.05,
        metavar="PCT",
        help="largest slowdown of the median step time that passes, e.g. 5%% (default 5%%)",
    )
    p.add_argument(
        "--noise-k",
        type=float,
        default=2.0,
        metavar="K",
        help="a change must also exceed K standard errors of the step-time difference (default 2)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=10,
        metavar="N",
        help="kernels and findings listed, by change and saving (default 10)",
    )
    p.add_argument(
        "--format", choices=FORMATS, default="text", help="output format (default: text)"
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    add_store_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.api import load
    from stallscope.compare import compare_jobs, render_compare

    store = open_store(args)
    base = load(args.base, store=store).refs
    new = load(args.new, store=store).refs
    result = compare_jobs(
        store, base, new, max_regression=args.max_regression, noise_k=args.noise_k, top=args.top
    )
    text = render_compare(result, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return EXIT_FINDINGS if result["verdict"] == "regression" else EXIT_OK
