"""stallscope: find where GPU jobs lose time.

The headless core (ingest -> store -> analyzers -> report) lives in this
package and never imports streamlit; ``stallscope.pages`` is the dashboard.
The notebook API is ``stallscope.load(path_or_id)`` (``stallscope.api``,
imported on first use so that ``import stallscope`` stays light).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Job", "__version__", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "Job"):
        from stallscope import api

        return getattr(api, name)
    raise AttributeError(f"module 'stallscope' has no attribute {name!r}")
