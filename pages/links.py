"""Links between dashboard pages that carry their state in the URL."""

from __future__ import annotations

import streamlit as st

MIN_PAD_NS = 50_000  # context each side of a linked window: at least 50 µs


def padded(window: list[int] | tuple[int, int]) -> tuple[int, int]:
    """A finding's window with half its length (at least 50 µs) of context each side, ns."""
    start, end = int(window[0]), int(window[1])
    pad = max((end - start) // 2, MIN_PAD_NS)
    return start - pad, end + pad


def timeline_link(query: dict[str, str], label: str) -> None:
    """A same-tab link to the Timeline page with ``query`` (``job``, ``trace``, ``ranks``,
    ``window`` = ``START-END`` ns, ``finding``): st.page_link, so the app navigates in place,
    keeping the session and its caches (a markdown link opens a new tab and a new session,
    which took ~7 s)."""
    from stallscope.pages.main import page_for

    target = page_for("timeline")
    if isinstance(target, str):  # outside st.navigation (a page run on its own)
        st.markdown(f"[{label}](timeline?{'&'.join(f'{k}={v}' for k, v in query.items())})")
    else:
        st.page_link(target, label=label, icon=":material/timeline:", query_params=query)
