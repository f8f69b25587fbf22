"""SQL page: read-only queries over every trace in the store."""

from __future__ import annotations

import streamlit as st

from stallscope.pages.state import get_store
from stallscope.sql import QueryError, readonly_query

EXAMPLE = """SELECT n.name, count(*) AS launches, sum(g.end_ns - g.start_ns) / 1e6 AS gpu_ms
FROM gpu g JOIN names n USING (trace_id, name_id)
WHERE g.kind = 'kernel'
GROUP BY 1 ORDER BY gpu_ms DESC LIMIT 20"""


COLUMNS = """SELECT table_name AS "table", string_agg(column_name, ', ' ORDER BY ordinal_position) AS columns
FROM information_schema.columns GROUP BY 1 ORDER BY 1"""


def _columns():
    return readonly_query(get_store(), COLUMNS)


def render() -> None:
    st.title("SQL")
    st.caption(
        "Read-only DuckDB over the canonical tables of every stored trace: gpu, host, ranges, collectives, names, kernel_metrics, "
        "threads, devices, catalog (see docs/schema.md). One SELECT at a time; no file or network access; "
        "30 s and 10,000 rows at most."
    )
    with st.expander("Tables and their columns"):
        try:
            st.dataframe(_columns(), width="stretch", hide_index=True)
        except QueryError as exc:
            st.caption(str(exc))
        st.caption(
            "Names are interned: join `names` on (trace_id, name_id) to read them, as the example does."
        )
    st.session_state.setdefault("sql_query", EXAMPLE)
    query = st.text_area("Query", key="sql_query", height=160)
    if st.button("Run", type="primary"):
        try:
            frame = readonly_query(get_store(), query)
        except QueryError as exc:
            st.error(str(exc))
            return
        st.caption(f"{len(frame)} rows")
        st.dataframe(frame, width="stretch", hide_index=True)
