"""Trace- and user-controlled text shown literally by Streamlit (never as Markdown or HTML).

Kernel names, op names, file names, job names, uploader names, tags and notes
come from traces and visitors: ``![x](http://host/pixel)`` in a kernel name
must print as those characters, not load an image or render a link.
"""

from __future__ import annotations

_MARKDOWN_SPECIALS = "\\`*_{}[]()<>#!|$~:."


def literal(text: object) -> str:
    """``text`` with every Markdown-special character backslash-escaped (one line); ``:`` and
    ``.`` too, so ``http://`` and ``www.`` never autolink and ``:red[x]`` is no directive."""
    out = []
    for char in str(text).replace("\n", " "):
        out.append("\\" + char if char in _MARKDOWN_SPECIALS else char)
    return "".join(out)
