"""``stallscope serve``: start the dashboard on a store."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from stallscope.cli import add_store_option, open_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="start the dashboard (Streamlit) on the store",
        description=(
            "Start the web dashboard on the store. On an empty store the sample traces are ingested first "
            "(unless --no-samples), and analyzed by a background process while the dashboard starts. With $STALLSCOPE_TOKEN set, every page and upload needs the team "
            "token, entered once per browser (a 7-day session cookie); uploads have per-user quotas "
            "(docs/security.md)."
        ),
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for a team server)",
    )
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument(
        "--max-upload-mb",
        type=int,
        default=int(os.environ.get("STALLSCOPE_MAX_UPLOAD_MB", "1024")),
        help="largest upload accepted, per file, in MB (default 1024, or $STALLSCOPE_MAX_UPLOAD_MB)",
    )
    p.add_argument(
        "--no-samples",
        action="store_true",
        help="do not preload the sample traces into an empty store",
    )
    add_store_option(p)
    p.set_defaults(handler=run)


def sample_traces_dir() -> Path | None:
    """$STALLSCOPE_SAMPLES, else the checkout's sample_traces/ folder."""
    env = os.environ.get("STALLSCOPE_SAMPLES")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "sample_traces")
    return next((c for c in candidates if c.is_dir()), None)


def preload_samples(store) -> int:
    """Ingest the samples into an empty store: each folder of sample_traces/kineto (with the
    Nsight Compute CSV pages of the same program, ``ncu/<folder>.*.csv``, in the same job), each
    nsys export."""
    from stallscope.ingest import ingest_paths

    if store.traces():
        return 0
    root = sample_traces_dir()
    if root is None:
        return 0
    folders = (
        sorted(p for p in (root / "kineto").glob("*") if p.is_dir())
        if (root / "kineto").is_dir()
        else []
    )
    count = 0
    for folder in folders:
        traces = sorted(
            str(p) for p in folder.glob("*.json*") if not p.name.endswith(".truth.json")
        )
        traces += sorted(str(p) for p in (root / "ncu").glob(f"{folder.name}.*.csv"))
        if traces:
            ingest_paths(store, traces, uploaded_by="samples", tags=["sample", "kineto"])
            count += 1
    nsys = (
        sorted(str(p) for p in (root / "nsys").glob("*.sqlite*"))
        if (root / "nsys").is_dir()
        else []
    )
    if nsys:
        done = ingest_paths(store, nsys, each=True, uploaded_by="samples", tags=["sample", "nsys"])
        count += len(done)
    return count


def run(args: argparse.Namespace) -> int:
    from stallscope.access import Settings
    from stallscope.errors import StallscopeError

    try:
        Settings.from_env()  # a bad quota or session setting: one line now, not at the first request
    except ValueError as exc:
        raise StallscopeError(str(exc)) from None
    store = open_store(args)
    if not args.no_samples:
        loaded = preload_samples(store)
        if loaded:
            print(f"loaded {loaded} sample job(s) into {store.root}")
            from stallscope.report_child import analyze_missing_in_background

            analyze_missing_in_background(str(store.root))  # their reports, stored as they come
    import stallscope.pages

    # an st.App: Streamlit serves it behind the access gate (token, session cookie, quotas)
    app = Path(stallscope.pages.__file__).resolve().parent / "serve_app.py"
    env = dict(
        os.environ,
        STALLSCOPE_STORE=str(store.root),
        STALLSCOPE_MAX_UPLOAD_MB=str(args.max_upload_mb),
    )
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", args.host, "--server.port", str(args.port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--server.maxUploadSize", str(args.max_upload_mb),
        "--client.toolbarMode", "viewer",  # no Deploy button or developer menu
        "--server.enableAgentApi", "false",  # Streamlit's experimental HTTP agent API: off
    ]  # fmt: skip
    print(f"stallscope dashboard on http://{args.host}:{args.port} (store {store.root})")
    sys.stdout.flush()
    # Become the Streamlit server (same PID): SIGTERM from systemd or docker reaches it directly.
    os.execve(sys.executable, cmd, env)
    return 0  # not reached
