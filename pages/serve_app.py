"""What ``stallscope serve`` hands to ``streamlit run``: the dashboard as an ``st.App``
behind the access gate (``stallscope.pages.gate``), which Streamlit serves with uvicorn.

``streamlit run`` finds the ``app = st.App(...)`` assignment below and serves that ASGI
app; the gate is its outermost middleware, so it sees every request first.
"""

import streamlit as st

from stallscope.pages.gate import ENTRY, install

app = st.App(ENTRY, middleware=install())
