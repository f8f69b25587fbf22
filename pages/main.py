"""Streamlit app: navigation over the dashboard pages.

Deep links: every page reads its state from the URL (``/overview?job=ID``,
``/timeline?trace=ID&window=START-END``); ``/?page=NAME&trace=ID`` works too.
"""

from __future__ import annotations

import streamlit as st

_PAGES: dict[str, st.Page] = {}


def page_for(name: str) -> st.Page | str:
    """The navigation page called ``name`` (for st.page_link), or its URL path outside the app."""
    return _PAGES.get(name, name)


def authorized() -> bool:
    """Optional shared-token access control: set STALLSCOPE_TOKEN on the server.

    A visitor passes it once (a form, or ``?token=`` in a link); the session
    remembers it. Without the variable the dashboard is open.
    """
    import hmac
    import os

    token = os.environ.get("STALLSCOPE_TOKEN", "")
    if not token or st.session_state.get("authorized"):
        return True
    offered = st.query_params.get("token", "")
    if not offered:
        with st.form("login"):
            st.title("stallscope")
            offered = st.text_input("Team token", type="password")
            st.form_submit_button("Enter")
    if offered and hmac.compare_digest(offered.encode(), token.encode()):
        st.session_state["authorized"] = True
        if "token" in st.query_params:
            del st.query_params["token"]
        return True
    if offered:
        st.error("Wrong token.")
    return False


def main() -> None:
    st.set_page_config(page_title="stallscope", page_icon="⏱", layout="wide")
    if not authorized():
        st.stop()
    from stallscope.pages import (
        compare,
        distributed,
        kernels,
        library,
        occupancy,
        overview,
        sql,
        timeline,
    )

    pages = {
        "library": st.Page(library.render, title="Library", default=True),
        "overview": st.Page(overview.render, title="Overview", url_path="overview"),
        "timeline": st.Page(timeline.render, title="Timeline", url_path="timeline"),
        "kernels": st.Page(kernels.render, title="Kernels", url_path="kernels"),
        "distributed": st.Page(distributed.render, title="Distributed", url_path="distributed"),
        "occupancy": st.Page(occupancy.render, title="Occupancy", url_path="occupancy"),
        "compare": st.Page(compare.render, title="Compare", url_path="compare"),
        "sql": st.Page(sql.render, title="SQL", url_path="sql"),
    }
    _PAGES.clear()
    _PAGES.update(pages)
    nav = st.navigation(list(pages.values()))
    wanted = st.query_params.get("page")
    if wanted in pages and nav is pages["library"]:
        params = {k: v for k, v in st.query_params.items() if k != "page"}
        st.switch_page(pages[wanted], query_params=params)
    st.sidebar.caption("stallscope · where your GPU time goes")
    nav.run()


if __name__ == "__main__":
    main()
