"""Streamlit app: navigation over the dashboard pages."""

from __future__ import annotations

import streamlit as st


def main() -> None:
    st.set_page_config(page_title="stallscope", page_icon="⏱", layout="wide")
    from stallscope.pages import library, overview

    nav = st.navigation(
        [
            st.Page(library.render, title="Library", url_path="library", default=True),
            st.Page(overview.render, title="Overview", url_path="overview"),
        ]
    )
    nav.run()


if __name__ == "__main__":
    main()
