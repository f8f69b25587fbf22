"""Streamlit app: navigation over the dashboard pages.

The pages are found in ``pages/`` (each module's ``PAGE``, :mod:`stallscope.pages.spec`), in
their declared order. Deep links: every page reads its state from the URL (``/overview?job=ID``,
``/timeline?trace=ID&window=START-END``); ``/?page=NAME&trace=ID`` works too.
"""

from __future__ import annotations

from types import ModuleType

import streamlit as st

from stallscope.pages.spec import PageSpec
from stallscope.pages.spec import pages as declared

_PAGES: dict[str, st.Page] = {}


def page_for(name: str) -> st.Page | str:
    """The navigation page called ``name`` (for st.page_link), or its URL path outside the app."""
    return _PAGES.get(name, name)


def authorized() -> bool:
    """The page gate, behind the HTTP gate (``stallscope.pages.gate``): with a team token
    set, the page runs only for a browser session whose cookie is valid now.

    The HTTP gate already refuses a WebSocket without a valid cookie, so this catches a
    session that outlived its cookie (the cookie is read once, when the tab connects).
    A token set on a server started without the gate (``streamlit run pages/entry.py``)
    keeps the dashboard closed: its upload endpoint would be unguarded.
    """
    import os

    from stallscope.pages import gate

    keeper = gate.current()
    token = keeper.settings.token if keeper else os.environ.get("STALLSCOPE_TOKEN", "")
    if not token:
        return True
    if keeper is None:
        st.title("stallscope")
        st.error(
            "STALLSCOPE_TOKEN is set but this server runs without the access gate, so uploads "
            "would be unguarded: start it with `stallscope serve` or `streamlit run app.py`."
        )
        return False
    if keeper.session(session_cookie()) is not None:
        return True
    st.title("stallscope")
    st.warning("Your session has ended: log in again with the team token.")
    st.markdown(f'<a href="{gate.LOGIN_PATH}" target="_self">Log in</a>', unsafe_allow_html=True)
    return False


def session_cookie() -> str | None:
    """This browser session's stallscope cookie, as sent when the tab connected."""
    from stallscope.access import COOKIE_NAME

    return st.context.cookies.get(COOKIE_NAME)


def _logout_link() -> None:
    from stallscope.pages import gate

    keeper = gate.current()
    if keeper is not None and keeper.guarded:
        link = f'<a href="{gate.LOGOUT_PATH}" target="_self">Log out</a>'
        st.sidebar.markdown(link, unsafe_allow_html=True)


def _preload_note() -> None:
    """While ``serve`` loads the sample traces in the background, say how far it got."""
    from stallscope import preload
    from stallscope.pages.state import get_store

    running = preload.status(get_store().root)
    if running is not None:
        st.sidebar.info(
            f"Loading the sample traces: {running.done} of {running.total} jobs ready "
            "(they appear in the Library as they land)."
        )


def _nav_page(spec: PageSpec, module: ModuleType) -> st.Page:
    """The navigation entry of a declared page (``stallscope.pages.spec``); ``url_path`` empty:
    the default page, at the root."""
    if not spec.url_path:
        return st.Page(module.render, title=spec.title, default=True)
    return st.Page(module.render, title=spec.title, url_path=spec.url_path)


def main() -> None:
    st.set_page_config(page_title="stallscope", page_icon="⏱", layout="wide")
    if not authorized():
        st.stop()
    pages = {name: _nav_page(spec, module) for name, (spec, module) in declared().items()}
    home = next(name for name, (spec, _) in declared().items() if not spec.url_path)
    _PAGES.clear()
    _PAGES.update(pages)
    nav = st.navigation(list(pages.values()))
    wanted = st.query_params.get("page")
    if wanted in pages and nav is pages[home]:
        params = {k: v for k, v in st.query_params.items() if k != "page"}
        st.switch_page(pages[wanted], query_params=params)
    st.sidebar.caption("stallscope · where your GPU time goes")
    _preload_note()
    _logout_link()
    nav.run()


if __name__ == "__main__":
    main()
