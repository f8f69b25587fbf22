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
            "Start the web dashboard on the store. On an empty store the sample traces are ingested in "
            "the background (unless --no-samples): the dashboard answers at once and the jobs appear "
            "one by one. With $STALLSCOPE_TOKEN set, every page and upload needs the team "
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


def run(args: argparse.Namespace) -> int:
    from stallscope.access import Settings
    from stallscope.errors import StallscopeError

    try:
        Settings.from_env()  # a bad quota or session setting: one line now, not at the first request
    except ValueError as exc:
        raise StallscopeError(str(exc)) from None
    store = open_store(args)
    if not args.no_samples:
        from stallscope import preload

        if preload.start_in_background(store):
            print(f"loading the sample traces into {store.root} in the background")
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
