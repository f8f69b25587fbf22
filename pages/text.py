"""Trace- and user-controlled text shown literally by Streamlit (never as Markdown or HTML).

Kernel names, op names, file names, job names, uploader names, tags and notes
come from traces and visitors: ``![x](http://host/pixel)`` in a kernel name
must print as those characters, not load an image or render a link.
"""

from __future__ import annotations

import re

_MARKDOWN_SPECIALS = "\\`*_{}[]()<>#!|$~:"
# GFM turns bare URLs into links after parsing, where escapes are gone: a zero-width space
# inside ``://`` and after ``www`` breaks the pattern and prints the same.
_AUTOLINK = re.compile(r"(?i)(?<=:)(?=//)|(?<=\bwww)(?=\.)")


def literal(text: object) -> str:
    """``text`` with every Markdown-special character backslash-escaped (one line), ``:`` too
    (no ``:red[x]`` directive), and bare URLs kept from becoming links."""
    line = _AUTOLINK.sub("\u200b", str(text).replace("\n", " "))
    return "".join("\\" + char if char in _MARKDOWN_SPECIALS else char for char in line)
