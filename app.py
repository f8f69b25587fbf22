"""Dashboard entry point for ``streamlit run app.py`` from a checkout.

The same app, behind the same access gate, as ``stallscope serve`` (which runs
``pages/serve_app.py``); all the logic is in ``stallscope.pages`` and the headless core.
"""

import streamlit as st

from stallscope.pages.gate import ENTRY, install

app = st.App(ENTRY, middleware=install())
