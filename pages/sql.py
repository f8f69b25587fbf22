"""SQL page: read-only queries in a sandbox over copies of the stored traces.

Every query runs in its own sandbox process (stallscope.sql): no file, setting
or path is reachable, memory, time and the result are capped. Nothing a user
or a trace controls is rendered as Markdown here: messages go through
:func:`stallscope.pages.text.code_span` (an inline code span), results through ``st.dataframe``
(plain cells).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stallscope.pages.spec import PageSpec
from stallscope.pages.state import get_store
from stallscope.pages.text import code_span
from stallscope.sql import (
    MAX_RESULT_BYTES,
    MAX_ROWS,
    MEMORY_MB,
    TIMEOUT_S,
    QueryError,
    plan_load,
    sandbox_query,
    table_columns,
)

EXAMPLE = """SELECT n.name, count(*) AS launches, sum(g.end_ns - g.start_ns) / 1e6 AS gpu_ms
FROM gpu g JOIN names n USING (trace_id, name_id)
WHERE g.kind = 'kernel'
GROUP BY 1 ORDER BY gpu_ms DESC LIMIT 20"""


@st.cache_data(ttl=300, show_spinner=False)
def _columns(trace_ids: tuple[str, ...]) -> pd.DataFrame:
    """The tables and their columns (keyed by the traces loaded, so new uploads show)."""
    wanted = set(trace_ids)
    listing = table_columns([r for r in get_store().traces() if r.trace_id in wanted])
    return pd.DataFrame(
        [(table, ", ".join(columns)) for table, columns in listing], columns=["table", "columns"]
    )


PAGE = PageSpec("SQL", "sql", order=100, needs=())


def render() -> None:
    st.title("SQL")
    store = get_store()
    plan = plan_load(store.traces())
    st.caption(
        "Read-only DuckDB over copies of the canonical tables: gpu, host, ranges, collectives, names, "
        "kernel_metrics, threads, devices, catalog (see docs/schema.md). One SELECT at a time, in a "
        f"sandbox with no file, network, setting or path access; {TIMEOUT_S:g} s, {MEMORY_MB:,} MB of "
        f"memory, {MAX_ROWS:,} rows and {MAX_RESULT_BYTES >> 20} MB of results at most (docs/security.md)."
    )
    st.caption(f"Loaded: {plan.describe()}.")  # counts and sizes only: nothing user-controlled
    with st.expander("Tables and their columns"):
        st.dataframe(
            _columns(tuple(r.trace_id for r in plan.traces)), width="stretch", hide_index=True
        )
        st.caption(
            "Names are interned: join `names` on (trace_id, name_id) to read them, as the example "
            "does. `catalog.file_name` is the uploaded file's base name."
        )
    st.session_state.setdefault("sql_query", EXAMPLE)
    query = st.text_area("Query", key="sql_query", height=160)
    if st.button("Run", type="primary"):
        try:
            result = sandbox_query(store, query, traces=plan.traces)
        except QueryError as exc:
            st.error(code_span(exc))
            return
        for note in result.notes:
            st.warning(code_span(note))
        shown = f"{len(result.frame):,} rows"
        if result.truncated:
            shown += f": the {result.truncated}"
        st.caption(shown)
        st.dataframe(result.frame, width="stretch", hide_index=True)
